#!/usr/bin/env bash
# A single-node SLURM with accounting, for the suite's `slurm` tests: tests/slurm/cluster.sh start|stop.
# Root on Debian, no systemd: installs slurm-wlm, munge and MariaDB if missing, writes /etc/slurm/*.conf,
# starts munged, mariadbd, slurmdbd, slurmctld and a slurmd per node, and waits (bounded) for idle nodes and sacct.
# start is idempotent (a SLURM that answers is left as it is); stop ends exactly the daemons start started.
# Two nodes on this one machine, each offered all of it: <host> alone in partition cpu (no GPU, as a CPU-only
# cluster) and <host>-gpu alone in partition gpu, with one fake GPU (gres File=/dev/null) so GPU requests
# schedule on a CPU machine. Both partitions have a time limit (MaxTime), as clusters have.
set -euo pipefail
STATE=/run/memdefrag-slurm              # pid files and logs of what this script started
STARTED=$STATE/started                  # "name pid" per daemon this script started, in start order
MARK="# written by memdefrag tests/slurm/cluster.sh"
WAIT_S=${MEMDEFRAG_SLURM_WAIT_S:-60}    # the longest wait for any one daemon

say() { echo "cluster.sh: $*" >&2; }
fail() { say "$*"; exit 1; }

# until <what> <command...>: retry the command for up to WAIT_S seconds
until_up() {
    local what=$1 deadline=$((SECONDS + WAIT_S)); shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "$what did not answer within ${WAIT_S}s (logs: $STATE)"
        sleep 0.5
    done
}

MAX_TIME=2-00:00:00                     # each partition's time limit (2 days)

# every node idle (sinfo lists each node once per partition)
node_idle() { local states; states=$(timeout 10 sinfo -h -N -o %T 2>/dev/null) && [[ -n $states ]] &&
    ! grep -qv '^idle' <<< "$states"; }

# launch <name> <pidfile> <command...>: run a daemon unless one runs whose command line is <command...>
# (slurmd: one per node) or, for the others, whose name is <name>; record it if started here
launch() {
    local name=$1 pidfile=$2; shift 2
    if if [[ $name == slurmd ]]; then pgrep -xf "$*" >/dev/null; else pgrep -x "$name" >/dev/null; fi; then
        say "$* already running: left to whoever started it"; return
    fi
    "$@"
    local deadline=$((SECONDS + WAIT_S))
    until [[ -s $pidfile ]]; do
        ((SECONDS < deadline)) || fail "$name wrote no pid file within ${WAIT_S}s (logs: $STATE)"
        sleep 0.2
    done
    echo "$name $(cat "$pidfile")" >> "$STARTED"
}

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && return
    local t0=$SECONDS
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        slurmctld slurmd slurm-client slurmdbd munge mariadb-server >/dev/null
    say "packages installed in $((SECONDS - t0)) s"
}

write_configs() {
    local host node
    host=$(hostname -s)
    node=$(slurmd -C | head -1)          # NodeName=<host> CPUs=... RealMemory=...
    for f in /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf /etc/slurm/gres.conf; do
        [[ ! -e $f ]] || head -1 "$f" | grep -qx "$MARK" || fail "$f exists and was not written by this script"
    done
    cat > /etc/slurm/slurm.conf <<CONF
$MARK
ClusterName=memdefrag
SlurmctldHost=$host
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd-%n
SlurmctldPidFile=$STATE/slurm/slurmctld.pid
SlurmdPidFile=$STATE/slurm/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurm/slurmctld.log
SlurmdLogFile=$STATE/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
EnforcePartLimits=ALL
ReturnToService=2
KillWait=5
MinJobAge=600
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
$node State=UNKNOWN
${node/NodeName=$host /NodeName=$host-gpu NodeHostname=$host-gpu NodeAddr=127.0.0.1 Port=6820 } Gres=gpu:1 State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=$MAX_TIME State=UP
PartitionName=gpu Nodes=$host-gpu MaxTime=$MAX_TIME State=UP
CONF
    printf '%s\nName=gpu File=/dev/null\n' "$MARK" > /etc/slurm/gres.conf
    cat > /etc/slurm/slurmdbd.conf <<CONF
$MARK
DbdHost=localhost
SlurmUser=slurm
AuthType=auth/munge
PidFile=$STATE/slurm/slurmdbd.pid
LogFile=$STATE/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=memdefrag
StorageLoc=slurm_acct_db
CONF
    chown slurm:slurm /etc/slurm/slurmdbd.conf
    chmod 600 /etc/slurm/slurmdbd.conf
}

start() {
    if pgrep -x slurmctld >/dev/null && node_idle; then say "SLURM already answers: left as it is"; return; fi
    local t0=$SECONDS
    install_packages
    install -d -o munge -g munge /run/munge
    install -d -o mysql -g mysql /run/mysqld "$STATE/mariadb"
    install -d -o slurm -g slurm "$STATE/slurm"
    touch "$STARTED"
    write_configs
    local t1=$SECONDS
    launch munged /run/munge/munged.pid runuser -u munge -- /usr/sbin/munged
    launch mariadbd "$STATE/mariadb/mariadbd.pid" start-stop-daemon --start --background --exec /usr/sbin/mariadbd \
        -- --user=mysql --skip-networking --socket=/run/mysqld/mysqld.sock \
        --pid-file="$STATE/mariadb/mariadbd.pid" --log-error="$STATE/mariadb/mariadbd.log"
    until_up "MariaDB" mariadb -e "SELECT 1"
    # OR REPLACE: a user left with an old password would hang slurmdbd
    mariadb -e "CREATE OR REPLACE USER 'slurm'@'localhost' IDENTIFIED BY 'memdefrag';
                CREATE DATABASE IF NOT EXISTS slurm_acct_db;
                GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
    launch slurmdbd "$STATE/slurm/slurmdbd.pid" /usr/sbin/slurmdbd
    until_up "slurmdbd" sacctmgr -n list cluster
    launch slurmctld "$STATE/slurm/slurmctld.pid" /usr/sbin/slurmctld
    local name
    for name in "$(hostname -s)" "$(hostname -s)-gpu"; do
        launch slurmd "$STATE/slurm/slurmd-$name.pid" /usr/sbin/slurmd -N "$name"
    done
    until_up "the nodes (sinfo: idle)" node_idle
    until_up "sacct" sacct -n -X
    say "SLURM up in $((SECONDS - t1)) s ($((SECONDS - t0)) s with packages and configs); logs in $STATE"
}

stop() {
    [[ -f $STARTED ]] || { say "nothing started by this script"; return; }
    local name pid deadline
    tac "$STARTED" | while read -r name pid; do
        kill "$pid" 2>/dev/null || continue
        deadline=$((SECONDS + WAIT_S))
        while kill -0 "$pid" 2>/dev/null; do
            ((SECONDS < deadline)) || { say "$name ($pid) still running after ${WAIT_S}s"; break; }
            sleep 0.2
        done
        say "stopped $name ($pid)"
    done
    rm -f "$STARTED"
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    *) fail "usage: $0 start|stop" ;;
esac
