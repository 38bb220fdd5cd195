"""`config.model`: which policy a run post-trains (asyncrl/policy.py loads it)."""

from __future__ import annotations

import os

from asyncrl.model.config import ModelConfig
from asyncrl.sections import Section, fail, section

PARAM_DTYPES = ("float32", "bfloat16")


@section
class ModelSection(Section):
    name = "model"
    checkpoint: str  # 'embedded', 'random', an HF folder or a .gguf file
    preset: str  # a ModelConfig preset, used when checkpoint == 'random'
    param_dtype: str  # the trainer's master weights (rollout casts its copy)

    def check(self) -> None:
        if not callable(getattr(ModelConfig, self.preset, None)) or self.preset.startswith(("_", "from_")):
            fail("model.preset", self.preset, "the name of a ModelConfig preset "
                 "(asyncrl/model/config.py), e.g. 'smollm2_135m' or 'tiny'")
        if self.param_dtype not in PARAM_DTYPES:
            fail("model.param_dtype", self.param_dtype, f"one of {', '.join(PARAM_DTYPES)}")

    def check_files(self) -> None:
        if self.checkpoint not in ("embedded", "random") and not os.path.exists(self.checkpoint):
            fail("model.checkpoint", self.checkpoint,
                 "'embedded', 'random', or the path of a Hugging Face folder or a .gguf file")
