"""Greedy held-out evaluation on a rollout engine: accuracy and mean response length; and
the unbiased pass@k estimator for sampled evaluation.

Runs on its own engine (temperature 0) so it never disturbs the training rollouts' random
streams; the slots are refilled continuously, as in rollout.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from asyncrl.rollout.engine import Engine


@dataclasses.dataclass(frozen=True)
class EvalResult:
    accuracy: float
    mean_length: float
    num_problems: int
    seconds: float

    def as_dict(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}_accuracy": self.accuracy, f"{prefix}_mean_length": self.mean_length}


def greedy_eval(engine: Engine, params, prompts: Sequence[Sequence[int]], answers: Sequence[str],
                decode: Callable[[list[int]], str], score: Callable[[str, str], float],
                version: int = 0) -> EvalResult:
    start = time.perf_counter()
    state = engine.init_decode_state()
    pending = list(range(len(prompts)))[::-1]
    rewards = np.zeros(len(prompts))
    lengths = np.zeros(len(prompts))
    # Trajectory ids only seed sampling, which greedy decoding does not use.
    while pending or len(engine.free_slots()) < engine.num_slots:
        free = engine.free_slots()
        while pending and free:
            i = pending.pop()
            prefix, _ = engine.prefill(params, np.asarray(prompts[i], np.int32), trajectory_id=i,
                                       version=version)
            state = engine.insert(prefix, state, free.pop(0))
        if engine.running():
            state, _ = engine.generate(params, state, version=version)
        for record in engine.pop_finished():
            i = record.trajectory_id
            rewards[i] = score(decode(record.tokens), answers[i])
            lengths[i] = len(record.tokens)
    return EvalResult(float(rewards.mean()) if len(prompts) else 0.0,
                      float(lengths.mean()) if len(prompts) else 0.0, len(prompts),
                      time.perf_counter() - start)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, "Codex").

        pass@k = 1 - C(n - c, k) / C(n, k)

    the probability that k samples drawn without replacement from the n include a correct one.
    The binomials overflow floats for n in the hundreds, so the ratio is taken as the product
    C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i), every factor in [0, 1].
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}], got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c (correct samples) must be in [0, n={n}], got {c}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))
