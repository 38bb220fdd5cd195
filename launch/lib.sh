# Sourced by the launch scripts. `step CMD ARG...` prints the command as one complete,
# copy-pasteable line, then runs it unless --dry-run was given. Quoting is shell quoting:
# what is printed is what runs.

DRY_RUN=0

shell_line() {
  local arg out=()
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_./:=@,+%-]+$ ]]; then out+=("$arg"); else out+=("${arg@Q}"); fi
  done
  printf '%s\n' "${out[*]}"
}

step() {
  shell_line "$@"
  if (( ! DRY_RUN )); then "$@"; fi
}

die() {
  echo "error: $*" >&2
  exit 2
}

# The repository root (launch/..), where the job runs and what the setup steps ship.
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Setup's Python: the default TPU VM and Ubuntu 22.04 GPU images have 3.10, asyncrl needs
# 3.11 or newer. One shell line, run in the checkout on a node: uv (from pip, else its
# installer) installs 3.11 and makes .venv from it, unless .venv already has 3.11+; it ends
# with one error line naming the version if it cannot.
PYTHON_VENV='export PATH="$HOME/.local/bin:$PATH" && { .venv/bin/python -c "import sys; assert sys.version_info >= (3, 11)" 2>/dev/null || { { command -v uv >/dev/null || python3 -m pip install --user --quiet uv || curl -LsSf https://astral.sh/uv/install.sh | sh; } && uv python install 3.11 && rm -rf .venv && uv venv --seed --python 3.11 .venv && .venv/bin/python -c "import sys; assert sys.version_info >= (3, 11)"; } || { echo "error: setup needs Python >= 3.11 (the image has $(python3 -V 2>&1)) and could not install 3.11 with uv: install python3.11 (e.g. apt from deadsnakes) and make .venv with it" >&2; exit 1; }; }'

# Detached jobs. `detached DIR CMD` is one shell line that starts CMD in its own session
# (setsid nohup, stdin closed), immune to the ssh connection dropping, its output in
# DIR/job.log, its pid in DIR/job.pid and, once it ends, its exit status in DIR/job.rc. The
# wrapper shell survives a SIGTERM (it traps it) so that it still records the status after
# the job's own SIGTERM handling (a checkpoint). `follow DIR` is one shell line that prints
# the log until the job ends, then exits with the job's status. DIR is relative to the
# checkout on the node; `$TAG`, if set, names the files per host (jobs on every worker).
detached() {
  local dir=$1 cmd="trap : TERM; $2; echo \$? > $1/job${TAG:-}.rc"
  printf '%s' "mkdir -p $dir && rm -f $dir/job${TAG:-}.rc && { setsid nohup bash -c ${cmd@Q} > $dir/job${TAG:-}.log 2>&1 < /dev/null & echo \$! > $dir/job${TAG:-}.pid; } && echo \"job detached: pid \$(cat $dir/job${TAG:-}.pid) on \$(hostname), log \$PWD/$dir/job${TAG:-}.log\""
}

follow() {
  local dir=$1
  printf '%s' "tail -n +1 --pid=\$(cat $dir/job${TAG:-}.pid) -f $dir/job${TAG:-}.log; exit \$(cat $dir/job${TAG:-}.rc 2>/dev/null || echo 1)"
}

# The job's workdir is a filesystem path (asyncrl refuses a URL: asyncrl/errors.py); refused
# here too, before any VM is set up or billed.
check_workdir() {
  [[ $1 != *://* ]] || die "--workdir=$1 is a URL; the workdir must be a filesystem path (for a bucket: mount it with gcsfuse at the same path on every host and pass that path)"
}

# `teardown_on_failure FUNCTION WHAT`: from here on, if the script exits with an error (a
# phase failed, or Ctrl-C), it says so and runs FUNCTION (which tolerates failures: it runs
# in a `||` list) before exiting with the same status. For `all`: nothing keeps running (or
# billing) after a failed phase.
teardown_on_failure() {
  TEARDOWN=$1 TEARDOWN_WHAT=$2
  echo "# all: if a phase fails, $TEARDOWN_WHAT ($TEARDOWN)" >&2
  trap '_status=$?; trap - EXIT; if (( _status )); then echo "error: a phase failed (exit status $_status): tearing down: $TEARDOWN_WHAT" >&2; "$TEARDOWN" || echo "error: the teardown failed too: check by hand" >&2; fi; exit $_status' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}
