#!/usr/bin/env bash
# Start the slurmd of one "host" (c1, c2, ...) of the multi-host Slurm from up-multi.sh, inside that
# host's network namespace and with its own hostname (UTS namespace). up-multi.sh calls it for every
# node; tests call it to bring a killed host back (tests/multihost/netns.py restart_host), so both
# start slurmd the same way. Idempotent: does nothing when a slurmd already runs in the namespace.
#
#   start-node.sh c2        (root, or passwordless sudo)
#   DHMC_MULTI_DIR          state dir of up-multi.sh (default /tmp/dhmc-multi-slurm)
set -euo pipefail

DIR=${DHMC_MULTI_DIR:-/tmp/dhmc-multi-slurm}
export PATH="$PATH:/usr/sbin:/sbin"
die() { echo "local-slurm start-node.sh: $*" >&2; exit 1; }

[ $# = 1 ] || die "usage: start-node.sh NODE   (c1, c2, ...)"
NODE=$1
case $NODE in c[1-9] | c[1-9][0-9]) ;; *) die "node name '$NODE' is not c1, c2, ...";; esac
if [ "$(id -u)" != 0 ]; then exec sudo -n env "DHMC_MULTI_DIR=$DIR" "$0" "$@"; fi

CONF=$DIR/slurm.conf
PIDFILE=$DIR/slurmd.$NODE.pid
LOG=$DIR/log/slurmd.$NODE.log
[ -s "$CONF" ] || die "no $CONF: run up-multi.sh first"
grep -q "^NodeName=$NODE " "$CONF" || die "$NODE is not a node of $CONF"
[ -e "/run/netns/$NODE" ] || die "no network namespace $NODE: run up-multi.sh first"

ns_slurmd() {  # PIDs of slurmd processes in the namespace (not slurmstepd, not jobs)
  local p
  for p in $(ip netns pids "$NODE" 2>/dev/null); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmd ] && echo "$p"
  done
  return 0
}
[ -z "$(ns_slurmd)" ] || exit 0

# a slurmd of this node outside the namespace (its namespace was deleted under it) is stale: stop it
if [ -s "$PIDFILE" ] && [ "$(cat "/proc/$(cat "$PIDFILE")/comm" 2>/dev/null)" = slurmd ]; then
  kill -KILL "$(cat "$PIDFILE")" 2>/dev/null || true
fi
rm -f "$PIDFILE"   # a stale one makes slurmd try to stop that old (dead, or reused) PID
mkdir -p "$DIR/spool/$NODE" "$DIR/log"
# Like `ip netns exec $NODE unshare --uts ...`, except that /sys stays the machine's: ip netns exec
# mounts a fresh sysfs, which hides /sys/fs/cgroup, and slurmd then dies with "Unable to initialize
# cgroup plugin". So: enter the network namespace, make a private mount namespace (slave, so mounts
# made later on the machine still show) in which /etc/hosts is the host's /etc/netns/$NODE/hosts (what
# ip netns exec would bind), and a UTS namespace with hostname $NODE. slurmd daemonizes; the
# namespaces stay with it and with every job step it forks, so jobs on this node bind this node's IP,
# resolve c1.. and head through that hosts file, and see hostname $NODE.
nsenter --net="/run/netns/$NODE" unshare --mount --propagation slave --uts sh -c \
  "mount --bind /etc/netns/$NODE/hosts /etc/hosts && hostname $NODE && exec slurmd -N $NODE -f $CONF" \
  || die "slurmd -N $NODE failed to start; see $LOG"

# bounded wait for the daemon to settle (it writes its PID file once it listens)
for _ in $(seq 50); do
  [ -s "$PIDFILE" ] && [ -n "$(ns_slurmd)" ] && exit 0
  sleep 0.1
done
die "slurmd -N $NODE did not come up within 5 s; last lines of $LOG:
$(tail -n 5 "$LOG" 2>/dev/null)"
