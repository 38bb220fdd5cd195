import pytest

from asyncrl.metrics import MetricsWriter, read_metrics


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
