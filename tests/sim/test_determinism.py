"""Same config and seed, same bytes: the grid's CSV is bit-identical across runs."""

import ml_collections
import pytest

from asyncrl.sim.config import systems
from asyncrl.sim.run import grid_points, run_grid

from tests.sim.helpers import tiny


def grid(workers: int):
    config = ml_collections.ConfigDict()
    config.run = tiny(instances=2, batch=6, steps=(1, 2))
    config.systems = systems()
    config.grid = ml_collections.ConfigDict({
        "instances": [1, 3], "etas": [1, 2], "seeds": [0],
        "systems": ["sync", "verl", "areal", "slime", "staleflow"], "workers": workers,
        "schedules": ()})
    return config


def test_same_seed_same_csv(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run_grid(grid(1), str(a), progress=False)
    run_grid(grid(2), str(b), progress=False)  # worker processes change nothing either
    assert (a / "results.csv").read_bytes() == (b / "results.csv").read_bytes()
    assert (a / "results.md").read_bytes() == (b / "results.md").read_bytes()
    for name in ("throughput.png", "staleness.png", "timing.json"):
        assert (a / name).stat().st_size > 0
    rows = (a / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 5
    assert rows[0].startswith("system,instances,eta,")
    # sync fixes η = 0: one run per cluster size, reported in the row of every η.
    sync = [r.split(",", 3) for r in rows[1:] if r.startswith("sync,")]
    assert [(n, eta) for _, n, eta, _ in sync] == [("1", "1"), ("1", "2"), ("3", "1"), ("3", "2")]
    assert sync[0][3] == sync[1][3] and sync[2][3] == sync[3][3]


def test_different_seed_different_workload(tmp_path):
    c0 = grid(1)
    c1 = grid(1)
    c1.run.seed = 1
    c1.grid.seeds = [1]
    run_grid(c0, str(tmp_path / "s0"), progress=False)
    run_grid(c1, str(tmp_path / "s1"), progress=False)
    s0, s1 = (tmp_path / s / "results.csv" for s in ("s0", "s1"))
    assert s0.read_bytes() != s1.read_bytes()


def test_the_moved_grid_field_says_where_it_went():
    config = grid(1)
    config.grid.schedules = ("verl",)
    with pytest.raises(ValueError, match=r"grid\.schedules=.*moved to grid\.systems"):
        grid_points(config)
