import json
import math
import os
import pathlib
import re
import sys

import pytest

from asyncrl.config import ConfigError, resolve, validate
from asyncrl.config_args import config_json
from asyncrl.errors import UserError
from asyncrl.metrics import WANDB_REQUIREMENT, MetricsWriter, read_metrics, steady_tokens_per_s
from experiments import grpo


def test_metrics_round_trip_and_tensorboard_files(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        writer.write(0, {"reward": 0.25, "loss": float("nan")}, {"staleness": [0, 1, 1, 2]},
                     {"consumed_entries": [3, 4]})
        writer.write(1, {"reward": 0.5})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0] == {"step": 0, "reward": 0.25, "loss": "nan", "staleness": [0.0, 1.0, 1.0, 2.0],
                       "consumed_entries": [3, 4]}
    assert rows[1] == {"step": 1, "reward": 0.5}
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_torn_last_line_is_skipped_but_corruption_elsewhere_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, "rew')
    assert read_metrics(path) == [{"step": 0}]
    path.write_text('{"step": 0}\nbroken\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON object"):
        read_metrics(path)


def test_steady_throughput_leaves_step_one_out():
    rows = [{"wall_s": 30.0, "rollout_tokens": 999}, {"wall_s": 32.0, "rollout_tokens": 100},
            {"wall_s": 34.0, "rollout_tokens": 300}]
    assert steady_tokens_per_s(rows) == 100.0  # (100 + 300) tokens over 4 s; step 1's compile left out
    assert math.isnan(steady_tokens_per_s(rows[:1]))


def test_a_resumed_run_sets_aside_the_rows_logged_after_its_checkpoint(tmp_path):
    """A run killed at step 7 with its checkpoint at 6 logs step 7 again when it resumes:
    the first step-7 row moves aside (kept), so the file has one row per step."""
    with MetricsWriter(tmp_path) as writer:
        for step in range(1, 8):
            writer.write(step, {"reward": step / 10})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 8, "rew')  # killed mid-write
    with MetricsWriter(tmp_path, resume_step=6) as writer:
        writer.write(7, {"reward": 0.75})
    assert [(r["step"], r["reward"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == \
        [(s, s / 10) for s in range(1, 7)] + [(7, 0.75)]
    superseded = (tmp_path / "superseded.metrics.jsonl").read_text().splitlines()
    assert superseded == ['{"step": 7, "reward": 0.7}', '{"step": 8, "rew']


def test_staleness_summary_covers_every_entry_and_the_steps_after_eta():
    from asyncrl.metrics import staleness_summary
    rows = [{"step": 1, "staleness": [0, 0]}, {"step": 2, "staleness": [1, 1]},
            {"step": 3, "staleness": [1, 2]}, {"step": 4, "staleness": [1, 1]}]
    assert staleness_summary(rows, eta=2) == {"mean": 0.875, "max": 2, "mean_after_eta_steps": 1.25}
    assert staleness_summary([], eta=2) == {"mean": None, "max": None, "mean_after_eta_steps": None}


def wandb_records(path):
    """The records of a W&B run file (`run-<id>.wandb`), read without W&B's servers: the
    LevelDB log format W&B writes (a 7-byte file header, then 32 KiB blocks of chunks, each
    a 7-byte header: CRC, length, kind 1 whole / 2 first / 3 middle / 4 last), each record a
    protobuf of the pinned wandb's own schema."""
    from wandb.proto import wandb_internal_pb2

    data, block, records, pending, at = path.read_bytes(), 32768, [], b"", 7
    assert data[:4] == b":W&B"
    while at + 7 <= len(data):
        if block - at % block < 7:  # too little left in this block for a header: padding
            at += block - at % block
            continue
        length, kind = int.from_bytes(data[at + 4:at + 6], "little"), data[at + 6]
        pending += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history_and_config(run_file):
    """{step: its row} and the config, from a W&B run file. An item's name is a key or a
    path (`staleness`, `values` for a histogram's counts): rows come back nested."""
    def nest(items) -> dict:
        nested: dict = {}
        for item in items:
            *parents, leaf = list(item.nested_key) or [item.key]
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = json.loads(item.value_json)
        return nested

    history, config = {}, {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = nest(record.history.item)
            history[row["_step"]] = row
        elif kind in ("run", "config"):
            config.update(nest((record.run.config if kind == "run" else record.config).update))
    return history, config


def child_processes() -> list[str]:
    """This process's live children, by name (Linux /proc)."""
    found = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            name, fields = stat.read_text().rsplit(")", 1)
        except OSError:
            continue  # exited meanwhile
        if int(fields.split()[1]) == os.getpid():
            found.append(name.split("(", 1)[1])
    return found


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    """W&B kept off the network and out of the user's settings: offline, its settings and
    caches in tmp_path, no error reports."""
    for name, value in [("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"),
                        ("WANDB_ERROR_REPORTING", "false"), ("WANDB_DISABLE_CODE", "true"),
                        ("WANDB_CONFIG_DIR", tmp_path / "wandb_config"),
                        ("WANDB_CACHE_DIR", tmp_path / "wandb_cache"),
                        ("WANDB_DATA_DIR", tmp_path / "wandb_data")]:
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_the_wandb_sink_gets_every_row_and_the_config_and_stops_its_service(
        tmp_path, wandb_offline):
    c = grpo.get_config("tiny")
    c.log.wandb, c.log.wandb_mode = True, "offline"
    workdir = tmp_path / "run"
    with MetricsWriter(workdir, log=resolve(c).log, run_config=config_json(c)) as writer:
        writer.write(1, {"reward_mean": 0.25, "loss": float("nan"), "evals_skipped": 0},
                     {"staleness": [0, 1, 1, 2]}, {"batch_digest": "ab12"})
        writer.write(2, {"reward_mean": 0.5, "loss": -0.5, "evals_skipped": 1})
    assert not [name for name in child_processes() if "wandb" in name]
    (run_file,) = (workdir / "wandb").glob("offline-run-*/run-*.wandb")
    history, config = wandb_history_and_config(run_file)
    assert math.isnan(history[1].pop("loss"))
    assert {step: {k: v for k, v in row.items() if not k.startswith("_")}
            for step, row in history.items()} == {
        1: {"reward_mean": 0.25, "evals_skipped": 0, "staleness": history[1]["staleness"]},
        2: {"reward_mean": 0.5, "loss": -0.5, "evals_skipped": 1}}
    staleness = history[1]["staleness"]
    assert staleness["_type"] == "histogram" and sum(staleness["values"]) == 4  # 0, 1, 1, 2
    config.pop("_wandb")  # W&B's own
    assert config == json.loads(json.dumps(c.to_dict()))  # the whole config, as JSON holds it
    # The same folder resumed: the same W&B run (its id kept in the folder), its later rows.
    with MetricsWriter(workdir, resume_step=2, log=resolve(c).log,
                       run_config=config_json(c)) as writer:
        writer.write(3, {"reward_mean": 0.75})
    runs = sorted((workdir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2 and len({p.name for p in runs}) == 1  # run-<one id>.wandb
    assert wandb_history_and_config(runs[-1])[0][3]["reward_mean"] == 0.75


def test_wandb_that_is_not_installed_or_misconfigured_is_a_config_error(monkeypatch):
    c = grpo.get_config("tiny")
    c.log.wandb_mode = "cloud"
    with pytest.raises(ConfigError, match=r"config.log.wandb_mode = 'cloud'.*'online', 'offline'"):
        validate(c, device_count=8)
    c.log.wandb_mode, c.log.wandb = "offline", True
    validate(c, device_count=8)
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=re.escape(
            "config.log.wandb = True is not allowed: wandb is not installed: pip install "
            "wandb==0.31.0 (or pip install -e .[wandb])")):
        validate(c, device_count=8)


def test_the_pinned_wandb_is_the_one_the_error_names():
    root = pathlib.Path(__file__).resolve().parents[1]
    assert f'wandb = ["{WANDB_REQUIREMENT}"]' in (root / "pyproject.toml").read_text()
    assert f"\n{WANDB_REQUIREMENT}\n" in (root / "requirements-test.txt").read_text()


def test_wandb_online_without_a_login_is_one_user_error(tmp_path, wandb_offline, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
    monkeypatch.delenv("WANDB_MODE")
    c = grpo.get_config("tiny")
    c.log.wandb, c.log.wandb_mode = True, "online"
    with pytest.raises(UserError, match=r"config.log.wandb: Weights & Biases did not start: "
                                        r".*wandb login.*--config.log.wandb_mode=offline"):
        MetricsWriter(tmp_path / "run", log=resolve(c).log)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not [name for name in child_processes() if "wandb" in name]


GLOSSARY = pathlib.Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def undocumented(keys) -> set[str]:
    """The metric names among `keys` that docs/metrics.md's glossary does not describe: its
    lines "- `name`: ...", where `<i>` or `<k>` in a name stands for a number."""
    names = re.findall(r"^- `([^`]+)`: ", GLOSSARY.read_text(), re.M)
    assert len(names) == len(set(names)), "a metric described twice in docs/metrics.md"
    patterns = [re.compile(re.sub(r"<[a-z]>", r"\\d+", re.escape(name))) for name in names]
    return {key for key in keys if not any(p.fullmatch(key) for p in patterns)}


def test_the_glossary_is_read_line_by_line_with_its_placeholders():
    assert undocumented({"step", "reward_mean", "instance12_idle_frac", "eval_pass@8",
                         "instance_idle_frac", "eval_pass@", "reward", "made_up"}) == {
        "instance_idle_frac", "eval_pass@", "reward", "made_up"}
