"""Packed rows (train.tokens_per_row > 0): which trajectories share a row, and how many rows.

A batch's trajectories differ in length by several times (a short answer, one cut at
rollout.max_new_tokens), so one per row padded to the longest spends much of the step on
padding. Packed, several share a row of a fixed token budget; segment ids keep their
attention apart and every loss term is still per trajectory (asyncrl/train/losses.py,
`Sequences`).

The step is compiled once per shape: rows have a fixed width, and their count is bucketed
(`bucket_rows`) so that a run sees a few shapes, not one per batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """The indices of `lengths` grouped into rows of at most `capacity` tokens: longest first
    (ties in index order), each into the first row with room for it, a new row when none has.
    Every index appears once; a row lists its trajectories in the order they sit in it."""
    lengths = np.asarray(lengths, np.int64)
    if lengths.size and lengths.max() > capacity:
        raise ValueError(f"a trajectory of {lengths.max()} tokens does not fit a row of "
                         f"train.tokens_per_row = {capacity}")
    free = np.zeros(len(lengths), np.int64)  # room left per row; never more rows than items
    rows: list[list[int]] = []
    for i in np.argsort(-lengths, kind="stable"):
        room = free[:len(rows)] >= lengths[i]
        row = int(np.argmax(room)) if room.any() else len(rows)
        if row == len(rows):
            rows.append([])
            free[row] = capacity
        rows[row].append(int(i))
        free[row] -= lengths[i]
    return rows


def _rungs():
    """1, 2, ..., 8, then eight rungs per doubling (9, 10, ..., 16, 18, 20, ..., 32, 36, ...):
    every count up to 16, and from 16 on each rung at most 9/8 of the one below, so a bucket
    adds at most an eighth of its rows again as padding; a run whose batches vary by a tenth
    in length sees two or three."""
    yield from range(1, 8)
    for power in itertools.count(3):
        step = 2 ** (power - 3)
        yield from range(2 ** power, 2 ** (power + 1), step)


def bucket_rows(rows: int, multiple: int, trajectories: int) -> int:
    """The row count a step is compiled for: `rows` rounded up to a multiple of `multiple`
    (the trainer's devices: each micro-batch is one packed row per device), then up to the
    next rung of multiple × (1, 2, ..., 8, 9, 10, ..., 16, 18, ...), capped at one row per
    trajectory (rounded up), the most first-fit ever uses.

    The shapes a run can see are the rungs up to that cap: with N trajectories, at most
    8·ceil(log2(N / multiple)) (one when N <= multiple); in practice the two or three
    around the typical batch, whose total length varies little from step to step.
    """
    units, most = -(-rows // multiple), -(-trajectories // multiple)
    rung = next(r for r in _rungs() if r >= units)
    return min(rung, most) * multiple
