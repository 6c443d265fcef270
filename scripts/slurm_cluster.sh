#!/usr/bin/env bash
# A real two-node SLURM cluster on this one machine, for the tests and CI (Debian's slurm-wlm 22.05, munge).
#
#   sudo bash scripts/slurm_cluster.sh up        # install (apt-get) if needed, start munged, slurmctld, 2 x slurmd
#   sudo bash scripts/slurm_cluster.sh status    # daemons, sinfo, squeue
#   sudo bash scripts/slurm_cluster.sh down      # cancel jobs, stop every daemon it started, nothing left behind
#
# Nodes node1 and node2 (1 CPU each, both 127.0.0.1, slurmd ports 17001/17002) in partition `debug`.
# Config, state, spool and logs live in SLURM_CLUSTER_DIR (default /tmp/project-slurm); /etc/slurm/slurm.conf is a
# symlink to its slurm.conf so that sbatch/squeue/scontrol/sacct need no SLURM_CONF. node1/node2 are added to
# /etc/hosts (Lightning's SLURMEnvironment makes the first node of the job, "node1", the main address).
# Accounting: no slurmdbd; finished jobs are written to $SLURM_CLUSTER_DIR/log/jobcomp.log (jobcomp/filetxt), which
# `sacct --completion -j ID -o JobID,State,ExitCode` reads. `scontrol show job ID` shows ExitCode= for MinJobAge (60 s).
# Must run as root (the daemons run as root, SlurmUser=root; jobs run as the submitting user).
set -euo pipefail

DIR=${SLURM_CLUSTER_DIR:-/tmp/project-slurm}
CONF=$DIR/etc/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
MARK="# written by scripts/slurm_cluster.sh"
NODES=(node1 node2)
CTLD_PORT=${SLURM_CLUSTER_CTLD_PORT:-16817}
NODE_PORT0=${SLURM_CLUSTER_NODE_PORT:-17001}
WAIT_S=${SLURM_CLUSTER_WAIT_S:-60}

say() { echo "[slurm_cluster] $*"; }
die() { echo "[slurm_cluster] ERROR: $*" >&2; exit 1; }

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

require_root() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "[slurm_cluster] must run as root (it installs packages, starts munged/slurmctld/slurmd as root and" \
      "edits /etc/hosts and /etc/slurm); try: sudo bash $0 $1" >&2
    exit 2
  fi
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
     && command -v sbatch >/dev/null; then
    return
  fi
  command -v apt-get >/dev/null || die "slurmctld is missing and there is no apt-get to install slurm-wlm"
  say "installing slurm-wlm and munge with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >"$DIR/log/apt.log" 2>&1 \
    || { tail -20 "$DIR/log/apt.log" >&2; die "apt-get install slurm-wlm munge failed"; }
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  if munge_ok; then return; fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    say "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown munge:munge /etc/munge /etc/munge/munge.key
  chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 755 /run/munge
  runuser -u munge -- /usr/sbin/munged || { tail -5 /var/log/munge/munged.log >&2 || true; die "munged failed"; }
  touch "$DIR/run/munged.started"   # `down` stops munged only when `up` started it
  for _ in $(seq 50); do munge_ok && return; sleep 0.1; done
  die "munged started but munge -n | unmunge fails"
}

write_conf() {
  local host; host=$(hostname)
  local i=0 nodes=""
  for n in "${NODES[@]}"; do
    nodes+="NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$((NODE_PORT0 + i)) CPUs=1 RealMemory=1000 State=UNKNOWN"$'\n'
    i=$((i + 1))
  done
  cat >"$CONF.new" <<EOF
$MARK (SLURM_CLUSTER_DIR=$DIR): a two-node test cluster on one machine
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups in a container
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# CPUs=1 per node whatever the hardware says
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=60
KillWait=30
InactiveLimit=0
Waittime=0
JobRequeue=1
MaxArraySize=1001
MpiDefault=none
SwitchType=switch/none
LaunchParameters=use_interactive_step
# accounting without slurmdbd: finished jobs go to a text file that sacct --completion reads
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
${nodes}PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  mv "$CONF.new" "$CONF"
  # clients (sbatch, srun inside jobs, squeue, sacct) read /etc/slurm/slurm.conf
  mkdir -p /etc/slurm
  if [[ -e $ETC_CONF || -L $ETC_CONF ]]; then
    if [[ -L $ETC_CONF ]] || head -1 "$ETC_CONF" | grep -q "^$MARK"; then
      ln -sfn "$CONF" "$ETC_CONF"
    else
      die "$ETC_CONF exists and was not written by this script: not touching a real cluster's configuration"
    fi
  else
    ln -s "$CONF" "$ETC_CONF"
  fi
}

hosts_add() {
  # in place (cat >), not sed -i: /etc/hosts is often a bind mount in containers
  local want="127.0.0.1 ${NODES[*]} $MARK"
  grep -qF "$want" /etc/hosts && return
  [[ -z $(tail -c1 /etc/hosts) ]] || echo >>/etc/hosts
  printf '%s\n' "$want" >>/etc/hosts
}

hosts_remove() {
  grep -qF "$MARK" /etc/hosts 2>/dev/null || return 0
  local keep; keep=$(grep -vF "$MARK" /etc/hosts || true)
  printf '%s\n' "$keep" >/etc/hosts
}

nodes_idle() {
  local out; out=$(sinfo -h -N -p debug -o "%N %t" 2>/dev/null) || return 1
  for n in "${NODES[@]}"; do grep -qx "$n idle" <<<"$out" || return 1; done
}

daemons_alive() {
  alive "$DIR/run/slurmctld.pid" || return 1
  for n in "${NODES[@]}"; do alive "$DIR/run/slurmd-$n.pid" || return 1; done
}

fail_with_logs() {
  echo "[slurm_cluster] ERROR: $1" >&2
  for f in "$DIR"/log/slurmctld.log "$DIR"/log/slurmd-*.log; do
    [[ -f $f ]] && { echo "--- tail $f" >&2; tail -15 "$f" >&2; }
  done
  sinfo -N -l >&2 2>&1 || true
  exit 1
}

cmd_up() {
  require_root up
  local t0=$SECONDS
  mkdir -p "$DIR"/{etc,state,run,log} "${NODES[@]/#/$DIR/spool/}"
  if daemons_alive && nodes_idle_or_busy; then
    say "already up (SLURM_CLUSTER_DIR=$DIR): reusing it"
    sinfo -N -p debug
    return 0
  fi
  install_packages
  start_munge
  hosts_add
  if ! alive "$DIR/run/slurmctld.pid"; then
    write_conf
    # -c: a fresh cluster, no jobs from an earlier `up`
    slurmctld -c -f "$CONF" || fail_with_logs "slurmctld would not start"
  fi
  for n in "${NODES[@]}"; do
    alive "$DIR/run/slurmd-$n.pid" || slurmd -N "$n" -f "$CONF" || fail_with_logs "slurmd -N $n would not start"
  done
  local deadline=$((SECONDS + WAIT_S))
  until nodes_idle; do
    ((SECONDS < deadline)) || fail_with_logs "nodes not idle after ${WAIT_S}s"
    # a node left down/drained by an earlier run comes back
    if sinfo -h -N -o "%N %t" 2>/dev/null | grep -Eq " (down|drain|drained)\*?$"; then
      scontrol update NodeName="$(IFS=,; echo "${NODES[*]}")" State=RESUME >/dev/null 2>&1 || true
    fi
    sleep 0.5
  done
  sinfo -N -p debug
  say "up in $((SECONDS - t0)) s (SLURM_CLUSTER_DIR=$DIR, config $CONF -> $ETC_CONF)"
}

nodes_idle_or_busy() {
  local out; out=$(sinfo -h -N -p debug -o "%N %t" 2>/dev/null) || return 1
  for n in "${NODES[@]}"; do grep -Eqx "$n (idle|alloc|mix|comp)" <<<"$out" || return 1; done
}

# processes of this cluster that outlived their daemons: slurmstepd keeps its sockets in our spool folder
leftover_pids() {
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p == "$$" ]] && continue
    if [[ $(readlink "/proc/$p/exe" 2>/dev/null) == */slurmstepd ]] \
       || { [[ -f $DIR/run/slurmctld.pid ]] && grep -qx "$p" "$DIR"/run/*.pid 2>/dev/null; }; then
      # only slurm processes that belong to this cluster (their files are under $DIR)
      if ls -l "/proc/$p/fd" "/proc/$p/cwd" 2>/dev/null | grep -qF "$DIR/"; then echo "$p"; fi
    fi
  done
}

cmd_down() {
  require_root down
  local t0=$SECONDS
  if [[ -d $DIR/run ]] && alive "$DIR/run/slurmctld.pid"; then
    # end the jobs first so that their tasks go too (KillWait applies to tasks that ignore SIGTERM)
    local jobs; jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      say "cancelling jobs: $(echo $jobs)"
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for _ in $(seq 80); do [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break; sleep 0.5; done
    fi
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  local pidf
  for pidf in "$DIR"/run/slurmd-*.pid "$DIR"/run/slurmctld.pid; do
    [[ -f $pidf ]] || continue
    if alive "$pidf"; then
      local pid; pid=$(cat "$pidf")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidf"
  done
  local left; left=$(leftover_pids)
  if [[ -n $left ]]; then
    say "killing leftover slurmstepd: $(echo $left)"
    # shellcheck disable=SC2086
    kill -9 $left 2>/dev/null || true
  fi
  if [[ -f $DIR/run/munged.started ]]; then
    munged -s >/dev/null 2>&1 || runuser -u munge -- munged -s >/dev/null 2>&1 || true
    rm -f "$DIR/run/munged.started"
  fi
  hosts_remove
  if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then rm -f "$ETC_CONF"; fi
  say "down in $((SECONDS - t0)) s"
}

cmd_status() {
  local rc=0
  if [[ -f $DIR/run/slurmctld.pid ]] && alive "$DIR/run/slurmctld.pid"; then
    say "slurmctld pid $(cat "$DIR/run/slurmctld.pid")"
  else
    say "slurmctld not running"; rc=3
  fi
  for n in "${NODES[@]}"; do
    if alive "$DIR/run/slurmd-$n.pid"; then say "slurmd $n pid $(cat "$DIR/run/slurmd-$n.pid")"
    else say "slurmd $n not running"; rc=3; fi
  done
  if munge_ok; then say "munge ok"; else say "munge not working"; rc=3; fi
  if ((rc == 0)); then sinfo -N -p debug; squeue; fi
  return $rc
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|status   (SLURM_CLUSTER_DIR=${DIR})" >&2; exit 64 ;;
esac
