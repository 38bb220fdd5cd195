#!/usr/bin/env bash
# One machine: the job with its rollout instances as Ray actors, on a Ray head the job starts
# inside its own process, listening and advertising on 127.0.0.1 alone, with a fresh token.
# The head ends with the job: nothing is left running (no `ray stop`, which would stop every
# Ray process on the machine, other users' included).
#
#   launch/one_machine.sh --workdir=runs/ray
#   launch/one_machine.sh --config=experiments/grpo.py:tiny --workdir=/tmp/tiny -- --config.train.steps=4
#   launch/one_machine.sh --netns ...     # also inside a network namespace with only `lo` (root)
#   launch/one_machine.sh --dry-run ...   # print the commands, run nothing
set -euo pipefail
. "$(dirname "$0")/lib.sh"

config=experiments/grpo.py workdir=runs/ray cpus=0 store_mb=1024 instances=2 netns=0
python=${PYTHON:-python3}
extra=()
while (( $# )); do
  case $1 in
    --config=*) config=${1#*=} ;;
    --workdir=*) workdir=${1#*=} ;;
    --cpus=*) cpus=${1#*=} ;;
    --object-store-mb=*) store_mb=${1#*=} ;;
    --instances=*) instances=${1#*=} ;;
    --python=*) python=${1#*=} ;;
    --netns) netns=1 ;;
    --dry-run) DRY_RUN=1 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument $1 (see the comments at the top of $0)" ;;
  esac
  shift
done

job=("$python" -m asyncrl.main "--config=$config" "--workdir=$workdir"
     --config.distributed.backend=ray --config.distributed.ray_address=local
     "--config.distributed.ray_num_cpus=$cpus" "--config.distributed.ray_object_store_mb=$store_mb"
     --config.distributed.transfer_host=127.0.0.1 "--config.mesh.rollout_instances=$instances"
     "${extra[@]}")

step cd "$REPO_ROOT"
if (( netns )); then
  # A namespace whose only interface is loopback: nothing can listen anywhere else.
  step unshare --net -- sh -c "ip link set lo up && exec $(shell_line "${job[@]}")"
else
  step "${job[@]}"
fi
