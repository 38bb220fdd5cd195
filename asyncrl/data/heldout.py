"""What a run evaluates on, and what that evaluation may honestly be called.

An evaluation set is "held-out" only when training can never draw its problems. The
arithmetic kinds hold a part of their spaces out by construction (asyncrl.data.arithmetic);
a held-out file is checked against its train file here, at preparation: a question the
train file also holds, or one the held-out file repeats, is dropped from the held-out set
and counted in a warning naming both files. Arithmetic kinds too small to hold problems out
are evaluated on their train problems, labelled "train-set".
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

from asyncrl.data.arithmetic import Problem
from asyncrl.data.math_data import ProblemSource

log = logging.getLogger(__name__)

HELDOUT = "held-out"
TRAIN_SET = "train-set"
EVAL_LABELS = (HELDOUT, TRAIN_SET)
_SHOWN_LINES = 10  # lines named in a warning; the counts are exact regardless


def normalised_question(question: str) -> str:
    """Lowercased, whitespace collapsed and stripped: a question retyped compares equal."""
    return " ".join(question.lower().split())


class ProblemSubset:
    """Some problems of a dataset (`MathDataset` or `PreparedDataset`), renumbered from 0
    so that `subset[p.prompt_id] == p`, as for every problem source."""

    def __init__(self, source: ProblemSource, indices: list[int]):
        self.source = source
        self.path = source.path
        self._indices = indices

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: int) -> Problem:
        if not 0 <= index < len(self):
            raise IndexError(f"{self.path}: held-out problem index must be in [0, {len(self)}), "
                             f"got {index}")
        return dataclasses.replace(self.source[self._indices[index]], prompt_id=index)

    def take(self, start: int, count: int) -> list[Problem]:
        return [self[i] for i in range(start, start + count)]

    def source_line(self, index: int) -> int:
        """The 1-based line (JSONL) or row (parquet) of the file problem `index` came from."""
        self[index]
        return self.source.source_line(self._indices[index])

    def __repr__(self) -> str:
        return f"ProblemSubset({self.path!r}, {len(self)} of {len(self.source)} problems)"

    def questions(self) -> Iterator[str]:
        return (self.source[i].question for i in self._indices)


@dataclasses.dataclass(frozen=True)
class HeldoutCheck:
    """What checking a held-out file against its train file found."""

    read: int  # problems in the held-out file
    overlapping: int  # dropped: the train file holds the same question
    duplicates: int  # dropped: an earlier held-out problem asks the same question

    @property
    def dropped(self) -> int:
        return self.overlapping + self.duplicates


def disjoint_heldout(train: ProblemSource, heldout: ProblemSource
                     ) -> tuple[ProblemSubset, HeldoutCheck]:
    """The held-out problems whose question the train file never asks, each question once.

    Dropped rather than refused: public splits (GSM8K, MATH) hold a few such repeats, and
    refusing would make a standard pair of files unusable over a handful of rows, while
    evaluating on them would score recall of trained problems as generalisation. The warning
    names both files, the count and the lines, so nothing is dropped silently; when too few
    problems remain for eval.heldout_size, `build_task_data` refuses with the same counts.
    """
    trained = {normalised_question(question) for question in train.questions()}
    seen: set[str] = set()
    kept, overlapping, duplicates = [], [], []
    for i, question in enumerate(map(normalised_question, heldout.questions())):
        if question in trained:
            overlapping.append(i)
        elif question in seen:
            duplicates.append(i)
        else:
            seen.add(question)
            kept.append(i)
    if overlapping:
        log.warning("%s: %d of its %d held-out questions also appear in the train file %s; "
                    "dropped from the held-out set (lines %s)", heldout.path, len(overlapping),
                    len(heldout), train.path, _lines(heldout, overlapping))
    if duplicates:
        log.warning("%s: %d held-out questions repeat an earlier one; each is evaluated once "
                    "(dropped lines %s)", heldout.path, len(duplicates),
                    _lines(heldout, duplicates))
    return ProblemSubset(heldout, kept), HeldoutCheck(len(heldout), len(overlapping),
                                                      len(duplicates))


def _lines(dataset: ProblemSource, indices: list[int]) -> str:
    shown = ", ".join(str(dataset.source_line(i)) for i in indices[:_SHOWN_LINES])
    more = len(indices) - _SHOWN_LINES
    return shown + (f" and {more} more" if more > 0 else "")
