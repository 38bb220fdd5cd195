"""Three splits by construction: for every registered arithmetic kind, training never draws a
validation or test problem under any seed, validation and test share no problem, and each
lists distinct problems. Kinds too small to hold problems out are evaluated on train
problems, and say so."""

import ml_collections
import numpy as np
import pytest

from asyncrl.config_args import ConfigError
from asyncrl.data.arithmetic import (KINDS, MAX_SPACE, MIN_SPACE_FOR_HELDOUT, ArithmeticTask,
                                     DistinctProblems, PromptCursor, part_of)
from asyncrl.data.heldout import TEST, TRAIN_SET, VALIDATION
from asyncrl.data.sources import build_task_data
from asyncrl.eval.accuracy import EvalResult, describe

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


# ArithmeticTask(0, ("add2",), "heldout").take(0, 5) at commit 60e56cd, the last with one
# held-out split.
EARLIER_HELDOUT_ADD2_SEED0 = ["What is 64 + 82?", "What is 52 + 26?", "What is 79 + 19?",
                              "What is 28 + 22?", "What is 89 + 42?"]
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
def test_training_never_draws_a_validation_or_test_problem(name):
    kind = KINDS.get(name)
    trained = {canonical(p) for p in train_draws((name,))}
    if not kind.has_heldout:
        for split in ("validation", "test"):
            assert kind.size < MIN_SPACE_FOR_HELDOUT and len(part_of(kind, split)) == 0
            with pytest.raises(ValueError,
                               match=f"no {split} split .*{name} has {kind.size} problems"):
                ArithmeticTask(0, (name,), split)
        return
    held = {}
    for split in ("validation", "test"):
        task = ArithmeticTask(0, (name,), split)
        assert len(task) == len(part_of(kind, split)) >= 1
        problems = [canonical(p) for p in task.take(0, len(task))]  # the most a run may ask
        assert len(set(problems)) == len(problems), f"the {split} split repeats a problem"
        assert not trained & set(problems), f"training drew a {split} problem"
        assert {kind.index_of(o) for _, o in problems} == set(part_of(kind, split).tolist())
        # The part is the kind's, not the seed's: another seed orders the same problems.
        other = ArithmeticTask(7, (name,), split)
        assert {canonical(p) for p in other.take(0, len(other))} == set(problems)
        with pytest.raises(IndexError, match=f"holds {len(task)} distinct problems"):
            task[len(task)]
        held[split] = set(problems)
    assert not held["validation"] & held["test"]
    assert len(held["validation"]) == len(held["test"])
    # The three parts cover the kind's space (a kind too large to enumerate lists samples:
    # the test below).
    if kind.size <= MAX_SPACE:
        assert sum(len(part_of(kind, p)) for p in ("train", "validation", "test")) == kind.size


def test_the_test_split_is_what_earlier_versions_held_out():
    # Figures measured on the single held-out split before validation existed stay comparable:
    # the test split is that split, problem for problem and in the same order (add2, seed 0,
    # as the default task evaluates it).
    test = ArithmeticTask(0, ("add2",), "test").take(0, 5)
    assert [p.question for p in test] == EARLIER_HELDOUT_ADD2_SEED0


def test_mixed_kinds_give_distinct_heldout_problems_in_turns():
    kinds = ("add1", "mul21", "add2", "add1")
    heldout = ArithmeticTask(3, kinds, "test")
    problems = heldout.take(0, len(heldout))
    assert len(heldout) == 10 + 90 + 810  # add1 named twice is still one part
    assert len({canonical(p) for p in problems}) == len(problems)
    assert not {canonical(p) for p in train_draws(kinds)} & {canonical(p) for p in problems}
    # The first problems mix the kinds evenly, as training does.
    assert [p.kind for p in problems[:6]] == ["add1", "mul21", "add2"] * 2


def test_problems_are_a_pure_function_of_seed_split_and_index():
    for split in ("train", "validation", "test"):
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
    assert data.heldout_disjoint and len(data.validation) == len(data.test) == 10
    assert (data.eval_label("validation"), data.eval_label("test")) == (VALIDATION, TEST)
    with pytest.raises(ConfigError, match=r"config.eval.heldout_size = 200 is more than the 10 "
                                          r"distinct problems of each held-out split "
                                          r"\(validation, test\) of config.task.kinds = "
                                          r"\('add1',\) \(per kind and split: add1: 10 of 100\)"
                                          r".*add2 \(810\)"):
        build_task_data(arithmetic_task(("add1",)), 200, "/nowhere")


def test_echo1_is_evaluated_on_train_problems_and_labelled_train_set(caplog):
    data = build_task_data(arithmetic_task(("echo1",)), 25, "/nowhere")
    assert not data.heldout_disjoint
    assert data.eval_label("validation") == data.eval_label("test") == TRAIN_SET
    assert "train-set accuracy" in caplog.text and "echo1 has 10 problems" in caplog.text
    assert "repeats them" in caplog.text  # 25 asked of 10 distinct problems
    problems = data.validation.take(0, 25)
    assert len({canonical(p) for p in problems[:10]}) == 10  # each once before any repeats
    assert {canonical(p) for p in problems} <= {canonical(p) for p in train_draws(("echo1",))}
    result = EvalResult(accuracy=0.5, mean_length=1.0, format_rate=None, num_problems=25,
                        seconds=0.0, eval_label=data.eval_label("validation"))
    assert describe(result).startswith("train-set accuracy 0.500 on 25 problems")
    # One kind too small makes the whole evaluation train-set: no mixed set claims held-out.
    mixed = build_task_data(arithmetic_task(("echo1", "add2")), 8, "/nowhere")
    assert mixed.eval_label("test") == TRAIN_SET and isinstance(mixed.test, DistinctProblems)
    mixed_problems = mixed.test.take(0, 8)
    assert {p.kind for p in mixed_problems} == {"echo1", "add2"}
    add2_held_out = {*part_of(KINDS.get("add2"), "validation").tolist(),
                     *part_of(KINDS.get("add2"), "test").tolist()}
    assert not {KINDS.get("add2").index_of(p.operands) for p in mixed_problems
                if p.kind == "add2"} & add2_held_out


def test_a_kind_too_large_to_enumerate_is_partitioned_problem_by_problem():
    """mul44 has 81 million problems: each one's part is where its hash falls, so training
    refuses every held-out problem, not only those of the listed sample; each held-out part
    lists a fixed sample of PART_SAMPLE, the same for every seed."""
    from asyncrl.data.arithmetic import PART_SAMPLE, _parts_by_hash

    kind = KINDS.get("mul44")
    assert kind.size == 9000 ** 2 > MAX_SPACE
    drawn = np.asarray([kind.index_of(p.operands) for p in train_draws(("mul44",))])
    assert set(_parts_by_hash(kind, drawn).tolist()) == {2}
    for code, split in enumerate(("test", "validation")):
        listed = part_of(kind, split)
        assert len(listed) == PART_SAMPLE and (_parts_by_hash(kind, listed) == code).all()
    # About a tenth of the space in each held-out part.
    share = np.bincount(_parts_by_hash(kind, np.arange(0, kind.size, 997)), minlength=3)
    assert abs(share[0] / share.sum() - 0.1) < 0.01 and abs(share[1] / share.sum() - 0.1) < 0.01
