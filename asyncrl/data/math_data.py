"""Math datasets from local files: GSM8K, MATH / DAPO-style, or any file of prompts and answers.

Formats (one problem per row; JSONL or parquet, by suffix):
  gsm8k    {"question": str, "answer": "...working...\\n#### 72"}; the answer kept is the
           number after the last `####` ("1,234" → "1234"). Hugging Face's `openai/gsm8k`
           parquet files are this layout as they are.
  math     {"problem": str, "answer": str | number} or
           {"problem": str, "solution": "... \\boxed{\\frac{1}{2}}"}; `answer` wins when both are
           there, else the answer is the last complete `\\boxed{}` of the solution; other
           fields are ignored, so `HuggingFaceH4/MATH-500` (with `solution`, `subject`,
           `level`, `unique_id`) is read as it is.
  prompts  any layout, its fields named by `Fields` (config.task.prompt_field,
           answer_field, answer_format): the prompt a non-empty string, the answer held as
           `ANSWER_FORMATS` says. A named field the file's first row (or a parquet file's
           columns) lacks is refused before any row is read, with the fields it has.

A malformed row is a DataError (a ValueError and an asyncrl UserError) naming the file, the
1-based line (or parquet row) and what is wrong. With `skip_malformed=True` it is skipped
instead, counted in `dataset.skipped`, its message kept in `dataset.errors` and the count
logged: never a silent drop. Blank JSONL lines are not rows (a trailing newline is not data)
and are passed over.

`prompt_id` is the index in the loaded dataset, so `dataset[p.prompt_id] == p` as for the
arithmetic task; it equals the row index in the file when nothing was skipped, and
`dataset.source_line(i)` gives the file line either way.

The data position of a run is a `ShuffledCursor`: grain's global shuffle, a fresh
permutation per epoch drawn from (seed, epoch), so its state (seed, epoch, position) is a few
ints and a resumed run neither repeats nor skips a prompt. It reads this module's in-memory
`MathDataset` or a dataset prepared on disk by `asyncrl.data.tfds_builders` alike.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from asyncrl.data.arithmetic import Problem
from asyncrl.errors import UserError
from asyncrl.rewards.answers import last_boxed
from asyncrl.rewards.math import gsm8k_reference

log = logging.getLogger(__name__)

FORMATS = ("gsm8k", "math", "prompts")
_KEPT_ERRORS = 20  # messages kept for skipped rows; the count is exact regardless


class DataError(UserError, ValueError):
    """A data file that cannot be used as its format says; the message names the file and,
    for a malformed row, its line (or parquet row) and what is wrong with it."""


class MissingDataFile(UserError, FileNotFoundError):
    """A data file that is not there."""


class MathDataset:
    """Random access to the problems of one file."""

    def __init__(self, path: str, problems: list[Problem], lines: list[int], skipped: int,
                 errors: list[str]):
        self.path = path
        self.skipped = skipped  # malformed rows passed over (skip_malformed=True only)
        self.errors = tuple(errors)  # the first few of their messages
        self._problems = problems
        self._lines = lines

    def __len__(self) -> int:
        return len(self._problems)

    def __getitem__(self, index: int) -> Problem:
        if not 0 <= index < len(self._problems):
            raise IndexError(f"{self.path}: problem index must be in [0, {len(self)}), got {index}")
        return self._problems[index]

    def take(self, start: int, count: int) -> list[Problem]:
        return [self[i] for i in range(start, start + count)]

    def questions(self) -> Iterator[str]:
        """Every question in order (as `PreparedDataset.questions`)."""
        return (p.question for p in self._problems)

    def source_line(self, index: int) -> int:
        """The 1-based line (JSONL) or row (parquet) problem `index` came from."""
        self[index]
        return self._lines[index]

    def __repr__(self) -> str:
        return f"MathDataset({self.path!r}, {len(self)} problems, {self.skipped} skipped)"


# ----------------------------------------------------------------------------- reading rows


def _jsonl_rows(path: pathlib.Path) -> Iterator[tuple[int, Any]]:
    """(1-based line, parsed row) pairs; a line that is not UTF-8 JSON yields its error
    instead. Read as bytes and decoded a line at a time, so a stray binary line is named
    exactly (a text-mode read would fail on a whole chunk of lines at once)."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield number, ValueError(f"not UTF-8 text ({e.reason} at byte {e.start + 1})")
                continue
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as e:
                yield number, ValueError(f"not valid JSON ({e.msg} at column {e.colno})")


def _parquet(path: pathlib.Path, schema_only: bool = False) -> Any:
    """The file's table, or only its schema (cheap: no rows are read)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"{path}: reading parquet needs pyarrow (pip install pyarrow); "
                          f"or convert the file to JSONL") from None
    import pyarrow

    try:
        return pq.read_schema(path) if schema_only else pq.read_table(path)
    except pyarrow.ArrowException as e:
        raise DataError(f"{path}: not a readable parquet file: {e}") from e


def _parquet_rows(path: pathlib.Path) -> Iterator[tuple[int, Any]]:
    yield from enumerate(_parquet(path).to_pylist(), start=1)


def _missing_field(field: str, fields: Iterable[str], setting: str = "") -> ValueError:
    """`setting`: the config field that names `field`, for a layout the config describes."""
    hint = f"; set config.task.{setting}" if setting else ""
    return ValueError(f"missing field {field!r} (fields: {', '.join(fields) or 'none'}){hint}")


def _text_field(row: dict, field: str, setting: str = "") -> str:
    if field not in row:
        raise _missing_field(field, row, setting)
    value = row[field]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"field {field!r} must be a non-empty string, got {value!r:.80}")
    return value


def _plain_answer(row: dict, field: str, setting: str = "") -> str:
    """The field is the answer: a string, or a number (DAPO-style files carry numbers)."""
    if field not in row:
        raise _missing_field(field, row, setting)
    answer = row[field]
    # bool is an int in Python but never an answer.
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"field {field!r} must be a non-empty string or a number, "
                         f"got {row[field]!r:.80}")
    return answer.strip()


def _gsm8k_answer(row: dict, field: str, setting: str = "") -> str:
    """The field is a worked solution ending in '#### N': the answer is N."""
    solution = _text_field(row, field, setting)
    if "####" not in solution:
        raise ValueError(f"field {field!r} has no '####' before the final number: "
                         f"{solution[-80:]!r}")
    return gsm8k_reference(solution)


def _boxed_answer(row: dict, field: str, setting: str = "") -> str:
    """The field is a solution: the answer is its last complete \\boxed{}."""
    boxed = last_boxed(_text_field(row, field, setting))
    if boxed is None:
        raise ValueError(f"field {field!r} has no complete \\boxed{{...}} holding the answer")
    return boxed


_ANSWERS: dict[str, Callable[[dict, str, str], str]] = {
    "plain": _plain_answer, "gsm8k": _gsm8k_answer, "boxed": _boxed_answer}
ANSWER_FORMATS = tuple(_ANSWERS)  # how a `prompts` file's answer field holds the answer


@dataclasses.dataclass(frozen=True)
class Fields:
    """Where the `prompts` format reads a row (config.task.prompt_field, answer_field,
    answer_format); the other formats have fixed layouts and ignore it."""

    prompt: str = "prompt"
    answer: str = "answer"
    answer_format: str = "plain"  # one of ANSWER_FORMATS

    def __post_init__(self):
        if self.answer_format not in _ANSWERS:
            raise ValueError(f"math data: answer_format must be one of {ANSWER_FORMATS}, "
                             f"got {self.answer_format!r}")


def _gsm8k_problem(row: dict, index: int, fields: Fields) -> Problem:
    return Problem(index, _text_field(row, "question"), _gsm8k_answer(row, "answer"), "gsm8k")


def _math_problem(row: dict, index: int, fields: Fields) -> Problem:
    problem = _text_field(row, "problem")
    if "answer" in row:
        return Problem(index, problem, _plain_answer(row, "answer"), "math")
    if "solution" not in row:
        raise ValueError(f"needs field 'answer' or 'solution' (fields: {', '.join(row)})")
    return Problem(index, problem, _boxed_answer(row, "solution"), "math")


def _prompts_problem(row: dict, index: int, fields: Fields) -> Problem:
    prompt = _text_field(row, fields.prompt, "prompt_field")
    answer = _ANSWERS[fields.answer_format](row, fields.answer, "answer_field")
    return Problem(index, prompt, answer, "prompts")


_MAKERS: dict[str, Callable[[dict, int, Fields], Problem]] = {
    "gsm8k": _gsm8k_problem, "math": _math_problem, "prompts": _prompts_problem}


def check_fields(path: str | pathlib.Path, fields: Fields) -> None:
    """Refuses a `prompts` file whose first row (a parquet file's columns) lacks a field
    `fields` names, before any row is read and whether malformed rows are skipped or not:
    a misnamed field would make every row malformed. A first row that is not an object is
    left to its own error when the rows are read."""
    path = pathlib.Path(path)
    if path.suffix == ".parquet":
        where, names = "row 1", _parquet(path, schema_only=True).names
    else:
        first = next(_jsonl_rows(path), None)
        if first is None or not isinstance(first[1], dict):
            return
        where, names = f"line {first[0]}", list(first[1])
    for field, setting in ((fields.prompt, "prompt_field"), (fields.answer, "answer_field")):
        if field not in names:
            raise DataError(f"{path}: {where} (prompts): {_missing_field(field, names, setting)}")


@dataclasses.dataclass
class Skipped:
    """The malformed rows a read passed over (skip_malformed=True only): an exact count and
    the first few messages."""

    count: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)


def read_problems(path: str | pathlib.Path, kind: str, skip_malformed: bool = False,
                  skipped: Skipped | None = None,
                  fields: Fields = Fields()) -> Iterator[tuple[Problem, int]]:
    """(problem, 1-based line or parquet row) for each good row; prompt ids count from 0.

    The one row parser: `load` and the TFDS builders (`asyncrl.data.tfds_builders`) both read
    through it, so a row means the same thing, and fails the same way, on either path. The
    kind, file, suffix and (for `prompts`) the named fields are checked at the call; the
    rows as the iterator is drained. A
    malformed row raises, or with `skip_malformed` is counted in `skipped` and logged once
    the file is done; a file with no good row raises at the end.
    """
    if kind not in _MAKERS:
        raise ValueError(f"math data: kind must be one of {FORMATS}, got {kind!r}")
    path = pathlib.Path(path)
    if not path.is_file():
        raise MissingDataFile(f"math data: no such file {str(path)!r}")
    if path.suffix == ".parquet":
        rows, unit = _parquet_rows(path), "row"
    elif path.suffix == ".jsonl":
        rows, unit = _jsonl_rows(path), "line"
    else:
        raise DataError(f"{path}: expected a .jsonl or .parquet file, got suffix {path.suffix!r}")
    if kind == "prompts":
        check_fields(path, fields)
    return _good_rows(path, kind, fields, rows, unit, skip_malformed,
                      Skipped() if skipped is None else skipped)


def _good_rows(path: pathlib.Path, kind: str, fields: Fields, rows: Iterator[tuple[int, Any]],
               unit: str, skip_malformed: bool, skipped: Skipped) -> Iterator[tuple[Problem, int]]:
    make = _MAKERS[kind]
    good = 0
    for number, row in rows:
        try:
            if isinstance(row, Exception):
                raise row
            if not isinstance(row, dict):
                raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
            problem = make(row, good, fields)
        except ValueError as e:
            message = f"{path}: {unit} {number} ({kind}): {e}"
            if not skip_malformed:
                raise DataError(message + " (skip_malformed=True skips such rows)") from None
            skipped.count += 1
            if len(skipped.errors) < _KEPT_ERRORS:
                skipped.errors.append(message)
            continue
        good += 1
        yield problem, number
    if skipped.count:
        log.warning("%s: skipped %d malformed %ss of %d; first: %s", path, skipped.count, unit,
                    skipped.count + good, skipped.errors[0])
    if not good:
        raise DataError(f"{path}: no usable {kind} problems (skipped {skipped.count} malformed)")


def load(path: str | pathlib.Path, kind: str, skip_malformed: bool = False,
         fields: Fields = Fields()) -> MathDataset:
    """Loads a local file of one of `FORMATS` (JSONL or parquet) into memory."""
    skipped = Skipped()
    pairs = list(read_problems(path, kind, skip_malformed, skipped, fields))
    return MathDataset(str(path), [p for p, _ in pairs], [line for _, line in pairs],
                       skipped.count, skipped.errors)


def load_gsm8k(path: str | pathlib.Path, skip_malformed: bool = False) -> MathDataset:
    return load(path, "gsm8k", skip_malformed)


def load_math(path: str | pathlib.Path, skip_malformed: bool = False) -> MathDataset:
    return load(path, "math", skip_malformed)


# -------------------------------------------------------------------------------- the cursor


class ProblemSource(Protocol):
    """What a cursor reads: random access to a finite list of problems, `problem i` having
    prompt_id i. `MathDataset` (in memory) and `tfds_builders.PreparedDataset` (on disk) are
    two."""

    path: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Problem: ...

    def questions(self) -> Iterator[str]: ...

    def source_line(self, index: int) -> int: ...


class ShuffledCursor:
    """The data position over a finite dataset: every epoch visits each problem once, in an
    order drawn from (seed, epoch). Same interface as `arithmetic.PromptCursor`.

    The order is grain's global shuffle (`MapDataset.seed(seed).shuffle().repeat()`): random
    access by the global index epoch·size + position, with a fresh permutation per epoch, so
    an epoch's order is known without replaying the ones before it and the state is a few
    ints. The state carries the dataset size, seed and shuffle flag, checked on load:
    resuming against a different file or seed would silently change the order, so it is
    refused instead.
    """

    def __init__(self, dataset: ProblemSource, seed: int, shuffle: bool = True):
        if len(dataset) == 0:
            raise ValueError("shuffled cursor: the dataset is empty")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"shuffled cursor: seed must be an int ≥ 0, got {seed!r}")
        self.dataset = dataset
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        import grain  # here: configs name the formats above without loading grain

        stream = grain.MapDataset.source(dataset)
        if shuffle:
            # `seed` feeds grain's seed derivation rather than `shuffle(seed=...)`: that one
            # shuffles epoch e with seed + e, so seed s from epoch 1 on would replay the
            # orders of seed s + 1 from epoch 0.
            stream = stream.seed(seed).shuffle()
        self._stream = stream.repeat()

    def __iter__(self) -> Iterator[Problem]:
        return self

    def __next__(self) -> Problem:
        if self.position == len(self.dataset):
            self.epoch += 1
            self.position = 0
        problem = self._stream[self.epoch * len(self.dataset) + self.position]
        self.position += 1
        return problem

    def state_dict(self) -> dict[str, int | bool]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position,
                "size": len(self.dataset), "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = {"seed", "epoch", "position", "size", "shuffle"}
        if set(state) != expected:
            raise ValueError(f"shuffled cursor state: expected keys {sorted(expected)}, "
                             f"got {sorted(state)}")
        for key in ("epoch", "position"):
            if not isinstance(state[key], int) or state[key] < 0:
                raise ValueError(f"shuffled cursor state: {key} must be an int ≥ 0, "
                                 f"got {state[key]!r}")
        mine = {"seed": self.seed, "size": len(self.dataset), "shuffle": self.shuffle}
        for key, value in mine.items():
            if state[key] != value:
                # A resume against another file or seed than the run was started with.
                raise DataError(f"shuffled cursor state: saved with {key}={state[key]!r}, "
                                f"this cursor has {key}={value!r} ({self.dataset.path})")
        if state["position"] > len(self.dataset):
            raise ValueError(f"shuffled cursor state: position must be ≤ the dataset size "
                             f"{len(self.dataset)}, got {state['position']}")
        self.epoch, self.position = state["epoch"], state["position"]
