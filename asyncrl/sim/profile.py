"""A hardware/model profile: every modelled duration of a simulated run.

  decode step   the coordinator's `LatencyModel` (t = a + b·kv + max(c, d + e·running))
  prefill       prefill_s_per_token × tokens (new prompts, and re-prefill after an
                interruption or a migration)
  train step    step_overhead_s + trained tokens × gpu_s_per_token / trainer GPUs
  weights       weights_bytes / bandwidth + a fixed pause/load/resume overhead, for a push
                (trainer → parameter server), a pull (server → instance) or a broadcast
  reward        a fixed latency per group once its last response finished
  KV cache      instance.kv_capacity_tokens (optional; 0 or absent: unlimited) with vLLM's
                recompute preemption (asyncrl/sim/instance.py)

The JSON schema is shown by `asyncrl/profiles/qwen2p5_7b_8xh100.json`; unknown or missing fields are
errors that name the file and the field.
"""

from __future__ import annotations

import dataclasses
import os

from asyncrl.coordinator.latency import LatencyModel
from asyncrl.jsonfile import read_json_object
from asyncrl.profiles import PROFILE_DIR


_OPTIONAL = {"instance.kv_capacity_tokens": 0.0}
_SECTIONS = {
    "instance": ("num_slots", "kv_capacity_tokens"),
    "network": ("weight_bandwidth_bytes_per_s", "weight_sync_overhead_s"),
    "trainer": ("gpu_s_per_token", "step_overhead_s"),
    "reward": ("latency_s",),
}
_TOP = {"name", "model", "hardware", "source", "step_latency", "prefill_s_per_token",
        "weights_bytes", *_SECTIONS}


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    latency: LatencyModel
    num_slots: int
    weights_bytes: float
    weight_bandwidth_bytes_per_s: float
    weight_sync_overhead_s: float
    gpu_s_per_token: float
    step_overhead_s: float
    reward_latency_s: float
    kv_capacity_tokens: int = 0  # 0: unlimited

    def transfer_s(self) -> float:
        """One copy of the weights: a push, a pull, or a broadcast to all instances at once."""
        return self.weights_bytes / self.weight_bandwidth_bytes_per_s + self.weight_sync_overhead_s

    def train_s(self, tokens: float, gpus: float) -> float:
        return self.step_overhead_s + tokens * self.gpu_s_per_token / gpus

    @classmethod
    def load(cls, path: str) -> "Profile":
        if not os.path.isabs(path) and not os.path.exists(path):
            path = os.path.join(PROFILE_DIR, path)
        d = read_json_object(path, "simulator profile")
        unknown = sorted(set(d) - _TOP)
        if unknown:
            raise ValueError(f"{path}: unknown field(s) {unknown}; expected {sorted(_TOP)}")
        latency = LatencyModel.from_dict(d, where=path)
        values = {}
        for section, keys in _SECTIONS.items():
            if not isinstance(d.get(section), dict):
                raise ValueError(f"{path}: missing section {section!r} with fields {list(keys)}")
            extra = sorted(set(d[section]) - set(keys))
            if extra:
                raise ValueError(
                    f"{path}: unknown field(s) {section}.{extra}; expected {list(keys)}")
            for key in keys:
                where = f"{path}: field '{section}.{key}'"
                name = f"{section}.{key}"
                if name in _OPTIONAL and key not in d[section]:
                    values[name] = _OPTIONAL[name]
                    continue
                values[name] = _number(d[section], key, where)
        weights = _number(d, "weights_bytes", f"{path}: field 'weights_bytes'")
        slots = values["instance.num_slots"]
        if slots != int(slots) or slots < 1:
            raise ValueError(
                f"{path}: field 'instance.num_slots' must be an int ≥ 1, got {slots}")
        if values["network.weight_bandwidth_bytes_per_s"] <= 0:
            raise ValueError(f"{path}: field 'network.weight_bandwidth_bytes_per_s' must be > 0")
        return cls(
            name=str(d.get("name", os.path.basename(path))),
            latency=latency,
            num_slots=int(slots),
            weights_bytes=weights,
            weight_bandwidth_bytes_per_s=values["network.weight_bandwidth_bytes_per_s"],
            weight_sync_overhead_s=values["network.weight_sync_overhead_s"],
            gpu_s_per_token=values["trainer.gpu_s_per_token"],
            step_overhead_s=values["trainer.step_overhead_s"],
            reward_latency_s=values["reward.latency_s"],
            kv_capacity_tokens=int(values["instance.kv_capacity_tokens"]),
        )


def _number(d: dict, key: str, where: str) -> float:
    if key not in d:
        raise ValueError(f"{where}: missing")
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{where}: must be a number ≥ 0, got {value!r}")
    return float(value)
