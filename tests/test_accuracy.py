import dataclasses
import fractions
import itertools
import math

import ml_collections
import pytest

from asyncrl.data.heldout import TEST, TRAIN_SET, VALIDATION
from asyncrl.data.sources import build_task_data
from asyncrl.eval.accuracy import EvalResult, describe, grade_in_pool, pass_at_k
from asyncrl.rewards import RewardPool


def closed_form(n, c, k):
    """1 - C(n-c, k) / C(n, k), exactly (math.comb is 0 when n - c < k)."""
    return float(1 - fractions.Fraction(math.comb(n - c, k), math.comb(n, k)))


def test_pass_at_k_matches_the_closed_form_for_every_small_case():
    for n in range(1, 13):
        for c, k in itertools.product(range(n + 1), range(1, n + 1)):
            assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), rel=1e-12, abs=1e-15)


def test_pass_at_k_stays_exact_where_the_binomials_overflow_floats():
    # C(2000, 600) is far beyond float range; the product form never forms it.
    for n, c, k in [(2000, 3, 600), (2000, 1000, 10), (1000, 1, 1), (1000, 0, 500)]:
        assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), rel=1e-9, abs=1e-15)


def test_pass_at_k_known_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the fraction correct
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 8, 3) == 1.0  # only 2 wrong samples: any 3 hold a correct one
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 3 of the 6 pairs hold the correct one
    values = [pass_at_k(20, 2, k) for k in range(1, 21)]
    assert values == sorted(values)  # more attempts never lower the chance


@pytest.mark.parametrize("n, c, k, message", [
    (5, 1, 0, r"k must be in \[1, n=5\], got 0"),
    (5, 1, 6, r"k must be in \[1, n=5\], got 6"),
    (5, 6, 1, r"c \(correct samples\) must be in \[0, n=5\], got 6"),
    (5, -1, 1, r"c \(correct samples\) must be in \[0, n=5\], got -1"),
])
def test_pass_at_k_rejects_impossible_counts(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def result_with(**changes):
    figures = {"accuracy": 0.25, "mean_length": 3.0, "format_rate": 0.5, "num_problems": 8,
               "seconds": 1.0, "pass_at": {1: 0.25}, "samples": 2}
    return EvalResult(**{**figures, **changes})


def test_results_say_which_set_they_were_measured_on():
    validation, test = result_with(), result_with(eval_label=TEST)
    train_set = result_with(eval_label=TRAIN_SET)
    assert validation.eval_label == VALIDATION  # the default: what periodic evaluations read
    assert describe(validation).startswith("validation accuracy 0.250 on 8 problems, pass@1 0.250")
    assert describe(test).startswith("test accuracy 0.250 on 8 problems")
    assert describe(train_set).startswith("train-set accuracy 0.250 on 8 problems")
    assert train_set.as_dict("eval") == {"eval_accuracy": 0.25, "eval_mean_length": 3.0,
                                         "eval_label": "train-set", "eval_format_rate": 0.5,
                                         "eval_pass@1": 0.25, "eval_cut_rate": 0.0,
                                         "eval_grader_errors": 0}
    assert dataclasses.asdict(train_set)["eval_label"] == "train-set"  # the results.json entry
    with pytest.raises(ValueError, match=r"label must be one of \('validation', 'test', "
                                         r"'train-set'\), got 'held-out'"):
        result_with(eval_label="held-out")


def test_the_task_data_labels_each_split_it_evaluates():
    def task(*kinds):
        return ml_collections.ConfigDict({"dataset": "arithmetic", "kinds": kinds, "seed": 0,
                                          "style": "compact"})

    split = build_task_data(task("add1"), 4, "/nowhere")
    assert [split.eval_label(name) for name in ("validation", "test")] == [VALIDATION, TEST]
    too_small = build_task_data(task("echo1"), 4, "/nowhere")
    assert [too_small.eval_label(name) for name in ("validation", "test")] == [TRAIN_SET] * 2
    with pytest.raises(ValueError, match=r"evaluation split must be one of \('validation', "
                                         r"'test'\), got 'train'"):
        split.eval_label("train")


def test_a_response_the_grader_fails_on_scores_0_is_counted_and_grading_goes_on():
    # Evaluation grades in reward workers: a response that makes the grader raise (here a
    # stand-in for math-verify past its time limit on a power tower) is one 0, with its reason.
    tower = r"\boxed{9^{9^{9^{9}}}}"
    with RewardPool(num_workers=2, timeout_s=5.0, plugins=("tests.rewards._hostile",)) as pool:
        graded = grade_in_pool(pool, "test_chokes_on_tower", ["7", tower, "8", "7"], ["7"] * 4)
        assert graded.scores == [1.0, 0.0, 0.0, 1.0]
        assert graded.errors == [None, "TimeoutError: verifying took too long", None, None]
        # The real grader: the tower against a numeric gold is no answer, found without math-verify.
        real = grade_in_pool(pool, "math_verify", [tower, r"\boxed{50}"], ["50", "50"])
        assert real.scores == [0.0, 1.0] and real.errors == [None, None]
        # A reference the grader cannot read is broken data: loud, naming it.
        with pytest.raises(ValueError, match=r"the reward 'test_reference_unreadable' fails on "
                                             r"the reference answer '\\\\frac\{' whatever"):
            grade_in_pool(pool, "test_reference_unreadable", ["7"], ["\\frac{"])
    counted = result_with(grader_errors=1)
    assert counted.as_dict("eval")["eval_grader_errors"] == 1
    assert describe(counted).endswith("; 1 responses could not be graded (scored 0)")
    assert "could not be graded" not in describe(result_with())
