#!/usr/bin/env bash
# Stop and remove the multi-host Slurm of up-multi.sh: cancel leftover jobs, kill exactly the
# processes in its network namespaces (`ip netns pids`: slurmctld, slurmd, job steps, Dask workers)
# and its own munged, delete the namespaces, /etc/netns/<ns>, the veths and the bridge dhmcbr0, and
# wait until the kernel has really removed them (deletion is asynchronous). Idempotent, any N.
# Leaves the single-node Slurm of up.sh alone, and keeps logs and the munge key in the state dir.
#   DHMC_MULTI_DIR   state dir (default /tmp/dhmc-multi-slurm)
set -uo pipefail

DIR=${DHMC_MULTI_DIR:-/tmp/dhmc-multi-slurm}
export PATH="$PATH:/usr/sbin:/sbin"
warn() { echo "local-slurm down-multi.sh: $*" >&2; }
if [ "$(id -u)" != 0 ]; then exec sudo -n env "DHMC_MULTI_DIR=$DIR" "$0" "$@"; fi

BR=dhmcbr0
HEAD_NS=dhmc-head
CONF=$DIR/slurm.conf
MARK="# written by dhmc deploy/local-slurm/up-multi.sh"

alive() {  # alive NAME: the daemon in $DIR/NAME.pid runs (and is a NAME, not a reused PID)
  local pid
  [ -s "$DIR/$1.pid" ] || return 1
  pid=$(cat "$DIR/$1.pid")
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]
}
stop_pids() {  # stop_pids WHAT PID...: SIGTERM, up to 5 s, then SIGKILL
  local what=$1 p left
  shift
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null
  for _ in $(seq 50); do
    left=""
    for p in "$@"; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -n "$left" ] || return 0
    sleep 0.1
  done
  warn "$what:$left ignored SIGTERM, killing"
  # shellcheck disable=SC2086
  kill -KILL $left 2>/dev/null
  return 0
}

# namespaces made by up-multi.sh: their /etc/netns/<ns>/hosts carries the mark
nss=""
for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
  case $ns in $HEAD_NS | c[0-9]*) grep -qF "$MARK" "/etc/netns/$ns/hosts" 2>/dev/null && nss="$nss $ns";; esac
done

# 1. cancel leftover jobs while slurmctld still runs, give slurmd a moment to end the steps
if alive slurmctld && [ -s "$CONF" ]; then
  export SLURM_CONF=$CONF
  timeout 10 scancel --quiet --partition=multi 2>/dev/null || true
  end=$((SECONDS + 10))
  while [ $SECONDS -lt $end ] && [ -n "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]; do sleep 0.5; done
fi

# 2. every process in our namespaces (slurmd, job steps, jobs; slurmctld in the head), and our munged,
#    all at once: each daemon takes 1.5-2 s to stop on SIGTERM
pids=""
for ns in $nss; do pids="$pids $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"; done
if alive munged; then pids="$pids $(cat "$DIR/munged.pid")"; fi
# shellcheck disable=SC2086
stop_pids "processes of the multi-host Slurm" $pids

# 3. namespaces, their /etc/netns dirs, veths, bridge; wait for the asynchronous deletion
for ns in $nss; do
  ip netns del "$ns" 2>/dev/null || warn "ip netns del $ns failed"
  rm -rf "/etc/netns/$ns"
done
for ns in $nss; do
  [ -e "/sys/class/net/v-$ns" ] && ip link del "v-$ns" 2>/dev/null
done
[ -e /sys/class/net/$BR ] && ip link del $BR
for _ in $(seq 100); do
  left=$(ls -d /sys/class/net/$BR /sys/class/net/v-$HEAD_NS /sys/class/net/v-c[0-9]* 2>/dev/null | tr '\n' ' ')
  [ -n "$left" ] || break
  sleep 0.1
done
[ -z "$left" ] || warn "still present after 10 s: $left"

# 4. the sysctl up-multi.sh changed, PID files, the address file tests read
if [ -s "$DIR/bridge-nf-call-iptables.saved" ]; then
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] \
    && sysctl -q -w net.bridge.bridge-nf-call-iptables="$(cat "$DIR/bridge-nf-call-iptables.saved")"
  rm -f "$DIR/bridge-nf-call-iptables.saved"
fi
rm -f "$DIR"/*.pid "$DIR/hosts.env"
echo "multi-host slurm down"
