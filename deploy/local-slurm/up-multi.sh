#!/usr/bin/env bash
# Start a multi-host Slurm on one Linux machine: N compute "hosts" as network namespaces on a bridge.
#
#   up-multi.sh [N]            N compute hosts, default 3 (root, or passwordless sudo)
#
#   root namespace   10.77.0.1   bridge dhmcbr0; the driver (pytest) and the Dask scheduler live here
#   dhmc-head        10.77.0.2   slurmctld (hostname head)
#   c1 .. cN         10.77.0.11, 10.77.0.12, ...   one slurmd each (-N cX, hostname cX); its jobs run
#                    in that namespace, so they bind that host's IP. Host side of each veth: v-c1, v-c2,
#                    ... (`ip link set v-c2 down` cuts host c2 off: a true, silent partition).
#
# Coexists with the single-node Slurm of up.sh: the config is NOT /etc/slurm/slurm.conf but
# $DHMC_MULTI_DIR/slurm.conf, and this cluster has its own munged (own key and socket). Clients
# select it with
#   export SLURM_CONF=/tmp/dhmc-multi-slurm/slurm.conf
# State dir DHMC_MULTI_DIR (default /tmp/dhmc-multi-slurm): slurm.conf, hosts.env (addresses, for
# tests), munge/, ctld/, spool/<node>/, log/ (munged.log, slurmctld.log, slurmd.<node>.log), PID files.
# Idempotent: what already runs is reused. Stop and remove everything with down-multi.sh.
# Installs Debian/Ubuntu packages slurmctld slurmd slurm-client munge when missing (as up.sh does).
set -euo pipefail

DIR=${DHMC_MULTI_DIR:-/tmp/dhmc-multi-slurm}
N=${1:-${DHMC_NODES:-3}}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$PATH:/usr/sbin:/sbin"
die() { echo "local-slurm up-multi.sh: $*" >&2; exit 1; }

trap 'die "failed (line $LINENO): $BASH_COMMAND; clean up with down-multi.sh"' ERR
set -E   # the trap also fires inside functions
case $N in [1-9] | [1-8][0-9]) ;; *) die "N must be 1..89, got '$N'";; esac
if [ "$(id -u)" != 0 ]; then exec sudo -n env "DHMC_MULTI_DIR=$DIR" "$0" "$@"; fi

BR=dhmcbr0
NET=10.77.0
HEAD_NS=dhmc-head
CONF=$DIR/slurm.conf
MARK="# written by dhmc deploy/local-slurm/up-multi.sh"
NODES=$(seq -f 'c%g' 1 "$N" | tr '\n' ' ' | sed 's/ $//')
t0=$SECONDS

alive() {  # alive NAME: the daemon in $DIR/NAME.pid runs (and is a NAME, not a reused PID)
  local pid
  [ -s "$DIR/$1.pid" ] || return 1
  pid=$(cat "$DIR/$1.pid")
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]
}
node_ip() { echo "$NET.$((10 + ${1#c}))"; }

# 0. an earlier cluster of another size must be removed first (down-multi.sh handles any size)
if [ -s "$DIR/hosts.env" ]; then
  old=$(sed -n 's/^NODES="\(.*\)"$/\1/p' "$DIR/hosts.env")
  [ "$old" = "$NODES" ] || die "a multi-host Slurm with nodes '$old' is up; run down-multi.sh first"
fi

# 1. packages
missing=""
for c in slurmctld slurmd sbatch munged ip unshare; do command -v $c >/dev/null || missing=1; done
if [ -n "$missing" ]; then
  echo "installing slurmctld slurmd slurm-client munge iproute2 ..."
  apt() { env DEBIAN_FRONTEND=noninteractive apt-get -y -qq "$@" >/dev/null; }
  policy=""   # keep the packages' init scripts from starting daemons of their own
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; policy=1
  fi
  pkgs="slurmctld slurmd slurm-client munge iproute2 util-linux"
  ok=1
  # shellcheck disable=SC2086
  apt install --no-install-recommends $pkgs || { apt update && apt install --no-install-recommends $pkgs; } || ok=""
  [ -z "$policy" ] || rm -f /usr/sbin/policy-rc.d
  [ -n "$ok" ] || die "apt-get install $pkgs failed"
fi

# 2. network: bridge in the root namespace, one namespace + veth per host
for link in /sys/class/net/v-$HEAD_NS /sys/class/net/v-c[0-9]*; do  # veths of namespaces deleted
  [ -e "$link" ] || continue                                         # moments ago vanish asynchronously
  n=${link##*/v-}
  [ -e "/run/netns/$n" ] && continue
  for _ in $(seq 50); do [ -e "$link" ] || break; sleep 0.1; done
done
if [ ! -e /sys/class/net/$BR ]; then ip link add $BR type bridge; fi
ip addr replace $NET.1/24 dev $BR
ip link set $BR up
# Docker sets the iptables FORWARD policy to DROP; with bridge-nf-call-iptables=1, traffic between
# bridge ports then goes through FORWARD and is dropped. The old value is restored by down-multi.sh.
NF=/proc/sys/net/bridge/bridge-nf-call-iptables
mkdir -p "$DIR"
if [ -e $NF ] && [ "$(cat $NF)" != 0 ]; then
  [ -e "$DIR/bridge-nf-call-iptables.saved" ] || cat $NF > "$DIR/bridge-nf-call-iptables.saved"
  sysctl -q -w net.bridge.bridge-nf-call-iptables=0
fi

hosts_file() {
  echo "$MARK"
  echo "127.0.0.1 localhost"
  echo "$NET.1 root"
  echo "$NET.2 head"
  for n in $NODES; do echo "$(node_ip "$n") $n"; done
}
mkns() {  # mkns NAMESPACE IP: namespace, veth v-NAMESPACE on the bridge, eth0 inside, lo up, /etc/hosts
  local ns=$1 ip=$2
  if [ -e "/run/netns/$ns" ] && ! grep -qF "$MARK" "/etc/netns/$ns/hosts" 2>/dev/null; then
    die "network namespace $ns exists but was not made by up-multi.sh; remove it (ip netns del $ns) first"
  fi
  mkdir -p "/etc/netns/$ns"   # first: the mark in it tells down-multi.sh the namespace is ours
  hosts_file > "/etc/netns/$ns/hosts"
  [ -e "/run/netns/$ns" ] || ip netns add "$ns"
  # a veth left over from an earlier namespace of that name (deleted by hand while a process still
  # held it) has its peer elsewhere: replace it
  if [ -e "/sys/class/net/v-$ns" ] && ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then ip link del "v-$ns"; fi
  [ -e "/sys/class/net/v-$ns" ] || ip link add "v-$ns" type veth peer name eth0 netns "$ns"
  ip link set "v-$ns" master $BR up
  ip -n "$ns" addr replace "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up   # lo is DOWN in a fresh namespace
}
mkns $HEAD_NS $NET.2
for n in $NODES; do mkns "$n" "$(node_ip "$n")"; done

# 3. state dir, munge key, config
mkdir -p "$DIR"/{munge,ctld,spool,log}
chmod 755 "$DIR" "$DIR/munge"   # clients (and every namespace) must reach the munge socket
[ -s "$DIR/munge/munge.key" ] || {
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/munge.key"
}
MEM=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
MEM=$(( ${MEM:-2048} * 9 / 10 / N ))
MEM=$(( MEM > 4096 ? 4096 : (MEM < 2048 ? 2048 : MEM) ))   # config_overrides: may exceed on small boxes
{
  cat <<EOF
$MARK
# Multi-host Slurm in network namespaces; clients: export SLURM_CONF=$CONF
ClusterName=dhmc-multi
SlurmctldHost=head($NET.2)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
# No NoInAddrAny here: it binds to gethostname() as resolved by /etc/hosts; each namespace has its
# own port space anyway, so the daemons listen on all of their namespace's addresses.
SlurmdParameters=config_overrides
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=30
MinJobAge=10
KillWait=5
# a job on a failed host ends (NODE_FAIL) instead of being requeued behind the tests' backs
JobRequeue=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
EOF
  for n in $NODES; do echo "NodeName=$n NodeAddr=$(node_ip "$n") CPUs=1 RealMemory=$MEM State=UNKNOWN"; done
  echo "PartitionName=multi Nodes=c[1-$N] Default=YES MaxTime=INFINITE State=UP"
} > "$CONF.new"
if cmp -s "$CONF.new" "$CONF"; then rm -f "$CONF.new"; else mv -f "$CONF.new" "$CONF"; fi

{
  echo "$MARK"
  echo "DHMC_MULTI_DIR=$DIR"
  echo "SLURM_CONF=$CONF"
  echo "PARTITION=multi"
  echo "BRIDGE=$BR"
  echo "BRIDGE_IP=$NET.1"
  echo "HEAD_NS=$HEAD_NS"
  echo "HEAD_IP=$NET.2"
  echo "NODES=\"$NODES\""
  for n in $NODES; do echo "NODE_$n=$(node_ip "$n")"; done
} > "$DIR/hosts.env"

# 4. daemons: munged in the root namespace (its path socket is reachable from every namespace),
#    slurmctld in dhmc-head, one slurmd per host namespace (start-node.sh)
if ! alive munged; then
  rm -f "$DIR/munged.pid"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed" \
    || die "munged failed to start; see $DIR/log/munged.log"
fi
if ! alive slurmctld; then
  rm -f "$DIR/slurmctld.pid"
  # -c: fresh state, no stale node or job records
  ip netns exec $HEAD_NS unshare --uts sh -c "hostname head && exec slurmctld -c -f $CONF" \
    || die "slurmctld failed to start; see $DIR/log/slurmctld.log"
fi
for n in $NODES; do DHMC_MULTI_DIR=$DIR "$HERE/start-node.sh" "$n"; done

# 5. wait (bounded) until every node is idle
export SLURM_CONF=$CONF
deadline=$((SECONDS + 40))
while :; do
  states=$(timeout 5 sinfo -h -N -p multi -o '%N %T' 2>/dev/null | sort -u || true)
  busy=$(echo "$states" | awk '$2 !~ /^(idle|mixed|allocated)$/' | tr '\n' ' ')
  if [ -n "$states" ] && [ -z "$busy" ] && [ "$(echo "$states" | wc -l)" = "$N" ]; then
    echo "multi-host slurm up: $(echo "$states" | awk '{print $1}' | tr '\n' ' ')$(echo "$states" \
      | awk '{print $2}' | sort -u | tr '\n' ' ')in $((SECONDS - t0)) s; export SLURM_CONF=$CONF"
    exit 0
  fi
  for d in munged slurmctld; do
    [ -s "$DIR/$d.pid" ] && ! alive $d && die "$d exited; last lines of $DIR/log/$d.log:
$(tail -n 5 "$DIR/log/$d.log")"
  done
  [ $SECONDS -lt "$deadline" ] || die "nodes not idle after 40 s (${busy:-no answer from slurmctld}); logs in $DIR/log, clean up with down-multi.sh"
  sleep 0.5
done
