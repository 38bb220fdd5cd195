"""A run's prompts, picked by `config.task.dataset`: the train split behind the run's data
cursor, the validation split a run evaluates while it trains, and the test split it reports.

  arithmetic   the seeded generator (`task.kinds`, `task.style`): endless, nothing to read
  gsm8k, math, local JSONL or parquet files (`task.train_path`, `task.test_path`):
  prompts      GSM8K's layout (`openai/gsm8k` as it is), MATH's (`HuggingFaceH4/MATH-500` as
               it is), or any layout whose fields the config names (`task.prompt_field`,
               `task.answer_field`, `task.answer_format`; `asyncrl.data.math_data`).
               Prepared once as TFDS ArrayRecord data under `task.data_dir` (default: the
               run's workdir/tfds) and read from disk without TensorFlow
               (`asyncrl.data.tfds_builders`); a malformed row is an error naming the file
               and line, or with `task.skip_malformed` a logged count. The train order is
               grain's shuffle. The validation split is carved out of the train file by
               construction.

Every split offers random access by prompt id (a checkpoint stores the ids of live prompts)
and `take(start, count)`; the cursor's `state_dict()` goes into every checkpoint.

Validation and test are held out (`TaskData.heldout_disjoint`; labels "validation", "test")
when training can never draw them: arithmetic kinds partition their spaces, a train file
loses its validation part, and a test file loses the questions its train file also asks
(`asyncrl.data.heldout`). Arithmetic kinds too small to hold problems out are evaluated on
their train problems, labelled "train-set", and have no separate test evaluation.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any

from asyncrl.config_args import ConfigError
from asyncrl.data import math_data
from asyncrl.data.arithmetic import (KINDS, MIN_SPACE_FOR_HELDOUT, ArithmeticTask,
                                     DistinctProblems, HELDOUT_PARTS, PromptCursor,
                                     has_heldout_split, part_of)
from asyncrl.data.heldout import (TRAIN_SET, VALIDATION_FRACTION, carve_validation,
                                  disjoint_heldout)

log = logging.getLogger(__name__)

DATASETS = ("arithmetic", *math_data.FORMATS)


SPLITS = HELDOUT_PARTS  # what a run evaluates: ("validation", "test")


@dataclasses.dataclass
class TaskData:
    train: Any  # ArithmeticTask | ProblemSubset of a train file: problem by prompt id
    validation: Any  # evaluated while training: `take(0, eval.heldout_size)`
    test: Any  # reported: evaluated before the first step and after the last
    cursor: Any  # PromptCursor | ShuffledCursor: the run's position in `train`
    heldout_disjoint: bool  # training can never draw a problem of `validation` or `test`

    def split(self, name: str) -> Any:
        if name not in SPLITS:
            raise ValueError(f"evaluation split must be one of {SPLITS}, got {name!r}")
        return getattr(self, name)

    def eval_label(self, split: str) -> str:
        """The split's name, or "train-set" when the task holds nothing out."""
        self.split(split)
        return split if self.heldout_disjoint else TRAIN_SET


def build_task_data(task, heldout_size: int, workdir: str | pathlib.Path) -> TaskData:
    """`task` is the config's task section (checked by asyncrl.config.validate); validation
    and test must each hold `heldout_size` distinct problems training never draws, which only
    building them can tell."""
    if task.dataset == "arithmetic":
        return _arithmetic(task, heldout_size)
    from asyncrl.data import tfds_builders  # TFDS loads slowly; arithmetic runs never need it

    data_dir = task.data_dir or pathlib.Path(workdir) / "tfds"
    fields = file_fields(task)
    train_file = tfds_builders.prepare(task.train_path, task.dataset, data_dir,
                                       task.skip_malformed, fields)
    read = tfds_builders.prepare(task.test_path, task.dataset, data_dir, task.skip_malformed,
                                 fields)
    try:
        train, validation = carve_validation(train_file)
    except ValueError as error:
        raise ConfigError(f"config.task.train_path = {task.train_path!r}: {error}") from None
    test, check = disjoint_heldout(train_file, read)
    if len(validation) < heldout_size:
        raise ConfigError(f"config.eval.heldout_size = {heldout_size} is more than the "
                          f"{len(validation)} validation problems carved out of "
                          f"config.task.train_path = {task.train_path!r} ({VALIDATION_FRACTION:.0%} of "
                          f"its {len(train_file)} problems by construction)")
    if len(test) < heldout_size:
        dropped = (f" ({check.read} read, less {check.overlapping} also in "
                   f"config.task.train_path = {task.train_path!r} and {check.duplicates} "
                   f"repeated questions)") if check.dropped else ""
        raise ConfigError(f"config.eval.heldout_size = {heldout_size} is more than the "
                          f"{len(test)} test problems in config.task.test_path = "
                          f"{task.test_path!r}{dropped}")
    return TaskData(train, validation, test, math_data.ShuffledCursor(train, task.seed),
                    heldout_disjoint=True)


def file_fields(task) -> math_data.Fields:
    """Where a `prompts` file's rows are read, as the task section names it; the other
    formats have fixed layouts."""
    if task.dataset != "prompts":
        return math_data.Fields()
    return math_data.Fields(task.prompt_field, task.answer_field, task.answer_format)


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
        return TaskData(train, evaluation, evaluation, PromptCursor(train), heldout_disjoint=False)
    # Validation and test parts are equal in size (a fraction each of every kind's space).
    validation, test = (ArithmeticTask(task.seed, kinds, split, task.style) for split in SPLITS)
    if heldout_size > len(test):
        held = {name: len(part_of(KINDS.get(name), "test")) for name in KINDS.names()}
        parts = ", ".join(f"{name}: {held[name]} of {KINDS.get(name).size}"
                          for name in dict.fromkeys(kinds))
        larger = ", ".join(f"{name} ({count})" for name, count in held.items()
                           if count >= heldout_size)
        raise ConfigError(
            f"config.eval.heldout_size = {heldout_size} is more than the {len(test)} "
            f"distinct problems of each held-out split (validation, test) of "
            f"config.task.kinds = {kinds} (per kind and split: {parts}); ask for at most "
            f"{len(test)}" + (f", or use kinds that hold more out: {larger}" if larger else ""))
    return TaskData(train, validation, test, PromptCursor(train), heldout_disjoint=True)
