"""Shared test data: the tiny configs, a deterministic batch generator, a toy data source and
the checkpointing part of the run loop."""

import jax
import numpy as np

from asyncrl.model import ModelConfig
from asyncrl.staleness import BufferStatus, StalenessManager
from asyncrl.train.checkpoint import ResumeData, restore_or_init
from asyncrl.train.late_metrics import LateMetrics
from asyncrl.train.losses import LossConfig
from asyncrl.train.trainer import TrainBatch, TrainConfig

B, T, G, PROMPT = 8, 16, 4, 6  # sequences, tokens, group size, prompt tokens
MODEL = ModelConfig.tiny()
# KL and entropy on, so the reference params, the ref forward and every metric are exercised.
CONFIG = TrainConfig(
    loss=LossConfig(kl_coef=0.02, entropy_coef=0.001),
    learning_rate=3e-3, warmup_steps=2, lr_schedule="cosine", total_steps=20, num_microbatches=2,
)


def make_batch(seed: int, version: int = 3, v_traj=None) -> TrainBatch:
    """A deterministic batch: same seed, same arrays."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, MODEL.vocab_size, (B, T)).astype(np.int32)
    positions = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy()
    lengths = rng.integers(PROMPT + 2, T + 1, B)
    mask = ((np.arange(T) >= PROMPT) & (np.arange(T) < lengths[:, None])).astype(np.float32)
    v_traj = np.asarray(rng.integers(max(version - 2, 0), version + 1, B) if v_traj is None else v_traj, np.int32)
    # A partial rollout finishes on newer weights: versions rise along the sequence, from V_traj.
    token_versions = np.minimum(v_traj[:, None] + (np.arange(T) >= 10), version).astype(np.int32)
    return TrainBatch(
        tokens=tokens, positions=positions, loss_mask=mask,
        behaviour_logp=-rng.uniform(4.5, 6.5, (B, T)).astype(np.float32),  # ≈ log(1/256) ± 1
        token_versions=token_versions, rewards=rng.integers(0, 2, B).astype(np.float32),
        v_traj=v_traj, buffer_version=np.int32(version), group_size=G,
    )


class ToySource:
    """A deterministic stand-in for the consume side of the system.

    It drives a real StalenessManager (2 entries of G sequences per buffer, η = 1) and keeps
    one trajectory in flight across every step, so a checkpoint always has a partial one.
    """

    def __init__(self):
        self.sm = StalenessManager(eta=1, batch_size=B // G)
        self.next_id = 0
        self.partial: dict[str, list[int]] = {}  # in flight: id -> tokens generated so far
        self.v_traj: dict[str, int] = {}

    def _dispatch(self, version: int) -> str:
        entry_id = f"e{self.next_id}"
        self.next_id += 1
        self.sm.reserve(entry_id, version)
        self.v_traj[entry_id] = version
        rng = np.random.default_rng(self.next_id)
        self.partial[entry_id] = rng.integers(3, 256, int(rng.integers(1, 7))).tolist()
        return entry_id

    def next_batch(self, version: int) -> TrainBatch:
        assert self.sm.version == version
        for entry_id in list(self.partial):
            self.sm.occupy(entry_id)
        while self.sm.status(version) is not BufferStatus.READY:
            self.sm.occupy(self._dispatch(version))
        ids = self.sm.consume()
        self.partial = {}
        self._dispatch(version + 1)  # stays in flight until the next step
        seed = sum(int(i[1:]) * 1000**k for k, i in enumerate(ids))
        v_traj = np.repeat([self.v_traj.pop(i) for i in ids], G)
        return make_batch(seed, version, v_traj)

    def resume_data(self) -> ResumeData:
        ids = sorted(self.partial)
        tokens = np.zeros((len(ids), 8), np.int32)
        for row, i in enumerate(ids):
            tokens[row, : len(self.partial[i])] = self.partial[i]
        meta = [{"id": i, "v_traj": self.v_traj[i], "len": len(self.partial[i])} for i in ids]
        return ResumeData(
            data_state={"next_id": self.next_id, "v_traj": self.v_traj},
            coordinator=self.sm.state_dict(),
            trajectories={"meta": meta},
            trajectory_arrays={"tokens": tokens},
        )

    def restore(self, resume: ResumeData) -> None:
        self.sm = StalenessManager.from_state_dict(resume.coordinator)
        self.next_id = resume.data_state["next_id"]
        self.v_traj = dict(resume.data_state["v_traj"])
        tokens = resume.trajectory_arrays["tokens"]
        self.partial = {m["id"]: tokens[row, : m["len"]].tolist() for row, m in enumerate(resume.trajectories["meta"])}


def train_steps(trainer, source: ToySource, workdir, num_steps: int, checkpoint_every: int,
                logged: list[int]):
    """What `asyncrl.run.run` does around checkpoints: resume from workdir or start, step,
    read metrics one step late (the logged steps go to `logged`), save every N steps."""
    ckpt, state, resume, _ = restore_or_init(trainer, workdir)
    if resume is not None:
        source.restore(resume)
    step, late = int(jax.device_get(state.step)), LateMetrics()
    try:
        while step < num_steps:
            state, metrics = trainer.step(state, trainer.put_batch(source.next_batch(step)))
            step += 1
            if (done := late.push(step, metrics)) is not None:
                logged.append(done[0])
            if step % checkpoint_every == 0 or step == num_steps:
                if (done := late.flush()) is not None:
                    logged.append(done[0])
                ckpt.save(state, source.resume_data())
    finally:
        ckpt.close()
    return state
