"""The plan file: what `python -m asyncrl.plan ... --out=plan.json` writes and the launch
scripts build (launch/tpu_vms.sh --plan=plan.json, launch/gpu_vms.sh --plan=plan.json).

    {"format": "asyncrl-plan/1",
     "config": "experiments/gsm8k.py:qwen2.5-7b",     # as given to the planner
     "overrides": {"staleness.eta": 1, ...},          # what the plan settled: --config.<k>=<v>
     "trainer": {"accelerator": "v5p-16", "kind": "tpu", "chips": 8, "hosts": 2,
                 "chips_per_host": 4, "runtime_version": "v2-alpha-tpuv5",
                 "hbm_bytes_per_device": ..., "hbm_capacity_bytes": ...},
     "rollout": {... the same ..., "devices_per_instance": 1, "instances_per_host": 8,
                 "instances": 8},
     "memory_fraction": null,                         # GPU: XLA_PYTHON_CLIENT_MEM_FRACTION
     "planned": {...}}                                # the planner's JSON line

The sides are the recommended split (`recommended` in the planner's output), which may be
the swap of the placement asked for, at the chip counts the simulator picked; only slices one
can rent are recommended (asyncrl/plan/accelerators.py `rentable`).

    python -m asyncrl.plan.launch_plan plan.json --for=tpu_vms    # what the script sets

prints the plan as the shell assignments a script `eval`s, or one `error:` line naming what
no script can build (exit status 2): a slice no one sells, an instance that does not divide a
host's chips, a GPU trainer over several machines, a GPU memory need past what JAX can be
given. Import-light: the launch scripts run it on the user's machine, before any VM exists.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys

from asyncrl.plan import accelerators

FORMAT = "asyncrl-plan/1"
# A checkpoint holds the float32 master weights and Adam's two moments (~12 bytes a
# parameter, 91 GB at 7B): TPU VMs boot with 100 GB disks, so a plan keeps one checkpoint
# (asyncrl writes the new one beside it before it drops the old, Orbax's atomic rename).
CHECKPOINTS_KEPT = 1
# GPU: JAX preallocates XLA_PYTHON_CLIENT_MEM_FRACTION of each GPU (0.75 by default). A plan
# that needs more asks for what it needs plus this margin; past MAX_MEMORY_FRACTION the CUDA
# context, cuBLAS and NCCL have no room left.
MEMORY_MARGIN = 0.03
MAX_MEMORY_FRACTION = 0.95
SCRIPTS = ("tpu_vms", "gpu_vms")


class PlanError(ValueError):
    """A plan no launch script can build; the message names the field and why."""


def side(accelerator: accelerators.Accelerator, hbm_bytes_per_device: float) -> dict:
    hosts, per_host = accelerator.hosts
    return {"accelerator": accelerator.name, "kind": accelerator.kind,
            "generation": accelerator.generation, "chips": accelerator.chips, "hosts": hosts,
            "chips_per_host": per_host,
            "runtime_version": accelerators.RUNTIME_VERSIONS.get(accelerator.generation),
            "hbm_bytes_per_device": float(hbm_bytes_per_device),
            "hbm_capacity_bytes": float(accelerator.chip.hbm_bytes)}


def build(config: str, spec, trainer: dict, rollout: dict, eta: int, layout,
          planned: dict) -> dict:
    """The plan file's content: `trainer` and `rollout` from `side`, `layout` the trainer's
    compiled step layout (its remat and micro-batch count go into the overrides where they
    are not the config's)."""
    per_instance = spec.mesh.devices_per_instance
    rollout = {**rollout, "devices_per_instance": per_instance,
               "instances_per_host": rollout["chips_per_host"] // per_instance,
               "instances": rollout["chips"] // per_instance}
    overrides = {"staleness.eta": eta, "checkpoint.keep": CHECKPOINTS_KEPT}
    if layout.remat != spec.train.remat:
        overrides["train.remat"] = layout.remat
    if not layout.packed and layout.num_microbatches != spec.train.num_microbatches:
        overrides["train.num_microbatches"] = layout.num_microbatches
    plan = {"format": FORMAT, "config": config, "overrides": overrides, "trainer": trainer,
            "rollout": rollout, "memory_fraction": None, "planned": planned}
    if trainer["kind"] == "gpu" or rollout["kind"] == "gpu":
        plan["memory_fraction"] = memory_fraction(plan)
    return plan


def memory_fraction(plan: dict) -> float:
    """The share of each GPU JAX must preallocate for the larger side's plan: at least JAX's
    own 0.75, the need plus a margin above it."""
    need = max(s["hbm_bytes_per_device"] / s["hbm_capacity_bytes"]
               for s in (plan["trainer"], plan["rollout"]) if s["kind"] == "gpu")
    fraction = max(0.75, math.ceil((need + MEMORY_MARGIN) * 100) / 100)
    if fraction > MAX_MEMORY_FRACTION:
        raise PlanError(f"memory_fraction: the plan needs {need:.0%} of each GPU's memory, more "
                        f"than the {MAX_MEMORY_FRACTION:.0%} JAX can be given beside CUDA's own "
                        f"buffers: plan more trainer chips or fewer KV pages")
    return fraction


def write(path: str, plan: dict) -> None:
    with open(path, "w") as f:
        json.dump(plan, f, indent=1)
        f.write("\n")


def read(path: str) -> dict:
    """A plan file, checked for the fields the scripts use; PlanError names what is wrong."""
    try:
        with open(path) as f:
            plan = json.load(f)
    except OSError as error:
        raise PlanError(f"{path}: cannot read the plan ({error.strerror})") from None
    except json.JSONDecodeError as error:
        raise PlanError(f"{path}: not a plan file (JSON: {error})") from None
    if not isinstance(plan, dict) or plan.get("format") != FORMAT:
        raise PlanError(f"{path}: format is {plan.get('format') if isinstance(plan, dict) else None!r}, "
                        f"expected {FORMAT!r} (write it with python -m asyncrl.plan ... --out=)")
    need = {"config": str, "overrides": dict, "trainer": dict, "rollout": dict}
    for key, kind in need.items():
        if not isinstance(plan.get(key), kind):
            raise PlanError(f"{path}: {key} missing or not a {kind.__name__}")
    for name in ("trainer", "rollout"):
        for key in ("accelerator", "kind", "chips", "hosts", "chips_per_host"):
            if key not in plan[name]:
                raise PlanError(f"{path}: {name}.{key} missing")
    for key in ("devices_per_instance", "instances_per_host", "instances"):
        if not isinstance(plan["rollout"].get(key), int) or plan["rollout"][key] < 1:
            raise PlanError(f"{path}: rollout.{key} missing or not a positive int")
    return plan


def _check_buildable(plan: dict, script: str) -> None:
    """PlanError for what `script` cannot create from `plan`."""
    for name in ("trainer", "rollout"):
        s = plan[name]
        accelerator = accelerators.parse(s["accelerator"])
        if not accelerators.rentable(accelerator):
            raise PlanError(f"{name}.accelerator: {s['accelerator']} is not a slice or machine "
                            f"one can rent (TPU v5e / v6e: 1, 4, 8, 16... chips; v4 / v5p: 4, "
                            f"8, 16...; GPUs: up to 8, or whole machines of 8)")
        wanted = "tpu" if script == "tpu_vms" else "gpu"
        if s["kind"] != wanted:
            raise PlanError(f"{name}.accelerator: {s['accelerator']} is not a "
                            f"{wanted.upper()}: launch it with launch/{s['kind']}_vms.sh")
    rollout = plan["rollout"]
    per, block = rollout["chips_per_host"], rollout["devices_per_instance"]
    if per % block:
        raise PlanError(f"rollout.devices_per_instance: {block} chips per instance does not "
                        f"divide a {rollout['accelerator']} host's {per} chips (an instance "
                        f"is one process on one host)")
    if script == "gpu_vms" and plan["trainer"]["hosts"] > 1:
        raise PlanError(f"trainer.accelerator: {plan['trainer']['accelerator']} spans "
                        f"{plan['trainer']['hosts']} machines; launch/gpu_vms.sh runs the "
                        f"trainer on the head's GPUs alone (at most "
                        f"{accelerators.GPUS_PER_MACHINE})")
    if script == "gpu_vms":
        memory_fraction(plan)  # refuses a need past what JAX can be given


def shell_assignments(plan: dict, script: str) -> str:
    """The plan as `name=value` lines for `script` to eval (shell-quoted)."""
    _check_buildable(plan, script)
    t, r = plan["trainer"], plan["rollout"]
    values = {
        "plan_config": plan["config"],
        "plan_trainer_type": t["accelerator"], "plan_trainer_hosts": t["hosts"],
        "plan_trainer_chips": t["chips_per_host"],
        "plan_type": r["accelerator"], "plan_hosts": r["hosts"],
        "plan_chips": r["chips_per_host"],
        "plan_devices_per_instance": r["devices_per_instance"],
        "plan_instances_per_host": r["instances_per_host"],
        "plan_instances": r["instances"],
    }
    if script == "tpu_vms":
        values["plan_trainer_version"] = t["runtime_version"]
        values["plan_version"] = r["runtime_version"]
    else:
        values["plan_memory_fraction"] = memory_fraction(plan)
    lines = [f"{k}={shlex.quote(str(v))}" for k, v in values.items()]
    flags = [f"--config.{k}={v}" for k, v in plan["overrides"].items()]
    lines.append(f"plan_overrides=({' '.join(shlex.quote(f) for f in flags)})")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Print a plan file as the shell assignments "
                                     "a launch script evaluates.")
    parser.add_argument("plan")
    parser.add_argument("--for", dest="script", choices=SCRIPTS, required=True)
    args = parser.parse_args(argv)
    try:
        print(shell_assignments(read(args.plan), args.script))
    except (PlanError, ValueError) as error:
        print(f"error: {args.plan}: {error}" if not str(error).startswith(args.plan)
              else f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
