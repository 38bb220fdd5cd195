"""Steady-state measurement: whole η + 1 cycles after a warm-up, over seeds, with a spread."""

import pytest

from asyncrl.config_args import ConfigError
from asyncrl.sim.compare import compare
from asyncrl.sim.config import check, is_steady, window
from asyncrl.sim.run import simulate

from tests.sim.helpers import tiny

LONG_TAIL = {"name": "bimodal", "short_median": 80.0, "long_median": 1500.0,
             "long_fraction": 0.15, "cap": 4000}


def _runs(cycles: int, seeds=(0, 1, 2), eta=1):
    out = []
    for system in ("staleflow", "areal"):
        for seed in seeds:
            c = tiny(system, instances=3, eta=eta, batch=6, group=4, slots=16, seed=seed,
                     response=LONG_TAIL, steps=(None, None))
            c.measure_cycles = cycles
            assert is_steady(c)
            out.append(simulate(c))
    return out


def test_the_default_window_is_whole_cycles_after_two():
    c = tiny(eta=2, steps=(None, None))
    assert window(c) == (6, 24) and is_steady(c)
    c.measure_steps = 10
    assert not is_steady(c)  # not a whole number of η + 1 = 3 cycles


def test_ratios_move_less_than_their_spread_when_the_window_doubles():
    short = compare(_runs(8), 1, ["areal"])
    long = compare(_runs(16), 1, ["areal"])
    moved = abs(long["staleflow_vs"]["areal"] - short["staleflow_vs"]["areal"])
    spread = max(short["staleflow_vs_spread"]["areal"], long["staleflow_vs_spread"]["areal"])
    assert spread > 0  # three seeds, three workloads
    assert moved < spread, (short, long)


@pytest.mark.parametrize("field,value", [("measure_cycles", 0), ("warmup_cycles", -1),
                                         ("measure_steps", 0), ("warmup_steps", -1)])
def test_bad_window_values_name_the_field(field, value):
    c = tiny()
    c[field] = value
    with pytest.raises(ConfigError, match=field):
        check(c)
