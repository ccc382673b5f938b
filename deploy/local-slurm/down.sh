#!/usr/bin/env bash
# Stop the single-node Slurm started by up.sh: cancel leftover jobs, then stop exactly the
# daemons whose PIDs up.sh recorded in the state dir. Idempotent. Leaves the packages installed.
set -uo pipefail

DIR=${DHMC_SLURM_DIR:-/tmp/dhmc-local-slurm}
CONF=/etc/slurm/slurm.conf
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"

pid_of() { [ -s "$DIR/$1.pid" ] && cat "$DIR/$1.pid"; }
running() { $SUDO kill -0 "$1" 2>/dev/null; }

if [ -n "$(pid_of slurmctld)" ] && running "$(pid_of slurmctld)"; then
  $SUDO timeout 10 scancel --quiet --partition=debug 2>/dev/null || true
  # give slurmd a moment to kill the job steps before it is stopped itself
  end=$((SECONDS + 10))
  while [ $SECONDS -lt $end ] && [ -n "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]; do sleep 0.5; done
fi

for d in slurmd slurmctld munged; do
  pid=$(pid_of $d) || continue
  if running "$pid"; then
    $SUDO kill -TERM "$pid"
    for _ in $(seq 50); do running "$pid" || break; sleep 0.2; done
    running "$pid" && { echo "local-slurm down.sh: $d ($pid) ignored SIGTERM, killing" >&2; $SUDO kill -KILL "$pid"; }
  fi
  $SUDO rm -f "$DIR/$d.pid"
done

if [ -e "$CONF.dhmc-backup" ]; then
  $SUDO mv -f "$CONF.dhmc-backup" "$CONF"
fi
echo "local slurm down"
