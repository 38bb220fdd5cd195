"""The simulated task: prompt g's lengths and rewards, the same under every system.

The core draws prompts from a `PromptSource`; the simulator's hands out prompt ids 0, 1, 2, …
whose tokens are placeholders of the prompt's length (tokens are never simulated).
Everything about prompt g comes from generators seeded by (seed, g's block of 1,024 prompts):
its prompt length, its responses' lengths (one per launched response, in member order) and
their rewards. Prompt g is therefore the same work under every system, however many prompts
another system drew before it (a retried prompt is the same work again).

Rewards model a task of mixed difficulty: each response to prompt g is rewarded 1 with a
probability p_g drawn from Beta(a, b) (`pass_rate_beta`; (1, 1) is uniform), else 0. A group
whose rewards are all equal, which dynamic sampling filters out, is as common as that makes
it (2/17 of groups of 16 when p_g is uniform). Without dynamic sampling the values are unused.
"""

from __future__ import annotations

import numpy as np

from asyncrl.coordinator.messages import Prompt
from asyncrl.sim.workload import build_lengths

BLOCK = 1024  # prompts whose lengths and rewards are drawn at once


class SimPrompts:
    """The core's prompt source, and each prompt's response lengths and rewards."""

    def __init__(self, config, responses_per_prompt: int):
        c = config
        self.seed = c.seed
        self.launch = responses_per_prompt
        self._prompt_lengths = build_lengths(c.prompt_lengths)
        self._response_lengths = build_lengths(c.response_lengths)
        a, b = c.pass_rate_beta
        if not (a > 0 and b > 0):
            raise ValueError(f"pass_rate_beta={tuple(c.pass_rate_beta)!r}: both must be > 0")
        self._beta = (float(a), float(b))
        self.max_new_tokens = int(self._response_lengths.cap)
        self._placeholder = np.zeros(int(self._prompt_lengths.cap), np.int32)
        self._block = -1
        self._next = 0

    def _rows(self, prompt_id: int) -> tuple[int, np.ndarray, np.ndarray]:
        block, row = divmod(prompt_id, BLOCK)
        if block != self._block:
            # The draws (and their order) of the schedules this replaces: the same seed gives
            # the same prompt and response lengths as before.
            rng = np.random.default_rng([self.seed, block])
            prompts = self._prompt_lengths.sample(rng, BLOCK)
            responses = self._response_lengths.sample(rng, BLOCK * self.launch)
            rewards = np.random.default_rng([self.seed, block, 1])
            pass_rate = rewards.beta(*self._beta, BLOCK)
            solved = rewards.random((BLOCK, self.launch)) < pass_rate[:, None]
            self._block = block
            self._pool = (prompts, responses.reshape(BLOCK, self.launch), solved.astype(float))
        prompts, responses, solved = self._pool
        return int(prompts[row]), responses[row], solved[row]

    # ---------------------------------------------------------------- PromptSource

    def __iter__(self):
        return self

    def __next__(self) -> Prompt:
        prompt_id, self._next = self._next, self._next + 1
        return self.get(prompt_id)

    def get(self, prompt_id: int) -> Prompt:
        length, _, _ = self._rows(prompt_id)
        return Prompt(prompt_id, self._placeholder[:length])

    # ---------------------------------------------------------------- the simulated responses

    def responses(self, prompt_id: int) -> tuple[int, list[int], list[float]]:
        """(prompt length, each member's response length, each member's reward)."""
        length, responses, rewards = self._rows(prompt_id)
        return length, responses.tolist(), rewards.tolist()
