"""A run's prompts, picked by `config.task.dataset`: the train split behind the run's data
cursor and the held-out split that evaluation reads.

  arithmetic   the seeded generator (`task.kinds`, `task.style`): endless, nothing to read
  gsm8k, math  local files (`task.train_path`, `task.heldout_path`) prepared once as TFDS
               ArrayRecord data under `task.data_dir` (default: the run's workdir/tfds) and
               read from disk without TensorFlow (`asyncrl.data.tfds_builders`); a
               malformed row is an error naming the file and line, or with
               `task.skip_malformed` a logged count. The train order is grain's shuffle.

Both splits offer random access by prompt id (a checkpoint stores the ids of live prompts)
and `take(start, count)`; the cursor's `state_dict()` goes into every checkpoint.

What evaluation reads is held out (`TaskData.heldout_disjoint`, label "held-out") when
training can never draw it: arithmetic kinds hold part of their spaces out by construction,
and a held-out file loses the questions its train file also asks (`asyncrl.data.heldout`).
Arithmetic kinds too small to hold problems out are evaluated on their train problems,
labelled "train-set".
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any

from asyncrl.config_args import ConfigError
from asyncrl.data import math_data
from asyncrl.data.arithmetic import (KINDS, MIN_SPACE_FOR_HELDOUT, ArithmeticTask,
                                     DistinctProblems, PromptCursor, has_heldout_split,
                                     heldout_part)
from asyncrl.data.heldout import HELDOUT, TRAIN_SET, disjoint_heldout

log = logging.getLogger(__name__)

DATASETS = ("arithmetic", *math_data.FORMATS)


@dataclasses.dataclass
class TaskData:
    train: Any  # ArithmeticTask | MathDataset | PreparedDataset: problem by prompt id
    heldout: Any  # what evaluation reads: `take(0, eval.heldout_size)`
    cursor: Any  # PromptCursor | ShuffledCursor: the run's position in `train`
    heldout_disjoint: bool  # training can never draw a problem of `heldout`

    @property
    def eval_label(self) -> str:
        """"held-out", or "train-set" when `heldout` holds train problems."""
        return HELDOUT if self.heldout_disjoint else TRAIN_SET


def build_task_data(task, heldout_size: int, workdir: str | pathlib.Path) -> TaskData:
    """`task` is the config's task section (checked by asyncrl.config.validate); the held-out
    set must hold `heldout_size` distinct problems training never draws, which only building
    it can tell."""
    if task.dataset == "arithmetic":
        return _arithmetic(task, heldout_size)
    from asyncrl.data import tfds_builders  # TFDS loads slowly; arithmetic runs never need it

    data_dir = task.data_dir or pathlib.Path(workdir) / "tfds"
    train = tfds_builders.prepare(task.train_path, task.dataset, data_dir, task.skip_malformed)
    read = tfds_builders.prepare(task.heldout_path, task.dataset, data_dir, task.skip_malformed)
    heldout, check = disjoint_heldout(train, read)
    if len(heldout) < heldout_size:
        dropped = (f" ({check.read} read, less {check.overlapping} also in "
                   f"config.task.train_path = {task.train_path!r} and {check.duplicates} "
                   f"repeated questions)") if check.dropped else ""
        raise ConfigError(f"config.eval.heldout_size = {heldout_size} is more than the "
                          f"{len(heldout)} held-out problems in config.task.heldout_path = "
                          f"{task.heldout_path!r}{dropped}")
    return TaskData(train, heldout, math_data.ShuffledCursor(train, task.seed),
                    heldout_disjoint=True)


def _arithmetic(task, heldout_size: int) -> TaskData:
    kinds = tuple(task.kinds)
    train = ArithmeticTask(task.seed, kinds, "train", task.style)
    if not has_heldout_split(kinds):
        too_small = ", ".join(f"{name} has {KINDS.get(name).size}" for name in dict.fromkeys(kinds)
                              if not KINDS.get(name).has_heldout)
        evaluation = DistinctProblems(task.seed, kinds, "train", task.style, repeat=True)
        log.warning("config.task.kinds = %s: %s problems, fewer than the %d a held-out part "
                    "needs; evaluation reads train problems and reports train-set accuracy",
                    kinds, too_small, MIN_SPACE_FOR_HELDOUT)
        if heldout_size > len(evaluation):
            log.warning("config.eval.heldout_size = %d is more than the %d distinct problems "
                        "of config.task.kinds = %s: the evaluation repeats them", heldout_size,
                        len(evaluation), kinds)
        return TaskData(train, evaluation, PromptCursor(train), heldout_disjoint=False)
    heldout = ArithmeticTask(task.seed, kinds, "heldout", task.style)
    if heldout_size > len(heldout):
        parts = ", ".join(f"{name}: {len(heldout_part(KINDS.get(name)))} of "
                          f"{KINDS.get(name).size}" for name in dict.fromkeys(kinds))
        larger = ", ".join(f"{name} ({len(heldout_part(KINDS.get(name)))})"
                           for name in KINDS.names()
                           if len(heldout_part(KINDS.get(name))) >= heldout_size)
        raise ConfigError(
            f"config.eval.heldout_size = {heldout_size} is more than the {len(heldout)} "
            f"distinct held-out problems of config.task.kinds = {kinds} (held out per kind: "
            f"{parts}); ask for at most {len(heldout)}"
            + (f", or use kinds that hold more out: {larger}" if larger else ""))
    return TaskData(train, heldout, PromptCursor(train), heldout_disjoint=True)
