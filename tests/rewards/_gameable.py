"""A reward open to gaming, as a user's plugin might be (config.rewards.plugins): it pays a
response that holds the answer anywhere, stated or not, as math-verify's extraction did."""

from asyncrl.rewards.registry import REWARDS


@REWARDS.register("test_answer_anywhere")
def answer_anywhere(response: str, answer: str) -> float:
    return 1.0 if str(answer) in response else 0.0
