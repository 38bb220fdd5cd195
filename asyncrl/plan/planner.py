"""Plan a run before renting the chips: does it fit, how fast will it go, how to split them.

    python -m asyncrl.plan --config=experiments/gsm8k.py:qwen2.5-7b --trainer=v5p-16 --rollout=v6e-8
    python -m asyncrl.plan --config=experiments/gsm8k.py:qwen2.5-1.5b --trainer=8xH100 --rollout=8xH100 --eta=1

On TPU the run's own programs are compiled for the accelerator's topology on this host, with
the run's shardings (asyncrl/plan/tpu_compile.py, libtpu needed, no TPU): the train step on
the trainer's chips, the engine's prefill and decode dispatch on one rollout instance's, and
the cast of the float32 master weights to the weights rollout receives. XLA's memory
analysis of each is the HBM plan (asyncrl/plan/parts.py). On GPU the same programs are
compiled for this host's CPU (XLA:GPU is not installed here) and read the same way: their
buffer sizes match what a GPU allocates to within layouts and fusions, and the plan says so.

The train step is compiled for the batch the run would build from one step's trajectories
drawn from the planner's length model (below; a fixed seed): a trajectory per row padded to
rollout.max_len, or with train.tokens_per_row the rows the packer fills, their count
bucketed for the trainer's chips, one row per chip per micro-batch (asyncrl/plan/parts.py
`step_layout`). The config's remat and micro-batch count come first; where they do not fit,
doublings of the count are compiled up to one row per chip at once, then the same with each
remat policy that keeps less, down to 'full', and the plan names the remat and count that
fit (set them in the config). Where none does, the `error:` line says so and names the
smallest trainer slice whose chips would hold a row beside their share of the state (the
compiled figures scaled, not compiled).

Times are predicted from what those programs compute and move, XLA's cost analysis with
every loop counted (asyncrl/plan/hlo_cost.py) and the paged attention kernel counted from its
block plan (asyncrl/plan/kernel_cost.py), on the chip's datasheet at stated efficiencies:
each a value with a low-high band, calibrated only where a measurement on that chip backs it
(asyncrl/plan/predict.py, its assumptions printed with the plan). The recommendation runs the
cluster simulator on profiles made from those times, over splits of the chips (both
assignments of the pools when the trainer and rollout are different chips) and over η
(asyncrl/plan/recommend.py), and reports StaleFlow's throughput against synchronous training.

`--trainer=cpu --rollout=cpu` plans a local CPU run (the config's own layout on this host's
CPU devices, one process): every device's memory is the host's, so the plan is one host
figure, counted from the same compiled programs (asyncrl/plan/parts.py `host_part`), against
the host's memory. No datasheet, so no times or split for a CPU.

The last line printed is one JSON object. A placement that cannot fit ends with one
`error:` line naming the part and what to change, exit status 2.

`--out=plan.json` also writes the recommended split as a plan file the launch scripts build
(asyncrl/plan/launch_plan.py; launch/tpu_vms.sh --plan=plan.json, launch/gpu_vms.sh).
"""

import os

from asyncrl.host_devices import split_cpu_host

# Before JAX is imported: the planner runs no program, it compiles (a GPU plan for up to 8
# devices of this host's CPU; a TPU plan for a topology libtpu describes).
split_cpu_host(8)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

from absl import flags  # noqa: E402

from asyncrl.cli import define_config_flag  # noqa: E402
from asyncrl.errors import UserError  # noqa: E402
from asyncrl.plan import accelerators, predict, recommend  # noqa: E402
from asyncrl.plan.hbm import model_of, param_count  # noqa: E402
from asyncrl.plan.parts import (  # noqa: E402
    check_fits, check_host_fits, host_part, rollout_part, run_import_bytes, trainer_part)

_CONFIG = define_config_flag("experiments/gsm8k.py:qwen2.5-7b", "Experiment config to plan.")
_TRAINER = flags.DEFINE_string("trainer", None, "The trainer's chips: a Cloud TPU accelerator "
                               "type (v5e-8, v5p-16, v6e-8) or GPUs (8xH100).", required=True)
_ROLLOUT = flags.DEFINE_string("rollout", None, "The rollout instances' chips, the same way.",
                               required=True)
_ETA = flags.DEFINE_integer("eta", None, "Staleness bound to plan for; default: the config's, "
                            "and the recommendation tries 1, 2 and 4 beside it.")
_RESPONSE_MEDIAN = flags.DEFINE_float(
    "response_median", 0.0, "Median response length the simulator and the train step's "
    "batch draw (lognormal, sigma 1, capped at rollout.max_new_tokens); 0: max_new_tokens / 8.")


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB"


def _spec(c, trainer, rollout, eta):
    """The run's spec on the planned chips: the trainer on all of its side, the instances
    filling the other (the config is copied, not changed)."""
    from asyncrl import config as config_lib

    per_instance = c.mesh.devices_per_instance
    overrides = {"mesh.colocate": False, "mesh.trainer_devices": trainer.chips,
                 "mesh.rollout_instances": max(rollout.chips // per_instance, 1)}
    if eta is not None:
        overrides["staleness.eta"] = eta
    return config_lib.validate(config_lib.with_overrides(c, overrides),
                               device_count=trainer.chips + rollout.chips, local_files=False)


def _assignment(spec, model, trainer_acc, rollout_acc,
                response_median: float, find_slice: bool = True) -> recommend.Assignment:
    """Both sides compiled and checked; DoesNotFit names the part that does not fit (and,
    with find_slice, the smallest trainer slice that holds a row, by compiling)."""
    trainer, t_info = trainer_part(spec, model, trainer_acc, response_median)
    done = "refused by the TPU compiler for want of HBM" if t_info["refused"] else "compiled"
    print(f"  {trainer_acc.name}: train step {done} in {t_info['compile_s']:.0f} s: "
          f"{trainer.layout.text(trainer_acc.chips)}", flush=True)
    _print_microbatches(spec, trainer, t_info["tried"])

    def holds(bigger) -> bool:
        print(f"  compiling the train step for {bigger.name}: does it hold a row?", flush=True)
        part = trainer_part(spec, model, bigger, response_median)[0]
        return part.hbm_bytes_per_device <= part.capacity

    # The smallest slice is searched (a few compiles) for the placement asked for; a swap
    # that does not fit is only said to.
    check_fits(trainer, None, spec, holds if find_slice else None)
    rollout, r_info = rollout_part(spec, model, rollout_acc)
    print(f"  {rollout_acc.name}: prefill and decode compiled in {r_info['compile_s']:.0f} s",
          flush=True)
    check_fits(trainer, rollout, spec)
    return recommend.Assignment(trainer, rollout, r_info["kernel"], r_info["engine"])


def _print_microbatches(spec, trainer, tried) -> None:
    """What each remat and micro-batch count tried needed, when the config's was not the one
    that fit."""
    if len(tried) == 1 and trainer.hbm_bytes_per_device <= trainer.capacity:
        return
    for remat, m, needed, refused in tried:
        print(f"    train.remat = '{remat}', {m} micro-batch(es): {_gb(needed)} per chip"
              + (" (the TPU compiler refused it for want of HBM)" if refused else ""))
    layout = trainer.layout
    if trainer.hbm_bytes_per_device <= trainer.capacity:
        changed = [f"train.remat = '{layout.remat}'"] if layout.remat != spec.train.remat else []
        if not layout.packed and layout.num_microbatches != spec.train.num_microbatches:
            changed.append(f"train.num_microbatches = {layout.num_microbatches}")
        if changed:
            print(f"    the config's step does not fit: the plan is {' and '.join(changed)} "
                  f"(set {'them' if len(changed) > 1 else 'it'})", flush=True)


def _assignments(c, spec, model, trainer_acc, rollout_acc, eta,
                 response_median: float) -> list[recommend.Assignment]:
    """The placement asked for (it must fit), and with two kinds of chip its swap, where it
    fits (a line says why not)."""
    assignments = [_assignment(spec, model, trainer_acc, rollout_acc, response_median)]
    if trainer_acc.generation != rollout_acc.generation:
        print(f"  the swap: train on {rollout_acc.name}, roll out on {trainer_acc.name}",
              flush=True)
        try:
            swapped = _spec(c, rollout_acc, trainer_acc, eta)
            assignments.append(_assignment(swapped, model, rollout_acc, trainer_acc,
                                           response_median, find_slice=False))
        except UserError as error:  # DoesNotFit, or a batch that does not split there
            print(f"  the swap is not tried: {error}", flush=True)
    return assignments


def plan(c, trainer_name: str, rollout_name: str, eta: int | None = None,
         response_median: float = 0.0, out: str | None = None, config_arg: str = "",
         config_overrides: dict | None = None) -> dict:
    """The plan's JSON; with `out`, the recommended split also as a plan file there, naming
    the config as `config_arg` with `config_overrides` (the planner's --config.* flags)."""
    from asyncrl import config as config_lib

    try:
        trainer_acc = accelerators.parse(trainer_name)
        rollout_acc = accelerators.parse(rollout_name)
    except ValueError as error:
        raise UserError(str(error)) from None
    if "cpu" in (trainer_acc.kind, rollout_acc.kind):
        if trainer_acc.kind != rollout_acc.kind:
            raise UserError(f"--trainer={trainer_name} --rollout={rollout_name}: a CPU run "
                            f"places both on this host: --trainer=cpu --rollout=cpu")
        if out:
            raise UserError(f"--out={out}: a CPU run has no slices or machines to launch "
                            f"(run it: python -m asyncrl.main)")
        return plan_host(c if eta is None else
                         config_lib.with_overrides(c, {"staleness.eta": eta}))
    spec = _spec(c, trainer_acc, rollout_acc, eta)
    model, source = model_of(spec)
    started = time.perf_counter()
    print(f"model: {source}, {param_count(model) / 1e9:.2f}B parameters, {model.param_dtype}")
    print(f"trainer: {trainer_acc.name} = {trainer_acc.chips} x {trainer_acc.chip.name}; "
          f"rollout: {rollout_acc.name} = {rollout_acc.chips} x {rollout_acc.chip.name}"
          + ("" if trainer_acc.kind == "tpu" and rollout_acc.kind == "tpu" else
             "; GPU parts compiled for this host's CPU (XLA:GPU is not here), sized on the "
             "datasheet"), flush=True)
    assignments = _assignments(c, spec, model, trainer_acc, rollout_acc, eta, response_median)
    given = assignments[0]
    trainer, rollout = given.trainer, given.rollout

    median = response_median or spec.rollout.max_new_tokens / 8
    mean_len = spec.rollout.prompt_bucket / 2 + median
    page = rollout.pieces["page_size"]
    per_sequence = math.ceil(mean_len / page) if given.engine.page_size is not None else 1
    concurrent = min(spec.rollout.num_slots, rollout.pieces["kv_pages"] // per_sequence)
    # The rows a steady-state step holds: every slot computes; an idle one reads no page.
    kv_lens = [round(mean_len)] * concurrent + [0] * (spec.rollout.num_slots - concurrent)
    predicted = recommend.predictions(spec, model, given, trainer, kv_lens)
    etas = sorted({1, 2, 4, spec.staleness.eta} - {0})
    same = trainer_acc.generation == rollout_acc.generation
    recommended = recommend.recommend(spec, model, assignments, etas, median, kv_lens,
                                      trainer_acc.chips + rollout_acc.chips if same else None)
    _print_plan(spec, given, predicted, recommended, concurrent, mean_len, median)
    print(f"planned in {time.perf_counter() - started:.0f} s")
    result = {
        "fits": True,
        "trainer": {"hbm_bytes_per_device": trainer.hbm_bytes_per_device,
                    "hbm_capacity_bytes": trainer.capacity,
                    **{k: trainer.pieces[k] for k in ("params_bytes", "optimizer_bytes",
                                                      "activation_bytes")},
                    "step": _layout_json(spec, trainer.layout)},
        "rollout": {"hbm_bytes_per_device": rollout.hbm_bytes_per_device,
                    "hbm_capacity_bytes": rollout.capacity,
                    "kv_pages": rollout.pieces["kv_pages"],
                    "max_concurrent_sequences": concurrent},
        "predicted": predicted.as_json(),
        "recommended": {k: recommended[k] for k in (
            "trainer", "trainer_chips", "rollout", "rollout_chips", "eta",
            "predicted_staleflow_vs_sync")},
    }
    if out:
        _write_plan(out, config_arg, config_overrides or {}, spec, assignments, recommended,
                    result)
    return result


def _write_plan(out, config_arg, config_overrides, spec, assignments, recommended,
                result) -> None:
    """The recommended split as a launch plan (asyncrl/plan/launch_plan.py)."""
    from asyncrl.plan import launch_plan
    from asyncrl.plan.parts import scaled_trainer

    picked = next(a for a in assignments if a.label == recommended["assignment"])
    trainer = scaled_trainer(picked.trainer, recommended["trainer_chips"])
    rollout_acc = picked.rollout.accelerator.with_chips(recommended["rollout_chips"])
    try:
        plan = launch_plan.build(
            config_arg, spec,
            launch_plan.side(trainer.accelerator, trainer.hbm_bytes_per_device),
            launch_plan.side(rollout_acc, picked.rollout.hbm_bytes_per_device),
            recommended["eta"], picked.trainer.layout, result)
    except launch_plan.PlanError as error:
        raise UserError(f"--out={out}: {error}") from None
    plan["overrides"] = {**config_overrides, **plan["overrides"]}
    launch_plan.write(out, plan)
    print(f"plan written to {out}: {recommended['trainer']} + {recommended['rollout']}, "
          f"{plan['rollout']['instances']} instance(s) of {spec.mesh.devices_per_instance} "
          f"chip(s), eta {recommended['eta']} (launch it: launch/"
          f"{plan['trainer']['kind']}_vms.sh all --plan={out} ...)")


def _layout_json(spec, layout) -> dict:
    """The rows the planned train step was compiled for, and how it attends."""
    return {"rows": layout.rows, "row_tokens": layout.width, "packed": layout.packed,
            "num_microbatches": layout.num_microbatches,
            "padding_fraction": round(layout.padding_fraction, 4),
            "attention": spec.train.attention, "remat": layout.remat}


def _print_plan(spec, given, predicted, recommended, concurrent, mean_len, median) -> None:
    trainer, rollout = given.trainer, given.rollout
    print(f"\n{'part':<9}{'HBM / chip':>12}{'capacity':>12}  pieces")
    for side, part in (("trainer", trainer), ("rollout", rollout)):
        pieces = ", ".join(f"{k.removesuffix('_bytes')} {_gb(v)}" for k, v in part.pieces.items()
                           if k.endswith("_bytes"))
        print(f"{side:<9}{_gb(part.hbm_bytes_per_device):>12}{_gb(part.capacity):>12}  {pieces}")
    print(f"KV: {rollout.pieces['kv_pages']} pages of {rollout.pieces['page_size']} positions "
          f"per instance; {concurrent} sequences at a mean of {mean_len:.0f} positions")
    step, decode = trainer.costs["train_step"], rollout.costs["decode_step"]
    print(f"\npredicted: value [low-high], calibrated where a measurement on the chip backs it "
          f"(responses lognormal, median {median:.0f}, sigma 1)")
    print(f"  train step      {predicted.train_step.text()}  "
          f"({step['flops'] / 1e12:,.0f} TFLOP, {_gb(step['bytes_accessed'])} per chip)")
    print(f"  decode step     {predicted.decode_step.text(1e-3, ' ms')}  "
          f"(compiled {decode['flops'] / 1e9:,.0f} GFLOP, {_gb(decode['bytes_accessed'])}"
          + (", plus the paged attention kernel" if given.kernel else "") + ")")
    print(f"  prefill         {predicted.prefill_per_token.text(1e-6, ' us')} per token")
    print(f"  weight sync     {predicted.weight_sync.text()}")
    print("assumptions:")
    kinds = {trainer.accelerator.kind, rollout.accelerator.kind}
    for line in predict.assumptions_text(kinds):
        print(f"  {line}")
    print(f"\nsimulated splits (trainer + rollout chips, eta: StaleFlow / sync tok/s); the pick: "
          f"the least eta within {recommend.ETA_TOLERANCE:.0%} of the best, then the fewest "
          f"chips")
    for row in recommended["tried"]:
        print(f"  {row['trainer']:>9} + {row['rollout']:<9} eta {row['eta']}: "
              f"{row['staleflow_tok_s']:,.0f} / {row['sync_tok_s']:,.0f} = "
              f"{row['predicted_staleflow_vs_sync']:.2f}")
    print(f"picked {recommended['trainer']} + {recommended['rollout']} at eta "
          f"{recommended['eta']}: {recommended['staleflow_tok_s']:,.0f} tok/s against the best "
          f"{recommended['best_tok_s']:,.0f}, {recommended['assignment']}")


def plan_host(c) -> dict:
    """A local CPU run on this host, in its config's layout: the trainer's step and one
    instance's engine compiled for this host's CPU devices, and the host figure."""
    import jax

    from asyncrl import config as config_lib

    runtime = run_import_bytes()
    spec = config_lib.validate(c, device_count=len(jax.devices("cpu")), local_files=False)
    model, source = model_of(spec)
    cpu = accelerators.parse("cpu")
    mesh = spec.mesh
    started = time.perf_counter()
    print(f"model: {source}, {param_count(model) / 1e6:.1f}M parameters, {model.param_dtype}")
    print(f"cpu: the trainer on {mesh.trainer_devices} CPU device(s), "
          f"{mesh.rollout_instances} instance(s) of {mesh.devices_per_instance}, one "
          f"process: host memory {cpu.chip.hbm_bytes / 1e9:.1f} GB", flush=True)
    trainer, t_info = trainer_part(spec, model, cpu.with_chips(mesh.trainer_devices))
    rollout, r_info = rollout_part(
        spec, model, cpu.with_chips(mesh.rollout_instances * mesh.devices_per_instance))
    print(f"  train step, prefill and decode compiled in "
          f"{t_info['compile_s'] + r_info['compile_s']:.0f} s", flush=True)
    host = host_part(spec, model, trainer, rollout, runtime)
    check_host_fits(host)
    print(f"\nhost {_gb(host.hbm_bytes_per_device)} of {_gb(host.capacity)}: "
          + ", ".join(f"{k.removesuffix('_bytes').replace('_', ' ')} {_gb(v)}"
                      for k, v in host.pieces.items()))
    for side, part in (("trainer", trainer), ("rollout", rollout)):
        pieces = ", ".join(f"{k.removesuffix('_bytes')} {_gb(v)}" for k, v in part.pieces.items()
                           if k.endswith("_bytes"))
        print(f"  {side} per device: {_gb(part.hbm_bytes_per_device)} ({pieces})")
    print("no times or split predicted: a CPU has no datasheet (plan an accelerator for them)")
    print(f"planned in {time.perf_counter() - started:.0f} s")
    return {
        "fits": True,
        "host": {"host_bytes": host.hbm_bytes_per_device, "host_capacity_bytes": host.capacity,
                 **host.pieces},
        "trainer": {"hbm_bytes_per_device": trainer.hbm_bytes_per_device,
                    **{k: trainer.pieces[k] for k in ("params_bytes", "optimizer_bytes",
                                                      "activation_bytes")}},
        "rollout": {"hbm_bytes_per_device": rollout.hbm_bytes_per_device,
                    "kv_pages": rollout.pieces["kv_pages"],
                    "kv_bytes": rollout.pieces["kv_bytes"],
                    "temp_bytes": rollout.pieces["temp_bytes"]},
    }


def main(argv, out: str | None = None):
    """The CLI (asyncrl/plan/__main__.py, which defines --out: a flag named like one a
    benchmark defines, so not defined where tests import the planner)."""
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    from ml_collections import config_flags

    holder = flags.FLAGS["config"]
    result = plan(_CONFIG.value, _TRAINER.value, _ROLLOUT.value, _ETA.value,
                  _RESPONSE_MEDIAN.value, out, config_flags.get_config_filename(holder),
                  config_flags.get_override_values(holder))
    print(json.dumps(result))
