"""Held-out evaluation on a rollout engine: greedy accuracy, sampled pass@k, response length
and answer-format rate; and the unbiased pass@k estimator.

Every result carries the label of the set it was measured on: "validation" or "test" (the
task's held-out splits, which training can never draw), "train-set" when the task is too
small to hold any out (`TaskData.eval_label`), so no figure claims more than it measured.

Accuracy is graded by the task reward's strict grader (`asyncrl.rewards.strict_grader`), even
when training uses a lenient reward, and reported beside the rate of responses that put an
answer where the prompt asked (the format rate) and the rate cut at the token cap: a policy
that learned to game a reward shows there, not as accuracy.

Grading runs in reward worker processes (asyncrl/rewards/pool.py), as in training: a grader
that raises on a response or runs past the time limit (math-verify on `\\boxed{9^{9^{9^{9}}}}`)
scores that response 0 and is counted (`grader_errors`), and never stops the evaluation; in
this process, off the main thread, nothing could stop a verifier that hangs. A reference
answer the grader cannot read is broken data: a ValueError, loudly.

Runs on engines of its own (greedy: temperature 0; sampled: the rollout's sampling) so it
never disturbs the training rollouts' random streams; the slots are refilled continuously,
as in rollout, and a problem's k samples share one prefill (multi-sampling).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import pathlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncrl.data.heldout import EVAL_LABELS, VALIDATION
from asyncrl.eval.section import EvalSection
from asyncrl.model import ShardingRules, shardings_for
from asyncrl.rewards import RewardPool
from asyncrl.rewards.registry import strict_grader
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.messages import Trajectory
from asyncrl.rollout.slots import Slots
from asyncrl.model.sampling import SamplingParams
from asyncrl.servers.parameters import place

log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class Graded:
    scores: list[float]  # 1.0 means correct (or formatted); 0.0 where grading failed
    errors: list[str | None]  # why grading a response failed, in one line; None: it did not


# (responses, answers) -> their grades, in order
Grade = Callable[[Sequence[str], Sequence[str]], Graded]


def grade_in_pool(pool: RewardPool, reward: str, responses: Sequence[str],
                  answers: Sequence[str]) -> Graded:
    """Each response graded by the reward `reward` in `pool`'s workers. One whose grading
    raised or ran past the pool's timeout scores 0.0 and says why; a reward that fails on a
    reference answer whatever the response is broken data (or a broken reward): ValueError."""
    outcomes = pool.map(reward, [{"response": r, "answer": a} for r, a in zip(responses, answers)])
    for outcome, answer in zip(outcomes, answers):
        if outcome.raised:
            raise ValueError(f"evaluation: the reward {reward!r} fails on the reference answer "
                             f"{str(answer)[:80]!r} whatever the response: {outcome.error}")
    return Graded([o.reward if o.ok else 0.0 for o in outcomes],
                  [o.error or o.response_error for o in outcomes])


@dataclasses.dataclass(frozen=True)
class Completions:
    """Every response to every problem: the arrays are [problems, samples]."""

    correct: np.ndarray
    formatted: np.ndarray
    lengths: np.ndarray
    cut: np.ndarray  # stopped by the token cap, not by the model
    responses: list[list[str]]
    seconds: float
    errors: list[list[str | None]]  # why grading (or the format check) failed; None: it did not

    @property
    def grader_errors(self) -> int:
        return sum(e is not None for row in self.errors for e in row)


def complete(engine: Engine, params, prompts: Sequence[Sequence[int]], answers: Sequence[str],
             decode: Callable[[list[int]], str], score: Grade, samples: int = 1,
             is_formatted: Grade | None = None, version: int = 0) -> Completions:
    """Generates `samples` responses per prompt, then grades them all."""
    if not 1 <= samples <= engine.num_slots:
        raise ValueError(f"samples per problem must be in [1, num_slots={engine.num_slots}], "
                         f"got {samples}")
    start = time.perf_counter()
    shape = (len(prompts), samples)
    lengths, cut = np.zeros(shape), np.zeros(shape, bool)
    responses = [[""] * samples for _ in prompts]
    slots, state = Slots(engine), engine.init_decode_state()
    pending = list(range(len(prompts)))[::-1]
    while pending or len(slots.free_slots()) < engine.num_slots:
        free = slots.free_slots()
        while pending and len(free) >= samples:
            i = pending.pop()
            prompt = np.asarray(prompts[i], np.int32)
            # Sample j of problem i is trajectory i·samples + j: its own random stream.
            group = [Trajectory(i * samples + j, prompt, engine.max_new_tokens)
                     for j in range(samples)]
            state = slots.start(params, state, group, free[:samples], version=version)
            free = free[samples:]
        if slots.running():
            state = slots.step(params, state, version=version)
        for record in slots.pop_finished():
            i, j = divmod(record.trajectory_id, samples)
            responses[i][j] = decode(record.tokens)
            lengths[i, j] = len(record.tokens)
            cut[i, j] = record.finish_reason == "length"
    flat = [r for row in responses for r in row]
    golds = [answer for answer in answers for _ in range(samples)]
    graded = score(flat, golds)
    correct = np.array(graded.scores, float).reshape(shape) >= 1.0
    errors, formatted = list(graded.errors), np.full(shape, np.nan)
    if is_formatted is not None:
        checked = is_formatted(flat, golds)
        formatted = (np.array(checked.scores, float).reshape(shape) >= 1.0).astype(float)
        errors = [e if e is not None else f for e, f in zip(errors, checked.errors)]
    return Completions(correct, formatted, lengths, cut, responses, time.perf_counter() - start,
                       [errors[i:i + samples] for i in range(0, len(errors), samples)])


@dataclasses.dataclass(frozen=True)
class EvalResult:
    accuracy: float  # greedy
    mean_length: float  # greedy responses, tokens
    format_rate: float | None  # greedy responses in the asked-for format; None: no check set
    num_problems: int
    seconds: float
    pass_at: dict[int, float] | None = None  # k -> pass@k over the sampled responses
    samples: int = 0  # sampled responses per problem (0: greedy only)
    eval_label: str = VALIDATION  # or "test", or "train-set": problems training also draws
    cut_rate: float = 0.0  # greedy responses stopped by the token cap
    grader: str = ""  # the reward that graded `accuracy`
    # Responses (greedy and sampled) whose grading raised or timed out: each scored 0.
    grader_errors: int = 0

    def __post_init__(self):
        _check_label(self.eval_label)

    def as_dict(self, prefix: str) -> dict[str, float | str]:
        """Flat figures for a metrics line: `{prefix}_accuracy`, `{prefix}_pass@4`, ..., and
        `{prefix}_label`, the set they were measured on."""
        out: dict[str, float | str] = {f"{prefix}_accuracy": self.accuracy,
                                       f"{prefix}_mean_length": self.mean_length,
                                       f"{prefix}_cut_rate": self.cut_rate,
                                       f"{prefix}_grader_errors": self.grader_errors,
                                       f"{prefix}_label": self.eval_label}
        if self.format_rate is not None:
            out[f"{prefix}_format_rate"] = self.format_rate
        for k, value in (self.pass_at or {}).items():
            out[f"{prefix}_pass@{k}"] = value
        return out


def evaluate_policy(greedy_engine: Engine, sampling_engine: Engine | None, params,
                    prompts: Sequence[Sequence[int]], answers: Sequence[str],
                    decode: Callable[[list[int]], str], score: Grade, *,
                    is_formatted: Grade | None = None, samples: int = 0,
                    pass_ks: Sequence[int] = (), version: int = 0,
                    eval_label: str = VALIDATION, grader: str = "",
                    on_greedy: Callable[[Completions], None] | None = None) -> EvalResult:
    """Greedy accuracy, length, format and cut rates; with `samples` > 0 also pass@k for each
    k in `pass_ks` from that many sampled responses per problem. `eval_label` names the set
    `prompts` come from (see EVAL_LABELS), `grader` the reward `score` is;
    `on_greedy` sees the greedy responses."""
    if samples and any(not 1 <= k <= samples for k in pass_ks):
        raise ValueError(f"every k of pass@k must be in [1, samples={samples}], got {list(pass_ks)}")
    greedy = complete(greedy_engine, params, prompts, answers, decode, score, 1, is_formatted,
                      version)
    if on_greedy is not None:
        on_greedy(greedy)
    pass_at, seconds, errors = None, greedy.seconds, greedy.grader_errors
    if samples:
        if sampling_engine is None:
            raise ValueError("samples > 0 needs a sampling engine")
        sampled = complete(sampling_engine, params, prompts, answers, decode, score, samples,
                           None, version)
        counts = sampled.correct.sum(axis=1).astype(int)
        pass_at = {int(k): float(np.mean([pass_at_k(samples, c, k) for c in counts]))
                   for k in pass_ks} if len(prompts) else {int(k): 0.0 for k in pass_ks}
        seconds += sampled.seconds
        errors += sampled.grader_errors
    n = len(prompts)
    return EvalResult(
        accuracy=float(greedy.correct.mean()) if n else 0.0,
        mean_length=float(greedy.lengths.mean()) if n else 0.0,
        format_rate=float(greedy.formatted.mean()) if n and is_formatted else None,
        num_problems=n, seconds=seconds, pass_at=pass_at, samples=samples, eval_label=eval_label,
        cut_rate=float(greedy.cut.mean()) if n else 0.0, grader=grader, grader_errors=errors)


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """What evaluation's engines share with the rollouts' (config.rollout, config.seed): the
    slots, the prompt bucket, the sampling of pass@k's samples and the seed."""

    num_slots: int
    prompt_bucket: int
    sampling: SamplingParams
    seed: int


class Evaluator:
    """A run's evaluation (config.eval) on one rollout mesh, on engines built at the first
    call: every evaluation of a run shares their compiles. `data` is the run's `TaskData`:
    each call reads the first config.eval.heldout_size problems of one of its splits
    ('validation' or 'test'), labelled by `data.eval_label`. Accuracy is graded by the strict
    grader of config.task.reward."""

    def __init__(self, evaluation: EvalSection, engines: EngineSettings, graphdef, model_config,
                 mesh, data, encode: Callable[[Any], Sequence[int]],
                 decode: Callable[[list[int]], str], *, reward: str,
                 reward_pool: Callable[[], RewardPool]):
        """`reward`: the task's reward (config.task.reward), whose strict grader grades and
        whose format the format rate checks; `reward_pool` starts the graders' workers."""
        self.evaluation, self.engines = evaluation, engines
        self.graphdef, self.model_config, self.mesh = graphdef, model_config, mesh
        self.data, self.encode, self.decode = data, encode, decode
        self.grader = strict_grader(reward)
        self.format_check = evaluation.format_check(reward)
        self.new_pool = reward_pool
        self.seconds = 0.0  # spent evaluating, over the run
        self._engines: tuple[Engine, Engine | None] | None = None  # greedy, sampled
        # Its graders' worker processes, started at the first call as the engines are and
        # kept until close(): a run evaluates seven times or more, and each start spawns the
        # workers and imports the rewards again.
        self._pool: RewardPool | None = None
        # split -> (problems, prompts): each split is fixed for the run, encoded once
        self._problems: dict[str, tuple[list, list[Sequence[int]]]] = {}

    def _engine(self, sampling: SamplingParams, num_slots: int) -> Engine:
        e, max_new = self.engines, self.evaluation.max_new_tokens
        return Engine(self.graphdef, self.model_config, num_slots=num_slots,
                      max_len=e.prompt_bucket + max_new, prompt_buckets=(e.prompt_bucket,),
                      sampling=sampling, max_new_tokens=max_new,
                      # Its own seed: evaluation's trajectory ids reuse the rollouts' ids.
                      seed=e.seed + 1, mesh=self.mesh, rules=ShardingRules.replicated())

    def __call__(self, params, version: int, label: str, split: str = VALIDATION,
                 responses_to: pathlib.Path | None = None) -> EvalResult:
        """`responses_to`: a JSONL file that receives every greedy response with its problem,
        reference and grades (one line a problem), for a recount by other means."""
        ev, e = self.evaluation, self.engines
        if split not in self._problems:
            problems = self.data.split(split).take(0, ev.heldout_size)
            self._problems[split] = (problems, [self.encode(p) for p in problems])
        problems, prompts = self._problems[split]
        if self._engines is None:
            # One problem's samples are inserted together: at least that many slots.
            sampled = self._engine(e.sampling, max(e.num_slots, ev.samples)) \
                if ev.samples else None
            self._engines = (self._engine(SamplingParams(temperature=0.0), e.num_slots), sampled)
        greedy, sampled = self._engines
        # On a CPU host the engines read the caller's buffers, not a copy of them: the
        # caller's weights stay unchanged while this runs (a published version, a copy
        # BackgroundEvaluator made, or the trainer's before the first step or after the last).
        params, _ = place(params, shardings_for(params, self.mesh, ShardingRules.replicated()))

        def save(completions: Completions) -> None:
            if responses_to is not None:
                write_responses(responses_to, problems, completions, self.grader)

        if self._pool is None:
            self._pool = self.new_pool()
        result = evaluate_policy(
            greedy, sampled, params, prompts, [p.answer for p in problems], self.decode,
            functools.partial(grade_in_pool, self._pool, self.grader),
            is_formatted=(functools.partial(grade_in_pool, self._pool, self.format_check)
                          if self.format_check else None),
            samples=ev.samples, pass_ks=ev.pass_k, version=version,
            eval_label=self.data.eval_label(split), grader=self.grader, on_greedy=save)
        self.seconds += result.seconds
        return result

    def close(self) -> None:
        """Ends the graders' worker processes (a later call starts them again)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class BackgroundEvaluator:
    """Runs an Evaluator on its own thread, so periodic evaluation never holds the trainer.

    `submit(version, params)` copies the weights (the next train step donates them) and
    returns at once (`copy=False`: weights nothing will change, e.g. a published version,
    are read as they are); `results()` hands back what finished since the last call, each with the
    version it evaluated. If a new evaluation is submitted while one is still waiting to
    start, the older one is skipped (and counted): evaluation falls behind, never memory.
    """

    def __init__(self, evaluate: Evaluator, split: str = VALIDATION):
        self.evaluate, self.split = evaluate, split
        self.skipped = 0
        self._copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))
        self._waiting: tuple[int, Any] | None = None
        self._finished: list[tuple[int, EvalResult]] = []
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="evaluation", daemon=True)
        self._thread.start()

    def submit(self, version: int, params, *, copy: bool = True) -> None:
        copy = self._copy(params) if copy else params
        with self._cond:
            self._raise_failure()
            if self._waiting is not None:
                self.skipped += 1
                log.warning("evaluation of version %d skipped: version %d is due and the "
                            "evaluator is still busy", self._waiting[0], version)
            self._waiting = (version, copy)
            self._cond.notify_all()

    def results(self) -> list[tuple[int, EvalResult]]:
        with self._cond:
            self._raise_failure()
            done, self._finished = self._finished, []
            return done

    def close(self) -> list[tuple[int, EvalResult]]:
        """Finishes what was submitted, stops the thread; returns the last results."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        return self.results()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise RuntimeError("the evaluation thread failed") from self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None and not self._closing:
                    self._cond.wait()
                if self._waiting is None:
                    return
                (version, params), self._waiting = self._waiting, None
            try:
                result = self.evaluate(params, version, f"version {version}",
                                       split=self.split)
            except BaseException as error:  # surfaces in the trainer's next call
                log.exception("evaluation of version %d failed", version)
                with self._cond:
                    self._error = error
                return
            with self._cond:
                self._finished.append((version, result))


def write_responses(path: pathlib.Path, problems, completions: Completions, grader: str) -> None:
    """One JSON line per problem: its question, reference, greedy response and grades."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as f:
        for i, problem in enumerate(problems):
            formatted = completions.formatted[i, 0]
            f.write(json.dumps({
                "prompt_id": problem.prompt_id, "question": problem.question,
                "answer": problem.answer, "response": completions.responses[i][0],
                "correct": bool(completions.correct[i, 0]), "grader": grader,
                "formatted": None if np.isnan(formatted) else bool(formatted),
                "cut": bool(completions.cut[i, 0]), "length": int(completions.lengths[i, 0]),
                "grader_error": completions.errors[i][0],
            }) + "\n")
    partial.replace(path)


def describe(result: EvalResult) -> str:
    passes = "".join(f", pass@{k} {v:.3f}" for k, v in (result.pass_at or {}).items())
    formatted = "" if result.format_rate is None else f", format {result.format_rate:.3f}"
    errors = (f"; {result.grader_errors} responses could not be graded (scored 0)"
              if result.grader_errors else "")
    return (f"{result.eval_label} accuracy {result.accuracy:.3f} on {result.num_problems} "
            f"problems{passes}{formatted}, cut at the cap {result.cut_rate:.3f} (mean length "
            f"{result.mean_length:.1f} tokens, {result.seconds:.1f} s){errors}")


def _check_label(label: str) -> str:
    if label not in EVAL_LABELS:
        raise ValueError(f"evaluation label must be one of {EVAL_LABELS}, got {label!r}")
    return label


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
