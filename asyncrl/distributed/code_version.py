"""Which asyncrl a process runs: a fingerprint of the package's source, compared at every Ray
actor's start with the driver's, so that a host left with another checkout (a setup skipped,
an rsync to one node forgotten) fails the start with one line naming both versions and the
host, instead of running other code mid-job.

The fingerprint is a hash of every `.py` file under the package (their paths relative to it
and their bytes), computed once per process. It needs no git: `tpu_vms.sh setup` ships a
`git archive` without `.git`. Import-light (no JAX, no Ray).
"""

from __future__ import annotations

import functools
import hashlib
import pathlib

from asyncrl.errors import UserError

PACKAGE = pathlib.Path(__file__).resolve().parents[1]  # asyncrl/


class CodeVersionError(UserError, RuntimeError):
    """An actor's host runs other asyncrl source than the driver."""


def fingerprint(package: str | pathlib.Path) -> str:
    """`sha256:<16 hex>` of the `.py` files under `package` (relative paths and contents, in
    path order; caches skipped)."""
    root = pathlib.Path(package)
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    for path in files:
        relative = path.relative_to(root).as_posix().encode()
        content = path.read_bytes()
        digest.update(len(relative).to_bytes(8, "little") + relative)
        digest.update(len(content).to_bytes(8, "little") + content)
    return f"sha256:{digest.hexdigest()[:16]}"


@functools.lru_cache(maxsize=None)
def code_version() -> str:
    """This process's asyncrl fingerprint (computed once)."""
    return fingerprint(PACKAGE)


def check_code_version(driver: str, who: str, host: str, here: str | None = None) -> None:
    """Raises CodeVersionError unless this process runs the driver's asyncrl (`driver`; ''
    skips the check). `who` and `host` name the actor and where it runs."""
    here = code_version() if here is None else here
    if driver and driver != here:
        raise CodeVersionError(
            f"{who} on host {host} runs asyncrl {here} ({PACKAGE}), the driver runs {driver}: "
            f"every host must run the same code (run the launch script's setup phase again)")
