#!/usr/bin/env bash
# A throwaway one-node SLURM cluster on this machine, for CI and for trying the slurm profile by hand.
#   workflow/scripts/local-slurm.sh up       start munged + slurmctld + slurmd (idempotent; prints the env to use)
#   workflow/scripts/local-slurm.sh status   is it up? (sinfo, squeue; exit 1 when down)
#   workflow/scripts/local-slurm.sh env      the line to eval in a shell that talks to it: export SLURM_CONF=...
#   workflow/scripts/local-slurm.sh down     cancel its jobs, stop its daemons, remove its state (idempotent)
# Needs root and Debian's `slurm-wlm` + `munge` packages (SLURM 22.05). Everything lives in one state folder
# ($PREDICT_SLURM_DIR, default /tmp/predict-slurm): config, munge key and socket, spool, logs, pid files.
# The one thing outside it: /etc/slurm/{slurm,gres}.conf become links to its config while it is up, because the
# slurm executor's job step strips SLURM_CONF from the environment of the `srun` it starts inside each job (a
# real cluster keeps its config there too). `up` refuses to replace a config it did not write; `down` removes
# only its own links. /etc/munge is never touched (munged runs on its own key and socket in the state folder).
# The node: `localhost`, 2 CPUs, memory from /proc/meminfo, one fake GPU (gres gpu:1, File=/dev/null), in partition
# `debug`. No slurmdbd, so no sacct: completed jobs stay in `scontrol show job` for MinJobAge (1 h) and every end
# of job is appended to $PREDICT_SLURM_DIR/jobcomp.log.
set -euo pipefail

STATE="${PREDICT_SLURM_DIR:-/tmp/predict-slurm}"
PORT="${PREDICT_SLURM_PORT:-6817}"   # slurmctld; slurmd takes PORT+1
NODE=localhost
CONF="$STATE/slurm.conf"
ETC=/etc/slurm
export SLURM_CONF="$CONF"

say() { echo "local-slurm: $*" >&2; }

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

is_up() {
  [ -f "$CONF" ] && pid_alive "$STATE/munged.pid" && pid_alive "$STATE/slurmctld.pid" && pid_alive "$STATE/slurmd.pid" &&
    scontrol ping 2>/dev/null | grep -q UP
}

write_conf() {
  local mem
  # Leave 10% of the machine's memory (and at least 1 GiB) to everything that is not a job.
  mem=$(awk '/^MemTotal:/ {m=int($2/1024); r=int(m/10); if (r<1024) r=1024; print m-r}' /proc/meminfo)
  mkdir -p "$STATE"
  cat > "$CONF" <<CONF_EOF
# Written by workflow/scripts/local-slurm.sh: a throwaway one-node cluster.
ClusterName=predict-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket.2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.log
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=10
InactiveLimit=0
SlurmdTimeout=300
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=2 RealMemory=$mem Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF_EOF
  # One fake GPU: enough for SLURM to schedule and record gres requests; nothing uses it.
  echo "NodeName=$NODE Name=gpu Count=1 File=/dev/null" > "$STATE/gres.conf"
}

wait_for() {  # wait_for <seconds> <what> <command...>
  local n=$1 what=$2
  shift 2
  for _ in $(seq $((n * 4))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  say "$what did not come up; logs in $STATE/log"
  tail -n 20 "$STATE"/log/*.log >&2 2>/dev/null || true
  return 1
}

up() {
  if is_up; then
    say "already up ($CONF)"
    return 0
  fi
  down quiet  # a half-started cluster from an earlier run: start clean
  for cmd in munged mungekey slurmctld slurmd scontrol sbatch squeue; do
    command -v "$cmd" >/dev/null || { say "$cmd not found: apt-get install -y slurm-wlm munge"; exit 1; }
  done
  [ "$(id -u)" = 0 ] || { say "needs root (slurmd runs jobs as their users)"; exit 1; }
  mkdir -p "$STATE"/{munge,ctld,spool,log}
  write_conf
  link_etc || { rm -rf "$STATE"; exit 1; }
  trap 'say "start failed; cleaning up"; down quiet' ERR
  chmod 700 "$STATE/munge"
  mungekey --create --keyfile "$STATE/munge/munge.key" 2>/dev/null ||
    { dd if=/dev/urandom bs=1 count=1024 of="$STATE/munge/munge.key" 2>/dev/null; }
  chmod 600 "$STATE/munge/munge.key"
  munged --force --socket "$STATE/munge/munge.socket.2" --key-file "$STATE/munge/munge.key" \
    --pid-file "$STATE/munged.pid" --log-file "$STATE/log/munged.log" --seed-file "$STATE/munge/munged.seed"
  wait_for 10 munged test -S "$STATE/munge/munge.socket.2"
  slurmctld -f "$CONF"
  wait_for 30 slurmctld scontrol ping
  slurmd -f "$CONF" -N "$NODE"
  wait_for 30 "node $NODE" bash -c "sinfo -h -n $NODE -o %t | grep -Eq '^(idle|mix|alloc)'"
  trap - ERR
  say "up: SLURM $(scontrol --version | awk '{print $2}'), node $NODE, partition debug ($CONF)"
  echo "export SLURM_CONF=$CONF"
}

ours() { [ -L "$1" ] && [ "$(readlink "$1")" = "$2" ]; }

link_etc() {  # /etc/slurm/{slurm,gres}.conf -> the state folder's, unless a real config sits there
  mkdir -p "$ETC"
  for f in slurm.conf gres.conf; do
    if [ -e "$ETC/$f" ] || [ -L "$ETC/$f" ]; then
      if ! ours "$ETC/$f" "$STATE/$f"; then
        say "$ETC/$f exists and is not ours: this machine has a SLURM config; not replacing it"
        exit 1
      fi
    fi
    ln -sfn "$STATE/$f" "$ETC/$f"
  done
}

unlink_etc() {
  for f in slurm.conf gres.conf; do
    if ours "$ETC/$f" "$STATE/$f"; then rm -f "$ETC/$f"; fi
  done
}

stop_pid() {  # stop_pid <pidfile> <name>: TERM, wait, KILL; only the process whose id the file holds
  local f=$1 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

down() {
  [ -d "$STATE" ] || { unlink_etc; [ "${1:-}" = quiet ] || say "not running"; return 0; }
  if pid_alive "$STATE/slurmctld.pid" && pid_alive "$STATE/slurmd.pid"; then
    # Cancel every job first so slurmstepd takes the jobs' processes down with it, then wait for them to go.
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$jobs" ] || scancel $jobs 2>/dev/null || true
    for _ in $(seq 80); do
      [ -z "$(squeue -h -t R,CG,S 2>/dev/null)" ] && break
      sleep 0.25
    done
  fi
  stop_pid "$STATE/slurmd.pid"
  stop_pid "$STATE/slurmctld.pid"
  stop_pid "$STATE/munged.pid"
  unlink_etc
  rm -rf "$STATE"
  [ "${1:-}" = quiet ] || say "down (state removed)"
}

status() {
  if is_up; then
    sinfo -N -o "%N %P %t %c %m %G"
    squeue -o "%i %j %T %M %b"
  else
    say "down"
    return 1
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
