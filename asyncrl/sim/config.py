"""The config of one simulated run, and its checks. Experiment files build on `run_config()`.

Fields (a locked ConfigDict; a misspelt override fails):
  profile                hardware/model profile JSON (a file in asyncrl/sim/profiles, or a path)
  num_instances, eta, schedule, seed
  group_size             N responses per prompt (GRPO group)
  batch_size             B, groups (prompts) per training step, fixed across cluster sizes
                         (strong scaling: more instances train the same batch faster), or
  groups_per_instance    if batch_size = 0: B = groups_per_instance × instances (weak scaling)
  train_gpus_per_instance  trainer GPUs per rollout instance (each instance is 8 GPUs)
  num_slots              decode slots per instance; 0 takes the profile's
  prompt_lengths, response_lengths   named distributions (asyncrl/sim/workload.py)
  reprefill_on_resume    an interrupted response re-prefills its KV on resume (all schedules)
  warmup_steps, measure_steps   throughput is measured over the steps after warmup
  max_sim_time_s         a run that has not finished by then has deadlocked: an error
  schedules.<name>       each schedule's own parameters (see its module)
"""

from __future__ import annotations

import ml_collections

from asyncrl.config_args import ConfigError


def run_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.profile = "qwen2p5_7b_8xh100.json"
    c.num_instances = 32
    c.eta = 2
    c.schedule = "staleflow"
    c.seed = 0
    c.group_size = 16
    c.batch_size = 512
    c.groups_per_instance = 0.0
    c.train_gpus_per_instance = 4.0
    c.num_slots = 0
    c.prompt_lengths = ml_collections.ConfigDict(
        {"name": "lognormal", "median": 256.0, "sigma": 0.5, "cap": 2048})
    c.response_lengths = ml_collections.ConfigDict(
        {"name": "empirical", "path": "long_cot_math.json"})
    c.reprefill_on_resume = True
    c.warmup_steps = 2
    c.measure_steps = 6
    c.max_sim_time_s = 1.0e7

    s = c.schedules = ml_collections.ConfigDict()
    s.sync = ml_collections.ConfigDict({"router": "least_loaded"})
    s.one_step = ml_collections.ConfigDict({"router": "least_loaded"})
    s.verl = ml_collections.ConfigDict({
        "router": "least_loaded", "staleness_threshold": 0.0,  # 0: use η
        "trigger_parameter_sync_step": 1, "partial_rollout": True, "max_queue_groups": 0})
    s.areal = ml_collections.ConfigDict({"router": "least_loaded"})
    s.roll = ml_collections.ConfigDict({"router": "least_loaded"})
    s.slime = ml_collections.ConfigDict({
        "router": "least_loaded", "over_sampling": 1.5, "partial_rollout": True,
        "update_weights_interval": 0})  # 0: use η
    s.staleflow = ml_collections.ConfigDict({
        "router": "throughput_optimal", "sync": "when_idle",
        "sync_params": {"when_idle": {"low_watermark": 0.5}},
        "migration": "balance",
        "migration_params": {"balance": {"starve_fraction": 0.25, "min_gap": 8, "max_moves": 64}},
        "migration_interval_s": 5.0, "redundancy": "none",
        "redundancy_params": {"batch": {"batch_ratio": 1.25}, "group": {"extra_responses": 4}}})
    c.lock()  # a misspelt field is an error, not a silently new key
    return c


def check(c) -> None:
    """Raises ConfigError (a ValueError) naming the field, the value and what is allowed."""
    from asyncrl.sim.schedules import SCHEDULES

    if c.schedule not in SCHEDULES:
        raise ConfigError(f"schedule={c.schedule!r} is not registered; registered: "
                          f"{', '.join(SCHEDULES.names())}")
    for name, minimum in (("num_instances", 1), ("eta", 0), ("group_size", 1), ("warmup_steps", 0),
                          ("measure_steps", 1), ("batch_size", 0), ("num_slots", 0)):
        value = c[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"{name}={value!r}: must be an int ≥ {minimum}")
    if c.batch_size == 0 and not c.groups_per_instance > 0:
        raise ConfigError(
            f"groups_per_instance={c.groups_per_instance!r}: must be > 0 when batch_size=0")
    if not c.train_gpus_per_instance > 0:
        raise ConfigError(f"train_gpus_per_instance={c.train_gpus_per_instance!r}: must be > 0")
