"""Data files in the layouts users bring: Hugging Face's parquet copies as they are
(`openai/gsm8k`: question, answer ending in `#### N`; `HuggingFaceH4/MATH-500`: problem,
answer, with solution, subject, level and unique_id beside them), and the generic `prompts`
format whose field names the config gives. Each file is written here, tiny, in that layout,
and read through the run's own path (`build_task_data`: prepared as TFDS data) or the loader.
"""

import pytest

from asyncrl.config import validate
from asyncrl.data.math_data import DataError, Fields, load
from asyncrl.data.sources import build_task_data
from asyncrl.data.tfds_builders import builder_for
from tests.data.test_math_data import write_jsonl
from tests.test_system import tiny

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# Enough train rows that the validation split (a tenth, carved by a hash of each question)
# holds one or more.
N_TRAIN = 100


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def gsm8k_rows(numbers):
    return [{"question": f"Tom has {n} apples and buys 2 more. How many?",
             "answer": f"He has {n} + 2 = <<{n}+2={n + 2}>>{n + 2} apples.\n#### {n + 2:,}"}
            for n in numbers]


def math500_rows(numbers):
    """MATH-500's columns in its order; `answer` is the reference, `solution` only working."""
    return [{"problem": f"Compute $\\frac{{{2 * n}}}{{4}}$.",
             "solution": f"It is $\\boxed{{\\frac{{{n}}}{{2}}}}$.",
             "answer": f"\\frac{{{n}}}{{2}}", "subject": "Prealgebra", "level": 1 + n % 5,
             "unique_id": f"test/prealgebra/{n}.json"} for n in numbers]


def task(tmp_path, dataset, train, test, **fields):
    c = tiny(task__dataset=dataset, task__train_path=str(train), task__test_path=str(test),
             task__data_dir=str(tmp_path / "tfds"), eval__heldout_size=1,
             **{f"task__{k}": v for k, v in fields.items()})
    validate(c, 8)  # the fields exist in grpo.py's task section and pass its checks
    return c.task


def test_huggingface_gsm8k_parquet_is_read_as_it_is(tmp_path):
    train = write_parquet(tmp_path / "train-00000-of-00001.parquet", gsm8k_rows(range(N_TRAIN)))
    test = write_parquet(tmp_path / "test-00000-of-00001.parquet", gsm8k_rows([999, 1000, 1001]))
    data = build_task_data(task(tmp_path, "gsm8k", train, test), 1, tmp_path)
    problems = data.test.take(0, 3)
    assert [p.answer for p in problems] == ["1001", "1002", "1003"]  # "1,001" after ####
    assert problems[0].question == "Tom has 999 apples and buys 2 more. How many?"
    assert len(data.train) + len(data.validation) == N_TRAIN
    # The same problems as the JSONL copy of the same rows.
    jsonl = write_jsonl(tmp_path / "test.jsonl", gsm8k_rows([999, 1000, 1001]))
    assert load(jsonl, "gsm8k").take(0, 3) == load(test, "gsm8k").take(0, 3)


def test_math500_layout_takes_the_answer_column_in_parquet_and_jsonl(tmp_path):
    rows = math500_rows(range(N_TRAIN))
    rows[0]["solution"] = "Working with no box at all."  # the answer column is what counts
    train = write_parquet(tmp_path / "train.parquet", rows)
    test = write_parquet(tmp_path / "test.parquet", math500_rows([501, 502]))
    data = build_task_data(task(tmp_path, "math", train, test), 1, tmp_path)
    assert [p.answer for p in data.test.take(0, 2)] == ["\\frac{501}{2}", "\\frac{502}{2}"]
    assert data.test[0].question == "Compute $\\frac{1002}{4}$."
    from_jsonl = load(write_jsonl(tmp_path / "train.jsonl", rows), "math")
    assert from_jsonl.take(0, N_TRAIN) == load(train, "math").take(0, N_TRAIN)
    assert from_jsonl[0].answer == "\\frac{0}{2}"


@pytest.mark.parametrize("answer_format, answer, expected", [
    ("plain", 7, "7"),
    ("plain", " \\frac{1}{2} ", "\\frac{1}{2}"),
    ("gsm8k", "3 + 4 = 7\n#### 1,007", "1007"),
    ("boxed", "First \\boxed{6}, then $\\boxed{\\frac{7}{1}}$.", "\\frac{7}{1}"),
])
def test_prompts_read_the_fields_the_config_names(tmp_path, answer_format, answer, expected):
    def rows(numbers):
        return [{"id": n, "input": f"Question number {n}?", "target": answer} for n in numbers]

    train = write_jsonl(tmp_path / "train.jsonl", rows(range(N_TRAIN)))
    test = write_parquet(tmp_path / "test.parquet", rows([500, 501]))
    section = task(tmp_path, "prompts", train, test, prompt_field="input",
                   answer_field="target", answer_format=answer_format)
    data = build_task_data(section, 1, tmp_path)
    assert [(p.question, p.answer) for p in data.test.take(0, 2)] == [
        ("Question number 500?", expected), ("Question number 501?", expected)]


def test_prompts_defaults_read_prompt_and_answer(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2 + 2?", "answer": "4"}])
    assert [(p.question, p.answer, p.kind) for p in load(path, "prompts").take(0, 1)] == [
        ("What is 2 + 2?", "4", "prompts")]


def test_other_field_names_prepare_the_same_file_afresh(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"q": "Q?", "a": "#### 4", "b": "5"}])
    first = builder_for(path, "prompts", tmp_path, fields=Fields("q", "a", "gsm8k"))
    other = builder_for(path, "prompts", tmp_path, fields=Fields("q", "b", "plain"))
    assert first.data_dir != other.data_dir


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_a_field_the_first_row_lacks_is_refused_before_any_row_is_read(tmp_path, suffix):
    rows = gsm8k_rows(range(3))
    path = (write_parquet if suffix == "parquet" else write_jsonl)(tmp_path / f"train.{suffix}",
                                                                   rows)
    where = "row 1" if suffix == "parquet" else "line 1"
    expected = (rf"train\.{suffix}: {where} \(prompts\): missing field 'prompt' "
                rf"\(fields: question, answer\); set config\.task\.prompt_field")
    # Skipping malformed rows would skip every one: the layout is refused either way.
    with pytest.raises(DataError, match=expected):
        load(path, "prompts", skip_malformed=True)
    with pytest.raises(DataError, match=r"missing field 'target' .*set config\.task\.answer_field"):
        load(path, "prompts", fields=Fields(prompt="question", answer="target"))
    # The run's config check reads the first rows too: refused before anything is built.
    with pytest.raises(DataError, match=expected):
        task(tmp_path, "prompts", path, path)


def test_a_later_row_without_the_field_names_its_row_and_the_fields_it_has(tmp_path):
    rows = [{"prompt": "P1", "answer": "1"}, {"prompt": "P2", "answer": "2"},
            {"question": "P3", "answer": "3"}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError, match=r"train\.jsonl: line 3 \(prompts\): missing field "
                                        r"'prompt' \(fields: question, answer\); set "
                                        r"config\.task\.prompt_field \(skip_malformed=True"):
        load(path, "prompts")
    assert load(path, "prompts", skip_malformed=True).skipped == 1


@pytest.mark.parametrize("kind, fields, row, complaint", [
    ("gsm8k", Fields(), {"question": "Q", "answer": "so it is 12"},
     r"row 2 \(gsm8k\): field 'answer' has no '####'"),
    ("gsm8k", Fields(), {"question": "Q", "answer": "#### twelve"},
     r"row 2 \(gsm8k\): .*must be one number"),
    ("math", Fields(), {"problem": "Q", "answer": None, "solution": "\\boxed{1}"},
     r"row 2 \(math\): field 'answer' must be a non-empty string or a number, got None"),
    ("prompts", Fields("q", "s", "boxed"), {"q": "Q", "s": "cut \\boxed{3"},
     r"row 2 \(prompts\): field 's' has no complete \\boxed"),
    ("prompts", Fields("q", "s", "gsm8k"), {"q": "Q", "s": "the answer is 3"},
     r"row 2 \(prompts\): field 's' has no '####'"),
])
def test_a_malformed_answer_names_the_file_and_row(tmp_path, kind, fields, row, complaint):
    good = {"gsm8k": gsm8k_rows([1])[0], "math": math500_rows([1])[0],
            "prompts": {fields.prompt: "Q0", fields.answer: "\\boxed{1} #### 1"}}[kind]
    path = write_parquet(tmp_path / "bad.parquet", [good, row])
    with pytest.raises(DataError, match=rf"bad\.parquet: {complaint}"):
        load(path, kind, fields=fields)


def test_prompt_fields_are_checked_by_the_config(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", gsm8k_rows(range(3)))
    with pytest.raises(ValueError, match=r"config\.task\.answer_format = 'latex' is not "
                                         r"allowed: one of plain, gsm8k, boxed"):
        task(tmp_path, "prompts", path, path, prompt_field="question", answer_format="latex")
    with pytest.raises(ValueError, match=r"config\.task\.prompt_field = '' is not allowed"):
        task(tmp_path, "prompts", path, path, prompt_field="")
    # Named for another dataset, a field would be ignored: refused instead.
    with pytest.raises(ValueError, match=r"config\.task\.prompt_field = 'question' .*only "
                                         r"with task\.dataset = 'prompts', and task\.dataset "
                                         r"is 'gsm8k'"):
        task(tmp_path, "gsm8k", path, path, prompt_field="question")
