#!/usr/bin/env bash
# One TPU slice without Ray: every worker runs the same command, and JAX joins them into one
# job (jax.distributed, its settings read from the TPU VM's metadata). Untested here (no TPU
# in CI); the dry run is what the tests check. The slice is created and set up by
# launch/tpu_vms.sh (create, setup).
#
#   launch/tpu_slice.sh check --name=asyncrl --zone=us-central2-b     # the trainer group check
#   launch/tpu_slice.sh run --name=asyncrl --zone=us-central2-b --hosts=1 --workdir=runs/tpu
#   launch/tpu_slice.sh wait --name=asyncrl --zone=us-central2-b --workdir=runs/tpu  # follow the job
#   launch/tpu_slice.sh --dry-run check|run|wait ...                   # print, run nothing
#
# check: every host trains 3 synthetic steps as one trainer group (one FSDP mesh over the
#   slice's chips) and prints the losses; process 0's match a one-process run's.
# run: the post-training job. One host (v4-8, v5litepod-8, ...): the trainer and the rollout
#   instances on its chips. Several hosts (--hosts=N): one trainer group
#   (--config.distributed.coordinator_address=auto): worker 0 leads the run (instances, data,
#   metrics) and the trainer mesh takes --chips - --instances chips of every host; the other
#   hosts' remaining chips stay idle. The workdir must be shared storage (NFS, or a bucket
#   mounted by gcsfuse, the same path on every host): every host saves and restores its
#   shards of one checkpoint there.
# run starts the job on every worker detached from ssh (setsid nohup; each worker's output in
#   WORKDIR/job-HOSTNAME.log), so a dropped connection does not kill it; --wait: then
#   follow them; --foreground: in the foreground of ssh.
# wait: follows each worker's log until its job ends, exiting with its status.
# Extra flags after `--` go to asyncrl.main (run) or the group check (check).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

phase="" name=asyncrl zone="" project="" hosts=1 chips=4 instances=2 config=experiments/grpo.py
workdir=runs/tpu foreground=0 wait=0
extra=()
while (( $# )); do
  case $1 in
    check|run|wait) phase=$1 ;;
    --foreground) foreground=1 ;;
    --wait) wait=1 ;;
    --name=*) name=${1#*=} ;;
    --zone=*) zone=${1#*=} ;;
    --project=*) project=${1#*=} ;;
    --hosts=*) hosts=${1#*=} ;;
    --chips=*) chips=${1#*=} ;;
    --instances=*) instances=${1#*=} ;;
    --config=*) config=${1#*=} ;;
    --workdir=*) workdir=${1#*=} ;;
    --dry-run) DRY_RUN=1 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument $1 (see the comments at the top of $0)" ;;
  esac
  shift
done
[[ -n $phase ]] || die "name a phase: check, run or wait"
[[ -n $zone ]] || die "--zone=ZONE is required"
where=("--zone=$zone")
[[ -n $project ]] && where+=("--project=$project")
venv="cd asyncrl && . .venv/bin/activate"
check_workdir "$workdir"
TAG='-$(hostname)'  # every worker runs the job: one log (and pid, status) per host

everywhere() {  # the same command on every worker of the slice
  step gcloud compute tpus tpu-vm ssh "$name" "${where[@]}" --worker=all "--command=$1"
}

case $phase in
  check)
    everywhere "$venv && python -m asyncrl.distributed.trainer_group --steps=3 --coordinator_address=auto $(shell_line "${extra[@]}")"
    ;;
  run)
    trainer=$(( chips - instances ))
    (( trainer >= 1 )) || die "--chips=$chips leaves no chip to the trainer beside $instances instances"
    group=""
    (( hosts > 1 )) && group="--config.distributed.coordinator_address=auto "
    job="python -m asyncrl.main --config=$config --workdir=$workdir --config.mesh.trainer_devices=$trainer --config.mesh.rollout_instances=$instances --config.mesh.devices_per_instance=1 $group$(shell_line "${extra[@]}")"
    if (( foreground )); then
      everywhere "$venv && $job"
    else
      everywhere "$venv && $(detached "$workdir" "$job")"
      echo "# the job runs detached on every worker: logs ~/asyncrl/$workdir/job-HOSTNAME.log; follow them: $0 wait (same flags); stop it (it checkpoints): gcloud compute tpus tpu-vm ssh $name ${where[*]} --worker=all --command='kill -TERM -- -\$(cat asyncrl/$workdir/job-\$(hostname).pid)'" >&2
      if (( wait )); then everywhere "cd asyncrl && $(follow "$workdir")"; fi
    fi
    ;;
  wait)
    everywhere "cd asyncrl && $(follow "$workdir")"
    ;;
esac
