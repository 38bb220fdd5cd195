"""Held out by construction: for every registered arithmetic kind, training never draws a
held-out problem under any seed, and the held-out set lists distinct problems. Kinds too small
to hold problems out are evaluated on train problems, and say so."""

import ml_collections
import pytest

from asyncrl.config_args import ConfigError
from asyncrl.data.arithmetic import (KINDS, MIN_SPACE_FOR_HELDOUT, ArithmeticTask,
                                     DistinctProblems, PromptCursor, heldout_part)
from asyncrl.data.heldout import HELDOUT, TRAIN_SET
from asyncrl.data.sources import build_task_data
from asyncrl.accuracy import EvalResult, describe

SEEDS = (0, 1, 2, 3, 4)
TRAIN_DRAWS = 5_000  # per kind, spread over SEEDS


def canonical(problem):
    return problem.kind, problem.operands


def arithmetic_task(kinds, seed=0, style="compact"):
    return ml_collections.ConfigDict({"dataset": "arithmetic", "kinds": tuple(kinds),
                                      "seed": seed, "style": style})


def train_draws(kinds, draws=TRAIN_DRAWS):
    per_seed = draws // len(SEEDS)
    return [p for seed in SEEDS for p in ArithmeticTask(seed, tuple(kinds)).take(0, per_seed)]


SPLITTABLE = [name for name in KINDS.names() if KINDS.get(name).has_heldout]
TOO_SMALL = [name for name in KINDS.names() if not KINDS.get(name).has_heldout]


def test_the_registry_says_how_many_problems_each_kind_has():
    sizes = {name: KINDS.get(name).size for name in KINDS.names()}
    assert sizes["add1"] == 100 and sizes["add2"] == 90 * 90 and sizes["echo1"] == 10
    assert "echo1" in TOO_SMALL and {"add1", "add2", "add3", "mul21"} <= set(SPLITTABLE)
    for name in KINDS.names():
        kind = KINDS.get(name)
        # The size is the space the problems really come from.
        drawn = {p.operands for p in ArithmeticTask(0, (name,)).take(0, 300)}
        assert all(0 <= kind.index_of(o) < kind.size and kind.operands_at(kind.index_of(o)) == o
                   for o in drawn)


@pytest.mark.parametrize("name", KINDS.names())
def test_training_never_draws_a_heldout_problem(name):
    kind = KINDS.get(name)
    trained = {canonical(p) for p in train_draws((name,))}
    if not kind.has_heldout:
        assert kind.size < MIN_SPACE_FOR_HELDOUT and len(heldout_part(kind)) == 0
        with pytest.raises(ValueError,
                           match=f"no held-out split .*{name} has {kind.size} problems"):
            ArithmeticTask(0, (name,), "heldout")
        return
    heldout = ArithmeticTask(0, (name,), "heldout")
    assert len(heldout) == len(heldout_part(kind)) >= 1
    problems = heldout.take(0, len(heldout))  # the largest held-out set a run may ask for
    held = [canonical(p) for p in problems]
    assert len(set(held)) == len(held), "the held-out set repeats a problem"
    assert not trained & set(held), "training drew a held-out problem"
    assert {kind.index_of(o) for _, o in held} == set(heldout_part(kind).tolist())
    # The part is the kind's, not the seed's: another seed orders the same problems.
    other = ArithmeticTask(7, (name,), "heldout")
    assert {canonical(p) for p in other.take(0, len(other))} == set(held)
    with pytest.raises(IndexError, match=f"holds {len(heldout)} distinct problems"):
        heldout[len(heldout)]


def test_mixed_kinds_give_distinct_heldout_problems_in_turns():
    kinds = ("add1", "mul21", "add2", "add1")
    heldout = ArithmeticTask(3, kinds, "heldout")
    problems = heldout.take(0, len(heldout))
    assert len(heldout) == 10 + 90 + 810  # add1 named twice is still one part
    assert len({canonical(p) for p in problems}) == len(problems)
    assert not {canonical(p) for p in train_draws(kinds)} & {canonical(p) for p in problems}
    # The first problems mix the kinds evenly, as training does.
    assert [p.kind for p in problems[:6]] == ["add1", "mul21", "add2"] * 2


def test_problems_are_a_pure_function_of_seed_split_and_index():
    for split in ("train", "heldout"):
        task = ArithmeticTask(5, ("add2", "sub2"), split)
        problems = task.take(0, 40)
        again = ArithmeticTask(5, ("add2", "sub2"), split)
        # A checkpoint stores prompt ids: each gives its problem back, in any order.
        assert [again[p.prompt_id] for p in reversed(problems)] == problems[::-1]
    cursor = PromptCursor(ArithmeticTask(5, ("add1",)))
    first = [next(cursor) for _ in range(30)]
    resumed = PromptCursor(ArithmeticTask(5, ("add1",)))
    resumed.load_state_dict(cursor.state_dict())
    assert next(resumed) == ArithmeticTask(5, ("add1",))[30] and len(first) == 30


def test_a_heldout_size_beyond_the_heldout_part_names_the_field_kinds_and_count():
    data = build_task_data(arithmetic_task(("add1",)), 10, "/nowhere")
    assert data.heldout_disjoint and data.eval_label == HELDOUT and len(data.heldout) == 10
    with pytest.raises(ConfigError, match=r"config.eval.heldout_size = 200 is more than the 10 "
                                          r"distinct held-out problems of config.task.kinds = "
                                          r"\('add1',\) \(held out per kind: add1: 10 of 100\)"
                                          r".*add2 \(810\)"):
        build_task_data(arithmetic_task(("add1",)), 200, "/nowhere")


def test_echo1_is_evaluated_on_train_problems_and_labelled_train_set(caplog):
    data = build_task_data(arithmetic_task(("echo1",)), 25, "/nowhere")
    assert not data.heldout_disjoint and data.eval_label == TRAIN_SET
    assert "train-set accuracy" in caplog.text and "echo1 has 10 problems" in caplog.text
    assert "repeats them" in caplog.text  # 25 asked of 10 distinct problems
    problems = data.heldout.take(0, 25)
    assert len({canonical(p) for p in problems[:10]}) == 10  # each once before any repeats
    assert {canonical(p) for p in problems} <= {canonical(p) for p in train_draws(("echo1",))}
    result = EvalResult(accuracy=0.5, mean_length=1.0, format_rate=None, num_problems=25,
                        seconds=0.0, eval_label=data.eval_label)
    assert describe(result).startswith("train-set accuracy 0.500 on 25 problems")
    # One kind too small makes the whole evaluation train-set: no mixed set claims held-out.
    mixed = build_task_data(arithmetic_task(("echo1", "add2")), 8, "/nowhere")
    assert mixed.eval_label == TRAIN_SET and isinstance(mixed.heldout, DistinctProblems)
    mixed_problems = mixed.heldout.take(0, 8)
    assert {p.kind for p in mixed_problems} == {"echo1", "add2"}
    add2_held_out = set(heldout_part(KINDS.get("add2")).tolist())
    assert not {KINDS.get("add2").index_of(p.operands) for p in mixed_problems
                if p.kind == "add2"} & add2_held_out
