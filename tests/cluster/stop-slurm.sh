#!/usr/bin/env bash
# Stop the private cluster of tests/cluster/start-slurm.sh: its jobs are cancelled, then each
# daemon it recorded in run/pids is stopped by that PID (newest first; TERM, then KILL after
# 20 s), and only while that PID still runs the program it started. Nothing else is signalled.
# Logs stay in $TILEDATTN_SLURM_DIR/log.
set -uo pipefail
DIR=${TILEDATTN_SLURM_DIR:-/var/tmp/tiledattn-ci-slurm}
PIDS=$DIR/run/pids
[ -f "$PIDS" ] || { echo "stop-slurm.sh: no cluster of start-slurm.sh in $DIR"; exit 0; }
ours() {  # PID $2 is alive and still the $1 that start-slurm.sh started
  [ "$(cat "/proc/$2/comm" 2>/dev/null)" = "$1" ]
}
if export SLURM_CONF=$DIR/etc/slurm.conf && squeue -h -o %i >/dev/null 2>&1; then
  scancel --full $(squeue -h -o %i) 2>/dev/null || true
  for _ in $(seq 30); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 1; done
fi
tac "$PIDS" | while read -r name pid; do
  ours "$name" "$pid" || continue
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 40); do ours "$name" "$pid" || break; sleep 0.5; done
  if ours "$name" "$pid"; then kill -KILL "$pid" 2>/dev/null; fi
  echo "stop-slurm.sh: stopped $name (pid $pid)"
done
rm -f "$PIDS" "$DIR"/run/*.pid "$DIR"/munge/munged.pid
