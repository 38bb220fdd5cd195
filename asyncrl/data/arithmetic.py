"""A seeded synthetic arithmetic task: problems whose difficulty and answer lengths vary.

Problem i of a split is a pure function of (seed, split, i), so the data position is one
integer: a checkpoint saves it and a resumed run neither repeats nor skips a prompt.

Three splits by construction: each kind's problem space (every combination of its operands)
is partitioned once, the same for every seed, by a stable hash of the canonical problem (kind,
operands), ranked: the HELDOUT_FRACTION of problems with the smallest hashes form the test
part, the next HELDOUT_FRACTION the validation part, the rest train. The train split is an
endless stream that redraws any validation or test problem, so no seed ever trains on one;
the validation and test splits list their part's problems once each, in a seeded order. A
kind smaller than MIN_SPACE_FOR_HELDOUT holds nothing out: a task using it can only be
evaluated on its train problems (`DistinctProblems(..., part="train")`).

Kinds (the operands' digit counts set the difficulty; `KINDS.get(name).size` is the number
of distinct problems):
  add1   a + b, one digit each          add2   two digits each     add3   three digits each
  mul21  a × b, two digits by one       sub2   a - b, two digits (answer may be negative)
  mod10  (a + b) % 10, one digit each: a one-token answer
  mul44, mul55, mul66   a × b, 4 / 5 / 6 digits each: too many problems to enumerate, so
         partitioned problem by problem, each part listing a fixed sample (MAX_SPACE)
  echo1  a one-digit number, answered by itself: what a random tiny model learns first

Styles: 'words' renders "What is 3 + 4?" (for chat models); 'compact' renders "3+4=" (for
the tiny character tokenizer, whose vocabulary is just digits and operators).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable
from typing import Iterator

import numpy as np

from asyncrl.registry import Registry

KINDS = Registry("arithmetic kind")
# "test" second: the seeded order of a part is drawn with the part's index here, and the test
# part is the one earlier versions called "heldout" (same problems, same order), so figures
# measured on it before the validation split existed stay comparable.
SPLITS = ("train", "test", "validation")
PARTS = SPLITS  # of a kind's problem space, as `DistinctProblems` lists them
HELDOUT_PARTS = ("validation", "test")
STYLES = ("words", "compact")

HELDOUT_FRACTION = 0.1  # of a kind's space, for each of validation and test
# Below this many problems a kind has no held-out parts. A tenth of 100 is 10 problems, the
# fewest whose accuracy says more than noise (each one moves it by 0.1); and holding problems
# out of a smaller space takes a visible share of what training can learn (echo1 would lose
# one of its ten digits to a one-problem "held-out set").
MIN_SPACE_FOR_HELDOUT = 100
# The partition hashes and sorts a kind's whole space once, at 8 bytes a problem: 10^7
# problems is 80 MB and a second or two. A larger space is partitioned problem by problem,
# by where its hash falls (the same fractions, without enumerating it), and each of its
# parts lists a fixed sample of PART_SAMPLE problems, drawn once for every seed.
MAX_SPACE = 10 ** 7
PART_SAMPLE = 10_000


@dataclasses.dataclass(frozen=True)
class Problem:
    prompt_id: int
    question: str  # "What is 37 + 5?"
    answer: str  # "42"
    kind: str
    operands: tuple[int, ...] = ()  # with `kind`, the canonical problem (arithmetic only)


@dataclasses.dataclass(frozen=True)
class Kind:
    """A family of problems: each combination of one value from every operand range is one
    problem, numbered by its mixed-radix index (the first operand most significant)."""

    name: str
    operand_ranges: tuple[range, ...]
    render: Callable[..., tuple[str, int]]  # operands -> (expression, value)

    def __post_init__(self):
        if not self.operand_ranges or any(len(r) == 0 for r in self.operand_ranges):
            raise ValueError(f"arithmetic kind {self.name!r}: every operand range must be "
                             f"non-empty, got {self.operand_ranges}")

    @property
    def size(self) -> int:
        return math.prod(len(r) for r in self.operand_ranges)

    @property
    def has_heldout(self) -> bool:
        return self.size >= MIN_SPACE_FOR_HELDOUT

    def index_of(self, operands: tuple[int, ...]) -> int:
        index = 0
        for value, values in zip(operands, self.operand_ranges):
            index = index * len(values) + values.index(value)
        return index

    def operands_at(self, index: int) -> tuple[int, ...]:
        operands = []
        for values in reversed(self.operand_ranges):
            index, offset = divmod(index, len(values))
            operands.append(values[offset])
        return tuple(reversed(operands))

    def draw(self, rng: np.random.Generator) -> tuple[int, ...]:
        return tuple(int(rng.integers(r.start, r.stop)) for r in self.operand_ranges)


def _name_salt(name: str) -> int:
    """64 bits from the kind's name: Python's hash() of a str changes from run to run."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def _stable_hash(name: str, indices: np.ndarray) -> np.ndarray:
    """splitmix64 of (name, problem index): fixed across runs, machines and versions."""
    z = indices.astype(np.uint64) ^ np.uint64(_name_salt(name))
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False  # cached and shared: no caller may move the partition
    return array


def _enumerable(kind: Kind) -> bool:
    return kind.size <= MAX_SPACE


def _parts_by_hash(kind: Kind, indices: np.ndarray) -> np.ndarray:
    """A large kind's part of each problem: its hash's place in [0, 2^64) (0 test, 1
    validation, 2 train), HELDOUT_FRACTION of the range for each held-out part."""
    band = np.uint64(int(HELDOUT_FRACTION * 2 ** 64))
    hashes = _stable_hash(kind.name, np.asarray(indices, np.int64))
    return np.where(hashes < band, 0, np.where(hashes < 2 * band, 1, 2))


def _held_out(kind: Kind, index: int) -> bool:
    """Whether problem `index` of `kind` is a validation or test problem: training never
    draws it."""
    if _enumerable(kind):
        return bool(_heldout_mask(kind)[index])
    return kind.has_heldout and int(_parts_by_hash(kind, np.asarray([index]))[0]) < 2


@functools.cache
def _sampled_part(kind: Kind, part: str) -> np.ndarray:
    """PART_SAMPLE distinct problems of one part of a large kind, ascending: the first ones
    a stream fixed by the kind's name draws into that part."""
    code = {"test": 0, "validation": 1, "train": 2}[part]
    rng = np.random.default_rng([_name_salt(kind.name), code])
    kept: dict[int, None] = {}
    while len(kept) < PART_SAMPLE:
        draws = rng.integers(0, kind.size, size=4 * PART_SAMPLE)
        for index in draws[_parts_by_hash(kind, draws) == code]:
            kept.setdefault(int(index))
            if len(kept) == PART_SAMPLE:
                break
    return _frozen(np.sort(np.fromiter(kept, np.int64)))


@functools.cache
def _heldout_ranked(kind: Kind) -> tuple[np.ndarray, np.ndarray]:
    """(test, validation) problem indices of `kind`, each ascending; empty when the kind is
    too small to hold problems out."""
    if not kind.has_heldout:
        return _frozen(np.empty(0, np.int64)), _frozen(np.empty(0, np.int64))
    count = max(1, round(kind.size * HELDOUT_FRACTION))
    ranked = np.argsort(_stable_hash(kind.name, np.arange(kind.size)), kind="stable")
    return _frozen(np.sort(ranked[:count])), _frozen(np.sort(ranked[count:2 * count]))


@functools.cache
def _heldout_mask(kind: Kind) -> np.ndarray:
    """True for every validation or test problem of `kind`: what training never draws."""
    mask = np.zeros(kind.size, bool)
    for part in _heldout_ranked(kind):
        mask[part] = True
    return _frozen(mask)


@functools.cache
def part_of(kind: Kind, part: str) -> np.ndarray:
    """The problem indices of one part of `kind`'s space, ascending (of a kind too large to
    enumerate, its fixed sample)."""
    if part not in PARTS:
        raise ValueError(f"arithmetic task: part must be one of {PARTS}, got {part!r}")
    if not _enumerable(kind):
        return _sampled_part(kind, part)
    if part == "train":
        return _frozen(np.flatnonzero(~_heldout_mask(kind)))
    test, validation = _heldout_ranked(kind)
    return test if part == "test" else validation


def has_heldout_split(kinds: tuple[str, ...]) -> bool:
    """Whether every kind is large enough to hold problems out of training."""
    return all(KINDS.get(name).has_heldout for name in kinds)


def _register(name: str, operand_ranges: tuple[range, ...],
              render: Callable[..., tuple[str, int]]) -> None:
    KINDS.add(name, Kind(name, operand_ranges, render))


def _digits(count: int) -> range:
    return range(0 if count == 1 else 10 ** (count - 1), 10 ** count)  # no leading zeros


_register("add1", (_digits(1),) * 2, lambda a, b: (f"{a} + {b}", a + b))
_register("add2", (_digits(2),) * 2, lambda a, b: (f"{a} + {b}", a + b))
_register("add3", (_digits(3),) * 2, lambda a, b: (f"{a} + {b}", a + b))
_register("sub2", (_digits(2),) * 2, lambda a, b: (f"{a} - {b}", a - b))
_register("echo1", (_digits(1),), lambda a: (f"{a}", a))
_register("mod10", (_digits(1),) * 2, lambda a, b: (f"({a} + {b}) % 10", (a + b) % 10))
_register("mul21", (_digits(2), _digits(1)), lambda a, b: (f"{a} * {b}", a * b))
# Products of 4-6 digit numbers: what a small model cannot work out in its head, and a
# calculator can (the tool task, asyncrl/agents).
for _n in (4, 5, 6):
    _register(f"mul{_n}{_n}", (_digits(_n),) * 2, lambda a, b: (f"{a} * {b}", a * b))


def _checked_kinds(kinds: tuple[str, ...], style: str) -> list[Kind]:
    if style not in STYLES:
        raise ValueError(f"arithmetic task: style must be one of {STYLES}, got {style!r}")
    if not kinds:
        raise ValueError("arithmetic task: kinds must name at least one kind, got ()")
    return [KINDS.get(name) for name in kinds]


def _problem(kind: Kind, operands: tuple[int, ...], prompt_id: int, style: str) -> Problem:
    expression, value = kind.render(*operands)
    question = (f"What is {expression}?" if style == "words"
                else expression.replace(" ", "") + "=")
    return Problem(prompt_id, question, str(value), kind.name, operands)


class DistinctProblems:
    """Every problem of one part ('train', 'validation' or 'test') of the kinds' spaces once, in an
    order drawn from the seed. The kinds take turns (one whose part is used up drops out), so
    the first n problems mix the kinds evenly, as the train stream does.

    `repeat=True` starts over after the last problem instead of raising IndexError: for a
    train-set evaluation of kinds too small to hold problems out, which may ask for more
    problems than there are.
    """

    def __init__(self, seed: int, kinds: tuple[str, ...], part: str, style: str = "words",
                 repeat: bool = False):
        if part not in PARTS:
            raise ValueError(f"arithmetic task: part must be one of {PARTS}, got {part!r}")
        # A kind named twice weighs more in training but holds the same problems.
        self._kinds = _checked_kinds(tuple(dict.fromkeys(kinds)), style)
        self.kinds = tuple(kind.name for kind in self._kinds)
        self.seed, self.part, self.style, self.repeat = seed, part, style, repeat
        self._order: tuple[np.ndarray, np.ndarray] | None = None  # (kind, problem index) each

    def __len__(self) -> int:
        return sum(len(part_of(kind, self.part)) for kind in self._kinds)

    def _ordered(self) -> tuple[np.ndarray, np.ndarray]:
        if self._order is None:
            part_code = PARTS.index(self.part)
            shuffled = [np.random.default_rng([self.seed, 1, part_code, _name_salt(kind.name)])
                        .permutation(part_of(kind, self.part)) for kind in self._kinds]
            turns = np.concatenate([np.arange(len(s)) for s in shuffled])
            kind_ids = np.concatenate([np.full(len(s), i) for i, s in enumerate(shuffled)])
            by_turn = np.lexsort((kind_ids, turns))
            self._order = (kind_ids[by_turn], np.concatenate(shuffled)[by_turn])
        return self._order

    def __getitem__(self, index: int) -> Problem:
        size = len(self)
        if index < 0 or (index >= size and not (self.repeat and size)):
            raise IndexError(f"arithmetic task: the {self.part} part of kinds {self.kinds} "
                             f"holds {size} distinct problems; index {index} is out of range")
        kind_ids, indices = self._ordered()
        kind = self._kinds[int(kind_ids[index % size])]
        return _problem(kind, kind.operands_at(int(indices[index % size])), index, self.style)

    def take(self, start: int, count: int) -> list[Problem]:
        return [self[i] for i in range(start, start + count)]


class ArithmeticTask:
    """Random access to one split: 'train' is an endless, reproducible stream (repeats
    included) that never yields a validation or test problem; 'validation' and 'test' are
    `DistinctProblems` of their parts, finite and without repeats."""

    def __init__(self, seed: int, kinds: tuple[str, ...] = ("add1",), split: str = "train",
                 style: str = "words"):
        if split not in SPLITS:
            raise ValueError(f"arithmetic task: split must be one of {SPLITS}, got {split!r}")
        self._kinds = _checked_kinds(tuple(kinds), style)
        self.kinds = tuple(kinds)
        self.seed = seed
        self.split = split
        self.style = style
        self._listed: DistinctProblems | None = None  # a validation or test split
        if split in HELDOUT_PARTS:
            too_small = {k.name: k.size for k in self._kinds if not k.has_heldout}
            if too_small:
                raise ValueError(
                    f"arithmetic task: no {split} split for kinds {self.kinds}: "
                    f"{', '.join(f'{n} has {s} problems' for n, s in too_small.items())}, fewer "
                    f"than the {MIN_SPACE_FOR_HELDOUT} a held-out part needs; evaluate on "
                    f"train problems instead (DistinctProblems(..., part='train'))")
            self._listed = DistinctProblems(seed, self.kinds, split, style)

    def __len__(self) -> int:
        if self._listed is None:
            raise TypeError("arithmetic task: the train split is endless and has no length")
        return len(self._listed)

    def __bool__(self) -> bool:
        return True  # never empty; without this, testing the train split's truth calls __len__

    def __getitem__(self, index: int) -> Problem:
        if index < 0:
            raise IndexError(f"arithmetic task: problem index must be ≥ 0, got {index}")
        if self._listed is not None:
            return self._listed[index]
        rng = np.random.default_rng([self.seed, SPLITS.index("train"), index])
        kind = self._kinds[int(rng.integers(len(self._kinds)))]
        operands = kind.draw(rng)
        while _held_out(kind, kind.index_of(operands)):  # redrawn from the same stream: pure
            operands = kind.draw(rng)
        return _problem(kind, operands, index, self.style)

    def take(self, start: int, count: int) -> list[Problem]:
        return [self[i] for i in range(start, start + count)]


class PromptCursor:
    """The data position of a run: hands out consecutive problems; its state is one int."""

    def __init__(self, task: ArithmeticTask, position: int = 0):
        self.task = task
        self.position = position

    def __iter__(self) -> Iterator[Problem]:
        return self

    def __next__(self) -> Problem:
        problem = self.task[self.position]
        self.position += 1
        return problem

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        position = state.get("position")
        if not isinstance(position, int) or position < 0:
            raise ValueError(f"data cursor state: position must be an int ≥ 0, got {position!r}")
        self.position = position
