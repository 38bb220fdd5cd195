"""The config of one simulated run, the systems a grid compares, and the checks.

Fields of `run_config()` (a locked ConfigDict; a misspelt override fails):
  profile                hardware/model profile JSON (a file in asyncrl/profiles, or a path)
  num_instances, eta, seed
  lead                   the live config's staleness.lead: 'auto' (new work starts only as far
                         ahead of the trainer as keeps it fed) or 'max' (as far as η allows)
  shared_cores           decide as a live run whose instances share the trainer's CPU cores
                         (`auto` holds one buffer); the simulator does not model the sharing
  label                  the system's name in results and tables ('' = the admission's name)
  coordinator.*          the live config's `coordinator` section, the same schema
                         (asyncrl/coordinator/config.py) with cluster-scale defaults:
                         admission, admission_params.<name>, routing, dispatch, binding,
                         latency_model ('' = the profile's step latency), sync,
                         partial_rollout, migration, migration_interval_s, redundancy,
                         dynamic_sampling
  group_size             N responses per prompt (GRPO group)
  batch_size             B, groups (prompts) per training step, fixed across cluster sizes
                         (strong scaling: more instances train the same batch faster), or
  groups_per_instance    if batch_size = 0: B = groups_per_instance × instances (weak scaling)
  train_gpus_per_instance  trainer GPUs per rollout instance (each instance is 8 GPUs)
  num_slots              decode slots per instance; 0 takes the profile's
  prompt_lengths, response_lengths   named distributions (asyncrl/sim/workload.py)
  pass_rate_beta         (a, b): each prompt's chance of a reward of 1 (asyncrl/sim/prompts.py)
  reprefill_on_resume    an interrupted response re-prefills its KV on resume
  warmup_steps, measure_steps   throughput is measured over the steps after warmup; None
                         (the default) is the steady window of `window()`:
  warmup_cycles, measure_cycles  warm-up and measured window in cycles of η + 1 steps
  max_sim_time_s         a run that has not finished by then has deadlocked: an error

`systems()` names the systems a grid compares, each a labelled variant of an admission.
"""

from __future__ import annotations

import copy

import ml_collections

from asyncrl.config_args import ConfigError
from asyncrl.coordinator.config import CoordinatorSection, check_lead_field, coordinator_config

# Fields that moved, and where they went: setting one fails naming its new place.
MOVED = {
    "schedule": "coordinator.admission (with coordinator.admission_params.<name>), or a "
                "labelled system of the grid (systems(), grid.systems)",
}


def run_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.profile = "qwen2p5_7b_8xh100.json"
    c.num_instances = 32
    c.eta = 2
    c.lead = "max"
    c.shared_cores = False
    c.seed = 0
    c.label = ""
    # A simulated run defaults to StaleFlow with its own tools (systems()' "staleflow"), not
    # the live run's small-machine settings: routing by the profile's step latency, a pull
    # when an instance would otherwise starve, moves considered every 5 s of virtual time.
    c.coordinator = coordinator_config(routing="throughput_optimal", sync="when_idle",
                                       migration_interval_s=5.0)
    c.group_size = 16
    c.batch_size = 512
    c.groups_per_instance = 0.0
    c.train_gpus_per_instance = 4.0
    c.num_slots = 0
    c.prompt_lengths = ml_collections.ConfigDict(
        {"name": "lognormal", "median": 256.0, "sigma": 0.5, "cap": 2048})
    c.response_lengths = ml_collections.ConfigDict(
        {"name": "empirical", "path": "long_cot_math.json"})
    c.pass_rate_beta = (1.0, 1.0)
    c.reprefill_on_resume = True
    # StaleFlow's steps run in a cycle of η + 1 (one long step while every instance syncs,
    # then η short ones), and the baselines settle only after their first steps: a window
    # that is not whole cycles past a warm-up of two cycles measures a transient.
    c.warmup_steps = None
    c.measure_steps = None
    c.warmup_cycles = 2
    c.measure_cycles = 8
    c.max_sim_time_s = 1.0e7
    for name in MOVED:
        c[name] = ""  # a placeholder, so that setting it reaches `check` and its message
    c.lock()  # a misspelt field is an error, not a silently new key
    return c


def systems() -> ml_collections.ConfigDict:
    """The paper's systems as labelled variants of the admissions: label → the run config's
    coordinator fields it sets, and `eta` where the system fixes its own.

    The baselines route least-loaded and never migrate; StaleFlow uses every tool it has.
    verl syncs every η steps with a ratio window of 0.5·B per step (its recommended setting).
    slime updates the weights every η steps, over-sampling 1.5·B and recycling the surplus as
    partial rollouts; ROLL is AReaL's admission plus its replay buffer's collection.
    """
    base = {"routing": "least_loaded", "migration": "none"}
    return ml_collections.ConfigDict({
        "sync": {"eta": 0, "coordinator": {"admission": "barrier", **base}},
        "one_step": {"eta": 1, "coordinator": {"admission": "barrier", **base}},
        # verl as its own admission, not AReaL's bound under another name (the threshold is
        # our choice; public run scripts set it anywhere from 0 to 4): a sample
        # ratio (0.5 of a batch per update) whose window resets at each parameter sync, one
        # sync every η local updates.
        "verl": {"coordinator": {"admission": "verl", **base, "admission_params": {"verl": {
            "staleness_threshold": 0.5, "trigger_parameter_sync_step": None}}}},
        "areal": {"coordinator": {"admission": "token_bucket", **base}},
        "roll": {"coordinator": {"admission": "token_bucket", **base,
                                 "admission_params": {"token_bucket": {"drop_stale": True}}}},
        "slime": {"coordinator": {"admission": "barrier", **base,
                                  "admission_params": {"barrier": {"over_sampling": 1.5}}}},
        "staleflow": {"coordinator": {"admission": "staleflow", "routing": "throughput_optimal",
                                      "sync": "when_idle", "migration": "balance"}},
    })


def system_config(run, systems_table, label: str, **fields) -> ml_collections.ConfigDict:
    """A copy of `run` as system `label` of `systems_table`, with `fields` (e.g. num_instances,
    eta, seed) set first; a system that fixes its η overrides the `eta` given."""
    if label not in systems_table:
        raise ConfigError(f"system {label!r} is not in systems; defined: "
                         f"{', '.join(sorted(systems_table.keys()))}")
    rc = copy.deepcopy(run)
    for name, value in fields.items():
        rc[name] = value
    system = systems_table[label].to_dict()
    unknown = set(system) - {"eta", "coordinator"}
    if unknown:
        raise ConfigError(f"systems.{label}: unknown field(s) {sorted(unknown)}; a system sets "
                         "'eta' and 'coordinator' fields only")
    rc.label = label
    if "eta" in system:
        rc.eta = system["eta"]
    for name, value in system.get("coordinator", {}).items():
        if name == "admission_params":
            for admission, params in value.items():
                table = rc.coordinator.admission_params
                with table.unlocked():
                    if admission not in table:
                        table[admission] = {}
                    for key, v in params.items():
                        table[admission][key] = v
        elif name not in rc.coordinator:
            raise ConfigError(f"systems.{label}.coordinator.{name}: not a coordinator field; "
                             f"fields: {', '.join(sorted(rc.coordinator.keys()))}")
        else:
            rc.coordinator[name] = value
    return rc


def window(c) -> tuple[int, int]:
    """(warm-up, measured) training steps: the explicit `warmup_steps` / `measure_steps`, or
    whole cycles of η + 1 steps (`warmup_cycles`, `measure_cycles`)."""
    cycle = c.eta + 1
    warmup = c.warmup_cycles * cycle if c.warmup_steps is None else c.warmup_steps
    measure = c.measure_cycles * cycle if c.measure_steps is None else c.measure_steps
    return warmup, measure


def is_steady(c) -> bool:
    """Whether the window meets the steady-state rule every reported ratio needs: warm-up ≥
    2(η + 1) steps and a measured window of ≥ 8 whole cycles of η + 1."""
    warmup, measure = window(c)
    cycle = c.eta + 1
    return warmup >= 2 * cycle and measure % cycle == 0 and measure >= 8 * cycle


def label_of(c) -> str:
    return c.label or c.coordinator.admission


def check(c) -> None:
    """Raises ConfigError (a ValueError) naming the field, the value and what is allowed."""
    for name, place in MOVED.items():
        if name in c and c[name]:
            raise ConfigError(f"{name}={c[name]!r}: this field moved to {place}")
    for name, minimum in (("num_instances", 1), ("eta", 0), ("group_size", 1), ("warmup_steps", 0),
                          ("measure_steps", 1), ("batch_size", 0), ("num_slots", 0),
                          ("warmup_cycles", 0), ("measure_cycles", 1)):
        value = c[name]
        if value is None and name in ("warmup_steps", "measure_steps"):
            continue  # the steady window, in cycles
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"{name}={value!r}: must be an int ≥ {minimum}"
                              + (" (or None: the steady window)" if name.endswith("_steps") else ""))
    if c.batch_size == 0 and not c.groups_per_instance > 0:
        raise ConfigError(
            f"groups_per_instance={c.groups_per_instance!r}: must be > 0 when batch_size=0")
    if not c.train_gpus_per_instance > 0:
        raise ConfigError(f"train_gpus_per_instance={c.train_gpus_per_instance!r}: must be > 0")
    # The live run's checks of the same fields, not a copy of them.
    coordinator_section(c).check_admission_params(c.eta, max(c.batch_size, 1))
    check_lead_field("lead", c.lead)


def coordinator_section(c) -> CoordinatorSection:
    """The run config's `coordinator` section as the live run's spec holds it, checked by
    the same rules (asyncrl/coordinator/config.py)."""
    section = CoordinatorSection.from_node(c.coordinator, "coordinator")
    section.check()
    return section
