"""Every schedule runs, and each keeps to (or reports beyond) the staleness it promises."""

import pytest

from asyncrl.sim.config import run_config
from asyncrl.sim.engine import Engine
from asyncrl.sim.run import simulate
from asyncrl.sim.schedules import SCHEDULES

from tests.sim.helpers import tiny

ALL = ("sync", "one_step", "verl", "areal", "roll", "slime", "staleflow")


def test_all_schedules_registered():
    assert set(SCHEDULES.names()) == set(ALL)


@pytest.mark.parametrize("schedule", ALL)
@pytest.mark.parametrize("eta", [1, 3])
def test_schedule_runs_and_reports(schedule, eta):
    c = tiny(schedule, instances=3, eta=eta, batch=6, group=4, slots=16, steps=(1, 4))
    r = simulate(c)
    assert r.throughput_tok_s > 0 and r.step_time_s > 0
    assert sum(r.staleness_hist.values()) == 5 * c.batch_size  # every consumed entry recorded
    bound = {"sync": 0, "one_step": 1, "roll": eta, "staleflow": eta}
    if schedule in bound:
        assert r.max_staleness <= bound[schedule]
    if schedule != "roll":
        assert r.wasted_frac == 0.0  # only ROLL throws work away (redundancy is off)


def test_roll_collects_stale_groups():
    c = tiny("roll", instances=2, eta=1, batch=8, group=4, steps=(1, 6),
             response={"name": "bimodal", "short_median": 50.0, "long_median": 3000.0,
                       "long_fraction": 0.2, "cap": 6000})
    r = simulate(c)
    assert r.max_staleness <= 1 and r.dropped_groups > 0 and r.wasted_frac > 0


def test_areal_can_exceed_eta_with_a_long_tail():
    # The admission bound counts rollouts, so a long response is trained late: staler than η.
    c = tiny("areal", instances=2, eta=1, batch=8, group=4, steps=(1, 8),
             response={"name": "bimodal", "short_median": 50.0, "long_median": 3000.0,
                       "long_fraction": 0.1, "cap": 6000})
    assert simulate(c).max_staleness > 1


def test_staleflow_uses_the_real_manager_and_policies():
    from asyncrl.coordinator.routing import ThroughputOptimal
    from asyncrl.coordinator.sync import WhenIdle
    from asyncrl.staleness import StalenessManager

    engine = Engine(tiny("staleflow"))
    s = engine.schedule
    assert isinstance(s.sm, StalenessManager) and isinstance(s.router, ThroughputOptimal)
    assert isinstance(s.sync, WhenIdle)
    engine.run()
    assert s.sm.version == engine.total_steps
    assert engine.timer.calls > 0


def test_unknown_names_fail_with_the_registered_ones():
    c = run_config()
    c.schedule = "verll"
    names = "areal, one_step, roll, slime, staleflow, sync, verl"
    with pytest.raises(ValueError, match=f"registered: {names}"):
        simulate(c)
    c = tiny("staleflow")
    c.schedules.staleflow.router = "fastest"
    with pytest.raises(ValueError, match="round_robin"):
        simulate(c)
    with pytest.raises(AttributeError):
        run_config().etaa = 3  # locked config: typos fail  # noqa: B018


def test_policies_and_simulator_import_no_model_code():
    # DESIGN: coordinator policies and the simulator import no JAX or model code. A fresh
    # interpreter, because this test session has imported JAX for other tests.
    import subprocess
    import sys

    code = (
        "import sys; import asyncrl.coordinator; from asyncrl.sim.run import simulate\n"
        "from tests.sim.helpers import tiny; simulate(tiny())\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax')\n"
        "             or m.startswith(('asyncrl.model', 'asyncrl.rollout', 'asyncrl.train')))\n"
        "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
