"""The recommendation: the cluster simulator (asyncrl/sim) run on profiles made from the
predicted times (asyncrl/plan/predict.py), over ways to split the chips and over η.

Which splits are tried:
  one kind of chip   any power-of-two split of the one pool between trainer and rollout
                     (TPU slices come in powers of two; GPUs any count);
  two kinds          both assignments of the pools, trainer on one and rollout on the other,
                     where each side's compiled plan fits its chips, and on each pool a
                     power-of-two share of it, down to a quarter (more chips never slow a
                     side; fewer may cost nothing when the other side sets the pace).
Only slices one can rent are tried (`accelerators.rentable`: no 2-chip v6e), so the pick is
one the launch scripts can create (asyncrl/plan/launch_plan.py).
Each split is simulated synchronous (η = 0) and StaleFlow at each η; the pick is the least η
within ETA_TOLERANCE of the best StaleFlow throughput found, then the fewest chips, then the
higher throughput.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

from asyncrl.plan import predict
from asyncrl.plan.accelerators import rentable
from asyncrl.plan.hbm import DoesNotFit, param_count
from asyncrl.plan.parts import Part, length_model, policy_bytes, scaled_trainer

# A larger η never lowers StaleFlow's throughput in the simulator, but each step of lag
# costs learning (docs/results.md): the recommendation takes the least η within this share
# of the best throughput found.
ETA_TOLERANCE = 0.05
# The smallest share of a pool tried when the trainer and rollout are different chips.
SMALLEST_SHARE = 4


@dataclasses.dataclass
class Assignment:
    """The trainer's plan on one pool's chips and one instance's on the other's."""

    trainer: Part  # compiled on all of its pool
    rollout: Part  # one instance
    kernel: str | None  # the paged decode kernel the instance calls: tpu_ragged, gpu_paged
    engine: object  # asyncrl.rollout.engine.Engine, abstract

    @property
    def label(self) -> str:
        return (f"train {self.trainer.accelerator.chip.name}, roll out "
                f"{self.rollout.accelerator.chip.name}")


def predictions(spec, model, assignment: Assignment, trainer: Part,
                kv_lens: list[int]) -> predict.Predictions:
    """The predicted times of `trainer` (the assignment's, at some chip count) and of one
    instance whose rows hold `kv_lens` tokens."""
    count = param_count(model)
    rollout = assignment.rollout
    decode, latency = predict.decode_step(spec, model, rollout, assignment.kernel,
                                          assignment.engine, kv_lens,
                                          rollout.pieces["params_bytes"])
    sync, bandwidth = predict.weight_sync(policy_bytes(model), trainer.accelerator.kind,
                                          rollout.accelerator.kind)
    return predict.Predictions(
        train_step=predict.train_step(spec, model, trainer, count), decode_step=decode,
        prefill_per_token=predict.prefill_per_token(spec, rollout), weight_sync=sync,
        sync_bandwidth=bandwidth, latency=latency)


def profile_for(spec, model, predicted: predict.Predictions, trainer: Part, rollout: Part,
                trainer_chips: int, instances: int) -> dict:
    """A simulator profile (asyncrl/sim/profile.py) from the predictions' values. The
    simulator charges the trainer per token of the trajectories it trains, so the predicted
    step is spread over the trajectories' tokens of the layout it was compiled for, not
    over the rows' (padding included)."""
    tokens = trainer.layout.useful
    overhead = predict.OVERHEADS["train_step"].value
    return {
        "name": "planned", "model": f"{param_count(model):.4g} parameters",
        "hardware": f"{instances} rollout instances of {rollout.accelerator.chip.name}; "
                    f"the trainer on {trainer_chips} chips",
        "source": "asyncrl.plan: predictions from the compiled programs",
        "step_latency": predicted.latency,
        "prefill_s_per_token": predicted.prefill_per_token.value,
        "instance": {"num_slots": spec.rollout.num_slots,
                     "kv_capacity_tokens": rollout.pieces["kv_pages"]
                     * rollout.pieces["page_size"]},
        "weights_bytes": policy_bytes(model),
        "network": {"weight_bandwidth_bytes_per_s": predicted.sync_bandwidth,
                    "weight_sync_overhead_s": predict.OVERHEADS["weight_sync"].value},
        "trainer": {"gpu_s_per_token": (predicted.train_step.value - overhead)
                    * trainer_chips / tokens,
                    "step_overhead_s": overhead},
        "reward": {"latency_s": 1.0},
    }


def simulate(spec, profile: dict, instances: int, trainer_chips: int, eta: int, label: str,
             response_median: float):
    """One simulated run of system `label` (asyncrl/sim/config.py systems) on `profile`."""
    from asyncrl.sim.config import run_config, systems
    from asyncrl.sim.run import simulate_point

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(profile, f)
    try:
        rc = run_config()
        rc.profile = f.name
        rc.group_size = spec.rollout.group_size
        rc.batch_size = spec.train.batch_size
        rc.train_gpus_per_instance = trainer_chips / instances
        rc.num_slots = spec.rollout.num_slots
        rc.prompt_lengths, rc.response_lengths = length_model(spec, response_median)
        rc.warmup_cycles, rc.measure_cycles = 1, 3
        return simulate_point(rc, systems(), label, instances=instances, eta=eta)
    finally:
        os.unlink(f.name)


def splits(assignment: Assignment, per_instance: int, same_kind: bool,
           total: int) -> list[tuple[int, int]]:
    """(trainer chips, rollout chips) to try (module docstring); `total`: both pools' chips
    when they are one kind."""
    trainer, rollout = assignment.trainer.accelerator, assignment.rollout.accelerator
    if same_kind:
        out, t = [], 1
        while t < total:
            r = total - t
            if (r >= per_instance and rentable(trainer.with_chips(t))
                    and rentable(rollout.with_chips(r - r % per_instance))):
                out.append((t, r - r % per_instance))
            t *= 2
        return out or [(trainer.chips, total - trainer.chips)]

    def shares(accelerator, step):
        out, n = [], accelerator.chips
        while n >= max(step, accelerator.chips // SMALLEST_SHARE, 1):
            if n % step == 0 and rentable(accelerator.with_chips(n)):
                out.append(n)
            n //= 2
        return out or [accelerator.chips]  # a size asked for, no share of it sold: as asked

    return [(t, r) for t in shares(trainer, 1) for r in shares(rollout, per_instance)]


def recommend(spec, model, assignments: list[Assignment], etas, response_median: float,
              kv_lens: list[int], total: int | None) -> dict:
    """The simulator over `assignments`, their splits and η (module docstring). `total`:
    the one pool's chips when both sides are one kind, else None."""
    per_instance = spec.mesh.devices_per_instance
    tried = []
    for assignment in assignments:
        capacity = assignment.trainer.capacity
        for t_chips, r_chips in splits(assignment, per_instance, total is not None,
                                       total or 0):
            trainer = scaled_trainer(assignment.trainer, t_chips)
            if trainer.hbm_bytes_per_device > capacity:
                continue
            instances = r_chips // per_instance
            predicted = predictions(spec, model, assignment, trainer, kv_lens)
            profile = profile_for(spec, model, predicted, trainer, assignment.rollout, t_chips,
                                  instances)
            sync = simulate(spec, profile, instances, t_chips, 0, "sync", response_median)
            for eta in etas:
                stale = simulate(spec, profile, instances, t_chips, eta, "staleflow",
                                 response_median)
                tried.append({
                    "assignment": assignment.label,
                    "trainer": trainer.accelerator.name, "trainer_chips": t_chips,
                    "rollout": assignment.rollout.accelerator.with_chips(r_chips).name,
                    "rollout_chips": r_chips, "eta": eta,
                    "staleflow_tok_s": stale.throughput_tok_s,
                    "sync_tok_s": sync.throughput_tok_s,
                    "predicted_staleflow_vs_sync": stale.throughput_tok_s
                    / sync.throughput_tok_s})
    if not tried:
        raise DoesNotFit("no split of the chips fits the trainer; add trainer chips")
    top = max(row["staleflow_tok_s"] for row in tried)
    good = [row for row in tried if row["staleflow_tok_s"] >= (1 - ETA_TOLERANCE) * top]
    best = min(good, key=lambda row: (row["eta"], row["trainer_chips"] + row["rollout_chips"],
                                      -row["staleflow_tok_s"]))
    return {**best, "best_tok_s": top, "tried": tried}
