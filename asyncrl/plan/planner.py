"""Plan a run before renting the chips: does it fit, how fast will it go, how to split them.

    python -m asyncrl.plan --config=experiments/gsm8k.py:qwen2.5-7b --trainer=v5p-16 --rollout=v6e-8
    python -m asyncrl.plan --config=experiments/gsm8k.py:qwen2.5-1.5b --trainer=8xH100 --rollout=8xH100 --eta=1

On TPU the run's own programs are compiled for the accelerator's topology on this host, with
the run's shardings (asyncrl/plan/tpu_compile.py, libtpu needed, no TPU): the train step on the
trainer's chips, the engine's prefill and decode dispatch on one rollout instance's, and the
cast of the float32 master weights to the weights rollout receives. XLA's memory analysis of
each is the HBM plan. On GPU the same programs are compiled for this host's CPU (XLA:GPU is
not installed here) and read the same way: their buffer sizes match what a GPU allocates to
within layouts and fusions, and the plan says so.

Times are rooflines on the chip's datasheet (asyncrl/plan/accelerators.py), their assumptions
printed: the train step at its FLOPs (6 per parameter per token, 8 with full remat, plus
attention), decode at the bytes it must read (parameters and live KV; the paged engine read
1.04-1.05x that in XLA's analysis of its TPU step, docs/results.md), prefill at 2 FLOPs per
parameter per token, a weight sync at the host network's bandwidth. The recommendation runs
the cluster simulator (asyncrl/sim) on a profile made from those times, over the splits of
the chips between trainer and rollout and over η, and reports StaleFlow's throughput
against synchronous training on the same chips.

`--trainer=cpu --rollout=cpu` plans a local CPU run (the config's own layout on this host's
CPU devices, one process): every device's memory is the host's, so the plan is one host
figure, counted from the same compiled programs (asyncrl/plan/planner.py `host_part`), against the
host's memory. No datasheet, so no times or split for a CPU.

The last line printed is one JSON object. A placement that cannot fit ends with one
`error:` line naming the part and what to change, exit status 2.
"""

import os
import subprocess
import sys

from asyncrl.host_devices import split_cpu_host

# Before JAX is imported: the planner runs no program, it compiles (a GPU plan for up to 8
# devices of this host's CPU; a TPU plan for a topology libtpu describes).
split_cpu_host(8)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from absl import flags  # noqa: E402

from asyncrl.plan import accelerators  # noqa: E402
from asyncrl.cli import define_config_flag  # noqa: E402
from asyncrl.errors import UserError  # noqa: E402
from asyncrl.plan.hbm import DoesNotFit, model_of, param_count  # noqa: E402

_CONFIG = define_config_flag("experiments/gsm8k.py:qwen2.5-7b", "Experiment config to plan.")
_TRAINER = flags.DEFINE_string("trainer", None, "The trainer's chips: a Cloud TPU accelerator "
                               "type (v5e-8, v5p-16, v6e-8) or GPUs (8xH100).", required=True)
_ROLLOUT = flags.DEFINE_string("rollout", None, "The rollout instances' chips, the same way.",
                               required=True)
_ETA = flags.DEFINE_integer("eta", None, "Staleness bound to plan for; default: the config's, "
                            "and the recommendation tries 1, 2 and 4 beside it.")
_RESPONSE_MEDIAN = flags.DEFINE_float(
    "response_median", 0.0, "Median response length the simulator draws (lognormal, sigma "
    "1, capped at rollout.max_new_tokens); 0: max_new_tokens / 8.")

# Assumptions of the predictions, printed with them.
HOST_NETWORK_BYTES_PER_S = 12.5e9  # a 100 Gb/s NIC per host, trainer to rollout
GPU_PEER_BYTES_PER_S = 50e9  # GPU to GPU inside one machine (PCIe 5 / NVLink, conservative)
STEP_OVERHEAD_S = 0.5  # per train step: the host's batch building, dispatch and logging
DECODE_OVERHEAD_S = 0.001  # per decode dispatch: host dispatch and sampling
SYNC_OVERHEAD_S = 1.0  # per weight sync: pause, swap, resume
TRAIN_MFU = 1.0  # a roofline: the datasheet's peak, not an achieved fraction


@dataclasses.dataclass
class Part:
    """One side's memory plan on one chip."""

    accelerator: accelerators.Accelerator
    hbm_bytes_per_device: float
    pieces: dict[str, float]  # what the bytes are made of, by name

    @property
    def capacity(self) -> float:
        return self.accelerator.chip.hbm_bytes


def _devices(accelerator, count: int):
    import jax

    from asyncrl.plan.tpu_compile import topology_devices

    if accelerator.kind == "tpu":
        try:
            return topology_devices(accelerator.with_chips(count).topology)[:count]
        except ValueError as error:
            import importlib.util
            if importlib.util.find_spec("libtpu") is None:
                raise UserError(f"planning for {accelerator.name} compiles for a TPU on this "
                                f"host, which needs libtpu: pip install 'jax[tpu]==0.10.2' "
                                f"(requirements-test.txt pins it)") from None
            raise UserError(str(error)) from None
    cpus = jax.devices("cpu")
    if count > len(cpus):
        raise UserError(f"planning {count} GPUs compiles for {count} CPU devices; this host has "
                        f"{len(cpus)} (XLA_FLAGS sets --xla_force_host_platform_device_count)")
    return cpus[:count]


def _nbytes(tree) -> float:
    import jax
    import numpy as np

    return float(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize
                     for x in jax.tree.leaves(tree)))


def trainer_part(c, model, accelerator) -> tuple[Part, dict]:
    """The train step compiled on all the trainer's chips (FSDP), and its memory analysis."""
    import jax
    import jax.numpy as jnp

    from asyncrl.train.settings import train_config
    from asyncrl.train.trainer import Trainer, TrainBatch, batch_shardings, trainer_mesh

    devices = _devices(accelerator, accelerator.chips)
    mesh = trainer_mesh(devices)
    trainer = Trainer.create(train_config(c), model, mesh, c.rollout.group_size)
    state = trainer.abstract_state()
    rows = c.train.batch_size * c.rollout.group_size
    length = c.rollout.prompt_bucket + c.rollout.max_new_tokens
    sh = batch_shardings(mesh, c.rollout.group_size)

    def arr(shape, dtype, sharding):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    batch = TrainBatch(
        arr((rows, length), jnp.int32, sh.tokens), arr((rows, length), jnp.int32, sh.positions),
        arr((rows, length), jnp.float32, sh.loss_mask),
        arr((rows, length), jnp.float32, sh.behaviour_logp),
        arr((rows, length), jnp.int32, sh.token_versions), arr((rows,), jnp.float32, sh.rewards),
        arr((rows,), jnp.int32, sh.v_traj), arr((), jnp.int32, sh.buffer_version),
        group_size=c.rollout.group_size)
    chips = accelerator.chips
    pieces = {"params_bytes": _nbytes(state.params) / chips,
              "optimizer_bytes": _nbytes(state.opt_state) / chips,
              "batch_bytes": _nbytes(batch) / chips,
              # The policy copy rollout receives exists beside the state while it is pushed.
              "policy_copy_bytes": _nbytes(state.params) / 2 / chips
              if model.param_dtype != "float32" else 0.0}
    start = time.perf_counter()
    step = _compiled(trainer.step, (state, batch), devices, (0,))
    if not isinstance(step, dict):  # the TPU compiler found it cannot fit
        pieces["activation_bytes"] = step
        return Part(accelerator, sum(pieces.values()), pieces), {"compile_s": 0.0}
    pieces["activation_bytes"] = step["temp_bytes"]
    # The first half of the trainer-to-rollout reshard: the policy copy cast on the trainer's
    # shards (the second half crosses to the rollout's chips over the network).
    cast = (_compiled(trainer.to_policy, (state.params,), devices)
            if model.param_dtype != "float32" else None)  # float32: the master is the policy
    if isinstance(cast, dict):
        pieces["policy_copy_bytes"] = cast["output_bytes"]
    total = step["device_bytes"] + pieces["policy_copy_bytes"]
    return Part(accelerator, total, pieces), {"compile_s": time.perf_counter() - start}


def _compiled(fn, args, devices, donate_argnums=()):
    """XLA's analysis of fn compiled for `devices`; a float, the temporaries it needed, when
    the TPU compiler refuses for want of HBM (it says so rather than compiling)."""
    import re

    import jax

    from asyncrl.plan.tpu_compile import analysis, compile_for

    try:
        return analysis(compile_for(fn, args, devices, donate_argnums=donate_argnums))
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        needed = re.search(r"HLO temporaries \(([\d.]+)([KMGT])\)", str(error))
        if needed is None:
            return 0.0
        scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}[needed.group(2)]
        return float(needed.group(1)) * scale


def rollout_part(c, model, accelerator) -> tuple[Part, dict]:
    """One instance's engine (devices_per_instance chips, weights replicated as the run
    places them): the prefill chunk and the decode dispatch compiled, the larger peak kept."""
    import jax
    import jax.numpy as jnp

    from asyncrl.model import abstract_params
    from asyncrl.rollout.engine import Engine, KVOptions, _generate, _prefill_chunk
    from asyncrl.model.sampling import SamplingParams

    per_instance = c.mesh.devices_per_instance
    if accelerator.chips % per_instance:
        raise UserError(f"the rollout's {accelerator.chips} chips do not split into instances "
                        f"of mesh.devices_per_instance = {per_instance}")
    devices = _devices(accelerator, per_instance)
    graphdef, params = abstract_params(model)
    max_len = c.rollout.prompt_bucket + c.rollout.max_new_tokens
    # The run's own engine options: "auto" attention resolves when traced for the target
    # (compile_for sets its device), to the TPU kernel or the gather as the run would.
    kv = KVOptions.of_rollout(c.rollout)
    sampling = SamplingParams.of_rollout(c.rollout)
    engine = Engine(graphdef, model, num_slots=c.rollout.num_slots, max_len=max_len,
                    prompt_buckets=(c.rollout.prompt_bucket,), sampling=sampling,
                    **kv.engine_kwargs())
    state = jax.eval_shape(engine._empty_state)
    table = (None if engine.page_size is None else
             jax.ShapeDtypeStruct((engine.num_slots, engine.pages_per_row), jnp.int32))
    decode = functools.partial(  # the engine's own dispatch, as it jits it
        _generate, graphdef, steps=engine.decode_steps, attention=kv.attention, seed=0,
        sampling=sampling, stop_tokens=engine.stop_tokens, max_len=max_len)
    prefill = functools.partial(_prefill_chunk, graphdef)
    pages = engine.num_pages if engine.page_size is not None else engine.num_slots
    pieces = {"params_bytes": _nbytes(params), "kv_bytes": _nbytes(state.cache),
              "kv_pages": pages, "page_size": engine.page_size or max_len}
    start = time.perf_counter()
    decoded = _compiled(decode, (params, state, table), devices, (1,))
    row = jax.eval_shape(engine._new_row)
    tokens = jax.ShapeDtypeStruct((1, c.rollout.prompt_bucket), jnp.int32)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    prefilled = _compiled(prefill, (params, row, tokens, scalar, scalar), devices, (1,))
    info = {"compile_s": time.perf_counter() - start, "engine": engine}
    if not isinstance(decoded, dict) or not isinstance(prefilled, dict):
        refused = [x for x in (decoded, prefilled) if not isinstance(x, dict)]
        pieces["temp_bytes"] = max(refused)
        total = pieces["params_bytes"] + pieces["kv_bytes"] + pieces["temp_bytes"]
        return Part(accelerator, total, pieces), info
    pieces["temp_bytes"] = max(decoded["temp_bytes"], prefilled["temp_bytes"])
    total = max(decoded["device_bytes"], prefilled["device_bytes"] + pieces["kv_bytes"])
    return Part(accelerator, total, pieces), info


# Weight versions resident at once on a CPU host: the newest published one, and the one
# the instances (and an evaluation) still decode with until they pull it. The instances and
# the evaluator share these buffers rather than copying them (asyncrl/servers/parameters.py).
HOST_WEIGHT_VERSIONS = 2


def run_import_bytes() -> float:
    """A run's process's resident memory once the run's modules are imported, measured in a
    child process: the planner needs none of the run's code, and a fresh process counts the
    run's imports alone."""
    code = ("import resource\nimport asyncrl.run\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")  # KiB on Linux
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"importing the run's modules in a child process failed: "
                           f"{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def host_part(c, model, trainer: Part, rollout: Part, runtime_bytes: float) -> Part:
    """A local CPU run's peak host memory, counted: the runtime (a process's resident
    memory once the run's modules are imported), the trainer's compiled step (master
    weights, Adam moments, the batch, temporaries; the policy copy when its dtype differs),
    HOST_WEIGHT_VERSIONS published weight versions shared by the instances, each instance's
    KV cache and decode temporaries, and an evaluation (the version it reads, older than
    both of those while it runs beside training; its engine's KV; a decode's temporaries).
    A CPU checkpoint save writes from the state's own buffers before the next step
    (asyncrl/train/checkpoint.py): nothing to add."""
    from asyncrl.model.paged import kv_bytes_per_token

    weights = policy_bytes(model)
    instances = c.mesh.rollout_instances
    per_instance = (rollout.pieces["kv_bytes"] + rollout.pieces["temp_bytes"]) \
        * c.mesh.devices_per_instance
    eval_positions = c.rollout.num_slots * (c.rollout.prompt_bucket + c.eval.max_new_tokens)
    if c.eval.samples:  # the sampled engine's slots, beside the greedy one's
        eval_positions += (max(c.rollout.num_slots, c.eval.samples)
                           * (c.rollout.prompt_bucket + c.eval.max_new_tokens))
    pieces = {"runtime_bytes": runtime_bytes,
              "trainer_bytes": trainer.hbm_bytes_per_device * trainer.accelerator.chips,
              "weight_versions_bytes": HOST_WEIGHT_VERSIONS * weights,
              "instances_bytes": instances * per_instance,
              "evaluation_bytes": weights + eval_positions * kv_bytes_per_token(model)
              + rollout.pieces["temp_bytes"]}
    return Part(trainer.accelerator, sum(pieces.values()), pieces)


def check_host_fits(host: Part) -> None:
    if host.hbm_bytes_per_device <= host.capacity:
        return
    p = host.pieces
    largest = max((k for k in p if k != "runtime_bytes"), key=p.get)
    raise DoesNotFit(
        f"the run does not fit this host: {host.hbm_bytes_per_device / 1e9:.1f} GB against its "
        f"{host.capacity / 1e9:.1f} GB of memory, "
        f"{(host.hbm_bytes_per_device - host.capacity) / 1e9:.1f} GB over; the largest part is "
        f"{largest.removesuffix('_bytes').replace('_', ' ')} ({p[largest] / 1e9:.1f} GB): "
        + {"trainer_bytes": "raise train.num_microbatches or set train.remat='full'",
           "instances_bytes": "use fewer rollout.num_slots or mesh.rollout_instances",
           "weight_versions_bytes": "use a smaller model or model.param_dtype='bfloat16'",
           "evaluation_bytes": "use fewer rollout.num_slots or eval.samples"}[largest])


def plan_host(c) -> dict:
    """A local CPU run on this host, in its config's layout: the trainer's step and one
    instance's engine compiled for this host's CPU devices, and the host figure."""
    import jax

    from asyncrl import config as config_lib

    runtime = run_import_bytes()
    config_lib.validate(c, device_count=len(jax.devices("cpu")), local_files=False)
    model, source = model_of(c)
    cpu = accelerators.parse("cpu")
    started = time.perf_counter()
    print(f"model: {source}, {param_count(model) / 1e6:.1f}M parameters, {model.param_dtype}")
    print(f"cpu: the trainer on {c.mesh.trainer_devices} CPU device(s), "
          f"{c.mesh.rollout_instances} instance(s) of {c.mesh.devices_per_instance}, one "
          f"process: host memory {cpu.chip.hbm_bytes / 1e9:.1f} GB", flush=True)
    trainer, t_info = trainer_part(c, model, cpu.with_chips(c.mesh.trainer_devices))
    rollout, r_info = rollout_part(
        c, model, cpu.with_chips(c.mesh.rollout_instances * c.mesh.devices_per_instance))
    print(f"  train step, prefill and decode compiled in "
          f"{t_info['compile_s'] + r_info['compile_s']:.0f} s", flush=True)
    host = host_part(c, model, trainer, rollout, runtime)
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


def check_fits(trainer: Part, rollout: Part | None, c) -> None:
    """Raises DoesNotFit naming the part over a chip's HBM, by how much, and what to change."""
    for side, part in (("trainer", trainer), ("rollout", rollout)):
        if part is None or part.hbm_bytes_per_device <= part.capacity:
            continue
        over = part.hbm_bytes_per_device - part.capacity
        p = part.pieces
        head = (f"the {side} does not fit: {part.hbm_bytes_per_device / 1e9:.1f} GB per "
                f"{part.accelerator.chip.name} chip ({part.accelerator.name}) against its "
                f"{part.capacity / 1e9:.1f} GB of HBM, {over / 1e9:.1f} GB over")
        if side == "trainer":
            state = p["params_bytes"] + p["optimizer_bytes"] + p["policy_copy_bytes"]
            if state >= part.capacity:
                # FSDP splits the float32 master weights and Adam's moments over the chips.
                chips = math.ceil(state * part.accelerator.chips / (0.8 * part.capacity))
                raise DoesNotFit(
                    f"{head}: parameters and optimizer state alone are {state / 1e9:.1f} GB "
                    f"per chip (float32 master weights {p['params_bytes'] / 1e9:.1f} GB, Adam "
                    f"moments {p['optimizer_bytes'] / 1e9:.1f} GB); FSDP splits them: use at "
                    f"least {chips} trainer chips")
            remat = "" if c.train.remat == "full" else f", set train.remat='full' (now " \
                                                         f"'{c.train.remat}')"
            raise DoesNotFit(
                f"{head}: activations and other temporaries of the train step are "
                f"{p['activation_bytes'] / 1e9:.1f} GB; raise train.num_microbatches (now "
                f"{c.train.num_microbatches}){remat}, or use more trainer chips")
        if p["params_bytes"] >= part.capacity:
            raise DoesNotFit(f"{head}: the weights alone are {p['params_bytes'] / 1e9:.1f} GB "
                             f"and an instance holds them whole on each chip: use a chip with "
                             f"more HBM")
        if p["kv_bytes"] >= p["temp_bytes"]:
            fit = int(max(part.capacity - p["params_bytes"] - p["temp_bytes"], 0) * 0.9
                      / p["kv_bytes"] * p["kv_pages"])
            raise DoesNotFit(
                f"{head}: the KV cache is {p['kv_bytes'] / 1e9:.1f} GB ({p['kv_pages']} pages "
                f"of {p['page_size']}); set rollout.num_pages to at most {fit}"
                + ("" if c.rollout.page_size else " with rollout.page_size = 16")
                + " or use fewer rollout.num_slots")
        raise DoesNotFit(f"{head}: the decode and prefill temporaries are "
                         f"{p['temp_bytes'] / 1e9:.1f} GB; use fewer rollout.num_slots (now "
                         f"{c.rollout.num_slots})")


def policy_bytes(model) -> float:
    """The weights rollout receives: every parameter in the model's dtype."""
    import jax.numpy as jnp

    return param_count(model) * jnp.dtype(model.param_dtype).itemsize


def predictions(c, model, rollout: Part, trainer: accelerators.Accelerator) -> dict:
    """Roofline times on the datasheets (module docstring), for the `trainer` chips and one
    rollout instance of `rollout`."""
    from asyncrl.model.paged import kv_bytes_per_token

    n = param_count(model)
    trainer_chip = trainer.chip
    r_chip = rollout.accelerator.chip
    length = c.rollout.prompt_bucket + c.rollout.max_new_tokens
    tokens = c.train.batch_size * c.rollout.group_size * length
    per_token = (8 if c.train.remat == "full" else 6) * n
    # Causal attention over the padded rows, QK and PV: forward 2 x 2 x L x (T / 2) x N x H
    # per token, the backward twice that.
    attention = 3 * 2 * 2 * model.num_layers * (length / 2) * model.num_heads * model.head_dim
    train_flops = tokens * (per_token + attention)
    kv_per_token = kv_bytes_per_token(model)
    # An instance's chips hold the weights whole (rollout rules replicate them): each reads
    # them all, so its decode step is one chip's.
    weights_s = rollout.pieces["params_bytes"] / r_chip.hbm_bytes_per_s
    bandwidth = (GPU_PEER_BYTES_PER_S if rollout.accelerator.kind == trainer.kind == "gpu"
                 else HOST_NETWORK_BYTES_PER_S)
    return {"train_step_s": train_flops / (trainer.chips * trainer_chip.bf16_flops_per_s
                                           * TRAIN_MFU) + STEP_OVERHEAD_S,
            "train_flops": train_flops, "train_tokens": tokens,
            "decode_weights_s": weights_s, "decode_kv_s_per_token": kv_per_token / r_chip.hbm_bytes_per_s,
            "prefill_s_per_token": 2 * n / r_chip.bf16_flops_per_s,
            "weight_sync_s": policy_bytes(model) / bandwidth + SYNC_OVERHEAD_S,
            "sync_bandwidth": bandwidth}


def profile_for(c, model, predicted: dict, rollout: Part, trainer_chips: int,
                instances: int) -> dict:
    """A simulator profile (asyncrl/sim/profile.py) from the predictions."""
    return {
        "name": "planned", "model": f"{param_count(model):.4g} parameters",
        "hardware": f"{instances} rollout instances of {rollout.accelerator.chip.name}; "
                    f"the trainer on {trainer_chips} chips",
        "source": "asyncrl.plan: roofline predictions on the datasheets",
        "step_latency": {"a": DECODE_OVERHEAD_S, "b": predicted["decode_kv_s_per_token"],
                         "c": predicted["decode_weights_s"], "d": 0.0,
                         "e": predicted["prefill_s_per_token"]},
        "prefill_s_per_token": predicted["prefill_s_per_token"],
        "instance": {"num_slots": c.rollout.num_slots,
                     "kv_capacity_tokens": rollout.pieces["kv_pages"] * rollout.pieces["page_size"]},
        "weights_bytes": policy_bytes(model),
        "network": {"weight_bandwidth_bytes_per_s": predicted["sync_bandwidth"],
                    "weight_sync_overhead_s": SYNC_OVERHEAD_S},
        "trainer": {"gpu_s_per_token": (predicted["train_step_s"] - STEP_OVERHEAD_S)
                    * trainer_chips / predicted["train_tokens"],
                    "step_overhead_s": STEP_OVERHEAD_S},
        "reward": {"latency_s": 1.0},
    }


def simulate(c, profile: dict, instances: int, trainer_chips: int, eta: int, label: str,
             response_median: float):
    """One simulated run of system `label` (asyncrl/sim/config.py systems) on `profile`."""
    from asyncrl.sim.config import run_config, systems
    from asyncrl.sim.run import simulate_point

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(profile, f)
    try:
        rc = run_config()
        rc.profile = f.name
        rc.group_size = c.rollout.group_size
        rc.batch_size = c.train.batch_size
        rc.train_gpus_per_instance = trainer_chips / instances
        rc.num_slots = c.rollout.num_slots
        rc.prompt_lengths = {"name": "lognormal", "median": c.rollout.prompt_bucket / 2,
                             "sigma": 0.3, "cap": c.rollout.prompt_bucket}
        rc.response_lengths = {"name": "lognormal", "median": response_median, "sigma": 1.0,
                               "cap": c.rollout.max_new_tokens}
        rc.warmup_cycles, rc.measure_cycles = 1, 3
        return simulate_point(rc, systems(), label, instances=instances, eta=eta)
    finally:
        os.unlink(f.name)


def splits(trainer: accelerators.Accelerator, rollout: accelerators.Accelerator,
           per_instance: int) -> list[tuple[int, int]]:
    """(trainer chips, rollout chips) to try: any power-of-two split of one pool when both
    sides are the same kind of chip, else the split given."""
    if trainer.generation != rollout.generation:
        return [(trainer.chips, rollout.chips)]
    total = trainer.chips + rollout.chips
    out, t = [], 1
    while t < total:
        r = total - t
        if r >= per_instance and (trainer.kind == "gpu" or r & (r - 1) == 0):
            out.append((t, r - r % per_instance))
        t *= 2
    return out or [(trainer.chips, rollout.chips)]


def scaled_trainer(part: Part, chips: int) -> Part:
    """The trainer's plan on another chip count: FSDP splits params, moments, the batch and
    its activations evenly, so each piece scales as 1 / chips (the compiled point's)."""
    ratio = part.accelerator.chips / chips
    pieces = {k: v * ratio for k, v in part.pieces.items()}
    return Part(part.accelerator.with_chips(chips), part.hbm_bytes_per_device * ratio, pieces)


# A larger η never lowers StaleFlow's throughput in the simulator, but each step of lag
# costs learning (docs/results.md): the recommendation takes the least η within this share
# of the best throughput found.
ETA_TOLERANCE = 0.05


def recommend(c, model, trainer: Part, rollout: Part, etas, response_median: float) -> dict:
    """The simulator over splits and η: the split with StaleFlow's best throughput, at the
    least η within ETA_TOLERANCE of it, and its ratio to synchronous training there."""
    per_instance = c.mesh.devices_per_instance
    best, tried = None, []
    for t_chips, r_chips in splits(trainer.accelerator, rollout.accelerator, per_instance):
        if scaled_trainer(trainer, t_chips).hbm_bytes_per_device > trainer.capacity:
            continue
        instances = r_chips // per_instance
        predicted = predictions(c, model, rollout, trainer.accelerator.with_chips(t_chips))
        profile = profile_for(c, model, predicted, rollout, t_chips, instances)
        sync = simulate(c, profile, instances, t_chips, 0, "sync", response_median)
        for eta in etas:
            stale = simulate(c, profile, instances, t_chips, eta, "staleflow", response_median)
            row = {"trainer_chips": t_chips, "rollout_chips": r_chips, "eta": eta,
                   "staleflow_tok_s": stale.throughput_tok_s, "sync_tok_s": sync.throughput_tok_s,
                   "predicted_staleflow_vs_sync": stale.throughput_tok_s / sync.throughput_tok_s}
            tried.append(row)
    if not tried:
        raise DoesNotFit("no split of the chips fits the trainer; add trainer chips")
    top = max(row["staleflow_tok_s"] for row in tried)
    good = [row for row in tried if row["staleflow_tok_s"] >= (1 - ETA_TOLERANCE) * top]
    best = min(good, key=lambda row: (row["eta"], -row["staleflow_tok_s"]))
    return {**best, "tried": tried}


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB"


def plan(c, trainer_name: str, rollout_name: str, eta: int | None = None,
         response_median: float = 0.0) -> dict:
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
        if eta is not None:
            c.staleness.eta = eta
        return plan_host(c)
    if eta is not None:
        c.staleness.eta = eta
    # The run's meshes on the planned chips: the trainer on all of its side, the instances
    # filling the other.
    c.mesh.colocate = False
    c.mesh.trainer_devices = trainer_acc.chips
    c.mesh.rollout_instances = max(rollout_acc.chips // c.mesh.devices_per_instance, 1)
    config_lib.validate(c, device_count=trainer_acc.chips + rollout_acc.chips,
                        local_files=False)
    model, source = model_of(c)
    started = time.perf_counter()
    print(f"model: {source}, {param_count(model) / 1e9:.2f}B parameters, {model.param_dtype}")
    print(f"trainer: {trainer_acc.name} = {trainer_acc.chips} x {trainer_acc.chip.name}; "
          f"rollout: {rollout_acc.name} = {rollout_acc.chips} x {rollout_acc.chip.name}"
          + ("" if trainer_acc.kind == "tpu" and rollout_acc.kind == "tpu" else
             "; GPU parts compiled for this host's CPU (XLA:GPU is not here), sized on the "
             "datasheet"), flush=True)
    trainer, t_info = trainer_part(c, model, trainer_acc)
    print(f"  train step compiled in {t_info['compile_s']:.0f} s" if t_info["compile_s"] else
          "  train step: the TPU compiler refused it for want of HBM", flush=True)
    check_fits(trainer, None, c)
    rollout, r_info = rollout_part(c, model, rollout_acc)
    print(f"  prefill and decode compiled in {r_info['compile_s']:.0f} s", flush=True)
    check_fits(trainer, rollout, c)

    engine = r_info["engine"]
    mean_len = c.rollout.prompt_bucket / 2 + (response_median or c.rollout.max_new_tokens / 8)
    page = rollout.pieces["page_size"]
    per_sequence = math.ceil(mean_len / page) if engine.page_size is not None else 1
    concurrent = min(c.rollout.num_slots, rollout.pieces["kv_pages"] // per_sequence)
    predicted = predictions(c, model, rollout, trainer_acc)
    decode_s = (DECODE_OVERHEAD_S + predicted["decode_weights_s"]
                + concurrent * mean_len * predicted["decode_kv_s_per_token"])
    median = response_median or c.rollout.max_new_tokens / 8
    etas = sorted({1, 2, 4, c.staleness.eta} - {0})
    recommended = recommend(c, model, trainer, rollout, etas, median)

    print(f"\n{'part':<9}{'HBM / chip':>12}{'capacity':>12}  pieces")
    for side, part in (("trainer", trainer), ("rollout", rollout)):
        pieces = ", ".join(f"{k.removesuffix('_bytes')} {_gb(v)}" for k, v in part.pieces.items()
                           if k.endswith("_bytes"))
        print(f"{side:<9}{_gb(part.hbm_bytes_per_device):>12}{_gb(part.capacity):>12}  {pieces}")
    print(f"KV: {rollout.pieces['kv_pages']} pages of {page} positions per instance; "
          f"{concurrent} sequences at a mean of {mean_len:.0f} positions")
    print(f"\npredicted (rooflines: {trainer_acc.chip.name} "
          f"{trainer_acc.chip.bf16_flops_per_s / 1e12:.0f} TFLOP/s, {rollout_acc.chip.name} "
          f"{rollout_acc.chip.hbm_bytes_per_s / 1e12:.2f} TB/s and "
          f"{rollout_acc.chip.bf16_flops_per_s / 1e12:.0f} TFLOP/s; weight sync at "
          f"{predicted['sync_bandwidth'] / 1e9:.1f} GB/s + {SYNC_OVERHEAD_S:.0f} s; "
          f"{STEP_OVERHEAD_S} s per train step and {DECODE_OVERHEAD_S * 1e3:.0f} ms per decode "
          f"dispatch of host overhead; responses lognormal, median {median:.0f}, sigma 1)")
    print(f"  train step {predicted['train_step_s']:.2f} s ({predicted['train_flops'] / 1e12:,.0f} "
          f"TFLOP), decode step {decode_s * 1e3:.1f} ms, prefill "
          f"{predicted['prefill_s_per_token'] * 1e6:.2f} us/token, weight sync "
          f"{predicted['weight_sync_s']:.1f} s")
    print(f"\nsimulated splits (trainer chips + rollout chips, eta: StaleFlow / sync tok/s; "
          f"recommended: the least eta within {ETA_TOLERANCE:.0%} of the best)")
    for row in recommended["tried"]:
        print(f"  {row['trainer_chips']:>3} + {row['rollout_chips']:<3} eta {row['eta']}: "
              f"{row['staleflow_tok_s']:,.0f} / {row['sync_tok_s']:,.0f} = "
              f"{row['predicted_staleflow_vs_sync']:.2f}")
    print(f"planned in {time.perf_counter() - started:.0f} s")
    return {
        "fits": True,
        "trainer": {"hbm_bytes_per_device": trainer.hbm_bytes_per_device,
                    "hbm_capacity_bytes": trainer.capacity,
                    **{k: trainer.pieces[k] for k in ("params_bytes", "optimizer_bytes",
                                                      "activation_bytes")}},
        "rollout": {"hbm_bytes_per_device": rollout.hbm_bytes_per_device,
                    "hbm_capacity_bytes": rollout.capacity,
                    "kv_pages": rollout.pieces["kv_pages"],
                    "max_concurrent_sequences": concurrent},
        "predicted": {"train_step_s": predicted["train_step_s"], "decode_step_s": decode_s,
                      "prefill_s_per_token": predicted["prefill_s_per_token"],
                      "weight_sync_s": predicted["weight_sync_s"]},
        "recommended": {k: recommended[k] for k in ("trainer_chips", "rollout_chips", "eta",
                                                     "predicted_staleflow_vs_sync")},
    }


def main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    result = plan(_CONFIG.value, _TRAINER.value, _ROLLOUT.value, _ETA.value,
                  _RESPONSE_MEDIAN.value)
    print(json.dumps(result))

