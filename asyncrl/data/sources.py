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
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from asyncrl.config_args import ConfigError
from asyncrl.data import math_data, tfds_builders
from asyncrl.data.arithmetic import ArithmeticTask, PromptCursor

DATASETS = ("arithmetic", *math_data.FORMATS)


@dataclasses.dataclass
class TaskData:
    train: Any  # ArithmeticTask | MathDataset: problem by prompt id
    heldout: Any
    cursor: Any  # PromptCursor | ShuffledCursor: the run's position in `train`


def build_task_data(task, heldout_size: int, workdir: str | pathlib.Path) -> TaskData:
    """`task` is the config's task section (checked by asyncrl.config.validate); the held-out
    file must hold `heldout_size` problems, which only reading it can tell."""
    if task.dataset == "arithmetic":
        train = ArithmeticTask(task.seed, tuple(task.kinds), "train", task.style)
        heldout = ArithmeticTask(task.seed, tuple(task.kinds), "heldout", task.style)
        return TaskData(train, heldout, PromptCursor(train))
    data_dir = task.data_dir or pathlib.Path(workdir) / "tfds"
    train = tfds_builders.prepare(task.train_path, task.dataset, data_dir, task.skip_malformed)
    heldout = tfds_builders.prepare(task.heldout_path, task.dataset, data_dir, task.skip_malformed)
    if len(heldout) < heldout_size:
        raise ConfigError(f"config.eval.heldout_size = {heldout_size} is more than the "
                          f"{len(heldout)} problems in config.task.heldout_path = "
                          f"{task.heldout_path!r}")
    return TaskData(train, heldout, math_data.ShuffledCursor(train, task.seed))
