#!/usr/bin/env bash
# Start a single-node Slurm (munged + slurmctld + slurmd) listening on 127.0.0.1 only.
#
# For tests (pytest -m slurm) and for trying `dhmc sample --cluster slurm` on one machine.
# Idempotent: daemons already started by an earlier run are reused. Stop with down.sh.
#
# Needs root, or passwordless sudo (the daemons run as root; jobs run as the submitting user).
# Installs Debian/Ubuntu packages slurmctld slurmd slurm-client munge when missing.
#
# The config is written to /etc/slurm/slurm.conf, the path Debian's Slurm clients read by
# default, so sbatch/squeue/scancel started by any later process (pytest, dask-jobqueue) find it
# without SLURM_CONF. A pre-existing slurm.conf not written by this script is saved once as
# slurm.conf.dhmc-backup and put back by down.sh. Everything else lives in the state dir:
#   DHMC_SLURM_DIR   state dir (default /tmp/dhmc-local-slurm): config copy, logs, spool, pids
#   DHMC_SLURM_CPUS  CPUs the node advertises (default: nproc, at least 2, so two 1-core jobs
#                    always fit; more than the hardware has means oversubscription)
set -euo pipefail

DIR=${DHMC_SLURM_DIR:-/tmp/dhmc-local-slurm}
export PATH="$PATH:/usr/sbin:/sbin"   # daemons live in sbin, often not on a user's PATH
CONF=/etc/slurm/slurm.conf
MARK="# written by dhmc deploy/local-slurm/up.sh"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"

die() { echo "local-slurm up.sh: $*" >&2; exit 1; }
alive() { [ -s "$DIR/$1.pid" ] && $SUDO kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }
died() { [ -s "$DIR/$1.pid" ] && ! alive "$1"; }   # no pid file yet: still starting
node_state() { timeout 5 sinfo -h -N -n "$HOST" -o %T 2>/dev/null | head -n1 || true; }
start() {  # start daemon $1 (command: the rest) unless the one started before still runs
  local d=$1; shift
  alive "$d" && return 0
  $SUDO rm -f "$DIR/$d.pid"
  $SUDO "$@" || die "$d failed to start; see $DIR/log/$d.log"
}

# 1. packages
missing=""
for c in slurmctld slurmd sbatch munged; do command -v $c >/dev/null || missing=1; done
if [ -n "$missing" ]; then
  echo "installing slurmctld slurmd slurm-client munge ..."
  apt() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -y -qq "$@" >/dev/null; }
  # keep the packages' init scripts from starting daemons of their own
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d; policy=1
  fi
  ok=1
  apt install --no-install-recommends slurmctld slurmd slurm-client munge \
    || { apt update && apt install --no-install-recommends slurmctld slurmd slurm-client munge; } || ok=""
  [ -z "$policy" ] || $SUDO rm -f /usr/sbin/policy-rc.d
  [ -n "$ok" ] || die "apt-get install slurmctld slurmd slurm-client munge failed"
fi

HOST=$(hostname -s)
CPUS=${DHMC_SLURM_CPUS:-$(( $(nproc) > 2 ? $(nproc) : 2 ))}
MEM=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
MEM=$(( ${MEM:-2048} * 9 / 10 ))

# 2. state dir, munge key, config
$SUDO mkdir -p "$DIR"/{munge,ctld,spool,log}
$SUDO chmod 755 "$DIR" "$DIR/munge"   # clients must reach the munge socket
[ -s "$DIR/munge/munge.key" ] || {
  $SUDO dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  $SUDO chmod 400 "$DIR/munge/munge.key"
}
$SUDO tee "$DIR/slurm.conf" >/dev/null <<EOF
$MARK
ClusterName=dhmc-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
SlurmdParameters=config_overrides
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
$SUDO mkdir -p /etc/slurm
if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF" && [ ! -e "$CONF.dhmc-backup" ]; then
  $SUDO mv "$CONF" "$CONF.dhmc-backup"
fi
$SUDO cp "$DIR/slurm.conf" "$CONF"

# 3. daemons (munged runs as root with its socket in the state dir; clients find it via AuthInfo)
start munged munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
  --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed"
start slurmctld slurmctld -c -f "$CONF"   # -c: fresh state, no stale node or job records
start slurmd slurmd -f "$CONF"

# 4. wait (bounded) for the node to be idle
deadline=$((SECONDS + 30))
while :; do
  state=$(node_state)
  case "$state" in idle*|mixed*|allocated*)
    echo "local slurm up: node $HOST $state, $CPUS CPUs, partition debug, state in $DIR"; exit 0 ;;
  esac
  for d in munged slurmctld slurmd; do
    died $d && die "$d exited; last lines of $DIR/log/$d.log:
$($SUDO tail -n 5 "$DIR/log/$d.log")"
  done
  [ $SECONDS -lt $deadline ] || die "node $HOST not idle after 30 s (state '${state:-no answer}'); logs in $DIR/log, clean up with down.sh"
  sleep 0.5
done
