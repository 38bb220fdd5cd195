"""A seeded synthetic arithmetic task: problems whose difficulty and answer lengths vary.

Problem i of a split is a pure function of (seed, split, i), so the data position is one
integer: a checkpoint saves it and a resumed run neither repeats nor skips a prompt. Train and
held-out splits draw from disjoint random streams.

Kinds (the operands' digit counts set the difficulty):
  add1   a + b, one digit each          add2   two digits each     add3   three digits each
  mul21  a × b, two digits by one       sub2   a - b, two digits (answer may be negative)
  mod10  (a + b) % 10, one digit each: a one-token answer
  echo1  a one-digit number, answered by itself: what a random tiny model learns first

Styles: 'words' renders "What is 3 + 4?" (for chat models); 'compact' renders "3+4=" (for
the tiny character tokenizer, whose vocabulary is just digits and operators).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from asyncrl.registry import Registry

KINDS = Registry("arithmetic kind")
SPLITS = ("train", "heldout")
STYLES = ("words", "compact")


@dataclasses.dataclass(frozen=True)
class Problem:
    prompt_id: int
    question: str  # "What is 37 + 5?"
    answer: str  # "42"
    kind: str


def _operands(rng: np.random.Generator, digits_a: int, digits_b: int) -> tuple[int, int]:
    low = lambda d: 0 if d == 1 else 10 ** (d - 1)  # noqa: E731 - no leading zeros
    return (int(rng.integers(low(digits_a), 10 ** digits_a)),
            int(rng.integers(low(digits_b), 10 ** digits_b)))


def _register_sum(name: str, digits: int, sign: str) -> None:
    @KINDS.register(name)
    def make(rng: np.random.Generator) -> tuple[str, int]:
        a, b = _operands(rng, digits, digits)
        return f"{a} {sign} {b}", a + b if sign == "+" else a - b


_register_sum("add1", 1, "+")
_register_sum("add2", 2, "+")
_register_sum("add3", 3, "+")
_register_sum("sub2", 2, "-")


@KINDS.register("echo1")
def _echo1(rng: np.random.Generator) -> tuple[str, int]:
    a = int(rng.integers(10))
    return f"{a}", a


@KINDS.register("mod10")
def _mod10(rng: np.random.Generator) -> tuple[str, int]:
    a, b = _operands(rng, 1, 1)
    return f"({a} + {b}) % 10", (a + b) % 10


@KINDS.register("mul21")
def _mul21(rng: np.random.Generator) -> tuple[str, int]:
    a, b = _operands(rng, 2, 1)
    return f"{a} * {b}", a * b


class ArithmeticTask:
    """Random access to an endless, reproducible stream of problems."""

    def __init__(self, seed: int, kinds: tuple[str, ...] = ("add1",), split: str = "train",
                 style: str = "words"):
        if style not in STYLES:
            raise ValueError(f"arithmetic task: style must be one of {STYLES}, got {style!r}")
        if split not in SPLITS:
            raise ValueError(f"arithmetic task: split must be one of {SPLITS}, got {split!r}")
        if not kinds:
            raise ValueError("arithmetic task: kinds must name at least one kind, got ()")
        self._makers = [KINDS.get(k) for k in kinds]
        self.kinds = tuple(kinds)
        self.seed = seed
        self.split = split
        self.style = style

    def __getitem__(self, index: int) -> Problem:
        if index < 0:
            raise IndexError(f"arithmetic task: problem index must be ≥ 0, got {index}")
        rng = np.random.default_rng([self.seed, SPLITS.index(self.split), index])
        kind = int(rng.integers(len(self._makers)))
        expression, value = self._makers[kind](rng)
        question = (f"What is {expression}?" if self.style == "words"
                    else expression.replace(" ", "") + "=")
        return Problem(index, question, str(value), self.kinds[kind])

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
