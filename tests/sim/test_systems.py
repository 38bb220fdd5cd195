"""Every system runs, each keeps to (or reports beyond) the staleness it promises, and every
decision is the coordinator core's."""

import pytest

from asyncrl.coordinator.admission import ADMISSIONS
from asyncrl.sim.cluster import Cluster
from asyncrl.sim.config import run_config, system_config, systems
from asyncrl.sim.run import simulate

from tests.sim.helpers import tiny

ALL = ("sync", "one_step", "verl", "areal", "roll", "slime", "staleflow")
LONG_TAIL = {"name": "bimodal", "short_median": 50.0, "long_median": 3000.0,
             "long_fraction": 0.2, "cap": 6000}


def test_every_system_is_an_admission():
    assert set(systems().keys()) == set(ALL)
    assert {s.coordinator.admission for s in systems().values()} <= set(ADMISSIONS.names())
    assert set(ADMISSIONS.names()) == {"barrier", "staleflow", "token_bucket", "verl"}


@pytest.mark.parametrize("system", ALL)
@pytest.mark.parametrize("eta", [1, 3])
def test_system_runs_and_reports(system, eta):
    c = tiny(system, instances=3, eta=eta, batch=6, group=4, slots=16, steps=(1, 4))
    r = simulate(c)
    assert r.system == system and r.throughput_tok_s > 0 and r.step_time_s > 0
    assert sum(r.staleness_hist.values()) == 5 * c.batch_size  # every consumed entry recorded
    bound = {"sync": 0, "one_step": 1, "roll": eta, "staleflow": eta}
    if system in bound:
        assert r.max_staleness <= bound[system]
    if system != "roll":
        assert r.wasted_frac == 0.0  # only ROLL throws work away (redundancy is off)


def test_roll_collects_stale_groups():
    r = simulate(tiny("roll", instances=2, eta=1, batch=8, group=4, steps=(1, 6),
                      response=LONG_TAIL))
    assert r.max_staleness <= 1 and r.dropped_groups > 0 and r.wasted_frac > 0


def test_areal_can_exceed_eta_with_a_long_tail():
    # The admission bound counts rollouts, so a long response is trained late: staler than η.
    c = tiny("areal", instances=2, eta=1, batch=8, group=4, steps=(1, 8),
             response={**LONG_TAIL, "long_fraction": 0.1})
    assert simulate(c).max_staleness > 1


def test_verl_drops_the_oldest_of_a_full_queue():
    c = tiny("verl", instances=2, eta=1, batch=4, group=4, steps=(1, 4), response=LONG_TAIL)
    # (1 + 3)·B entries may be out at once, the queue holds B: a slow trainer overflows it.
    c.coordinator.admission_params.verl.staleness_threshold = 3.0
    c.coordinator.admission_params.verl.max_queue_size = 4
    c.train_gpus_per_instance = 0.01
    r = simulate(c)
    assert r.dropped_groups > 0 and r.wasted_frac > 0


def test_slime_recycles_its_surplus_as_partial_rollouts():
    c = tiny("slime", instances=2, eta=2, batch=6, group=4, slots=12, steps=(1, 5),
             response=LONG_TAIL)
    cluster = Cluster(c)
    r = cluster.run()
    # Extracted at a batch's end and resumed by the next: re-prefilled, never wasted.
    assert cluster.metrics.reprefill_tokens > 0 and r.wasted_frac == 0.0
    c.coordinator.partial_rollout = False  # slime without --partial-rollout aborts them
    assert simulate(c).dropped_groups > 0


@pytest.mark.parametrize("system", ["staleflow", "verl", "areal"])
def test_without_partial_rollout_every_response_is_one_version(system):
    # A pull waits until the instance's running responses finished, as a live instance does.
    c = tiny(system, instances=2, eta=2, batch=6, group=4, slots=16, steps=(1, 4),
             response=LONG_TAIL)
    c.coordinator.partial_rollout = False
    cluster = Cluster(c)
    r = cluster.run()
    assert sum(r.staleness_hist.values()) == 5 * c.batch_size
    assert cluster.metrics.reprefill_tokens == 0  # nothing was interrupted by a pull


def test_dynamic_sampling_filters_groups_without_signal():
    c = tiny("staleflow", instances=2, eta=1, batch=6, group=2, steps=(1, 3))
    c.coordinator.dynamic_sampling = True
    cluster = Cluster(c)
    r = cluster.run()
    assert cluster.core.counters.filtered_groups > 0  # groups of 2: half agree, on average
    assert sum(r.staleness_hist.values()) == 4 * c.batch_size


def test_the_core_decides_with_the_real_manager_and_policies():
    from asyncrl.coordinator.admission import StaleFlow
    from asyncrl.coordinator.routing import ThroughputOptimal
    from asyncrl.coordinator.sync import WhenIdle
    from asyncrl.staleness import StalenessManager

    cluster = Cluster(tiny("staleflow"))
    core = cluster.core
    assert isinstance(core.admission, StaleFlow) and isinstance(core.admission.sm, StalenessManager)
    assert isinstance(core.router, ThroughputOptimal) and isinstance(core.admission.sync, WhenIdle)
    cluster.run()
    assert core.version == cluster.total_steps  # every batch taken through the core
    assert cluster.timer.calls > 0 and cluster.timer.total > 0


def test_unknown_names_and_moved_fields_fail_naming_the_field():
    c = run_config()
    c.coordinator.admission = "verll"
    with pytest.raises(ValueError, match="registered: barrier, staleflow, token_bucket, verl"):
        simulate(c)
    c = tiny("staleflow")
    c.coordinator.routing = "fastest"
    with pytest.raises(ValueError, match="round_robin"):
        simulate(c)
    c = tiny("staleflow")
    c.lead = "ahead"
    # The live run's check of the same field (asyncrl/coordinator/config.py), not a copy.
    with pytest.raises(ValueError, match=r"config.lead = 'ahead' is not allowed: 'auto' .* or 'max'"):
        simulate(c)
    c = run_config()
    c.schedule = "verl"
    with pytest.raises(ValueError, match=r"schedule='verl': this field moved to coordinator\.admission"):
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


def test_slime_launches_past_a_batch_its_recycled_rollouts_already_filled():
    # One instance, B = 1, over-sampling 1.5: the surplus recycled into batch b + 1 can fill
    # it before it is launched; the loop must then launch b + 2, not wait for b + 1 forever.
    c = tiny("staleflow", instances=1, eta=1, batch=1, group=1, slots=2, steps=(0, 5),
             response={"name": "lognormal", "median": 20.0, "sigma": 1.0, "cap": 50})
    c.reprefill_on_resume = False
    c = system_config(c, systems(), "slime")
    r = simulate(c)
    assert sum(r.staleness_hist.values()) == 5


def test_a_recycled_surplus_response_leaves_the_resume_queue_when_its_group_completes():
    # slime hands unfinished responses back to be resumed; with group redundancy one of them
    # can be the surplus dropped when its group completes while it waits to be resumed.
    c = tiny("staleflow", instances=1, eta=2, batch=3, group=2, slots=8, steps=(0, 3), seed=128,
             response={"name": "lognormal", "median": 20.0, "sigma": 1.0, "cap": 110})
    c.coordinator.redundancy = "group"
    c.reprefill_on_resume = False
    c = system_config(c, systems(), "slime")
    c.coordinator.redundancy = "group"
    r = simulate(c)
    assert sum(r.staleness_hist.values()) == 3 * 3
