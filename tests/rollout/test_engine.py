"""Engine (and the host records of its slots) against full recomputation without a KV cache
(`apply(..., cache=None)`).

Every check is teacher-forced: one cache-free forward over prompt + generated tokens gives the
logits at every generated position, so "token i is the argmax at row i, for every i" is the
same statement as "greedy decoding by full recomputation produces these tokens", at one
forward per trajectory instead of one per token. Engines are built once per module.
"""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from asyncrl.model import ModelConfig, ShardingRules, apply, init_params, init_sharded
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.messages import Trajectory
from asyncrl.model.sampling import SamplingParams
from asyncrl.rollout.slots import Slots

MAX_LEN = 48
BUCKETS = (8, 16)
CONFIG = ModelConfig.tiny()


@pytest.fixture(scope="module")
def model():
    graphdef, params = init_params(CONFIG, seed=0)
    return graphdef, params


@pytest.fixture(scope="module")
def full_logits(model):
    """seq -> log-softmax [len(seq), V] of a cache-free forward (right-padded to one shape)."""
    graphdef, _ = model
    forward = jax.jit(lambda p, t, pos: apply(graphdef, p, t, pos)[0][0])

    def run(params, seq):
        seq = np.asarray(seq, np.int32)
        padded = np.zeros((1, MAX_LEN), np.int32)
        padded[0, :seq.size] = seq
        logits = forward(params, padded, np.arange(MAX_LEN, dtype=np.int32)[None])
        return np.asarray(jax.nn.log_softmax(logits[:seq.size]))

    return run


def _stop_probe(model, full_logits):
    """A prompt and a token its greedy continuation emits at step 3 and not before: using that
    token as a stop token makes the stop rule observable without knowing the weights."""
    prompt = [1, 9, 4, 4, 7]
    seq = list(prompt)
    for _ in range(4):
        seq.append(int(np.argmax(full_logits(model[1], seq)[-1])))
    generated = seq[len(prompt):]
    assert generated[3] not in generated[:3], "probe needs a fresh token at step 3"
    return prompt, generated[3]


@pytest.fixture(scope="module")
def greedy(model, full_logits):
    prompt, stop = _stop_probe(model, full_logits)
    engine = Engine(model[0], CONFIG, num_slots=4, max_len=MAX_LEN, prompt_buckets=BUCKETS,
                    sampling=SamplingParams(temperature=0.0), stop_tokens=(stop,),
                    max_new_tokens=16, seed=0)
    engine.stop_probe = prompt
    return engine


@pytest.fixture(scope="module")
def sampler(model):
    return Engine(model[0], CONFIG, num_slots=4, max_len=MAX_LEN, prompt_buckets=BUCKETS,
                  sampling=SamplingParams(temperature=1.0), stop_tokens=(), max_new_tokens=12,
                  seed=5)


def _log_softmax(x):
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def _prompt(rng, n):
    return rng.integers(3, CONFIG.vocab_size, size=n).astype(np.int32)


def _rows(traj):
    """Rows of the full forward over prompt + tokens[:-1] that predict each generated token."""
    start = traj.prompt.size - 1
    return np.arange(start, start + len(traj.tokens))


def _check_greedy(traj, full_logits, params, rows=None):
    """Tokens are the argmax and both log-probs the full forward's, at the given rows."""
    logp = full_logits(params, np.concatenate([traj.prompt, traj.tokens[:-1]]))
    rows = _rows(traj) if rows is None else rows
    which = rows - _rows(traj)[0]  # indices into the generated tokens
    tokens = np.asarray(traj.tokens)[which]
    np.testing.assert_array_equal(tokens, np.argmax(logp[rows], -1))
    expected = logp[rows, tokens]
    np.testing.assert_allclose(np.asarray(traj.policy_logprobs)[which], expected, atol=1e-4)
    np.testing.assert_allclose(np.asarray(traj.logprobs)[which], expected, atol=1e-4)


def _start(slots, params, state, prompt, ids, at, *, budget=None, version=0):
    """Starts trajectories `ids` (one, or a group sharing `prompt`) in slots `at`."""
    ids = [ids] if isinstance(ids, int) else ids
    at = [at] if isinstance(at, int) else at
    budget = slots.engine.max_new_tokens if budget is None else budget
    group = [Trajectory(i, np.asarray(prompt, np.int32), budget) for i in ids]
    return slots.start(params, state, group, at, version=version)


def _run(slots, params, state, *, version=0, steps=None):
    """Steps until every slot is idle (or `steps` times); returns state and finished records."""
    finished = []
    for _ in range(steps or 10 * MAX_LEN):
        if steps is None and not slots.running():
            break
        state = slots.step(params, state, version=version)
        finished += slots.pop_finished()
    return state, finished


def test_greedy_with_staggered_inserts_matches_full_recomputation(model, greedy, full_logits):
    _, params = model
    rng = np.random.default_rng(0)
    # Lengths straddle both buckets (8 exactly, 16 = the largest); budgets stagger the finishes.
    requests = [(_prompt(rng, n), budget) for n, budget in
                [(3, 6), (8, 16), (11, 9), (16, 16), (5, 7), (9, 12)]]
    requests.append((np.asarray(greedy.stop_probe, np.int32), 16))
    slots, state = Slots(greedy), greedy.init_decode_state()
    queue, finished, tid = list(requests), [], 0
    while queue or slots.running():
        # Refill at most one slot per step, so inserts land at different times and reuse
        # slots whose caches still hold an earlier trajectory's keys and values.
        free = slots.free_slots()
        if queue and free:
            prompt, budget = queue.pop(0)
            state = _start(slots, params, state, prompt, tid, free[-1], budget=budget)
            tid += 1
        state = slots.step(params, state, version=0)
        finished += slots.pop_finished()
    assert sorted(t.trajectory_id for t in finished) == list(range(len(requests)))
    for traj in finished:
        prompt, budget = requests[traj.trajectory_id]
        np.testing.assert_array_equal(traj.prompt, prompt)
        _check_greedy(traj, full_logits, params)
        assert traj.versions == [0] * len(traj.tokens)
        # Greedy recomputation ends at the first stop token, else at the budget.
        stops = [i for i, t in enumerate(traj.tokens) if t in greedy.stop_tokens]
        if stops:
            assert stops == [len(traj.tokens) - 1] and traj.finish_reason == "stop"
        else:
            assert len(traj.tokens) == budget and traj.finish_reason == "length"
    probe = next(t for t in finished if t.trajectory_id == len(requests) - 1)
    assert probe.finish_reason == "stop" and len(probe.tokens) == 4


def test_params_swap_mid_sequence_uses_new_params_and_version(model, greedy, full_logits):
    _, params = model
    # New weights that differ only in the unembedding: the KV of earlier tokens is then the same
    # under both, so full recomputation with the new weights is the exact reference.
    assert not CONFIG.tie_embeddings
    other = init_params(CONFIG, seed=1)[1]
    swapped = jax.tree_util.tree_map_with_path(
        lambda path, a, b: b if "lm_head" in jax.tree_util.keystr(path) else a, params, other)
    prompt = _prompt(np.random.default_rng(1), 6)
    slots, state = Slots(greedy), greedy.init_decode_state()
    state = _start(slots, params, state, prompt, 0, 2, budget=14, version=3)
    state, _ = _run(slots, params, state, version=3, steps=5)
    state, (traj,) = _run(slots, swapped, state, version=4)
    assert traj.versions == [3] * 6 + [4] * 8
    rows = _rows(traj)
    _check_greedy(traj, full_logits, params, rows[:6])
    _check_greedy(traj, full_logits, swapped, rows[6:])
    # The swap matters: the old weights would have continued differently.
    seq = np.concatenate([traj.prompt, traj.tokens[:-1]])
    old_choice = np.argmax(full_logits(params, seq)[rows[6:]], -1)
    assert not np.array_equal(old_choice, np.asarray(traj.tokens[6:]))


def test_extract_and_resume_elsewhere_continues_the_trajectory(model, greedy, full_logits):
    _, params = model
    prompt = _prompt(np.random.default_rng(2), 10)
    slots, state = Slots(greedy), greedy.init_decode_state()
    state = _start(slots, params, state, prompt, 7, 0, budget=16)
    state, _ = _run(slots, params, state, steps=7)
    partial = slots.extract(0)
    assert partial.finish_reason is None and len(partial.tokens) == 8
    # Keep stepping: the vacated slot must not credit the extracted record any more.
    state, _ = _run(slots, params, state, steps=2)
    assert len(partial.tokens) == 8
    # Prompt + tokens so far = 18 > the largest bucket: the resume prefills in two chunks.
    state = slots.start(params, state, [partial], [3], version=1)
    state, (traj,) = _run(slots, params, state, version=1)
    assert traj.trajectory_id == 7 and traj.finish_reason == "length"
    assert traj.tokens[:8] == partial.tokens and len(traj.tokens) == 16
    assert traj.versions == [0] * 8 + [1] * 8
    _check_greedy(traj, full_logits, params)


def test_same_trajectory_id_draws_same_tokens_in_any_slot_or_engine(model, sampler, full_logits):
    graphdef, params = model
    rng = np.random.default_rng(3)
    prompt, others = _prompt(rng, 7), [_prompt(rng, n) for n in (4, 12, 9)]

    def alone():
        slots, state = Slots(sampler), sampler.init_decode_state()
        state = _start(slots, params, state, prompt, 42, 0)
        return _run(slots, params, state)[1][0]

    def crowded():
        slots, state = Slots(sampler), sampler.init_decode_state()
        for slot, other in enumerate(others):
            state = _start(slots, params, state, other, 100 + slot, slot)
        state, _ = _run(slots, params, state, steps=3)
        state = _start(slots, params, state, prompt, 42, 3)
        return next(t for t in _run(slots, params, state)[1] if t.trajectory_id == 42)

    small = Engine(graphdef, CONFIG, num_slots=2, max_len=MAX_LEN, prompt_buckets=BUCKETS,
                   sampling=sampler.sampling, stop_tokens=(), max_new_tokens=12, seed=sampler.seed)
    slots, state = Slots(small), small.init_decode_state()
    state = _start(slots, params, state, prompt, 42, 1)
    elsewhere = _run(slots, params, state)[1][0]

    reference = alone()
    assert crowded().tokens == reference.tokens == elsewhere.tokens
    # Temperature 1 without truncation samples the policy itself: both log-probs are its own.
    logp = full_logits(params, np.concatenate([prompt, reference.tokens[:-1]]))
    expected = logp[_rows(reference), reference.tokens]
    np.testing.assert_allclose(reference.logprobs, expected, atol=1e-4)
    np.testing.assert_allclose(reference.policy_logprobs, expected, atol=1e-4)
    # And the id is what matters: another id on the same prompt draws differently.
    slots, state = Slots(sampler), sampler.init_decode_state()
    state = _start(slots, params, state, prompt, 43, 0)
    assert _run(slots, params, state)[1][0].tokens != reference.tokens


def test_decoding_never_consumes_the_params(model, sampler):
    # Colocated instances decode with a reference to the parameter server's copy
    # (asyncrl/servers/parameters.py): an engine that donated params would delete it.
    params = jax.tree.map(lambda x: x.copy(), model[1])
    slots, state = Slots(sampler), sampler.init_decode_state()
    state = _start(slots, params, state, _prompt(np.random.default_rng(5), 9), 7, 0)
    state, _ = _run(slots, params, state, steps=2)
    state = slots.start(params, state, [slots.extract(0)], [1], version=1)
    _run(slots, params, state, steps=2)
    assert not any(x.is_deleted() for x in jax.tree.leaves(params))


def test_group_prefill_with_top_k_reports_truncated_logprobs(model, full_logits):
    graphdef, params = model
    sampling = SamplingParams(temperature=0.05, top_k=4)
    engine = Engine(graphdef, CONFIG, num_slots=4, max_len=MAX_LEN, prompt_buckets=BUCKETS,
                    sampling=sampling, stop_tokens=(), max_new_tokens=10, seed=1)
    prompt = _prompt(np.random.default_rng(4), 12)
    # One prefill fanned out into a GRPO group of 3; slot 1 stays empty.
    prefix = engine.prefill(params, prompt, trajectory_ids=[10, 11, 12])
    assert prefix.group == 3 and prefix.tokens.shape == (3,)
    slots, state = Slots(engine), engine.init_decode_state()
    state = _start(slots, params, state, prompt, [10, 11, 12], [3, 0, 2])
    state, group = _run(slots, params, state)
    assert sorted(t.trajectory_id for t in group) == [10, 11, 12]
    assert len({tuple(t.tokens) for t in group}) == 3, "members must draw independently"
    for traj in group:
        logp = full_logits(params, np.concatenate([prompt, traj.tokens[:-1]]))[_rows(traj)]
        scaled = logp / sampling.temperature  # log-softmax only shifts rows; that cancels
        kth = np.sort(scaled, -1)[:, -sampling.top_k][:, None]
        truncated = _log_softmax(np.where(scaled >= kth, scaled, -np.inf))
        picked = np.arange(len(traj.tokens)), np.asarray(traj.tokens)
        assert np.isfinite(truncated[picked]).all(), "token outside the top-k"
        np.testing.assert_allclose(traj.logprobs, truncated[picked], atol=1e-3)
        np.testing.assert_allclose(traj.policy_logprobs, logp[picked], atol=1e-4)


def test_sharded_engine_matches_full_recomputation(full_logits):
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (tests/conftest.py fakes 8 CPU devices)")
    # Auto axes, like the model's own tests: the model relies on GSPMD propagation.
    mesh = jax.make_mesh((2,), ("tp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:2])
    rules = ShardingRules.tensor_parallel("tp")
    graphdef, params = init_sharded(CONFIG, 0, mesh, rules)
    engine = Engine(graphdef, CONFIG, num_slots=2, max_len=MAX_LEN, prompt_buckets=(16,),
                    sampling=SamplingParams(temperature=0.0), stop_tokens=(), max_new_tokens=6,
                    mesh=mesh, rules=rules)
    slots, state = Slots(engine), engine.init_decode_state()
    assert state.cache.k.sharding.spec[3] == "tp"  # kv heads split, as the rules say
    state = _start(slots, params, state, _prompt(np.random.default_rng(5), 9), 0, 1)
    state, (traj,) = _run(slots, params, state)
    assert state.cache.k.sharding.spec[3] == "tp"  # and stay so through donation
    _check_greedy(traj, full_logits, jax.device_get(params))


def test_errors_name_what_was_received(model, greedy):
    _, params = model
    with pytest.raises(ValueError, match=r"17 tokens.*largest prompt bucket \(16\)"):
        greedy.prefill(params, np.ones(17, np.int32), trajectory_ids=[0])
    with pytest.raises(ValueError, match=r"distinct ints in \[0, 2\*\*32\)"):
        greedy.prefill(params, [5, 6], trajectory_ids=[3, 3])
    with pytest.raises(ValueError, match="prefix has 1 trajectories, got 2 slots"):
        greedy.insert(greedy.prefill(params, [5, 6], trajectory_ids=[0]),
                      greedy.init_decode_state(), [0, 1])
    slots, state = Slots(greedy), greedy.init_decode_state()
    state = _start(slots, params, state, [5, 6], 0, 1, budget=1)
    with pytest.raises(ValueError, match="slot 1 holds trajectory 0"):
        _start(slots, params, state, [5, 6], 1, 1)
    with pytest.raises(ValueError, match="1 trajectories for 2 slots"):
        _start(slots, params, state, [5, 6], 1, [2, 3])
    with pytest.raises(ValueError, match="share one prompt"):
        slots.start(params, state, [Trajectory(1, np.asarray([5, 6]), 4),
                                    Trajectory(2, np.asarray([5, 7]), 4)], [2, 3], version=0)
    (done,) = slots.pop_finished()  # max_new_tokens=1: finished by its first token
    assert done.finish_reason == "length" and len(done.tokens) == 1
    with pytest.raises(ValueError, match="already finished"):
        slots.start(params, state, [done], [0], version=0)
    with pytest.raises(ValueError, match="slot 1 is empty"):
        slots.extract(1)
    with pytest.raises(ValueError, match="preemption must be one of"):
        Slots(greedy, preemption="oldest")
