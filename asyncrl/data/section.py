"""`config.task`: what the run learns (the data, its prompt's words, the reward that pays it)
and the checks of those fields against the data formats, the arithmetic kinds and the
rewards registered (a reward plugin registers its rewards first: asyncrl/rewards/section.py).
"""

from __future__ import annotations

import os

from asyncrl.data.arithmetic import KINDS
from asyncrl.data.math_data import ANSWER_FORMATS, Fields, check_fields
from asyncrl.data.sources import DATASETS, file_fields
from asyncrl.rewards.registry import REWARDS
from asyncrl.sections import Section, fail, int_at_least, registered, section


@section
class TaskSection(Section):
    name = "task"
    dataset: str
    train_path: str
    test_path: str
    prompt_field: str
    answer_field: str
    answer_format: str
    skip_malformed: bool
    data_dir: str
    kinds: tuple[str, ...]
    style: str
    seed: int
    reward: str
    chat_template: str
    system_prompt: str
    instruction: str

    def check(self) -> None:
        int_at_least("task.seed", self.seed, 0)
        if self.dataset not in DATASETS:
            fail("task.dataset", self.dataset, f"one of {', '.join(DATASETS)}")
        for kind in self.kinds:
            if kind not in KINDS:
                fail("task.kinds", self.kinds, f"registered kinds: {', '.join(KINDS.names())}")
        registered("task.reward", self.reward, REWARDS)
        if self.system_prompt and not self.chat_template:
            fail("task.system_prompt", self.system_prompt,
                 "a system prompt needs a chat template (task.chat_template is '', raw prompts)")
        self._check_fields()

    def _check_fields(self) -> None:
        """The `prompts` format's field names, read by it alone: set for another dataset
        they would be ignored."""
        defaults = Fields()
        for field, default in (("prompt_field", defaults.prompt),
                               ("answer_field", defaults.answer),
                               ("answer_format", defaults.answer_format)):
            value = getattr(self, field)
            if self.dataset != "prompts" and value != default:
                fail(f"task.{field}", value, f"{default!r}: it is read only with task.dataset = "
                     f"'prompts', and task.dataset is {self.dataset!r}")
            if field != "answer_format" and not value:
                fail(f"task.{field}", value, "the name of a field of the data file's rows")
        if self.answer_format not in ANSWER_FORMATS:
            fail("task.answer_format", self.answer_format, f"one of {', '.join(ANSWER_FORMATS)}")

    def check_files(self) -> None:
        """The data files exist here and a `prompts` file's first row has the fields named,
        before anything is built."""
        if self.dataset == "arithmetic":
            return
        for field in ("train_path", "test_path"):
            if not os.path.isfile(getattr(self, field)):
                fail(f"task.{field}", getattr(self, field),
                     f"the path of a local {self.dataset} file (task.dataset)")
        if self.dataset == "prompts":
            for path in (self.train_path, self.test_path):
                check_fields(path, file_fields(self))
