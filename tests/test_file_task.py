"""A run on local data files (prepared as TFDS data, shuffled by grain) with evaluation during
training, then the standalone `python -m asyncrl.eval` on its checkpoint.

The problems are written in the tiny tokenizer's alphabet ("7=" answered "7"), MATH-style
JSONL, so the tiny random model can run on them end to end.
"""

import json
import pathlib
import subprocess
import sys

import pytest

from asyncrl.run import run
from asyncrl.metrics import read_metrics
from tests.test_metrics import undocumented
from tests.test_system import ROOT, tiny

STEPS, EVERY, SAMPLES = 4, 2, 4
TRAIN_FILE_ROWS = 200


def write_problems(path: pathlib.Path, digits: list[int]) -> pathlib.Path:
    path.write_text("".join(json.dumps({"problem": f"{d}=", "answer": str(d)}) + "\n" for d in digits))
    return path


@pytest.fixture(scope="module")
def file_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("file_task")
    # 200 numbers: the validation split, a tenth carved out by construction, holds ten.
    train = write_problems(root / "train.jsonl", list(range(TRAIN_FILE_ROWS)))
    # Numbers training never asks: a test question the train file holds would be dropped.
    test = write_problems(root / "test.jsonl", list(range(1000, 1010)))
    c = tiny(task__dataset="math", task__train_path=str(train), task__test_path=str(test),
             train__steps=STEPS, eval__heldout_size=10, eval__every_steps=EVERY,
             eval__samples=SAMPLES, eval__pass_k=(1, SAMPLES))
    workdir = root / "run"
    results = run(c, workdir)
    return c, workdir, results


def test_evaluation_during_training_is_in_the_metrics(file_run):
    _, workdir, results = file_run
    rows = read_metrics(workdir / "metrics.jsonl")
    evaluated = [r for r in rows if "eval_accuracy" in r]
    assert [r["eval_version"] for r in evaluated] == [EVERY]
    row = evaluated[0]
    for key in ("eval_pass@1", f"eval_pass@{SAMPLES}", "eval_mean_length", "eval_format_rate"):
        assert 0 <= row[key] <= (4 if key == "eval_mean_length" else 1), (key, row[key])
    assert row[f"eval_pass@{SAMPLES}"] >= row["eval_pass@1"]
    assert [e["step"] for e in results["evals"]] == [EVERY]
    assert set(results["after"]["pass_at"]) == {1, SAMPLES}
    # Every metric a run logs, evaluations during it included, is in the glossary.
    assert not undocumented({key for r in rows for key in r}), "add it to docs/metrics.md"
    assert (workdir / "tfds").is_dir()  # the files were prepared as TFDS data


def test_the_checkpoint_holds_the_shuffled_cursor(file_run):
    _, workdir, _ = file_run
    rows = read_metrics(workdir / "metrics.jsonl")
    assert rows[-1]["step"] == STEPS
    # The train split: the file's rows less its validation part.
    state = system_cursor_state(workdir)
    assert set(state) == {"seed", "epoch", "position", "size", "shuffle"}
    assert state["size"] == TRAIN_FILE_ROWS - results_validation_size(workdir)


def results_validation_size(workdir: pathlib.Path) -> int:
    from asyncrl.data.heldout import carve_validation
    from asyncrl.data.math_data import load_math

    _, validation = carve_validation(load_math(workdir.parent / "train.jsonl"))
    return len(validation)


def system_cursor_state(workdir: pathlib.Path) -> dict:
    metas = sorted((workdir / "checkpoints").glob("*/meta/metadata"), key=lambda p: int(p.parts[-3]))
    assert metas, "no checkpoint was written"
    return json.loads(metas[-1].read_text())["data_state"]["cursor"]


def test_standalone_eval_reproduces_the_final_greedy_accuracy(file_run):
    c, workdir, results = file_run
    command = [sys.executable, "-m", "asyncrl.eval", "--config=experiments/grpo.py:tiny",
               "--config.task.dataset=math", f"--config.task.train_path={c.task.train_path}",
               f"--config.task.test_path={c.task.test_path}",
               "--config.eval.heldout_size=10", f"--checkpoint={workdir}", "--split=test"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((workdir / "eval.json").read_text())
    assert f"restored step {STEPS}" in done.stdout
    assert figures["accuracy"] == results["test"]["after"]["accuracy"]
    assert figures["mean_length"] == results["test"]["after"]["mean_length"]
    assert "test accuracy" in done.stdout


def test_standalone_eval_names_a_missing_checkpoint(tmp_path):
    command = [sys.executable, "-m", "asyncrl.eval", "--config=experiments/grpo.py:tiny",
               f"--checkpoint={tmp_path / 'nowhere'}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert f"{tmp_path / 'nowhere'}: does not exist" in done.stderr
