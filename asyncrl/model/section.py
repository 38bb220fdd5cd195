"""`config.model`: which policy a run post-trains (asyncrl/policy.py loads it)."""

from __future__ import annotations

import os

from asyncrl.model.config import PARAM_DTYPES, PRESETS
from asyncrl.sections import Section, fail, section


@section
class ModelSection(Section):
    name = "model"
    checkpoint: str  # 'embedded', 'random', an HF folder or a .gguf file
    preset: str  # a ModelConfig preset, used when checkpoint == 'random'
    param_dtype: str  # the trainer's master weights (rollout casts its copy)

    def check(self) -> None:
        if self.preset not in PRESETS:
            fail("model.preset", self.preset, f"a ModelConfig preset: {', '.join(PRESETS)}")
        if self.param_dtype not in PARAM_DTYPES:
            fail("model.param_dtype", self.param_dtype, f"one of {', '.join(PARAM_DTYPES)}")

    def check_files(self) -> None:
        if self.checkpoint not in ("embedded", "random") and not os.path.exists(self.checkpoint):
            fail("model.checkpoint", self.checkpoint,
                 "'embedded', 'random', or the path of a Hugging Face folder or a .gguf file")
