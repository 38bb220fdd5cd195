"""A file task's three splits: the validation split is carved out of the train file by a
stable hash of each question, and the test file is checked against the train file when a run
prepares them: questions the train file also asks, and repeats within the test file, are
dropped and counted, so validation and test are disjoint from training and list each
question once."""

import logging

import ml_collections
import pytest

from asyncrl.config_args import ConfigError
from asyncrl.data.heldout import (TEST, VALIDATION, VALIDATION_FRACTION, carve_validation,
                                  disjoint_heldout, normalised_question)
from asyncrl.data.math_data import load
from asyncrl.data.sources import build_task_data
from tests.data.test_math_data import write_jsonl

# Enough distinct questions that a tenth of them, the validation split, holds a few.
TRAIN = (["What is 2 + 2?", "Simplify 2/4.", "How many legs has a spider?"]
         + [f"What is {i} times 7?" for i in range(300)])
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
        "dataset": "math", "train_path": str(train), "test_path": str(held),
        "data_dir": str(tmp_path / "tfds"), "skip_malformed": False, "seed": 0})


def test_questions_compare_lowercased_with_whitespace_collapsed():
    assert normalised_question("  What is\t2 +\n 2? ") == normalised_question("what is 2 + 2?")
    assert normalised_question("What is 2 + 2?") != normalised_question("What is 2+2?")


def test_overlapping_and_repeated_heldout_questions_are_dropped_and_counted(tmp_path, caplog):
    task = file_task(tmp_path)
    with caplog.at_level(logging.WARNING):
        data = build_task_data(task, len(KEPT), tmp_path)
    assert data.heldout_disjoint and data.eval_label("test") == TEST
    problems = data.test.take(0, len(data.test))
    assert [p.question for p in problems] == KEPT
    assert [data.test[p.prompt_id] for p in problems] == problems  # renumbered from 0
    assert [data.test.source_line(i) for i in range(3)] == [1, 3, 6]
    trained = {normalised_question(data.train[i].question) for i in range(len(data.train))}
    assert not trained & {normalised_question(p.question) for p in problems}
    assert (f"{task.test_path}: 2 of its 6 held-out questions also appear in the train "
            f"file {task.train_path}; dropped from the held-out set (lines 2, 5)") in caplog.text
    assert "1 held-out questions repeat an earlier one; each is evaluated once (dropped lines 4)" \
        in caplog.text


def test_a_heldout_size_beyond_what_is_left_names_both_files_and_the_counts(tmp_path):
    task = file_task(tmp_path)
    with pytest.raises(ConfigError) as raised:
        build_task_data(task, 4, tmp_path)
    assert str(raised.value) == (
        f"config.eval.heldout_size = 4 is more than the 3 test problems in "
        f"config.task.test_path = {task.test_path!r} (6 read, less 2 also in "
        f"config.task.train_path = {task.train_path!r} and 1 repeated questions)")


def test_disjoint_files_are_kept_whole_and_in_order(tmp_path, caplog):
    train = load(math_file(tmp_path / "train.jsonl", TRAIN), "math")
    heldout = load(math_file(tmp_path / "heldout.jsonl", KEPT), "math")
    with caplog.at_level(logging.WARNING):
        subset, check = disjoint_heldout(train, heldout)
    assert subset.take(0, len(subset)) == heldout.take(0, len(heldout))
    assert (check.read, check.overlapping, check.duplicates) == (3, 0, 0)
    assert not caplog.text


def test_the_validation_split_is_carved_out_of_the_train_file_by_construction(tmp_path):
    # One question asked twice (retyped): both rows land on the same side.
    rows = TRAIN + ["  what is 5 TIMES 7? "]
    train_file = load(math_file(tmp_path / "train.jsonl", rows), "math")
    train, validation = carve_validation(train_file)
    questions = {name: [normalised_question(p.question) for p in split.take(0, len(split))]
                 for name, split in (("train", train), ("validation", validation))}
    assert not set(questions["train"]) & set(questions["validation"])
    assert len(set(questions["validation"])) == len(questions["validation"])  # each once
    # Every row is on one side: the validation split drops only its repeats.
    repeats = len(rows) - len({normalised_question(q) for q in rows})
    assert len(train) + len(validation) in (len(rows), len(rows) - repeats)
    assert 0.5 * VALIDATION_FRACTION < len(validation) / len(rows) < 2 * VALIDATION_FRACTION
    # A pure function of each question: reordering or adding rows moves no other problem.
    _, again = carve_validation(load(math_file(tmp_path / "more.jsonl",
                                               rows[::-1] + ["A new question?"]), "math"))
    assert set(questions["validation"]) <= {normalised_question(p.question)
                                            for p in again.take(0, len(again))}


def test_a_run_evaluates_validation_carved_from_training_and_a_disjoint_test(tmp_path):
    data = build_task_data(file_task(tmp_path), 3, tmp_path)
    assert data.eval_label("validation") == VALIDATION and len(data.validation) >= 3
    drawn = {normalised_question(data.train[i].question) for i in range(len(data.train))}
    for split in (data.validation, data.test):
        assert not drawn & {normalised_question(p.question) for p in split.take(0, len(split))}
    # The cursor walks the train split only.
    cursor_questions = {normalised_question(next(data.cursor).question) for _ in range(400)}
    assert cursor_questions == drawn


def test_a_train_file_too_small_for_the_validation_size_names_the_field(tmp_path):
    task = file_task(tmp_path)
    with pytest.raises(ConfigError, match=r"config.eval.heldout_size = 200 is more than the \d+ "
                                          r"validation problems carved out of "
                                          r"config.task.train_path = .*train.jsonl"):
        build_task_data(task, 200, tmp_path)
