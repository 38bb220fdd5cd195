"""What a run evaluates on, and what that evaluation may honestly be called.

Every task has three splits, disjoint by construction: train, validation (what a run
evaluates while it trains, and where settings are chosen) and test (what a run reports,
evaluated before the first step and after the last). An evaluation is labelled "validation"
or "test" only when training can never draw its problems. The arithmetic kinds partition
their spaces (asyncrl.data.arithmetic). A file task has a train file and a test file: its
validation split is carved out of the train file here, by a stable hash of each normalised
question (so a question asked twice lands on one side, and adding rows moves no other
problem), and the test file is checked against the whole train file: a question the train
file also holds, or one the test file repeats, is dropped from the test set and counted in a
warning naming both files. Arithmetic kinds too small to hold problems out are evaluated on
their train problems, labelled "train-set".
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterator

from asyncrl.data.arithmetic import Problem
from asyncrl.data.math_data import ProblemSource

log = logging.getLogger(__name__)

VALIDATION = "validation"
TEST = "test"
TRAIN_SET = "train-set"
EVAL_LABELS = (VALIDATION, TEST, TRAIN_SET)
# Of a train file's distinct questions, the share carved out as its validation split (as
# each arithmetic kind holds out a tenth of its space for validation).
VALIDATION_FRACTION = 0.1
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
            raise IndexError(f"{self.path}: problem index must be in [0, {len(self)}), "
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


def _in_validation(question: str) -> bool:
    """Whether a train file's (normalised) question belongs to its validation split: the
    first 8 bytes of its SHA-256, as a fraction of 2^64, below VALIDATION_FRACTION."""
    digest = hashlib.sha256(question.encode()).digest()[:8]
    return int.from_bytes(digest, "little") < VALIDATION_FRACTION * 2 ** 64


def carve_validation(train: ProblemSource) -> tuple[ProblemSubset, ProblemSubset]:
    """(train, validation) of one train file: the validation split holds each of its
    questions once; the train split keeps every row of the others, repeats included."""
    kept, validation, seen = [], [], set()
    for i, question in enumerate(map(normalised_question, train.questions())):
        if not _in_validation(question):
            kept.append(i)
        elif question not in seen:
            seen.add(question)
            validation.append(i)
    if not kept:
        raise ValueError(f"{train.path}: every question fell in the validation split; a train "
                         f"file needs more than {len(train)} problems")
    return ProblemSubset(train, kept), ProblemSubset(train, validation)


def _lines(dataset: ProblemSource, indices: list[int]) -> str:
    shown = ", ".join(str(dataset.source_line(i)) for i in indices[:_SHOWN_LINES])
    more = len(indices) - _SHOWN_LINES
    return shown + (f" and {more} more" if more > 0 else "")
