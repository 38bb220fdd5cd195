"""The base class of every error a user causes and can fix: a misspelt flag or config field,
a value out of range, a missing, malformed or damaged file.

An entry point (`asyncrl.cli.run_main`) ends on a UserError with its one-line message and
exit status 2, no traceback: the message already says what to change. Anything else is a
bug and keeps its traceback. Import-light on purpose: config files and the simulator raise
these without loading JAX.
"""

import pathlib


class UserError(Exception):
    """Something the user can fix. The message names the culprit (the flag, the config field
    or the file) and what was expected, in one line."""


def local_workdir(workdir: str | pathlib.Path) -> pathlib.Path:
    """`workdir` as a local path; a URL (gs://, s3://) is refused naming what to use instead.

    The metrics, results and responses are written through the local filesystem, so a
    bucket URL would silently become a local folder named "gs:" (and the checkpoints with
    it). Many hosts need one folder: a shared filesystem mounted at the same path on each.
    """
    if "://" in str(workdir):
        raise UserError(
            f"--workdir={workdir} is a URL; the workdir must be a filesystem path. For a "
            f"bucket, mount it (e.g. gcsfuse) and pass the mount's path; a run over several "
            f"hosts needs that path shared (the same on every host: NFS, Filestore, gcsfuse)")
    return pathlib.Path(workdir)
