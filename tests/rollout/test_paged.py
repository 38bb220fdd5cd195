"""The paged engine against the contiguous one: same keys, same tokens, fewer bytes held.

Every run here feeds the same requests through `_serve` (continuous refill, GRPO groups,
preemption handed back and resumed like the coordinator would), so a difference in tokens
can only come from how the cache is held and read. Engines are built once per module.
"""

import queue

import jax.numpy as jnp
import numpy as np
import pytest

from asyncrl.model import ModelConfig, apply_hidden, init_params
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.instance import RolloutInstance
from asyncrl.rollout.messages import Trajectory, Work
from asyncrl.model.paged import BACKENDS
from asyncrl.rollout.pages import ATTENTION_BACKENDS, OutOfPages, PageTable
from asyncrl.model.sampling import SamplingParams
from asyncrl.rollout.slots import Slots
from asyncrl.train.trainer import _token_logprobs

CONFIG = ModelConfig.tiny()
MAX_LEN, PAGE = 48, 8
BUCKETS = (8, 16)
SLOTS = 6
# (prompt length, group size, budget): lengths on and off page boundaries, groups of 1-3.
REQUESTS = [(3, 1, 6), (8, 3, 16), (11, 2, 9), (16, 1, 30), (5, 3, 7), (9, 1, 12), (13, 2, 20)]


@pytest.fixture(scope="module")
def model():
    return init_params(CONFIG, seed=0)


def _engine(model, temperature, **kv):
    return Engine(model[0], CONFIG, num_slots=SLOTS, max_len=MAX_LEN, prompt_buckets=BUCKETS,
                  sampling=SamplingParams(temperature=temperature), stop_tokens=(),
                  max_new_tokens=MAX_LEN, seed=3, **kv)


@pytest.fixture(scope="module")
def engines(model):
    return {
        "contiguous": _engine(model, 1.0),
        "paged": _engine(model, 1.0, page_size=PAGE),
        "paged_k4": _engine(model, 1.0, page_size=PAGE, decode_steps=4),
        # 10 pages of 8: one sequence at full length and a bit; six slots must wait and preempt.
        "paged_short": _engine(model, 1.0, page_size=PAGE, num_pages=10, decode_steps=2),
        "greedy_contiguous": _engine(model, 0.0),
        "greedy_paged": _engine(model, 0.0, page_size=PAGE, num_pages=8, decode_steps=3),
    }


def _serve(engine, params, requests=REQUESTS, behind=0):
    """All requests through `engine` with refill; preempted sequences go to the back of the
    queue and resume; `behind`=1 reads each dispatch after the next one is queued, as an
    instance does. Returns ({trajectory id: record}, preemptions, the slots' records)."""
    rng = np.random.default_rng(0)
    queue_, next_id = [], 0
    for n, g, budget in requests:
        prompt = rng.integers(3, engine.config.vocab_size, size=n).astype(np.int32)
        queue_.append([Trajectory(i, prompt, budget) for i in range(next_id, next_id + g)])
        next_id += g
    slots, state, done, preempted = Slots(engine), engine.init_decode_state(), {}, 0
    for _ in range(2000):
        if not queue_ and len(slots.free_slots()) == engine.num_slots:
            break
        while queue_:
            work, free = queue_[0], slots.free_slots()
            length = len(work[0].prompt) + len(work[0].tokens)
            budget = work[0].max_new_tokens - len(work[0].tokens)
            if len(free) < len(work) or not slots.admits(length, len(work), budget):
                break
            state = slots.start(params, state, queue_.pop(0), free[:len(work)], version=0)
        for record in slots.preempt():
            preempted += 1
            queue_.append([record])
        state = slots.step(params, state, version=0)
        for record in slots.pop_finished(behind=behind):
            done[record.trajectory_id] = record
    assert not queue_ and not slots.running(), "the workload did not finish"
    return done, preempted, slots


class _Runs(dict):
    """name -> `_serve`'s result, run when a test first asks: the test workers split the
    tests, and each runs only the workloads its tests read."""

    def __init__(self, serve):
        super().__init__()
        self._serve = serve

    def __missing__(self, name):
        self[name] = self._serve(name)
        return self[name]


@pytest.fixture(scope="module")
def served(model, engines):
    def serve(name):
        if name == "paged_short_behind":  # the host one dispatch behind, preempting, k = 2
            return _serve(engines["paged_short"], model[1], behind=1)
        return _serve(engines[name], model[1])

    return _Runs(serve)


def test_paged_tokens_match_the_contiguous_engine_under_the_same_keys(served):
    reference, _, _ = served["contiguous"]
    assert len(reference) == sum(g for _, g, _ in REQUESTS)
    for name in ("paged", "paged_k4", "paged_short", "paged_short_behind"):
        records, _, _ = served[name]
        assert sorted(records) == sorted(reference), name
        for tid, record in records.items():
            assert record.tokens == reference[tid].tokens, (name, tid)
            np.testing.assert_allclose(record.logprobs, reference[tid].logprobs, atol=2e-5)
            np.testing.assert_allclose(record.policy_logprobs, reference[tid].policy_logprobs,
                                       atol=2e-5)


def test_greedy_paged_with_preemption_matches_contiguous(served):
    reference, _, _ = served["greedy_contiguous"]
    records, preempted, _ = served["greedy_paged"]
    assert preempted > 0, "the short pool should have forced a preemption"
    assert {t: r.tokens for t, r in records.items()} == {t: r.tokens for t, r in reference.items()}


@pytest.mark.parametrize("name", ["paged_short", "paged_short_behind"])
def test_a_short_pool_preempts_and_loses_nothing(served, name):
    records, preempted, slots = served[name]
    assert preempted > 0
    for (n, g, budget), first in zip(REQUESTS, np.cumsum([0] + [g for _, g, _ in REQUESTS])):
        for tid in range(first, first + g):
            assert len(records[tid].tokens) == budget and records[tid].finish_reason == "length"
    table = slots.pages
    assert table.free == table.num_pages and not table.slots, "pages leaked"
    assert (table.refs == 0).all()


def test_reading_one_dispatch_behind_leaves_the_newest_unread(model, engines):
    """`pop_finished(behind=1)` right after a dispatch reads the ones before it: a
    trajectory that finishes in the newest comes out of the next call, whole."""
    engine, params = engines["paged"], model[1]
    slots, state = Slots(engine), engine.init_decode_state()
    state = slots.start(params, state, [Trajectory(0, np.arange(3, 9, dtype=np.int32), 2)],
                        [0], version=0)  # the prefill draws one token, one dispatch the last
    state = slots.step(params, state, version=0)
    assert slots.pop_finished(behind=1) == []
    assert len(slots.records()[0].tokens) == 1  # the prefill's token was read
    state = slots.step(params, state, version=1)  # the slot's row is done on device
    (record,) = slots.pop_finished(behind=1)
    assert len(record.tokens) == 2 and record.versions == [0, 0]
    assert slots.pop_finished() == [] and slots.pages.used == 0


def test_a_group_shares_its_prompt_pages(model, engines):
    engine, params = engines["paged"], model[1]
    slots, state = Slots(engine), engine.init_decode_state()
    pages = slots.pages
    before = pages.free
    prompt = np.arange(3, 3 + 13, dtype=np.int32)  # one full page of 8 and 5 positions more
    group = [Trajectory(i, prompt, 4) for i in (70, 71, 72)]
    state = slots.start(params, state, group, [0, 2, 4], version=0)
    # One shared full page and a private copy of the partly filled one each: 4, not 6.
    assert before - pages.free == 1 + 3
    shared = pages.slots[0].pages[0]
    assert pages.refs[shared] == 3
    assert [pages.slots[s].pages[0] for s in (2, 4)] == [shared, shared]
    state = slots.step(params, state, version=0)
    while slots.running():
        state = slots.step(params, state, version=0)
    assert len(slots.pop_finished()) == 3
    assert pages.free == before and pages.refs[shared] == 0


def test_admission_waits_for_pages_and_generate_refuses_to_overrun(model, engines):
    engine, params = engines["paged_short"], model[1]
    slots, state = Slots(engine), engine.init_decode_state()
    prompt = np.arange(3, 19, dtype=np.int32)  # 16 positions: 2 pages each
    started = 0
    while slots.admits(16, 1, 32) and slots.free_slots():
        state = slots.start(params, state, [Trajectory(started, prompt, 32)],
                            slots.free_slots()[:1], version=0)
        started += 1
    assert 0 < started < SLOTS and not slots.admits(16, 1, 32)
    with pytest.raises(OutOfPages):
        slots.start(params, state, [Trajectory(started, prompt, 32)], slots.free_slots()[:1],
                    version=0)
    with pytest.raises(OutOfPages):
        for _ in range(40):  # the running sequences outgrow the pool: never a silent overrun
            state = slots.step(params, state, version=0)
            slots.pop_finished()
    victims = slots.preempt()
    assert victims and all(v.finish_reason is None and v.tokens for v in victims)
    state = slots.step(params, state, version=0)
    for slot in list(slots.running()):
        slots.free(slot)
    slots.pop_finished()
    assert slots.pages.free == slots.pages.num_pages, "freed slots keep no pages"


def test_a_dispatch_sends_the_columns_its_rows_hold_pages_in():
    """The gather reads what the table sends: the most pages a row holds, rounded up to a
    power of two, never more than the table has (and at least one column)."""
    from asyncrl.rollout.engine import live_width

    none = 10  # the pool's size: no page
    table = np.full((3, 6), none, np.int32)
    assert live_width(table, none) == 1
    table[0, :1] = [4]
    assert live_width(table, none) == 1
    table[1, :3] = [0, 1, 2]
    assert live_width(table, none) == 4
    table[2, :5] = [3, 5, 6, 7, 8]
    assert live_width(table, none) == 6  # 8 capped at the table's 6


def test_each_dispatch_names_the_width_it_sends(model, engines):
    """An instance's stall watch counts a call from the second of its kind on (the first
    compiles): a paged decode's kind names the columns the dispatch sends, predicted before
    the pages are topped up."""
    from asyncrl.rollout.engine import live_width

    engine, params = engines["paged_k4"], model[1]
    slots, state = Slots(engine), engine.init_decode_state()
    prompt = np.arange(3, 10, dtype=np.int32)  # 7 positions: one page, the next dispatch two
    state = slots.start(params, state, [Trajectory(0, prompt, 40)], [0], version=0)
    kinds = []
    while slots.running():
        kind = slots.dispatch_kind()
        state = slots.step(params, state, version=0)
        assert kind == f"decode/{live_width(slots.pages.table, engine.num_pages)}"
        kinds.append(kind)
        slots.pop_finished()
    assert kinds[0] == "decode/2" and kinds[-1] == "decode/6" and len(set(kinds)) == 3


def test_the_config_names_every_attention_backend_the_model_has():
    assert ATTENTION_BACKENDS == BACKENDS


def test_page_table_refcounts():
    table = PageTable(num_slots=3, num_pages=10, page_size=4, pages_per_row=8)
    shared, private = table.group_pages(length=9, group=3)  # 2 full pages, 1 position more
    assert len(shared) == 2 and len(private) == 3 and table.free == 5
    for g, slot in enumerate(range(3)):
        table.assign(slot, shared + private[g:g + 1], start=9, limit=32)
    assert list(table.table[1][:3]) == shared + [private[1]] and table.table[1][3] == 10
    table.top_up(steps=4, running=[0, 1, 2])  # positions up to 13: a fourth page each
    assert table.free == 2
    with pytest.raises(OutOfPages):
        table.top_up(steps=8, running=[0, 1, 2])  # 21 positions: 6 more pages, 2 free
    assert table.free == 2
    for slot in range(3):
        table.release_slot(slot)
    assert table.free == 10 and (table.refs == 0).all()
    assert table.prompt_pages_shared == 4 and table.prompt_pages_total == 9
    table.assign(0, table.take(1), start=3, limit=14)  # partial rollout off: all up front
    table.reserve_all(0)
    assert len(table.slots[0].pages) == 4 and table.shortfall(100, [0]) == {}


def test_a_kernel_that_cannot_take_the_model_is_refused_when_the_engine_is_built(model):
    with pytest.raises(ValueError, match="head_dim a multiple of 128, the model's is 16"):
        _engine(model, 1.0, page_size=PAGE, attention="tpu_ragged")


class _Sink:
    def __init__(self):
        self.reports = queue.Queue()

    def try_start(self, trajectory_id, at_step):
        return True

    def report(self, trajectory_id, tokens, logprobs, policy_logprobs, versions, finish_reason):
        self.reports.put((trajectory_id, list(tokens), finish_reason))
        return True


class _Events:
    def __init__(self, sink):
        self.sink, self.extracted_ids = sink, []

    def finished(self, instance, trajectory_ids): ...
    def synced(self, instance, version): ...

    def failed(self, instance, error):
        self.sink.reports.put(("failed", error, None))

    def extracted(self, instance, trajectory_ids):
        self.extracted_ids += trajectory_ids


def test_an_instance_hands_preempted_sequences_back_and_reports_its_pages(model, engines):
    """A pool too small for every slot at full length: the instance admits by pages, hands
    what it must preempt back as partial trajectories (the coordinator's resume path), and
    finishes the rest."""
    engine = engines["paged_short"]
    sink = _Sink()
    events = _Events(sink)
    instance = RolloutInstance(0, engine, lambda newer: (0, model[1]) if newer < 0 else None,
                               sink, events, partial_rollout=True)
    instance.start()
    outcomes = {}
    try:
        prompt = np.arange(3, 19, dtype=np.int32)
        for tid in range(SLOTS):
            instance.submit(Work([Trajectory(tid, prompt, 30)]))
        while len(outcomes) < SLOTS:
            tid, tokens, finish_reason = sink.reports.get(timeout=120)
            assert tid != "failed", f"instance failed: {tokens!r}"
            if finish_reason is None:  # handed back: resume it, as the coordinator would
                record = Trajectory(tid, prompt, 30, tokens=tokens, logprobs=[0.0] * len(tokens),
                                    policy_logprobs=[0.0] * len(tokens), versions=[0] * len(tokens))
                instance.submit(Work([record]))
            else:
                outcomes[tid] = (len(tokens), finish_reason)
        snapshot = instance.snapshot()
    finally:
        instance.stop()
    assert outcomes == {tid: (30, "length") for tid in range(SLOTS)}
    assert events.extracted_ids and snapshot.preemptions == len(events.extracted_ids)
    assert snapshot.kv_pages == 10 and snapshot.kv_capacity == 10 * PAGE


def test_bf16_paged_rollout_logprobs_match_the_trainers(model):
    """bf16 weights and a bf16 page pool; sampling and log-probs in float32. The behaviour
    log-probs agree with what the trainer computes for the same tokens from the same bf16
    weights (its hidden states and chunked log-softmax) within the bf16 logit tolerance the
    model's tests use."""
    config = CONFIG.replace(param_dtype="bfloat16")
    graphdef, params = init_params(config, seed=0)
    engine = Engine(graphdef, config, num_slots=2, max_len=MAX_LEN, prompt_buckets=(16,),
                    sampling=SamplingParams(temperature=1.0), stop_tokens=(), max_new_tokens=20,
                    seed=1, page_size=PAGE, decode_steps=4)
    assert engine.init_decode_state().cache.dtype == jnp.bfloat16
    records, _, _ = _serve(engine, params, requests=[(11, 2, 20)])
    for record in records.values():
        sequence = np.concatenate([record.prompt, record.tokens])[None].astype(np.int32)
        positions = np.arange(sequence.shape[1], dtype=np.int32)[None]
        hidden, table = apply_hidden(graphdef, params, sequence, positions)
        trainer, _ = _token_logprobs(hidden, table, jnp.asarray(sequence))
        trainer = np.asarray(trainer[0, len(record.prompt):], np.float32)
        np.testing.assert_allclose(record.logprobs, trainer, atol=5e-2)
        np.testing.assert_allclose(record.policy_logprobs, trainer, atol=5e-2)
