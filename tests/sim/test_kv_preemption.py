"""A KV capacity per instance, with vLLM-style recompute preemption."""

import json

import pytest

from asyncrl.sim.cluster import Cluster
from asyncrl.sim.instance import DONE
from asyncrl.profiles import PROFILE_DIR
from asyncrl.sim.profile import Profile

from tests.sim.helpers import tiny


def _small_cache(tmp_path, tokens: int) -> str:
    with open(f"{PROFILE_DIR}/qwen2p5_14b_h100_tp1.json") as f:
        d = json.load(f)
    d["instance"]["kv_capacity_tokens"] = tokens
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(d))
    return str(path)


def test_the_paper_profiles_have_a_cache():
    assert Profile.load("qwen2p5_14b_h100_tp1.json").kv_capacity_tokens == 190_000
    assert Profile.load("qwen2p5_7b_8xh100.json").kv_capacity_tokens == 0  # unlimited


@pytest.mark.parametrize("system", ["staleflow", "areal", "slime"])
def test_a_full_cache_evicts_and_every_token_still_counts(tmp_path, system):
    c = tiny(system, instances=2, eta=1, batch=6, group=4, slots=16, steps=(0, 5),
             response={"name": "lognormal", "median": 400.0, "sigma": 0.6, "cap": 1500})
    c.profile = _small_cache(tmp_path, 3000)
    cluster = Cluster(c)
    r = cluster.run()
    assert r.preemptions > 0 and r.reprefill_per_step > 0
    assert sum(r.staleness_hist.values()) == 5 * c.batch_size
    if system == "staleflow":
        assert r.max_staleness <= 1
    m = cluster.metrics
    done = sum(t.target for t in cluster.trajs.values() if t.state == DONE)
    assert m.generated_tokens == sum(m.step_tokens) + m.wasted_tokens + done
    for inst in cluster.instances:  # never more than the cache, but for one lone sequence
        assert inst.kv_tokens <= 3000 or inst.num_running == 1


def test_without_a_cache_limit_nothing_is_evicted():
    r = Cluster(tiny(instances=2, eta=1, batch=6, group=4, slots=16, steps=(0, 3))).run()
    assert r.preemptions == 0
