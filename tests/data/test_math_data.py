import json
import logging

import pytest

from asyncrl.data.arithmetic import Problem
from asyncrl.data.math_data import DataError, ShuffledCursor, load, load_gsm8k, load_math


def write_jsonl(path, rows):
    """Rows are dicts (written as JSON) or raw strings (written as they are)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


GSM8K_ROWS = [
    {"question": "Janet has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A car costs $1,200 more than $34.", "answer": "1200 + 34\n#### 1,234"},
    {"question": "What is 5 - 8?", "answer": "#### -3"},
]


def test_gsm8k_rows_become_problems_with_the_number_after_the_marks(tmp_path):
    dataset = load_gsm8k(write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS + [""]))
    assert len(dataset) == 3 and dataset.skipped == 0
    assert dataset[1] == Problem(1, GSM8K_ROWS[1]["question"], "1234", "gsm8k")
    assert [p.answer for p in dataset.take(0, 3)] == ["7", "1234", "-3"]
    assert [dataset[i].prompt_id for i in range(3)] == [0, 1, 2]
    with pytest.raises(IndexError, match=r"must be in \[0, 3\), got 3"):
        dataset[3]


@pytest.mark.parametrize("bad_row, complaint", [
    ('{"question": "Q", "answer": "#### 1"', "not valid JSON"),
    ('["question", "answer"]', "must be a JSON object, got list"),
    ({"question": "Q"}, "missing field 'answer'"),
    ({"answer": "#### 1"}, "missing field 'question'"),
    ({"question": "Q", "answer": "so it is 12"}, "no '####'"),
    ({"question": "Q", "answer": "#### twelve"}, "must be one number"),
    ({"question": "", "answer": "#### 1"}, "'question' must be a non-empty string"),
    ({"question": "Q", "answer": 12}, "'answer' must be a non-empty string"),
])
def test_a_malformed_gsm8k_row_names_the_file_and_line(tmp_path, bad_row, complaint):
    # Blank line 2 is skipped but still counted: the bad row is on line 4.
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [GSM8K_ROWS[0], "", GSM8K_ROWS[1], bad_row])
    with pytest.raises(ValueError, match=rf"gsm8k\.jsonl: line 4 \(gsm8k\): .*{complaint}"):
        load_gsm8k(path)


def test_a_binary_line_or_an_unreadable_parquet_file_is_named(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_bytes(json.dumps(GSM8K_ROWS[0]).encode() + b"\n\xff\xfe\x00\x01\n")
    with pytest.raises(DataError, match=r"g\.jsonl: line 2 \(gsm8k\): not UTF-8 text"):
        load_gsm8k(path)
    parquet = tmp_path / "m.parquet"
    parquet.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"m\.parquet: not a readable parquet file"):
        load_math(parquet)


def test_skip_malformed_counts_and_logs_every_skipped_row(tmp_path, caplog):
    rows = [GSM8K_ROWS[0], "{not json", {"question": "Q"}, GSM8K_ROWS[1],
            {"question": "Q", "answer": "no marks"}, GSM8K_ROWS[2]]
    with caplog.at_level(logging.WARNING, logger="asyncrl.data.math_data"):
        dataset = load_gsm8k(write_jsonl(tmp_path / "g.jsonl", rows), skip_malformed=True)
    assert dataset.skipped == 3 and len(dataset) == 3
    assert [e.split(": ")[1] for e in dataset.errors] == ["line 2 (gsm8k)", "line 3 (gsm8k)",
                                                          "line 5 (gsm8k)"]
    assert "skipped 3 malformed lines of 6" in caplog.text
    # prompt_id stays the dataset index; the file line is still known.
    assert [p.answer for p in dataset.take(0, 3)] == ["7", "1234", "-3"]
    assert dataset[2].prompt_id == 2 and dataset.source_line(2) == 6


def test_a_file_with_no_usable_rows_or_a_wrong_kind_or_suffix_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no usable gsm8k problems .skipped 1 malformed"):
        load_gsm8k(write_jsonl(tmp_path / "g.jsonl", ["{"]), skip_malformed=True)
    with pytest.raises(ValueError,
                       match="kind must be one of .'gsm8k', 'math', 'prompts'., got 'aime'"):
        load(tmp_path / "g.jsonl", "aime")
    with pytest.raises(ValueError, match="expected a .jsonl or .parquet file, got suffix '.csv'"):
        load_math(write_jsonl(tmp_path / "m.csv", [{"problem": "p", "answer": "1"}]))
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_math(tmp_path / "missing.jsonl")


MATH_ROWS = [
    {"problem": "Simplify 2/4.", "solution": r"It is $\boxed{\frac{1}{2}}$.", "level": "Level 1"},
    {"problem": "Pick.", "solution": r"First \boxed{3}; no, \boxed{4}."},
    {"problem": "DAPO style", "answer": 34},
    {"problem": "Both", "answer": "[1, 3)", "solution": r"\boxed{wrong}"},
]


def test_math_rows_take_the_answer_field_or_the_last_box_of_the_solution(tmp_path):
    dataset = load_math(write_jsonl(tmp_path / "math.jsonl", MATH_ROWS))
    assert [p.answer for p in dataset.take(0, 4)] == [r"\frac{1}{2}", "4", "34", "[1, 3)"]
    assert dataset[0] == Problem(0, "Simplify 2/4.", r"\frac{1}{2}", "math")


@pytest.mark.parametrize("bad_row, complaint", [
    ({"solution": r"\boxed{1}"}, "missing field 'problem'"),
    ({"problem": "P"}, "needs field 'answer' or 'solution'"),
    ({"problem": "P", "solution": "the answer is 3"}, r"no complete \\boxed"),
    ({"problem": "P", "solution": r"cut \boxed{3"}, r"no complete \\boxed"),
    ({"problem": "P", "answer": " "}, "'answer' must be a non-empty string or a number"),
    ({"problem": "P", "answer": True}, "'answer' must be a non-empty string or a number"),
])
def test_a_malformed_math_row_names_the_file_and_line(tmp_path, bad_row, complaint):
    path = write_jsonl(tmp_path / "math.jsonl", MATH_ROWS[:2] + [bad_row])
    with pytest.raises(ValueError, match=rf"math\.jsonl: line 3 \(math\): .*{complaint}"):
        load_math(path)


def test_math_parquet_reads_like_jsonl_and_names_bad_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    columns = {"problem": ["Simplify 2/4.", "No answer"],
               "solution": [r"$\boxed{\frac{1}{2}}$", "it is three"]}
    pq.write_table(pa.table(columns), tmp_path / "math.parquet")
    with pytest.raises(ValueError, match=r"math\.parquet: row 2 \(math\): .*no complete"):
        load_math(tmp_path / "math.parquet")
    dataset = load_math(tmp_path / "math.parquet", skip_malformed=True)
    assert [p.answer for p in dataset.take(0, 1)] == [r"\frac{1}{2}"] and dataset.skipped == 1


def dataset_of(tmp_path, n):
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(n)]
    return load_gsm8k(write_jsonl(tmp_path / f"d{n}.jsonl", rows))


def test_cursor_epochs_visit_every_problem_once_in_a_fresh_order(tmp_path):
    cursor = ShuffledCursor(dataset_of(tmp_path, 7), seed=3)
    epochs = [[next(cursor).prompt_id for _ in range(7)] for _ in range(3)]
    assert all(sorted(e) == list(range(7)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3  # reshuffled each epoch (seeded: fixed)
    unshuffled = ShuffledCursor(dataset_of(tmp_path, 7), seed=3, shuffle=False)
    assert [next(unshuffled).prompt_id for _ in range(9)] == [0, 1, 2, 3, 4, 5, 6, 0, 1]


@pytest.mark.parametrize("stop_after", [0, 4, 7, 12, 14])  # mid-epoch and on epoch edges
def test_cursor_resume_neither_repeats_nor_skips(tmp_path, stop_after):
    dataset = dataset_of(tmp_path, 7)
    reference = ShuffledCursor(dataset, seed=11)
    expected = [next(reference).prompt_id for _ in range(21)]

    first = ShuffledCursor(dataset, seed=11)
    seen = [next(first).prompt_id for _ in range(stop_after)]
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = ShuffledCursor(dataset, seed=11)
    resumed.load_state_dict(state)
    seen += [next(resumed).prompt_id for _ in range(21 - stop_after)]
    assert seen == expected


def test_cursor_refuses_a_state_from_another_seed_or_dataset(tmp_path):
    cursor = ShuffledCursor(dataset_of(tmp_path, 7), seed=1)
    next(cursor)
    state = cursor.state_dict()
    with pytest.raises(ValueError, match="saved with seed=1, this cursor has seed=2"):
        ShuffledCursor(dataset_of(tmp_path, 7), seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with size=7, this cursor has size=8"):
        ShuffledCursor(dataset_of(tmp_path, 8), seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="position must be an int ≥ 0, got -1"):
        cursor.load_state_dict({**state, "position": -1})
    with pytest.raises(ValueError, match="position must be ≤ the dataset size 7, got 8"):
        cursor.load_state_dict({**state, "position": 8})
    with pytest.raises(ValueError, match="expected keys"):
        cursor.load_state_dict({"position": 1})
