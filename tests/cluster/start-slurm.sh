#!/usr/bin/env bash
# Bring up a real single-node SLURM cluster (slurmctld, slurmd, slurmdbd + MariaDB
# accounting, munge) on loopback, with two GPU-shaped gres entries backed by character
# devices. Debian 12, root, no systemd. Idempotent: stops a previous instance first.
#   tests/cluster/start-slurm.sh        start (installs the packages if missing)
#   tests/cluster/start-slurm.sh stop   stop the daemons
set -euo pipefail
HOST=$(hostname)
stop() {
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  pkill -x slurmdbd 2>/dev/null || true
  sleep 1
  rm -f /run/slurmd.pid /run/slurmctld.pid /run/slurmdbd.pid /var/run/slurm*.pid
}
if [ "${1:-}" = stop ]; then stop; exit 0; fi
if ! command -v slurmctld >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge slurmdbd \
    mariadb-server >/dev/null
fi
stop
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /dev/fakegpu
chown slurm:slurm /var/spool/slurmctld /var/log/slurm 2>/dev/null || true
# GPU-shaped gres must point at real character devices (plain files drain the node).
for i in 0 1; do [ -e /dev/fakegpu/$i ] || mknod /dev/fakegpu/$i c 1 3; done

[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
chown munge:munge /etc/munge/munge.key /run/munge; chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c "/usr/sbin/munged --force"

/etc/init.d/mariadb start >/dev/null
mysql -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmdbpass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL

read -r CPUS MEM < <(slurmd -C | awk '{for(i=1;i<=NF;i++){split($i,a,"="); if(a[1]=="CPUs")c=a[2]; if(a[1]=="RealMemory")m=a[2]}} END{print c, int(m*0.9)}')
cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=slurm
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmdbpass
StorageLoc=slurm_acct_db
CONF
chown slurm:slurm /etc/slurm/slurmdbd.conf; chmod 600 /etc/slurm/slurmdbd.conf
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ci
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
# A requeued job waits cred_expire seconds before it may start again (default 120 s):
# shorter here so the time-limit requeue test takes one minute less.
AuthInfo=cred_expire=60
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
MinJobAge=300
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
# Account the GPUs a job was given, so a test can check that GPU steps asked for one.
AccountingStorageTRES=gres/gpu
GresTypes=gpu
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM} Gres=gpu:2 State=UNKNOWN
PartitionName=gpu Nodes=${HOST} Default=YES MaxTime=60 State=UP
CONF
cat > /etc/slurm/gres.conf <<CONF
NodeName=${HOST} Name=gpu File=/dev/fakegpu/[0-1]
CONF
slurmdbd
for _ in $(seq 30); do sacctmgr -i -n list cluster >/dev/null 2>&1 && break; sleep 1; done
slurmctld
sacctmgr -i add cluster ci >/dev/null 2>&1 || true
sacctmgr -i add account ci-account Cluster=ci >/dev/null 2>&1 || true
sacctmgr -i add user "$(id -un)" Account=ci-account >/dev/null 2>&1 || true
slurmd
for _ in $(seq 30); do
  state=$(sinfo -h -o %T 2>/dev/null | head -1)
  [ "$state" = idle ] && break
  sleep 1
done
sinfo
[ "$(sinfo -h -o %T | head -1)" = idle ] || { echo "node not idle: $(sinfo -h -o '%T %E')" >&2; exit 1; }
