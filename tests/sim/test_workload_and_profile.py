"""Length distributions, the simulated task and the hardware profile: shapes, caps, the same
work under every system, and errors that name the field."""

import json

import numpy as np
import pytest

from asyncrl.sim.cluster import Cluster
from asyncrl.sim.instance import GONE
from asyncrl.profiles import PROFILE_DIR
from asyncrl.sim.profile import Profile
from asyncrl.sim.prompts import SimPrompts
from asyncrl.sim.workload import LENGTHS, build_lengths

from tests.sim.helpers import tiny

RNG = np.random.default_rng(0)


def test_registered_distributions():
    assert set(LENGTHS.names()) == {"constant", "lognormal", "bimodal", "empirical"}
    with pytest.raises(ValueError, match="registered: bimodal, constant, empirical, lognormal"):
        build_lengths({"name": "normal"})
    with pytest.raises(ValueError, match="bad parameters"):
        build_lengths({"name": "lognormal", "median": 10.0})


def test_lognormal_is_capped():
    d = build_lengths({"name": "lognormal", "median": 1000.0, "sigma": 1.0, "cap": 2000})
    x = d.sample(RNG, 20_000)
    assert x.min() >= 1 and x.max() == 2000 and abs(np.median(x) - 1000) < 50
    assert d.cap == 2000


def test_bimodal_has_a_long_tail():
    d = build_lengths({"name": "bimodal", "short_median": 300.0, "long_median": 8000.0,
                       "long_fraction": 0.1, "cap": 16384})
    x = d.sample(RNG, 20_000)
    assert 0.08 < np.mean(x > 3000) < 0.12 and x.max() <= 16384


def test_shipped_long_cot_histogram():
    d = build_lengths({"name": "empirical", "path": "long_cot_math.json"})
    x = d.sample(RNG, 50_000)
    assert d.cap == 16384 and x.max() == 16384
    assert np.median(x) < 2048  # most responses are short
    assert 0.02 < np.mean(x == 16384) < 0.04  # a few percent cut at the cap
    assert abs(x.mean() - d.mean()) / d.mean() < 0.03


def test_empirical_errors_name_the_file(tmp_path):
    bad = tmp_path / "h.json"
    bad.write_text(json.dumps({"cap": 100, "bins": [[10, 200, 1.0]]}))
    with pytest.raises(ValueError, match=f"{bad}.*bins"):
        build_lengths({"name": "empirical", "path": str(bad)})
    bad.write_text(json.dumps({"bins": []}))
    with pytest.raises(ValueError, match="missing field 'cap'"):
        build_lengths({"name": "empirical", "path": str(bad)})


def test_profile_errors_name_the_file_and_field(tmp_path):
    with open(f"{PROFILE_DIR}/qwen2p5_7b_8xh100.json") as f:
        good = json.load(f)
    p = Profile.load("qwen2p5_7b_8xh100.json")
    assert p.transfer_s() == pytest.approx(15.22e9 / 50e9 + 1.0)
    for mutate, message in [
        (lambda d: d["network"].pop("weight_sync_overhead_s"), "network.weight_sync_overhead_s'"),
        (lambda d: d.update(extra=1), "unknown field"),
        (lambda d: d["trainer"].update(gpu_s_per_tokn=1), "unknown field"),
        (lambda d: d["instance"].update(num_slots=2.5), "instance.num_slots"),
        (lambda d: d["reward"].update(latency_s="1"), "reward.latency_s"),
    ]:
        d = json.loads(json.dumps(good))
        mutate(d)
        path = tmp_path / "p.json"
        path.write_text(json.dumps(d))
        with pytest.raises(ValueError, match=message) as err:
            Profile.load(str(path))
        assert str(path) in str(err.value)


def test_same_prompt_same_work_under_every_system():
    a = Cluster(tiny("areal", seed=3)).prompts
    b = Cluster(tiny("staleflow", seed=3)).prompts
    for _ in range(5):
        pa, pb = next(a), next(b)
        assert pa.prompt_id == pb.prompt_id and len(pa.tokens) == len(pb.tokens)
        assert a.responses(pa.prompt_id) == b.responses(pb.prompt_id)
    # Prompt g's work does not depend on which prompts were drawn before it.
    late = SimPrompts(tiny("sync", seed=3), responses_per_prompt=4)
    assert late.responses(1500) == a.responses(1500)
    assert late.responses(4) == a.responses(4)


def test_rewards_vary_by_prompt():
    prompts = SimPrompts(tiny(seed=0, group=16), responses_per_prompt=16)
    rewards = [prompts.responses(g)[2] for g in range(200)]
    assert {r for row in rewards for r in row} == {0.0, 1.0}
    agree = sum(len(set(row)) == 1 for row in rewards)
    assert 5 < agree < 50  # about 2/17 of groups of 16 when the pass rate is uniform


def test_tokens_are_conserved():
    # Every decoded token either trains or is counted as wasted; nothing is lost or doubled.
    for system in ("slime", "roll"):
        c = tiny(system, instances=2, eta=1, batch=6, group=4, slots=8, steps=(0, 5))
        cluster = Cluster(c)
        cluster.run()
        m = cluster.metrics
        trained = sum(m.step_tokens)
        done = sum(t.target for t in cluster.trajs.values() if t.state == 3)  # not trained yet
        assert all(t.state != GONE for t in cluster.trajs.values())
        assert m.generated_tokens == trained + m.wasted_tokens + done
