"""The trainer's log-probs are of the distribution the engine sampled from.

At temperature 0.7 and top-p 0.95 an on-policy batch (the trainer's weights are the ones
that sampled it) must see importance weights of 1: the trainer scores tokens under the same
tempered, truncated distribution. The control, scored at temperature 1 as before, is off by
far more than the 1% tolerance, so the check can fail. Packed three to a row
(train.tokens_per_row), the trainer scores the same tokens alike.
"""

import dataclasses

import jax
import numpy as np
import pytest

from asyncrl.model import ModelConfig, init_params
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.messages import Trajectory
from asyncrl.model.sampling import SamplingParams
from asyncrl.rollout.slots import Slots
from asyncrl.train.losses import LossConfig
from asyncrl.train.trainer import Trainer, TrainConfig, trainer_mesh

MODEL = ModelConfig.tiny()
TEMPERED = SamplingParams(temperature=0.7, top_p=0.95)
G, PROMPT, BUDGET = 4, 6, 10


@dataclasses.dataclass
class _Row:  # what TrainBatch.from_groups reads of a trajectory
    prompt: np.ndarray
    tokens: list
    logprobs: list
    versions: list
    reward: float


@pytest.fixture(scope="module")
def on_policy_batch():
    """One GRPO group sampled at TEMPERED by the engine from the weights the trainer holds."""
    graphdef, params = init_params(MODEL, seed=0)
    engine = Engine(graphdef, MODEL, num_slots=G, max_len=PROMPT + BUDGET + 2,
                    prompt_buckets=(PROMPT,), sampling=TEMPERED, stop_tokens=(), seed=3)
    slots, state = Slots(engine), engine.init_decode_state()
    prompt = np.arange(3, 3 + PROMPT, dtype=np.int32)
    group = [Trajectory(i, prompt, BUDGET) for i in range(G)]
    state = slots.start(params, state, group, range(G), version=0)
    while slots.running():
        state = slots.step(params, state, version=0)
    records = slots.pop_finished()
    rows = [_Row(r.prompt, r.tokens, r.logprobs, r.versions, float(i % 2))
            for i, r in enumerate(records)]
    return jax.device_get(params), [rows]


def _weights(params, groups, sampling, tokens_per_row=0):
    config = TrainConfig(loss=LossConfig(), learning_rate=1e-6, sampling=sampling,
                         tokens_per_row=tokens_per_row)
    trainer = Trainer.create(config, MODEL, trainer_mesh(jax.devices()[:1]), G)
    batch = trainer.host_batch(groups, [0], 0, PROMPT + BUDGET)
    assert batch.tokens.shape == ((2, 48) if tokens_per_row else (G, PROMPT + BUDGET))
    _, metrics = trainer.step(trainer.init_state(params), trainer.put_batch(batch))
    metrics = jax.device_get(metrics)
    return [float(metrics[k]) for k in ("is_weight_p50", "is_weight_p99", "is_weight_max")]


# Every response runs to BUDGET (no stop tokens): three fill a row of 48 to its last token.
@pytest.mark.parametrize("tokens_per_row", [0, 3 * (PROMPT + BUDGET)], ids=["padded", "packed"])
def test_an_on_policy_tempered_batch_has_importance_weights_of_one(on_policy_batch,
                                                                   tokens_per_row):
    params, groups = on_policy_batch
    p50, p99, largest = _weights(params, groups, TEMPERED, tokens_per_row)
    assert abs(p50 - 1) < 0.01 and abs(p99 - 1) < 0.01 and abs(largest - 1) < 0.01, \
        (p50, p99, largest)


def test_scored_at_temperature_one_the_same_batch_is_off_policy(on_policy_batch):
    params, groups = on_policy_batch
    p50, p99, largest = _weights(params, groups, SamplingParams())
    assert max(abs(p50 - 1), abs(p99 - 1), abs(largest - 1)) > 0.05, (p50, p99, largest)
