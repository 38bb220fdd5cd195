"""A reward the tiny random model can never earn, as a user's plugin might be
(config.rewards.plugins): it pays only a boxed answer, while the tiny task's prompt asks for a
bare digit and its character tokenizer cannot even spell `\\boxed`. Every group scores all 0."""

from asyncrl.rewards.math import gsm8k
from asyncrl.rewards.registry import REWARDS


@REWARDS.register("test_boxed_only")
def boxed_only(response: str, answer: str) -> float:
    return gsm8k(response, answer)
