"""A run folder's identity (asyncrl/run_folder.py): recorded on first use, another run refused
with one line before anything is written, a folder that cannot hold a run named as such.

The unit cases need no JAX; the command-line cases run `python -m asyncrl.main` up to its
refusal (a few seconds each: it imports JAX, builds nothing)."""

import contextlib
import errno
import json
import os
import pathlib
import subprocess
import sys

import pytest

from asyncrl.cli import EXIT_USER_ERROR
from asyncrl.run_folder import (RUN_FILE, RunFolderError, check_identity, claim,
                                default_workdir, experiment_name, folder_write_error,
                                stored_config)
from experiments import grpo
from experiments.baselines import sync

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = "experiments/grpo.py:tiny"


def tree(folder: pathlib.Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_first_use_records_the_experiment_the_resolved_config_and_the_code(tmp_path):
    config = grpo.get_config("tiny")
    claim(tmp_path, config, TINY)
    record = json.loads((tmp_path / RUN_FILE).read_text())
    assert record["experiment"] == TINY
    assert record["code"]["commit"] and isinstance(record["code"]["dirty"], bool)  # a checkout
    assert json.loads((tmp_path / RUN_FILE).read_text())["experiment"] == TINY
    assert stored_config(tmp_path) == config  # tuples come back as tuples
    (tmp_path / "metrics.jsonl").write_text("")  # the run got going
    claim(tmp_path, config, TINY)  # the same run again: one more use, nothing refused
    assert len(json.loads((tmp_path / RUN_FILE).read_text())["uses"]) == 1


@pytest.mark.parametrize("change, named", [
    (lambda c: setattr(c, "seed", 1), ["config.seed = 0 there, 1 here"]),
    (lambda c: setattr(c.model, "checkpoint", "embedded"), ["config.model.checkpoint"]),
    (lambda c: setattr(c.rollout, "group_size", 8), ["config.rollout.group_size = 16 there"]),
    (lambda c: setattr(c.train, "learning_rate", 1e-3), ["config.train.learning_rate"]),
    (lambda c: setattr(c.task, "kinds", ("add2",)), ["config.task.kinds = ['echo1'] there"]),
], ids=["seed", "model", "group-size", "optimizer", "task"])
def test_a_config_differing_in_what_the_state_depends_on_is_refused(change, named, tmp_path):
    claim(tmp_path, grpo.get_config("tiny"), TINY)
    (tmp_path / "checkpoints" / "6").mkdir(parents=True)
    before = tree(tmp_path)
    other = grpo.get_config("tiny")
    change(other)
    with pytest.raises(RunFolderError) as refused:
        claim(tmp_path, other, TINY)
    assert str(refused.value).startswith(f"workdir {tmp_path} holds another run: ")
    for name in named:
        assert name in str(refused.value)
    assert tree(tmp_path) == before


def test_fields_a_checkpoint_restores_under_may_change(tmp_path):
    claim(tmp_path, grpo.get_config("tiny"), TINY)
    longer = grpo.get_config("tiny")
    longer.train.steps = 300  # train on
    longer.mesh.rollout_instances = 1
    longer.staleness.lead = "max"
    claim(tmp_path, longer, TINY)


def test_the_protocol_a_checkpoint_holds_cannot_change_under_it(tmp_path):
    claim(tmp_path, grpo.get_config("tiny"), TINY)
    (tmp_path / "metrics.jsonl").write_text("")
    other = grpo.get_config("tiny")
    other.staleness.eta, other.train.batch_size = 1, 4
    with pytest.raises(RunFolderError, match=r"config.staleness.eta = 2 there, 1 here; "
                                             r"config.train.batch_size = 8 there, 4 here"):
        claim(tmp_path, other, TINY)


def test_a_first_attempt_that_failed_before_writing_anything_else_is_replaced(tmp_path):
    # A model that did not load: the fix changes an identity field, and must not be refused.
    claim(tmp_path, grpo.get_config("tiny"), TINY)
    fixed = grpo.get_config("tiny")
    fixed.model.param_dtype = "bfloat16"
    claim(tmp_path, fixed, TINY)
    assert stored_config(tmp_path).model.param_dtype == "bfloat16"
    (tmp_path / "results.json").write_text("{}")  # now it has evaluated: the folder is its
    with pytest.raises(RunFolderError, match="config.model.param_dtype = 'bfloat16' there"):
        claim(tmp_path, grpo.get_config("tiny"), TINY)


def test_a_file_named_two_ways_is_one_run(tmp_path, monkeypatch):
    data = tmp_path / "data.jsonl"
    data.write_text("")
    monkeypatch.chdir(tmp_path)
    config = grpo.get_config("tiny")
    config.task.train_path = "data.jsonl"
    run = tmp_path / "run"
    claim(run, config, f"{ROOT}/experiments/grpo.py:tiny")
    (run / "metrics.jsonl").write_text("")
    config.task.train_path = str(data)
    monkeypatch.chdir(ROOT)  # the same experiment file, named from elsewhere
    claim(run, config, TINY)


def test_the_same_experiment_from_a_checkout_elsewhere_is_one_run(tmp_path, monkeypatch):
    """A run folder taken to a fresh machine, whose checkout lies at another path: the same
    experiment name, a file that resolves elsewhere."""
    run = tmp_path / "run"
    claim(run, grpo.get_config("tiny"), TINY)
    (run / "metrics.jsonl").write_text("")
    record = json.loads((run / RUN_FILE).read_text())
    record["experiment_file"] = "/elsewhere/asyncrl/experiments/grpo.py"
    (run / RUN_FILE).write_text(json.dumps(record))
    claim(run, grpo.get_config("tiny"), TINY)
    with pytest.raises(RunFolderError, match=r"experiment experiments/grpo.py:tiny \(this run: "
                                             r"experiments/staleflow.py:tiny\)"):
        claim(run, grpo.get_config("tiny"), "experiments/staleflow.py:tiny")


def test_resume_anyway_uses_the_folder_and_records_what_differed(tmp_path):
    claim(tmp_path, grpo.get_config("tiny"), TINY)
    (tmp_path / "metrics.jsonl").write_text("")
    other = grpo.get_config("tiny")
    other.seed = 3
    claim(tmp_path, other, TINY, resume_anyway=True)
    use = json.loads((tmp_path / RUN_FILE).read_text())["uses"][-1]
    assert use["resumed_anyway"] == ["config.seed = 0 there, 3 here"]
    # From then on the folder is that config's run: eval reads it, a resume needs no flag.
    assert stored_config(tmp_path).seed == 3
    claim(tmp_path, other, TINY)


def test_a_folder_an_older_asyncrl_wrote_is_refused_unless_resumed_anyway(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(RunFolderError, match="holds a run but no run.json"):
        check_identity(tmp_path, grpo.get_config("tiny"), TINY)
    claim(tmp_path, grpo.get_config("tiny"), TINY, resume_anyway=True)
    assert json.loads((tmp_path / RUN_FILE).read_text())["experiment"] == TINY


def test_a_workdir_that_is_a_file_is_named(tmp_path):
    path = tmp_path / "run"
    path.write_text("not a folder")
    with pytest.raises(RunFolderError, match=f"--workdir={path}: {path} is a file"):
        check_identity(path, grpo.get_config("tiny"), TINY)
    with pytest.raises(RunFolderError, match=f"{path} is a file"):
        check_identity(path / "sub", grpo.get_config("tiny"), TINY)


@contextlib.contextmanager
def tmpfs(folder: pathlib.Path, options: str):
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root (the suite runs as root in CI)")
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def test_a_read_only_workdir_is_named(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=1m") as folder:
        with pytest.raises(RunFolderError, match=f"--workdir={folder}/run: its parent "
                                                 f"{folder} cannot be written"):
            check_identity(folder / "run", grpo.get_config("tiny"), TINY)


def test_a_full_disk_is_one_line_and_leaves_the_record_whole(tmp_path):
    with tmpfs(tmp_path / "small", "size=64k") as folder:
        claim(folder, grpo.get_config("tiny"), TINY)
        record = (folder / RUN_FILE).read_bytes()
        with contextlib.suppress(OSError):
            (folder / "filler").write_bytes(b"\0" * (1 << 20))
        with pytest.raises(RunFolderError, match=f"workdir {folder}: the disk is full"):
            claim(folder, grpo.get_config("tiny"), TINY)
        assert (folder / RUN_FILE).read_bytes() == record


def test_disk_full_message_names_the_file_and_how_to_go_on():
    error = OSError(errno.ENOSPC, "No space left on device", "/runs/x/metrics.jsonl")
    message = str(folder_write_error(pathlib.Path("/runs/x"), error))
    assert message == ("workdir /runs/x: the disk is full (No space left on device writing "
                       "/runs/x/metrics.jsonl); free space, or choose another --workdir, then "
                       "rerun: the run resumes from its last checkpoint")


def test_each_experiment_has_a_default_folder_of_its_own(monkeypatch, tmp_path):
    assert default_workdir("experiments/grpo.py") == "runs/grpo"  # the README's folder
    assert default_workdir("experiments/grpo.py:tiny") == "runs/grpo-tiny"
    assert default_workdir("experiments/grpo.py:tiny,eta=1") == "runs/grpo-tiny-eta=1"
    assert default_workdir("experiments/baselines/sync.py") == "runs/sync"
    monkeypatch.chdir(ROOT)
    assert experiment_name(f"{ROOT}/experiments/grpo.py:tiny") == TINY
    assert experiment_name("./experiments/grpo.py") == "experiments/grpo.py"


def run_main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asyncrl.main", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("args, named", [
    (["--config=experiments/staleflow.py:tiny"],
     ["experiment experiments/grpo.py:tiny (this run: experiments/staleflow.py:tiny)"]),
    (["--config=experiments/baselines/sync.py:tiny"], ["experiments/baselines/sync.py:tiny"]),
    ([f"--config={TINY}", "--config.seed=1"], ["config.seed = 0 there, 1 here"]),
], ids=["staleflow", "sync", "seed"])
def test_main_refuses_another_runs_folder_before_writing_anything(args, named, tmp_path):
    # A finished default run's folder: another experiment would "resume" it and write its
    # results over the run's own.
    claim(tmp_path, grpo.get_config("tiny"), TINY)
    (tmp_path / "results.json").write_text(json.dumps({"after": {"accuracy": 0.3}}))
    before = tree(tmp_path)
    run = run_main(*args, f"--workdir={tmp_path}")
    assert run.returncode == EXIT_USER_ERROR, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert errors[0].startswith(f"error: workdir {tmp_path} holds another run: ")
    assert "--resume_anyway" in errors[0]
    for name in named:
        assert name in errors[0]
    assert tree(tmp_path) == before


def test_main_names_a_workdir_that_is_a_file(tmp_path):
    path = tmp_path / "run"
    path.write_text("notes")
    run = run_main(f"--config={TINY}", f"--workdir={path}")
    assert run.returncode == EXIT_USER_ERROR, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1] == \
        f"error: --workdir={path}: {path} is a file, not a folder"


def test_the_sync_baseline_records_its_own_identity(tmp_path):
    claim(tmp_path, sync.get_config("tiny"), "experiments/baselines/sync.py:tiny")
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(RunFolderError, match="experiment experiments/baselines/sync.py:tiny"):
        check_identity(tmp_path, grpo.get_config("tiny"), TINY)
