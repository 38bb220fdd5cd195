"""A tiny run folder, shared by the tests of the commands that read one (python -m
asyncrl.eval, python -m asyncrl.export): two steps of experiments/grpo.py:tiny, with the
run.json the run records and its checkpoint at the end."""

import subprocess
import sys

import pytest

from tests.test_system import ROOT, tiny

EXPERIMENT = "experiments/grpo.py:tiny"
STEPS = 2


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    from asyncrl.run import run

    workdir = tmp_path_factory.mktemp("tiny_run") / "run"
    c = tiny(train__steps=STEPS)  # tiny: one checkpoint, at the end; no evaluation between
    results = run(c, workdir, experiment=EXPERIMENT)
    return c, workdir, results


def command(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m <module> <args>` from the repository root, as a user runs it."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    """The message of a command that ended on a user error: exit 2, one `error:` line."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), done.stderr[-3000:]
    return last
