"""Environments: what an episode of several turns talks to.

    env = ENVIRONMENTS.build("calculator")
    messages = env.reset(problem)            # the conversation the first turn continues
    outcome = env.step(model_turn)           # Observation: messages to append, then the
                                             # model's next turn; Final: the episode's reward

An environment is a Protocol, registered by name like the rewards (a user's module may
register its own). The engine side of an episode (the tokens it generated and was fed, the
per-episode staleness bound) is being built on this (issue 48); an environment knows only
text messages.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from asyncrl.agents.tool_calls import TOOL_CALL_FORMATS, run_tool
from asyncrl.registry import Registry
from asyncrl.rewards.registry import REWARDS

ENVIRONMENTS = Registry("environment")

# The tool's instructions, with one worked example: a model whose template has no tool format
# (SmolLM2) is taught the format here; Qwen2.5's and Qwen3's templates already know it.
CALCULATOR_SYSTEM_PROMPT = """You can use a calculator. To call it, write
<tool_call>
{"name": "calculator", "arguments": {"expression": "<arithmetic>"}}
</tool_call>
and stop; its result comes back in the next message. When you know the answer, write it as
"The answer is N."

Example. User: What is 2048 * 3571?
Assistant: <tool_call>
{"name": "calculator", "arguments": {"expression": "2048 * 3571"}}
</tool_call>
Tool: 7313408
Assistant: The answer is 7313408."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """The environment's reply to a turn: messages the next turn continues from."""
    messages: tuple[dict[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Final:
    """The episode is over: its reward, and what the episode did (for its metrics)."""
    reward: float


class Environment(Protocol):
    def reset(self, problem) -> list[dict[str, str]]:
        """The first messages of an episode on `problem` (a task's Problem)."""

    def step(self, model_turn: str) -> Observation | Final:
        """The environment's answer to the model's latest turn."""


@ENVIRONMENTS.register("calculator")
class CalculatorEnvironment:
    """Arithmetic with the calculator tool: a turn that calls it gets the results back as
    tool messages; a turn without a call is the final answer, graded by `reward` against the
    problem's answer. Calls past `max_tool_calls` in one episode end it with reward 0."""

    def __init__(self, *, tool_format: str = "hermes", reward: str = "exact_answer",
                 max_tool_calls: int = 4, system_prompt: str = CALCULATOR_SYSTEM_PROMPT):
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
        self.format = TOOL_CALL_FORMATS.build(tool_format)
        self.grade = REWARDS.get(reward)
        self.max_tool_calls, self.system_prompt = max_tool_calls, system_prompt
        self._answer: str | None = None
        self.tool_calls = 0
        self.tool_errors = 0

    def reset(self, problem) -> list[dict[str, str]]:
        self._answer, self.tool_calls, self.tool_errors = problem.answer, 0, 0
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": problem.question}]

    def step(self, model_turn: str) -> Observation | Final:
        if self._answer is None:
            raise RuntimeError("step before reset: an episode starts with reset(problem)")
        try:
            calls = self.format.parse(model_turn)
        except ValueError as error:  # a call written badly: the model reads why
            self.tool_errors += 1
            return Observation((self.format.result_message(f"error: {error}"),))
        if not calls:
            return Final(float(self.grade(response=model_turn, answer=self._answer)))
        self.tool_calls += len(calls)
        if self.tool_calls > self.max_tool_calls:
            return Final(0.0)
        results = [run_tool(call) for call in calls]
        self.tool_errors += sum(r.startswith("error: ") for r in results)
        return Observation(tuple(self.format.result_message(r) for r in results))
