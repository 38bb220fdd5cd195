"""The policy a run post-trains, and its prompts: loading the model and tokenizer, rendering
a problem as the prompt tokens the model sees, and the stream of prompts the coordinator
dispatches.

Loading order: 1. the embedded SmolLM2 GGUF  2. a local HF folder or .gguf file  3. a random
preset (the tiny config's model learns from scratch on a character tokenizer).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Iterator

from asyncrl.config_args import ConfigError
from asyncrl.coordinator.messages import Prompt
from asyncrl.data.arithmetic import Problem
from asyncrl.data.section import TaskSection
from asyncrl.data.tokenizer import char_tokenizer
from asyncrl.model.section import ModelSection
from asyncrl.model import (ModelConfig, default_policy_path, init_params, load_gguf, load_hf,
                           prompt_messages, resolve_chat_template)


@dataclasses.dataclass
class Policy:
    config: ModelConfig
    params: Any
    tokenizer: Any  # tokenizers.Tokenizer
    source: pathlib.Path | None  # the checkpoint it was loaded from; None for a random init
    _renderers: dict[str, Any] = dataclasses.field(default_factory=dict)

    def encode_prompt(self, problem: Problem, chat_template: str, instruction: str,
                      system_prompt: str = "") -> tuple[int, ...]:
        """`chat_template`: 'auto' (the checkpoint's own), a named format, or '' (raw)."""
        text = problem.question + (f" {instruction}" if instruction else "")
        if chat_template not in self._renderers:
            self._renderers[chat_template] = resolve_chat_template(chat_template, self.source)
        render = self._renderers[chat_template]
        if render is not None:
            # The template writes BOS where the model expects it (Llama 3 does, ChatML does not).
            text = render(prompt_messages(text, system_prompt))
            return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)
        # Raw prompts start from BOS, as the model saw in pre-training (or, tiny, in RL).
        return (self.config.bos_token_id, *self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)


def load_policy(model_cfg: ModelSection) -> Policy:
    dtype = model_cfg.param_dtype
    if model_cfg.checkpoint == "random":
        tokenizer = char_tokenizer()
        preset = getattr(ModelConfig, model_cfg.preset)
        config = preset(param_dtype=dtype, vocab_size=tokenizer.get_vocab_size()) \
            if model_cfg.preset == "tiny" else preset(param_dtype=dtype)
        return Policy(config, init_params(config, 0)[1], tokenizer, None)
    path = default_policy_path() if model_cfg.checkpoint == "embedded" else pathlib.Path(model_cfg.checkpoint)
    if str(path).endswith(".gguf"):
        config, params, tokenizer = load_gguf(path, param_dtype=dtype)
    else:
        config, params, tokenizer = load_hf(path, param_dtype=dtype)
    return Policy(config, params, tokenizer, path)


def encode(policy: Policy, problem: Problem, task: TaskSection, prompt_bucket: int) -> Prompt:
    """A problem as the policy's prompt, in the words and template `task` asks for, checked
    against the rollout's prompt bucket (config.rollout.prompt_bucket)."""
    tokens = policy.encode_prompt(problem, task.chat_template, task.instruction,
                                  task.system_prompt)
    if len(tokens) > prompt_bucket:
        raise ConfigError(
            f"config.rollout.prompt_bucket = {prompt_bucket} is shorter than "
            f"prompt {problem.prompt_id} ({len(tokens)} tokens: {problem.question!r})")
    return Prompt(problem.prompt_id, tokens)


class PromptStream:
    """The coordinator's prompt source: the train split in the data cursor's order, each
    problem rendered for the policy; `get` renders any problem again by its id."""

    def __init__(self, policy: Policy, task: TaskSection, prompt_bucket: int, split,
                 cursor: Iterator[Problem]):
        self.policy, self.task, self.prompt_bucket = policy, task, prompt_bucket
        self.split, self.cursor = split, cursor

    def __iter__(self) -> "PromptStream":
        return self

    def __next__(self) -> Prompt:
        return encode(self.policy, next(self.cursor), self.task, self.prompt_bucket)

    def get(self, prompt_id: int) -> Prompt:
        return encode(self.policy, self.split[prompt_id], self.task, self.prompt_bucket)
