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


def _result(system, eta, seed, tput, hist):
    from asyncrl.sim.metrics import Result
    consumed = sum(hist.values())
    return Result(system=system, instances=4, eta=eta, seed=seed, batch_groups=1, group_size=1,
                  throughput_tok_s=tput, samples_per_s=0.0, step_time_s=1.0,
                  max_staleness=max(hist), staleness_hist=hist,
                  mean_staleness=sum(k * v for k, v in hist.items()) / consumed,
                  wasted_frac=0.0, reprefill_per_step=0.0, pulls=0, migrated=0,
                  dropped_groups=0, events=0)


def test_frontier_compares_at_the_staleness_each_system_delivers():
    from asyncrl.sim import compare
    results = []
    for seed, noise in enumerate((1.0, 1.1, 0.9)):
        results += [
            _result("staleflow", 1, seed, 100 * noise, {0: 1, 1: 1}),
            _result("staleflow", 2, seed, 150 * noise, {1: 1, 2: 1}),
            # AReaL's η = 1 delivers a max of 2: it is matched with StaleFlow at η = 2.
            _result("areal", 1, seed, 120 * noise, {1: 3, 2: 1}),
            _result("areal", 2, seed, 160 * noise, {2: 3, 3: 1}),
        ]
    front = compare.frontier(results)
    assert front["areal"][1]["max_staleness"] == 2
    assert front["areal"][1]["share_above_eta"] == 0.25
    low, pairs = compare.frontier_min_ratio(front, ["areal"])
    assert {(p["eta"], round(p["ratio"], 3)) for p in pairs} == {(1, 1.25), (2, 0.938)}
    assert low == min(p["ratio"] for p in pairs)
    c = compare.compare(results, 2, ["areal"])
    assert c["staleflow_vs"]["areal"] == 150 / 160 and c["staleflow_vs_spread"]["areal"] < 1e-9
    assert c["staleflow_vs_matched_max"]["areal"] == 150 / 120
    assert "| areal | 1 |" in compare.frontier_markdown(results)
