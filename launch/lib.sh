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
