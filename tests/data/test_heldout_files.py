"""A held-out file is checked against its train file when a run prepares them: questions the
train file also asks, and repeats within the held-out file, are dropped and counted, so the
held-out set is disjoint from training and lists each question once."""

import logging

import ml_collections
import pytest

from asyncrl.config_args import ConfigError
from asyncrl.data.heldout import HELDOUT, disjoint_heldout, normalised_question
from asyncrl.data.math_data import load
from asyncrl.data.sources import build_task_data
from tests.data.test_math_data import write_jsonl

TRAIN = ["What is 2 + 2?", "Simplify 2/4.", "How many legs has a spider?"]
HELDOUT_ROWS = ["What is 3 + 3?",
                "  what is 2 +   2? ",  # the train file's first question, retyped
                "Simplify 6/9.",
                "simplify 6/9.",  # a repeat of the line before
                "How many legs has a SPIDER?\n",  # in the train file
                "Name a prime above 10."]
KEPT = ["What is 3 + 3?", "Simplify 6/9.", "Name a prime above 10."]


def math_file(path, questions):
    return write_jsonl(path, [{"problem": q, "answer": "1"} for q in questions])


def file_task(tmp_path, heldout=HELDOUT_ROWS):
    train = math_file(tmp_path / "train.jsonl", TRAIN)
    held = math_file(tmp_path / "heldout.jsonl", heldout)
    return ml_collections.ConfigDict({
        "dataset": "math", "train_path": str(train), "heldout_path": str(held),
        "data_dir": str(tmp_path / "tfds"), "skip_malformed": False, "seed": 0})


def test_questions_compare_lowercased_with_whitespace_collapsed():
    assert normalised_question("  What is\t2 +\n 2? ") == normalised_question("what is 2 + 2?")
    assert normalised_question("What is 2 + 2?") != normalised_question("What is 2+2?")


def test_overlapping_and_repeated_heldout_questions_are_dropped_and_counted(tmp_path, caplog):
    task = file_task(tmp_path)
    with caplog.at_level(logging.WARNING):
        data = build_task_data(task, len(KEPT), tmp_path)
    assert data.heldout_disjoint and data.eval_label == HELDOUT
    problems = data.heldout.take(0, len(data.heldout))
    assert [p.question for p in problems] == KEPT
    assert [data.heldout[p.prompt_id] for p in problems] == problems  # renumbered from 0
    assert [data.heldout.source_line(i) for i in range(3)] == [1, 3, 6]
    trained = {normalised_question(data.train[i].question) for i in range(len(data.train))}
    assert not trained & {normalised_question(p.question) for p in problems}
    assert (f"{task.heldout_path}: 2 of its 6 held-out questions also appear in the train "
            f"file {task.train_path}; dropped from the held-out set (lines 2, 5)") in caplog.text
    assert "1 held-out questions repeat an earlier one; each is evaluated once (dropped lines 4)" \
        in caplog.text


def test_a_heldout_size_beyond_what_is_left_names_both_files_and_the_counts(tmp_path):
    task = file_task(tmp_path)
    with pytest.raises(ConfigError) as raised:
        build_task_data(task, 4, tmp_path)
    assert str(raised.value) == (
        f"config.eval.heldout_size = 4 is more than the 3 held-out problems in "
        f"config.task.heldout_path = {task.heldout_path!r} (6 read, less 2 also in "
        f"config.task.train_path = {task.train_path!r} and 1 repeated questions)")


def test_disjoint_files_are_kept_whole_and_in_order(tmp_path, caplog):
    train = load(math_file(tmp_path / "train.jsonl", TRAIN), "math")
    heldout = load(math_file(tmp_path / "heldout.jsonl", KEPT), "math")
    with caplog.at_level(logging.WARNING):
        subset, check = disjoint_heldout(train, heldout)
    assert subset.take(0, len(subset)) == heldout.take(0, len(heldout))
    assert (check.read, check.overlapping, check.duplicates) == (3, 0, 0)
    assert not caplog.text
