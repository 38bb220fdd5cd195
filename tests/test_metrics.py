import math

import pytest

from asyncrl.metrics import MetricsWriter, read_metrics, steady_tokens_per_s


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
