r"""The paired lag test: what sampling with weights `lag` steps old costs GRPO, all else equal.

    python benchmarks/lag.py                                  # tiny config, 5 seeds x 30 steps
    python benchmarks/lag.py --seeds=0 --steps=3              # a smoke test
    python benchmarks/lag.py --variants=lag0,lag2 --override train.learning_rate=5e-3

One process, one trainer and one engine, no coordinator: the lag is set, not whatever a
schedule produces. Per (variant, seed) a loop of --steps steps; at step s (from 0):

  1. sample the batch with the weights of step max(0, s - lag) (a short history of the
     weights each step produced is kept): the same prompts in every variant (entry
     e = s·B + p is the cursor's e-th problem), and the same sampling keys, since the
     engine draws token i of trajectory t with fold_in(seed, t, i) and trajectory t is
     member m of entry e, t = e·G + m, in every variant;
  2. reward it with the task's reward (`asyncrl.rewards.REWARDS`, the reward workers' code);
  3. one train step (`Trainer.step`, `TrainBatch.from_groups`) on the current weights.

Variants: lag0, lag1, lag2 train with the configured loss (the default's DAPO clip with TIS
against the behaviour log-probs, i.e. those of the weights that sampled); `uncorrected` is
lag 2 with `policy_loss="uncorrected"` (asyncrl/train/losses.py), the negative control that
clips against the trainer's own log-probs. Only the lag (and, for the control, the loss)
differs: at step 0 every variant samples the same batch from the initial weights, so step-0
rewards are equal across variants, and two variants stay identical until their sampling
weights differ (lag1 and lag2 through step 1; lag2 and uncorrected through step 2, whose
batches all come from the initial weights).

Lag 0 is synchronous GRPO: the schedule of `experiments/baselines/sync.py` (η = 0, barrier
admission: batch s is entries s·B .. s·B+B-1 of the prompt cursor, sampled with version s,
groups in entry order, trajectory ids e·G + m as the trajectory server assigns them), the
same prompts, keys, rewards and train step. It is not the same program: the real sync run
goes through the coordinator, two rollout instance threads and the reward pool, spreads
groups over two engines and slots differently, and places the weights on the instances'
meshes. A token's draw depends only on its key and its logits, so the batches agree as long
as the logits do; bit-identity is not promised (a batched decode's per-row logits may round
differently with other rows beside them, which can flip a near-tie draw, and a flipped token
can change every later step). Measured against `python -m asyncrl.main
--config=experiments/baselines/sync.py:tiny --config.train.steps=N --config.seed=S
--config.task.seed=S` (its metrics.jsonl): seed 1, 30 steps, every batch reward equal to the
last bit and 29 of 30 batch digests (`--digests`) equal; seed 0, 100 steps, batch rewards
equal for the first 20 steps, then apart. So lag 0 is synchronous GRPO step for step until a
rounding difference flips a draw, not bit-identical to the threaded run. The variants are
compared in this loop only, so they share its numerics exactly.

--digests adds each batch's digest (sha256 of its tokens, as metrics.jsonl has it) to the
JSON for such a comparison.

Prints one row per (variant, seed): mean batch reward over --window (default the last 10
steps) and over all steps; then one JSON line with those, per-step rewards, medians over
seeds, and lagN_vs_lag0: the mean over seeds of the paired difference in window mean reward
(variant minus lag0 on the same seed; negative: the lag costs reward).
"""

from __future__ import annotations

import argparse
import ast
import functools
import dataclasses
import importlib
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from asyncrl.cli import exit_on_user_error, int_at_least  # noqa: E402
from asyncrl.config_args import ConfigError  # noqa: E402

VARIANTS = {"lag0": (0, None), "lag1": (1, None), "lag2": (2, None),
            "uncorrected": (2, "uncorrected")}  # name -> (lag, policy_loss; None: the config's)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tiny", help="experiments/grpo.py's argument")
    parser.add_argument("--steps", type=int_at_least(1), default=30)
    parser.add_argument("--seeds", default="0,1,2,3,4",
                        help="config.seed and config.task.seed: sampling keys and prompt order")
    parser.add_argument("--window", type=int, nargs=2, metavar=("FIRST", "LAST"), default=None,
                        help="steps (from 1, inclusive) the reward is averaged over; default "
                             "the last 10")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--override", action="append", default=[], metavar="FIELD=VALUE",
                        help="a config field, e.g. train.learning_rate=5e-3 (repeatable)")
    parser.add_argument("--digests", action="store_true",
                        help="also list every batch's digest, as a run's metrics.jsonl has "
                             "them (batch_digest): lag0's can be compared with a sync run's")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants or not args.seeds:
        parser.error(f"--variants of {list(VARIANTS)} and --seeds must be non-empty lists; "
                     f"got variants {args.variants}, seeds {args.seeds}")
    if args.window is None:
        args.window = [max(1, args.steps - 9), args.steps]
    if not 1 <= args.window[0] <= args.window[1] <= args.steps:
        parser.error(f"--window must lie within steps 1..{args.steps}, got {args.window}")
    return args


def overrides(c, pairs: list[str]) -> dict:
    """FIELD=VALUE strings as typed values: the field's current type decides the parse."""
    out = {}
    for pair in pairs:
        field, sep, text = pair.partition("=")
        if not sep:
            raise ConfigError(f"--override wants FIELD=VALUE, got {pair!r}")
        try:
            current = functools.reduce(lambda node, part: node[part], field.split("."), c)
        except KeyError:
            raise ConfigError(f"--override: config has no field {field!r}") from None
        if isinstance(current, str):
            out[field] = text
        elif isinstance(current, bool):
            out[field] = text.lower() in ("1", "true", "yes")
        else:
            value = ast.literal_eval(text)
            out[field] = type(current)(value) if isinstance(current, (int, float)) else value
    return out


def build_config(args, seed: int):
    from asyncrl.config import with_overrides
    from experiments import grpo

    c = grpo.get_config(args.config)
    # train.steps too: a decaying schedule then ends where this loop does, as a run's would.
    return with_overrides(c, {**overrides(c, args.override), "seed": seed, "task.seed": seed,
                              "train.steps": args.steps})


class Seed:
    """What every variant of one seed shares: the prompts, the engine (its keys), the policy."""

    def __init__(self, c, workdir: pathlib.Path):
        import jax

        from asyncrl.data.sources import build_task_data
        from asyncrl.model import graphdef_for
        from asyncrl.policy import encode, load_policy
        from asyncrl.rollout.engine import Engine

        self.c = c
        for module in c.rewards.plugins:  # rewards registered outside asyncrl, as a run's workers
            importlib.import_module(module)
        self.data = build_task_data(c.task, c.eval.heldout_size, workdir)
        self.policy = load_policy(c.model)
        self.initial = jax.device_get(self.policy.params)
        self.B, self.G = c.train.batch_size, c.rollout.group_size
        # Entry e is the cursor's e-th problem, as the coordinator draws them.
        problems = [next(self.data.cursor) for _ in range(c.train.steps * self.B)]
        self.problems = [(p, encode(self.policy, p, c.task, c.rollout.prompt_bucket).tokens)
                         for p in problems]
        self.max_len = c.rollout.max_len
        self.engine = Engine(graphdef_for(self.policy.config), self.policy.config,
                             num_slots=c.rollout.num_slots, max_len=self.max_len,
                             prompt_buckets=(c.rollout.prompt_bucket,),
                             sampling=c.rollout.sampling(), seed=c.seed,
                             **c.rollout.kv_options().engine_kwargs())

    def sample(self, params, step: int, version: int):
        """Batch `step`'s groups (entries in order, members in order) sampled with `params`."""
        import numpy as np

        from asyncrl.rewards import REWARDS
        from asyncrl.rollout.messages import Trajectory
        from asyncrl.rollout.slots import Slots

        engine, G = self.engine, self.G
        if engine.num_slots < G:
            raise ConfigError(f"rollout.num_slots={engine.num_slots} < group_size={G}")
        reward = REWARDS.get(self.c.task.reward)
        entries = list(range(step * self.B, (step + 1) * self.B))
        groups: dict[int, list] = {e: [None] * G for e in entries}
        slots, state = Slots(engine), engine.init_decode_state()
        pending = entries[::-1]
        while pending or slots.running():
            free, started = slots.free_slots(), False
            while pending and len(free) >= G and slots.admits(
                    len(self.problems[pending[-1]][1]), G, self.c.rollout.max_new_tokens):
                e = pending.pop()
                prompt = np.asarray(self.problems[e][1], np.int32)
                # Trajectory ids as the trajectory server gives them: the pairing's keys.
                group = [Trajectory(e * G + m, prompt, self.c.rollout.max_new_tokens)
                         for m in range(G)]
                state = slots.start(params, state, group, free[:G], version=version)
                free, started = free[G:], True
            if not started and not slots.running():
                # Nothing running and nothing admitted: the loop would spin forever.
                raise ConfigError(f"the rollout engine cannot start a group of {G} "
                                  f"(rollout.num_slots, num_pages)")
            if slots.running():
                state = slots.step(params, state, version=version)
            for record in slots.pop_finished():
                e, m = divmod(record.trajectory_id, G)
                problem = self.problems[e][0]
                record.reward = float(reward(response=self.policy.decode(record.tokens),
                                             answer=problem.answer))
                groups[e][m] = record
        lost = [e for e in entries if None in groups[e]]
        if lost:
            raise RuntimeError(f"step {step}: entries {lost} came back incomplete")
        return [groups[e] for e in entries]


def run_variant(seed: Seed, trainer, lag: int, steps: int) -> tuple[list[float], list[str]]:
    """Per-step mean batch reward and batch digest of one lagged loop."""
    import hashlib

    import jax
    import jax.numpy as jnp
    import numpy as np

    from asyncrl.train.trainer import TrainBatch

    c = seed.c
    state = trainer.init_state(seed.initial)
    # Copies: the train step donates its state, and these must outlive it.
    keep = jax.jit(lambda p: jax.tree.map(jnp.copy, p))
    history = {0: keep(trainer.policy_params(state.params))}
    rewards, digests = [], []
    for step in range(steps):
        version = max(0, step - lag)
        groups = seed.sample(history[version], step, version)
        rewards.append(float(np.mean([r.reward for g in groups for r in g])))
        batch = TrainBatch.from_groups(groups, [version] * len(groups), step, seed.max_len,
                                       c.rollout.group_size)
        digests.append(hashlib.sha256(batch.tokens.tobytes()).hexdigest()[:16])
        state, _ = trainer.step(state, trainer.put_batch(batch))
        history[step + 1] = keep(trainer.policy_params(state.params))
        for old in [v for v in history if v < step + 1 - lag]:
            del history[old]
    return rewards, digests


def main(argv=None) -> dict:
    args = parse_args(argv)
    import jax

    from asyncrl.config import resolve, with_overrides
    from asyncrl.train.trainer import Trainer, trainer_mesh

    mesh = trainer_mesh(jax.devices()[:1])
    rewards: dict[str, list[list[float]]] = {v: [] for v in args.variants}
    digests: dict[str, list[list[str]]] = {v: [] for v in args.variants}
    trainers: dict = {}  # TrainConfig -> Trainer, compiled once
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        for s in args.seeds:
            config = build_config(args, s)
            c = resolve(config)
            seed = Seed(c, pathlib.Path(workdir))
            for variant in args.variants:
                lag, loss = VARIANTS[variant]
                settings = (c if loss is None else resolve(with_overrides(
                    config, {"train.policy_loss": loss}))).train_config()
                # TrainConfig.seed seeds only a random init (the weights come from the policy
                # here) and the state's rng, which the loss never reads: one compile serves
                # every seed.
                settings = dataclasses.replace(settings, seed=0)
                if settings not in trainers:
                    trainers[settings] = Trainer.create(settings, seed.policy.config, mesh,
                                                        c.rollout.group_size)
                t0 = time.perf_counter()
                r, d = run_variant(seed, trainers[settings], lag, args.steps)
                rewards[variant].append(r)
                digests[variant].append(d)
                print(f"[lag] {variant} seed {s}: {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    return report(args, rewards, digests if args.digests else None, wall)


def report(args, rewards: dict[str, list[list[float]]], digests, wall_s: float) -> dict:
    first, last = args.window
    window = {v: [sum(r[first - 1:last]) / (last - first + 1) for r in runs]
              for v, runs in rewards.items()}
    overall = {v: [sum(r) / len(r) for r in runs] for v, runs in rewards.items()}
    print(f"{'variant':<12} {'seed':>4} {f'steps {first}-{last}':>12} {'all steps':>10}")
    for v in rewards:
        for s, w, a in zip(args.seeds, window[v], overall[v]):
            print(f"{v:<12} {s:>4} {w:>12.3f} {a:>10.3f}")
        print(f"{v:<12} {'med':>4} {statistics.median(window[v]):>12.3f} "
              f"{statistics.median(overall[v]):>10.3f}")
    result = {"steps": args.steps, "seeds": args.seeds, "window": [first, last],
              "mean_reward": window, "mean_reward_all_steps": overall,
              "median": {v: statistics.median(w) for v, w in window.items()},
              "rewards": rewards, "wall_s": round(wall_s, 1)}
    if digests is not None:
        result["batch_digests"] = digests
    if "lag0" in window:
        for v in window:
            if v != "lag0":
                result[f"{v}_vs_lag0"] = statistics.mean(
                    x - y for x, y in zip(window[v], window["lag0"]))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    exit_on_user_error(main)
