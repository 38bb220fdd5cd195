"""What the entry points tell a user before anything runs: `--help` lists `--config` and how
to override its fields; `--print_config` prints the resolved config and exits with nothing
loaded or written. Each runs the real command in a subprocess (about a second: no JAX)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from experiments import grpo

ROOT = pathlib.Path(__file__).resolve().parents[1]


def command(module: str, *args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    python = [sys.executable, *(["-X", "importtime"] if importtime else [])]
    return subprocess.run([*python, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


@pytest.mark.parametrize("module", ["asyncrl.main", "asyncrl.eval", "asyncrl.sim"])
def test_help_lists_the_config_flag_and_how_to_override_its_fields(module):
    run = command(module, "--help")  # absl's --help exits 1
    # absl's --help lists the entry point's own flags only: --config must be one of them.
    own_flags = run.stdout.split("Try --helpfull")[0]
    assert "  --config: " in own_flags
    assert "--config.<section>.<field>=<value>" in " ".join(own_flags.split())
    assert ("--[no]print_config" in own_flags) == (module == "asyncrl.main")


def test_print_config_prints_the_resolved_config_and_exits_with_nothing_loaded(tmp_path):
    workdir = tmp_path / "run"
    run = command("asyncrl.main", "--config=experiments/grpo.py:tiny", "--config.train.steps=7",
                  "--config.task.kinds=('add1', 'echo1')", "--print_config", f"--workdir={workdir}",
                  importtime=True)
    assert run.returncode == 0, run.stderr[-2000:]
    expected = grpo.get_config("tiny")
    expected.train.steps, expected.task.kinds = 7, ("add1", "echo1")
    assert json.loads(run.stdout) == json.loads(json.dumps(expected.to_dict()))
    assert not workdir.exists()
    imported = {line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines()
                if line.startswith("import time:")}
    assert "asyncrl.cli" in imported  # the list is read: its names are what was imported
    assert not {name for name in imported if name.split(".")[0] in ("jax", "flax", "wandb")}
