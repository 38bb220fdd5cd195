"""The paged decode kernels (TPU: asyncrl/model/paged_tpu.py, GPU: asyncrl/model/paged_gpu.py),
run in Pallas' interpreter inside the real engine, against the gather backend: same keys,
same tokens, with finished slots refilled, preemption and 1 to 4 decode steps per dispatch.

The TPU kernel needs head_dim 128, so these engines use a tiny model of that head size;
every run serves the same requests through test_paged's `_serve`. Interpreted, a kernel
call costs milliseconds of host work per layer: the workload is small.
"""

import functools

import numpy as np
import pytest

from asyncrl.model import ModelConfig, init_params
from asyncrl.model.sampling import SamplingParams
from asyncrl.rollout.engine import Engine
from tests.rollout.test_paged import _serve

CONFIG = ModelConfig.tiny(head_dim=128)
MAX_LEN, PAGE, SLOTS = 32, 8, 4
# (prompt length, group size, budget): on and off page boundaries, groups of 1-2.
REQUESTS = [(3, 1, 6), (8, 2, 12), (11, 1, 9), (5, 2, 17), (9, 1, 4)]
# (temperature, steps per dispatch, pages): a pool of 6 pages holds 48 positions for four
# slots that want up to 28 each, so rows are preempted and resumed.
SETTINGS = {"sampled_k1": (1.0, 1, None), "sampled_k2_short": (1.0, 2, 6),
            "greedy_k3_short": (0.0, 3, 6), "sampled_k4": (1.0, 4, None)}


@pytest.fixture(scope="module")
def served():
    """(setting, backend) -> `_serve`'s result, each run once per process and only when a
    test asks for it: the test workers split the tests, not the interpreted runs."""
    graphdef, params = init_params(CONFIG, seed=0)

    @functools.cache
    def run(name, attention):
        temperature, steps, num_pages = SETTINGS[name]
        engine = Engine(graphdef, CONFIG, num_slots=SLOTS, max_len=MAX_LEN,
                        prompt_buckets=(8, 16), stop_tokens=(), max_new_tokens=MAX_LEN,
                        sampling=SamplingParams(temperature=temperature), seed=3,
                        page_size=PAGE, num_pages=num_pages, decode_steps=steps,
                        attention=attention)
        return _serve(engine, params, REQUESTS)

    return run


@pytest.mark.parametrize("backend", ["tpu_ragged", "gpu_paged"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_kernel_gives_the_gathers_tokens(served, name, backend):
    reference, _, _ = served(name, "gather")
    records, preempted, slots = served(name, backend)
    assert sorted(records) == sorted(reference)
    assert len(records) == sum(g for _, g, _ in REQUESTS)
    if name.endswith("_short"):
        assert preempted > 0, "the short pool should have forced a preemption"
    for tid, record in records.items():
        assert record.tokens == reference[tid].tokens, (name, tid)
        np.testing.assert_allclose(record.logprobs, reference[tid].logprobs, atol=1e-4)
    table = slots.pages
    assert table.free == table.num_pages and not table.slots, "pages leaked"


def test_a_kernel_named_off_its_platform_says_it_runs_interpreted(caplog):
    from asyncrl.model.paged import resolve_backend

    with caplog.at_level("WARNING", logger="asyncrl.model.paged"):
        assert resolve_backend("tpu_ragged", 128, "cpu") == "tpu_ragged"
    assert "Pallas' interpreter" in caplog.text and "tpu" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="asyncrl.model.paged"):
        assert resolve_backend("tpu_ragged", 128, "tpu") == "tpu_ragged"
    assert caplog.text == ""
