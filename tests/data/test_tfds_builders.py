import importlib.util
import json
import logging
import sys

import pytest

from asyncrl.data import math_data
from asyncrl.data.math_data import ShuffledCursor, load
from asyncrl.data.tfds_builders import builder_for, prepare
from tests.data.test_math_data import GSM8K_ROWS, MATH_ROWS, write_jsonl


@pytest.fixture
def no_tensorflow():
    """TensorFlow is not installed, and the test did not import it.

    Its absence is checked rather than faked: TFDS (through etils) asks whether TF is
    installed or imported and takes other paths if so, so hiding an installed TF misleads
    it."""
    if importlib.util.find_spec("tensorflow") is not None:
        pytest.fail("TensorFlow is installed here: asyncrl reads its data without it (no "
                    "requirements file names it), and this test can only check that without it")
    yield
    assert "tensorflow" not in sys.modules, "preparing or reading the data imported TensorFlow"


def gsm8k_file(tmp_path, n, name="train.jsonl"):
    rows = [{"question": f"q{i}", "answer": f"{i} apples\n#### {i}"} for i in range(n)]
    return write_jsonl(tmp_path / name, rows)


def test_prepared_gsm8k_reads_back_as_the_in_memory_load_without_tensorflow(
        tmp_path, no_tensorflow):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS + [""] + GSM8K_ROWS[:1])
    prepared = prepare(path, "gsm8k", tmp_path / "tfds")
    loaded = load(path, "gsm8k")
    assert len(prepared) == len(loaded) == 4 and prepared.skipped == 0
    assert prepared.take(0, 4) == loaded.take(0, 4)  # one parser: same problems, same ids
    assert [prepared.source_line(i) for i in range(4)] == [1, 2, 3, 5]
    with pytest.raises(IndexError, match=r"must be in \[0, 4\), got 4"):
        prepared[4]


def test_prepared_math_parquet_reads_back_as_the_in_memory_load(tmp_path, no_tensorflow):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    columns = {"problem": [r["problem"] for r in MATH_ROWS[:2]],
               "solution": [r["solution"] for r in MATH_ROWS[:2]]}
    pq.write_table(pa.table(columns), tmp_path / "math.parquet")
    prepared = prepare(tmp_path / "math.parquet", "math", tmp_path / "tfds")
    assert prepared.take(0, 2) == load(tmp_path / "math.parquet", "math").take(0, 2)
    assert [p.answer for p in prepared.take(0, 2)] == [r"\frac{1}{2}", "4"]


def test_an_unchanged_file_is_not_prepared_again_a_changed_one_is(tmp_path, monkeypatch):
    path = gsm8k_file(tmp_path, 5)
    first = prepare(path, "gsm8k", tmp_path / "tfds")

    def no_reading(*args, **kwargs):
        raise AssertionError("the rows were read again")

    with monkeypatch.context() as patch:
        patch.setattr(math_data, "read_problems", no_reading)
        again = prepare(path, "gsm8k", tmp_path / "tfds")
    assert again.data_dir == first.data_dir and again.take(0, 5) == first.take(0, 5)

    gsm8k_file(tmp_path, 6)  # same name, new content
    changed = prepare(path, "gsm8k", tmp_path / "tfds")
    assert changed.data_dir != first.data_dir and len(changed) == 6
    # Skipping malformed rows or not is part of the key too: the content may differ.
    assert builder_for(path, "gsm8k", tmp_path / "tfds", skip_malformed=True).data_dir != \
        changed.data_dir


def test_a_malformed_row_fails_the_prepare_naming_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [GSM8K_ROWS[0], "", {"question": "Q"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 3 \(gsm8k\): missing field 'answer'"):
        prepare(path, "gsm8k", tmp_path / "tfds")
    assert not builder_for(path, "gsm8k", tmp_path / "tfds").is_prepared()
    math_path = write_jsonl(tmp_path / "m.jsonl", MATH_ROWS[:1] + [{"problem": "P"}])
    with pytest.raises(ValueError, match=r"m\.jsonl: line 2 \(math\): needs field 'answer'"):
        prepare(math_path, "math", tmp_path / "tfds")


def test_skipped_rows_are_counted_kept_and_logged_at_every_open(tmp_path, caplog):
    rows = [GSM8K_ROWS[0], "{not json", {"question": "Q"}, GSM8K_ROWS[1]]
    path = write_jsonl(tmp_path / "g.jsonl", rows)
    with caplog.at_level(logging.WARNING):
        prepared = prepare(path, "gsm8k", tmp_path / "tfds", skip_malformed=True)
    assert "skipped 2 malformed lines of 4" in caplog.text  # by the parser, as for load()
    assert prepared.skipped == 2 and len(prepared) == 2
    assert [e.split(": ")[1] for e in prepared.errors] == ["line 2 (gsm8k)", "line 3 (gsm8k)"]
    assert prepared[1].prompt_id == 1 and prepared.source_line(1) == 4

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        reopened = prepare(path, "gsm8k", tmp_path / "tfds", skip_malformed=True)
    assert reopened.skipped == 2 and "2 malformed rows were skipped" in caplog.text


def test_bad_kind_or_missing_file_is_an_error(tmp_path):
    with pytest.raises(ValueError,
                       match=r"kind must be one of \['gsm8k', 'math', 'prompts'\], got 'aime'"):
        prepare(gsm8k_file(tmp_path, 2), "aime", tmp_path / "tfds")
    with pytest.raises(FileNotFoundError, match="no such file"):
        prepare(tmp_path / "missing.jsonl", "gsm8k", tmp_path / "tfds")


def test_cursor_over_prepared_data_resumes_across_epochs_in_a_new_process(tmp_path):
    path = gsm8k_file(tmp_path, 7)
    dataset = prepare(path, "gsm8k", tmp_path / "tfds")
    reference = ShuffledCursor(dataset, seed=5)
    expected = [next(reference).prompt_id for _ in range(21)]
    epochs = [expected[i:i + 7] for i in (0, 7, 14)]
    assert all(sorted(e) == list(range(7)) for e in epochs)  # each epoch a permutation
    assert len({tuple(e) for e in epochs}) == 3

    for stop_after in (5, 7, 10):  # mid-epoch, on the edge, in the next epoch
        first = ShuffledCursor(dataset, seed=5)
        seen = [next(first).prompt_id for _ in range(stop_after)]
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
        # A resumed run opens the prepared data afresh.
        resumed = ShuffledCursor(prepare(path, "gsm8k", tmp_path / "tfds"), seed=5)
        resumed.load_state_dict(state)
        seen += [next(resumed).prompt_id for _ in range(21 - stop_after)]
        assert seen == expected

    state = ShuffledCursor(dataset, seed=5).state_dict()
    with pytest.raises(ValueError, match="saved with seed=5, this cursor has seed=6"):
        ShuffledCursor(dataset, seed=6).load_state_dict(state)
    bigger = prepare(gsm8k_file(tmp_path, 8, "other.jsonl"), "gsm8k", tmp_path / "tfds")
    with pytest.raises(ValueError, match=r"saved with size=7, this cursor has size=8 \(.*other"):
        ShuffledCursor(bigger, seed=5).load_state_dict(state)
