"""Constant lengths, η = 0, one instance: the simulated throughput is the closed-form value.

Every response has P prompt and L response tokens; the B·N responses of a step run as one
batch of n = B·N. One step then takes, in order: prefill of B·P tokens (a group's members
share their prompt's prefill, as in the engine), L decode steps
(step i reads n·(P + i) KV tokens), the reward latency, the training step, and two weight
transfers: the trainer's push to the parameter server, then the instance's pull (asked for
by the sync policy for StaleFlow, by the barrier's collective update for `sync`). The sum is
computed here step by step, independently of the simulator's closed-form chunk sums.
"""

import pytest

from asyncrl.sim.profile import Profile
from asyncrl.sim.run import simulate

from tests.sim.helpers import tiny

P, L, B, N = 32, 300, 4, 4


def step_period(profile: Profile, transfers: int) -> float:
    lat = profile.latency
    n = B * N
    prefill = lat.prefill_s_per_token * B * P
    decode = sum(lat.a + lat.b * n * (P + i) + max(lat.c, lat.d + lat.e * n) for i in range(L))
    tokens = n * (P + L)
    train = profile.step_overhead_s + tokens * profile.gpu_s_per_token / 4.0  # 4 GPUs/instance
    return prefill + decode + profile.reward_latency_s + train + transfers * profile.transfer_s()


@pytest.mark.parametrize("system, transfers", [("sync", 2), ("staleflow", 2)])
def test_constant_lengths_match_closed_form(system, transfers):
    c = tiny(system, instances=1, eta=0, batch=B, group=N,
             response={"name": "constant", "value": L}, steps=(1, 4))
    r = simulate(c)
    profile = Profile.load(c.profile)
    expected = B * N * L / step_period(profile, transfers)
    assert r.throughput_tok_s == pytest.approx(expected, rel=1e-9)
    assert r.max_staleness == 0 and r.wasted_frac == 0.0
