#!/usr/bin/env bash
# Bring up a private single-node SLURM cluster (slurmctld, slurmd, slurmdbd with its own
# MariaDB for accounting, its own munged) on loopback, with two GPU-shaped gres entries
# backed by character devices. Debian 12, root, no systemd.
#
# It touches only its own: config, state, spool, logs, MariaDB data and munge key live in
# one directory ($TILEDATTN_SLURM_DIR, default /var/tmp/tiledattn-ci-slurm), the daemons
# listen on their own ports (base $TILEDATTN_SLURM_PORT, default 16817), every daemon it
# starts is recorded by PID (run/pids) and stopped by that PID by tests/cluster/stop-slurm.sh.
# Nothing under /etc/slurm, /etc/munge or the system's MariaDB is read or written, and no
# process is signalled by name. Where another cluster runs (a SLURM daemon it did not
# start) or its ports are taken, it refuses with one line and exit code 3; so it does where
# its own cluster of the same directory still runs and answers (another CI run's, or one a
# user started: its jobs and accounting are not wiped unasked) unless --restart says to
# replace it. What a killed or interrupted earlier run left (daemons gone or not
# answering) is stopped by PID and started afresh.
#
# Clients find the cluster through SLURM_CONF: `. $TILEDATTN_SLURM_DIR/env.sh` (the last
# line it prints says so).
#   tests/cluster/start-slurm.sh            start (installs the packages if missing)
#   tests/cluster/start-slurm.sh --restart  replace a running cluster of this directory
#                                           (its jobs cancelled, its accounting emptied);
#                                           also TILEDATTN_SLURM_RESTART=1
#   tests/cluster/start-slurm.sh stop       stop it (same as stop-slurm.sh)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RESTART=${TILEDATTN_SLURM_RESTART:-0}
case "${1:-}" in
  stop) exec bash "$HERE/stop-slurm.sh";;
  --restart) RESTART=1;;
  "") ;;
  *) echo "start-slurm.sh: unknown argument '$1' (use: start-slurm.sh [--restart | stop])" >&2
     exit 2;;
esac
DIR=${TILEDATTN_SLURM_DIR:-/var/tmp/tiledattn-ci-slurm}
PORT=${TILEDATTN_SLURM_PORT:-16817}
CTLD_PORT=$PORT; SLURMD_PORT=$((PORT + 1)); DBD_PORT=$((PORT + 2)); DB_PORT=$((PORT + 3))
HOST=$(hostname)
refuse() { echo "start-slurm.sh: refused: $*" >&2; exit 3; }

[ "$(id -u)" = 0 ] || refuse "needs root (it starts slurmd, which runs jobs as their users)"
# The directory is emptied on each start: only one this script made (its marker inside).
MARK=.tiledattn-ci-slurm
if [ -e "$DIR" ] && [ ! -e "$DIR/$MARK" ]; then
  refuse "$DIR exists and is not a cluster directory of this script (no $MARK in it); set TILEDATTN_SLURM_DIR to a new path"
fi
# A previous run of this script in $DIR. Its cluster still running and answering is refused
# (unless --restart): stopping it would cancel someone's jobs and wipe their accounting.
# One it left stale (killed, an interrupted start) is stopped by PID, then started afresh.
live_daemons() {  # the daemons of run/pids still running the program they were started as
  local name pid
  while read -r name pid; do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] && printf ' %s(pid %s)' "$name" "$pid"
  done < "$DIR/run/pids"
  return 0
}
if [ -f "$DIR/run/pids" ]; then
  live=$(live_daemons)
  if [ "$RESTART" != 1 ] && [[ "$live" == *slurmctld* ]] \
      && SLURM_CONF=$DIR/etc/slurm.conf timeout 30 squeue -h -o %i >/dev/null 2>&1; then
    refuse "a cluster of this script runs in $DIR and answers (daemons:$live); not touching" \
      "it: stop it with TILEDATTN_SLURM_DIR=$DIR tests/cluster/stop-slurm.sh, or replace it" \
      "(its jobs cancelled, its accounting emptied) with start-slurm.sh --restart"
  fi
  bash "$HERE/stop-slurm.sh"
fi

if ! command -v slurmctld >/dev/null || ! command -v mariadbd >/dev/null \
    || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge slurmdbd \
    mariadb-server >/dev/null
fi

# Another cluster on this machine: any SLURM daemon running now is not ours (ours are stopped).
others=""
for p in /proc/[0-9]*; do
  comm=$(cat "$p/comm" 2>/dev/null) || continue
  case "$comm" in slurmctld|slurmd|slurmdbd|slurmstepd) others="$others $comm(pid ${p#/proc/})";; esac
done
[ -z "$others" ] || refuse "another SLURM cluster runs on this machine:$others; not touching it"
for port in $CTLD_PORT $SLURMD_PORT $DBD_PORT $DB_PORT; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    refuse "port $port on 127.0.0.1 is taken (set TILEDATTN_SLURM_PORT to a free base port)"
  fi
done

rm -rf "$DIR"
mkdir -p "$DIR"/{etc,run,log,spool/ctld,spool/d,db,munge,dev}
touch "$DIR/$MARK"
chmod 755 "$DIR"
PIDS=$DIR/run/pids
: > "$PIDS"
# Start one daemon in the foreground of a background job and record its PID.
spawn() {
  local name=$1; shift
  setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
  echo "$name $!" >> "$PIDS"
}
fail() { echo "start-slurm.sh: $*" >&2; bash "$HERE/stop-slurm.sh" >&2 || true; exit 1; }

# munge: its own key and socket (slurm.conf's AuthInfo=socket= points at it).
chown munge:munge "$DIR/munge"; chmod 755 "$DIR/munge"  # munged: socket dir executable by all
dd if=/dev/urandom bs=1 count=1024 of="$DIR/munge/munge.key" 2>/dev/null
chown munge:munge "$DIR/munge/munge.key"; chmod 400 "$DIR/munge/munge.key"
MUNGE_SOCKET=$DIR/munge/munge.socket
spawn munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F \
  --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
  --log-file="$DIR/munge/munged.log" --pid-file="$DIR/munge/munged.pid" \
  --seed-file="$DIR/munge/munged.seed"

# MariaDB: its own data directory, socket and port; its only users are its own.
mariadb-install-db --no-defaults --user=root --datadir="$DIR/db" --auth-root-authentication-method=socket \
  >"$DIR/log/mariadb-install.out" 2>&1 || fail "mariadb-install-db failed: $(tail -1 "$DIR/log/mariadb-install.out")"
DB_SOCKET=$DIR/run/mariadb.sock
spawn mariadbd /usr/sbin/mariadbd --no-defaults --user=root --datadir="$DIR/db" \
  --socket="$DB_SOCKET" --port="$DB_PORT" --bind-address=127.0.0.1 \
  --pid-file="$DIR/run/mariadb.pid" --log-error="$DIR/log/mariadb.log"
for _ in $(seq 60); do [ -S "$DB_SOCKET" ] && break; sleep 0.5; done
[ -S "$DB_SOCKET" ] || fail "MariaDB did not start: $(tail -1 "$DIR/log/mariadb.log")"
mariadb --no-defaults --socket="$DB_SOCKET" -u root <<SQL
CREATE DATABASE slurm_acct_db;
CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmdbpass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL

# GPU-shaped gres must point at real character devices (plain files drain the node).
for i in 0 1; do mknod "$DIR/dev/gpu$i" c 1 3; done
read -r CPUS MEM < <(slurmd -C | awk '{for(i=1;i<=NF;i++){split($i,a,"="); if(a[1]=="CPUs")c=a[2]; if(a[1]=="RealMemory")m=a[2]}} END{print c, int(m*0.9)}')
cat > "$DIR/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmdbpass
StorageLoc=slurm_acct_db
CONF
chmod 600 "$DIR/etc/slurmdbd.conf"
cat > "$DIR/etc/slurm.conf" <<CONF
ClusterName=ci
SlurmctldHost=${HOST}(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
# A requeued job waits cred_expire seconds before it may start again (default 120 s):
# shorter here so the time-limit requeue test takes one minute less.
AuthInfo=cred_expire=60,socket=$MUNGE_SOCKET
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
MinJobAge=300
ReturnToService=2
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# Clients (sacctmgr, slurmctld) reach slurmdbd through this munge socket, not AuthInfo's.
AccountingStoragePass=$MUNGE_SOCKET
JobAcctGatherType=jobacct_gather/none
# Account the GPUs a job was given, so a test can check that GPU steps asked for one.
AccountingStorageTRES=gres/gpu
GresTypes=gpu
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM} Gres=gpu:2 State=UNKNOWN
PartitionName=gpu Nodes=${HOST} Default=YES MaxTime=60 State=UP
CONF
cat > "$DIR/etc/gres.conf" <<CONF
NodeName=${HOST} Name=gpu File=$DIR/dev/gpu[0-1]
CONF
export SLURM_CONF=$DIR/etc/slurm.conf
cat > "$DIR/env.sh" <<ENV
# The private CI cluster of tests/cluster/start-slurm.sh: source this to use it.
export SLURM_CONF=$SLURM_CONF
ENV

spawn slurmdbd /usr/sbin/slurmdbd -D
for _ in $(seq 30); do timeout 5 sacctmgr -i -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
sacctmgr -i -n list cluster >/dev/null 2>&1 || fail "slurmdbd did not answer: $(tail -1 "$DIR/log/slurmdbd.log")"
sacctmgr -i add cluster ci >/dev/null
sacctmgr -i add account ci-account Cluster=ci >/dev/null
sacctmgr -i add user "$(id -un)" Account=ci-account >/dev/null
spawn slurmctld /usr/sbin/slurmctld -D
spawn slurmd /usr/sbin/slurmd -D
state=""
for _ in $(seq 60); do
  state=$(sinfo -h -o %T 2>/dev/null | head -1)
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || fail "node not idle: $(sinfo -h -o '%T %E' 2>&1 | head -1)"
sinfo
echo "start-slurm.sh: cluster up (daemons: $(tr '\n' ' ' < "$PIDS")); use it with: . $DIR/env.sh"
