"""Every config in experiments/ builds and passes validation, and each schedule of the live
system runs its tiny variant end to end: the admissions a user picks by config all work."""

import importlib
import json
import pathlib

import pytest

from asyncrl.config import validate, with_overrides
from asyncrl.metrics import read_metrics
from asyncrl.run import run

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUN_CONFIGS = ["experiments.grpo", "experiments.staleflow", "experiments.baselines.sync",
               "experiments.baselines.one_step_off", "experiments.baselines.barrier",
               "experiments.baselines.token_bucket"]


def test_every_experiment_file_is_covered():
    found = {".".join(p.relative_to(ROOT).with_suffix("").parts)
             for p in (ROOT / "experiments").rglob("*.py") if p.name != "__init__.py"}
    assert found == set(RUN_CONFIGS) | {"experiments.gsm8k", "experiments.sim.paper"}


@pytest.mark.parametrize("name", RUN_CONFIGS)
@pytest.mark.parametrize("arg", [None, "tiny"])
def test_run_configs_validate(name, arg):
    validate(importlib.import_module(name).get_config(arg), device_count=8)


def test_a_lead_that_does_not_exist_fails_naming_the_field():
    from asyncrl.config import ConfigError
    c = importlib.import_module("experiments.grpo").get_config("tiny")
    assert c.staleness.lead == "auto"
    c.staleness.lead = "min"
    with pytest.raises(ConfigError, match=r"config.staleness.lead = 'min' is not allowed: 'auto'"):
        validate(c, device_count=8)


@pytest.mark.parametrize("name, bounded", [
    ("experiments.staleflow", True), ("experiments.baselines.one_step_off", True),
    # slime's over-sampling recycles partial rollouts into later batches: measured, unbounded.
    ("experiments.baselines.barrier", False), ("experiments.baselines.token_bucket", False)])
def test_each_schedule_runs_end_to_end_and_accounts_for_every_entry(name, bounded, tmp_path):
    c = with_overrides(importlib.import_module(name).get_config("tiny"),
                       {"train.steps": 4, "eval.heldout_size": 8, "train.batch_timeout_s": 300.0})
    results = run(c, tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    lags = [lag for r in rows for lag in r["staleness"]]
    assert lags and min(lags) >= 0
    if bounded:
        assert max(lags) <= c.staleness.eta
    consumed = [e for r in rows for e in r["entries"]]
    assert len(consumed) == len(set(consumed)) == 4 * c.train.batch_size
    protocol = json.loads((tmp_path / "results.json").read_text())["protocol"]
    assert set(consumed) | set(protocol["unconsumed"]) | set(protocol["aborted"]) == \
        set(range(protocol["next_entry_id"]))
    assert results["steps"] == 4
