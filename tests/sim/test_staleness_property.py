"""StaleFlow never consumes an entry staler than η, whatever the workload and policies.

Randomised small clusters: few slots (so work queues), tiny batches, every router, sync,
migration and redundancy policy, both leads (`auto` also as on a CPU's shared cores), partial
rollout on and off, heavy-tailed lengths. The core
checks V_traj ≤ version ≤ V_traj + η on every consume of a bounded admission (and raises),
every simulated instance asserts no response starts on weights older than its entry's
V_traj, and the test checks the recorded histogram.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.coordinator import (BINDINGS, DISPATCH_MODES, MIGRATION_POLICIES, REDUNDANCY_POLICIES, ROUTERS,
                                 SYNC_POLICIES)
from asyncrl.coordinator.admission import LEADS
from asyncrl.sim.config import system_config, systems
from asyncrl.sim.run import simulate

from tests.sim.helpers import tiny


@st.composite
def workloads(draw):
    c = tiny(
        "staleflow",
        instances=draw(st.integers(1, 4)),
        eta=draw(st.integers(0, 3)),
        batch=draw(st.integers(1, 6)),
        group=draw(st.integers(1, 4)),
        slots=draw(st.integers(2, 24)),
        response={"name": "lognormal", "median": float(draw(st.integers(20, 400))),
                  "sigma": draw(st.floats(0.1, 1.5)), "cap": draw(st.integers(50, 3000))},
        steps=(0, draw(st.integers(3, 7))),
        seed=draw(st.integers(0, 2**16)),
    )
    c.lead = draw(st.sampled_from(LEADS))
    c.shared_cores = draw(st.booleans())
    co = c.coordinator
    co.routing = draw(st.sampled_from(ROUTERS.names()))
    co.dispatch = draw(st.sampled_from(DISPATCH_MODES.names()))
    co.binding = draw(st.sampled_from(BINDINGS.names()))
    co.sync = draw(st.sampled_from(SYNC_POLICIES.names()))
    co.migration = draw(st.sampled_from(MIGRATION_POLICIES.names()))
    co.migration_interval_s = draw(st.sampled_from([0.0, 0.5, 2.0, 7.0]))
    co.redundancy = draw(st.sampled_from(REDUNDANCY_POLICIES.names()))
    co.partial_rollout = draw(st.booleans())
    c.reprefill_on_resume = draw(st.booleans())
    return c


@given(workloads())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_staleflow_never_exceeds_eta(config):
    r = simulate(config)
    assert r.max_staleness <= config.eta, r.staleness_hist
    assert min(r.staleness_hist) >= 0
    assert sum(r.staleness_hist.values()) == config.measure_steps * config.batch_size


SYSTEM_BOUND = {"sync": 0, "one_step": 1, "roll": None, "verl": -1, "areal": -1, "slime": -1}


@given(workloads(), st.sampled_from(sorted(SYSTEM_BOUND)))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_system_finishes_and_keeps_its_promise(config, system):
    # The same random workloads drive the baselines: none may deadlock (the event loop raises
    # SimulationStalled), and the ones that promise a bound keep it.
    config = system_config(config, systems(), system)
    if config.coordinator.admission != "staleflow" and config.coordinator.redundancy in ("batch", "both"):
        config.coordinator.redundancy = "none"  # batch redundancy is StaleFlow's alone
    r = simulate(config)
    bound = SYSTEM_BOUND[system]
    bound = config.eta if bound is None else bound
    if bound >= 0:
        assert r.max_staleness <= bound, r.staleness_hist
    assert sum(r.staleness_hist.values()) == config.measure_steps * config.batch_size
