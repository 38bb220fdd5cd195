"""Each side's memory plan and compiled costs: the run's own programs compiled for the target
chips (asyncrl/plan/tpu_compile.py), XLA's memory analysis the HBM plan, its cost analysis
(loops counted, asyncrl/plan/hlo_cost.py) what each program computes and moves; and the
checks that say which part does not fit and what to change.

  trainer   the train step on all the trainer's chips (FSDP), and the cast of the float32
            master weights to the weights rollout receives;
  rollout   one instance's engine: its decode dispatch and its prefill chunk;
  host      a local CPU run: every device's memory is the host's, one figure.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import subprocess
import sys
import time

from asyncrl.errors import UserError
from asyncrl.plan import accelerators
from asyncrl.plan.hbm import DoesNotFit, param_count


@dataclasses.dataclass
class Part:
    """One side's memory plan on one chip, and what its compiled programs cost per chip."""

    accelerator: accelerators.Accelerator
    hbm_bytes_per_device: float
    pieces: dict[str, float]  # what the bytes are made of, by name
    # Program name -> per chip per call: flops, bytes_accessed, vmem_bytes (loops counted).
    costs: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    layout: StepLayout | None = None  # the trainer's: the rows its step was compiled for

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


def _cost(analysed: dict, per: float = 1.0) -> dict[str, float]:
    """A compiled program's cost per call, `per` calls in one program."""
    return {key: analysed[key] / per for key in ("flops", "bytes_accessed", "vmem_bytes")}


def _stand_in_cost(analysed: dict, model, float32, per: float = 1.0) -> dict[str, float]:
    """A GPU program's cost from its stand-in compiled for this host's CPU. XLA:CPU computes
    bf16 in float32, converting operands around every op, which a GPU does not: a bf16
    model's bytes are counted on the same program compiled in float32 (`float32()` compiles
    it), at the model's width (bytes_low) and at float32's (bytes_accessed); a fused
    scatter counts the update it writes in place. The FLOPs are the program's own."""
    import jax.numpy as jnp

    wide = analysed if model.param_dtype == "float32" else float32()
    narrow = jnp.dtype(model.param_dtype).itemsize / 4
    return {"flops": analysed["flops"] / per, "bytes_accessed": wide["moved_bytes"] / per,
            "bytes_low": wide["moved_bytes"] * narrow / per, "vmem_bytes": 0.0}


# The planner's length model, what its simulator draws too (asyncrl/sim/workload.py): prompts
# lognormal about half the bucket, responses lognormal about max_new_tokens / 8 (sigma 1, the
# long tail of reasoning traces), each capped. One step's trajectories are drawn from it with
# LENGTHS_SEED, so a plan is the same every time it is made.
LENGTHS_SEED = 0


def length_model(spec, response_median: float = 0.0) -> tuple[dict, dict]:
    """(prompt, response) length distributions as asyncrl/sim/workload.py names them;
    `response_median` 0: rollout.max_new_tokens / 8."""
    rollout = spec.rollout
    return ({"name": "lognormal", "median": rollout.prompt_bucket / 2, "sigma": 0.3,
             "cap": rollout.prompt_bucket},
            {"name": "lognormal", "median": response_median or rollout.max_new_tokens / 8,
             "sigma": 1.0, "cap": rollout.max_new_tokens})


def trajectory_lengths(spec, response_median: float = 0.0, seed: int = LENGTHS_SEED):
    """One step's trajectories' lengths (prompt + response), drawn from the length model: a
    prompt per entry, shared by its group's responses. `seed`: another draw (the plan's is
    LENGTHS_SEED)."""
    import numpy as np

    from asyncrl.sim.workload import build_lengths

    prompts, responses = (build_lengths(d) for d in length_model(spec, response_median))
    rng = np.random.default_rng(seed)
    entries, group = spec.train.batch_size, spec.rollout.group_size
    return (np.repeat(prompts.sample(rng, entries), group)
            + responses.sample(rng, entries * group))


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """The rows one train step computes: `rows` of `width` tokens in `num_microbatches`
    micro-batches, `useful` of those tokens trajectories' (the rest padding), each layer
    keeping what `remat` says for the backward pass."""

    rows: int
    width: int
    num_microbatches: int
    useful: int
    packed: bool
    remat: str

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.useful / (self.rows * self.width)

    def rows_per_chip(self, chips: int) -> int:
        """Of one micro-batch: what each chip computes at once."""
        return self.rows // (chips * self.num_microbatches)

    def text(self, chips: int) -> str:
        kind = "packed rows" if self.packed else "rows, a trajectory each,"
        return (f"{self.rows} {kind} of {self.width:,} tokens "
                f"({self.padding_fraction:.0%} padding), train.num_microbatches = "
                f"{self.num_microbatches}: {self.rows_per_chip(chips)} row(s) per chip at once, "
                f"train.remat = '{self.remat}'")


def step_layout(spec, chips: int, num_microbatches: int,
                response_median: float = 0.0) -> StepLayout:
    """The step's rows as the trainer lays out one batch drawn from the length model: one
    trajectory per row padded to rollout.max_len in `num_microbatches`, or
    (train.tokens_per_row) packed first-fit decreasing, the row count bucketed as
    `Trainer.host_batch` does for `chips` devices, one row per chip per micro-batch."""
    from asyncrl.train.packing import bucket_rows, first_fit_decreasing

    lengths = trajectory_lengths(spec, response_median)
    useful, budget = int(lengths.sum()), spec.train.tokens_per_row
    if not budget:
        return StepLayout(len(lengths), spec.rollout.max_len, num_microbatches, useful, False,
                          spec.train.remat)
    packed = len(first_fit_decreasing(lengths, budget))
    rows = bucket_rows(packed, chips, len(lengths))
    return StepLayout(rows, budget, rows // chips, useful, True, spec.train.remat)


def microbatch_counts(spec, chips: int) -> list[int]:
    """The micro-batch counts to try, fewest first: the config's, then doublings of it, up to
    one row per chip at once (the least a step can hold without splitting a row), where
    rows split evenly or not at all: a chip's rows, when no further doubling divides them.
    Packed rows have one count, the batch's (one row per chip at once)."""
    if spec.train.tokens_per_row:
        return [spec.train.num_microbatches]
    most = spec.train.batch_size * spec.rollout.group_size // chips
    counts = [spec.train.num_microbatches]
    while counts[-1] < most:
        doubled = 2 * counts[-1]
        counts.append(doubled if doubled < most and most % doubled == 0 else most)
    return counts


def _train_step_program(spec, model, devices, layout: StepLayout):
    """The train step as the run jits it, on `devices`, for a batch laid out as `layout`:
    (trainer, state, batch), abstract."""
    import jax
    import jax.numpy as jnp

    from asyncrl.train.trainer import Trainer, TrainBatch, batch_shardings, trainer_mesh

    mesh = trainer_mesh(devices)
    group = spec.rollout.group_size
    config = spec.train_config()
    if not layout.packed:  # packed rows count their own micro-batches
        config = dataclasses.replace(config, num_microbatches=layout.num_microbatches)
    trainer = Trainer.create(config, model, mesh, group)
    rows, length = layout.rows, layout.width
    trajectories = spec.train.batch_size * group  # one per row unpacked
    sh = batch_shardings(mesh, group, packed=layout.packed)

    def arr(shape, dtype, sharding):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    packed = {} if not layout.packed else dict(
        segment_ids=arr((rows, length), jnp.int32, sh.segment_ids),
        trajectory=arr((rows, length), jnp.int32, sh.trajectory),
        padded_len=arr((), jnp.int32, sh.padded_len))
    batch = TrainBatch(
        arr((rows, length), jnp.int32, sh.tokens), arr((rows, length), jnp.int32, sh.positions),
        arr((rows, length), jnp.float32, sh.loss_mask),
        arr((rows, length), jnp.float32, sh.behaviour_logp),
        arr((rows, length), jnp.int32, sh.token_versions),
        arr((trajectories,), jnp.float32, sh.rewards),
        arr((trajectories,), jnp.int32, sh.v_traj), arr((), jnp.int32, sh.buffer_version),
        group_size=group, **packed)
    return trainer, trainer.abstract_state(), batch


def train_step_part(spec, model, accelerator, layout: StepLayout,
                    devices=None) -> tuple[Part, dict | None]:
    """The train step for `layout` compiled on the trainer's chips (FSDP): its Part (on a
    TPU with its costs) and the step's analysis, None where the TPU compiler refused it for
    want of HBM (the Part's activations are then the temporaries it asked for)."""
    devices = devices or _devices(accelerator, accelerator.chips)
    trainer, state, batch = _train_step_program(spec, model, devices, layout)
    chips = accelerator.chips
    pieces = {"params_bytes": _nbytes(state.params) / chips,
              "optimizer_bytes": _nbytes(state.opt_state) / chips,
              "batch_bytes": _nbytes(batch) / chips,
              # The policy copy rollout receives exists beside the state while it is pushed.
              "policy_copy_bytes": _nbytes(state.params) / 2 / chips
              if model.param_dtype != "float32" else 0.0}
    step = _compiled(trainer.step, (state, batch), devices, (0,))
    if not isinstance(step, dict):  # the TPU compiler found it cannot fit
        pieces["activation_bytes"] = step
        return Part(accelerator, sum(pieces.values()), pieces, layout=layout), None
    pieces["activation_bytes"] = step["temp_bytes"]
    # The first half of the trainer-to-rollout reshard: the policy copy cast on the trainer's
    # shards (the second half crosses to the rollout's chips over the network).
    cast = (_compiled(trainer.to_policy, (state.params,), devices)
            if model.param_dtype != "float32" else None)  # float32: the master is the policy
    if isinstance(cast, dict):
        pieces["policy_copy_bytes"] = cast["output_bytes"]
    total = step["device_bytes"] + pieces["policy_copy_bytes"]
    costs = {}  # a GPU's need its float32 stand-in (trainer_part); a CPU run's none
    if accelerator.kind == "tpu":
        costs["train_step"] = _with_attention_kernel(_cost(step), spec, model, chips, layout)
    return Part(accelerator, total, pieces, costs, layout), step


# Remat policies from the most a layer keeps to the least (asyncrl/model/remat.py).
REMAT_BY_MEMORY = ("none", "dots", "full")


def remat_choices(spec) -> list[str]:
    """The config's remat policy, then each that keeps less, down to 'full' (one layer's
    inputs): what the planner tries when a step does not fit. A policy registered by a
    plugin is not ranked: it is tried, then 'full'."""
    remat = spec.train.remat
    if remat not in REMAT_BY_MEMORY:
        return [remat, "full"]
    return list(REMAT_BY_MEMORY[REMAT_BY_MEMORY.index(remat):])


def trainer_part(spec, model, accelerator, response_median: float = 0.0) -> tuple[Part, dict]:
    """The train step compiled on all the trainer's chips (FSDP), and its memory analysis.

    At the config's remat and micro-batch count first; on an accelerator where that does not
    fit, at more micro-batches (`microbatch_counts`, up to one row per chip at once), then
    the same at each remat that keeps less (`remat_choices`): the first that fits is the
    plan (its layout says which), else the one that needed the least is what check_fits
    reports (more micro-batches need not need less: past one, the step also holds a
    float32 gradient accumulator). info: compile_s; refused: the TPU compiler refused the
    one reported; tried: (remat, micro-batches, bytes per chip, refused) of each compile."""
    devices = _devices(accelerator, accelerator.chips)
    chips = accelerator.chips
    start, tried, best = time.perf_counter(), [], None
    # A host has no HBM to fit: its step is the config's.
    remats = [spec.train.remat] if accelerator.kind == "cpu" else remat_choices(spec)
    for remat in remats:
        planned = dataclasses.replace(spec, train=dataclasses.replace(spec.train, remat=remat))
        counts = ([spec.train.num_microbatches] if accelerator.kind == "cpu" else
                  microbatch_counts(planned, chips))
        for m in counts:
            layout = step_layout(planned, chips, m, response_median)
            part, step = train_step_part(planned, model, accelerator, layout, devices)
            tried.append((remat, layout.num_microbatches, part.hbm_bytes_per_device,
                          step is None))
            if best is None or part.hbm_bytes_per_device < best[0].hbm_bytes_per_device:
                best = part, step
            if part.hbm_bytes_per_device <= part.capacity:
                break
        if best[0].hbm_bytes_per_device <= best[0].capacity:
            break
    part, step = best
    layout = part.layout
    if step is not None and accelerator.kind == "gpu":
        planned = dataclasses.replace(spec, train=dataclasses.replace(spec.train,
                                                                      remat=layout.remat))

        def float32():
            wide = _train_step_program(planned, model.replace(param_dtype="float32"), devices,
                                       layout)
            return _compiled(wide[0].step, wide[1:], devices, (0,))
        part.costs["train_step"] = _stand_in_cost(step, model, float32)
    return part, {"compile_s": time.perf_counter() - start, "refused": step is None,
                  "tried": tried}


def _with_attention_kernel(cost: dict[str, float], spec, model, chips: int,
                           layout: StepLayout) -> dict[str, float]:
    """A TPU train step's cost with its splash attention added (`auto` and `splash` run the
    Pallas kernel there, which XLA credits with nothing): every layer, the step's rows (every
    micro-batch's) split over the trainer's chips, the forward twice under full remat."""
    import jax.numpy as jnp

    from asyncrl.plan.kernel_cost import splash_attention

    if spec.train.attention not in ("auto", "splash"):
        return cost
    kernel = splash_attention(
        rows=layout.rows / chips, length=layout.width, num_q_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads, head_dim=model.head_dim,
        itemsize=jnp.dtype(model.param_dtype).itemsize,
        # A Pallas call's output is never saved for the backward pass: any remat policy runs
        # the kernel's forward again there.
        forward_passes=1 if layout.remat == "none" else 2) * model.num_layers
    return {**cost, "flops": cost["flops"] + kernel.flops,
            "bytes_accessed": cost["bytes_accessed"] + kernel.bytes_accessed}


def _compiled(fn, args, devices, donate_argnums=()):
    """XLA's analysis of fn compiled for `devices`; a float, the temporaries it needed, when
    the TPU compiler refuses for want of HBM (it says so rather than compiling)."""
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


def _engine_programs(spec, model, devices, gpu_stand_in: bool = False) -> tuple:
    """An instance's engine and its decode dispatch and prefill chunk as the run jits them:
    (engine, (decode, args), (prefill, args)), abstract. Its own options: "auto" attention
    resolves when traced for the target (compile_for sets its device), to the TPU kernel or
    the gather as the run would. `gpu_stand_in`: the decode of a GPU instance whose pages the
    GPU kernel reads, compiled for this CPU: the gather reads one page-table column, and the
    kernel is counted from its plan instead (asyncrl/plan/kernel_cost.py)."""
    import jax
    import jax.numpy as jnp

    from asyncrl.model import abstract_params
    from asyncrl.rollout.engine import Engine, _generate, _prefill_chunk

    graphdef, params = abstract_params(model)
    max_len = spec.rollout.prompt_bucket + spec.rollout.max_new_tokens
    kv = spec.rollout.kv_options()
    sampling = spec.rollout.sampling()
    engine = Engine(graphdef, model, num_slots=spec.rollout.num_slots, max_len=max_len,
                    prompt_buckets=(spec.rollout.prompt_bucket,), sampling=sampling,
                    **kv.engine_kwargs())
    state = jax.eval_shape(engine._empty_state)
    width = 1 if gpu_stand_in else engine.pages_per_row
    table = (None if engine.page_size is None else
             jax.ShapeDtypeStruct((engine.num_slots, width), jnp.int32))
    decode = functools.partial(  # the engine's own dispatch, as it jits it
        _generate, graphdef, steps=engine.decode_steps,
        attention="gather" if gpu_stand_in else kv.attention, seed=0,
        sampling=sampling, stop_tokens=engine.stop_tokens, max_len=max_len)
    row = jax.eval_shape(engine._new_row)
    tokens = jax.ShapeDtypeStruct((1, spec.rollout.prompt_bucket), jnp.int32)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    return (engine, (decode, (params, state, table)),
            (functools.partial(_prefill_chunk, graphdef), (params, row, tokens, scalar, scalar)))


def rollout_part(spec, model, accelerator) -> tuple[Part, dict]:
    """One instance's engine (devices_per_instance chips, weights replicated as the run
    places them): the prefill chunk and the decode dispatch compiled, the larger peak kept.
    Costs: one decode step (the dispatch's over its steps) and one prefill chunk."""
    import jax

    from asyncrl.model.paged import resolve_backend

    per_instance = spec.mesh.devices_per_instance
    if accelerator.chips % per_instance:
        raise UserError(f"the rollout's {accelerator.chips} chips do not split into instances "
                        f"of mesh.devices_per_instance = {per_instance}")
    devices = _devices(accelerator, per_instance)
    # The paged decode kernel the instance calls, if any: what "auto" resolves to for the
    # compile below (a GPU's stand-in is this CPU: resolved for a GPU instead).
    kernel = None
    if spec.rollout.kv_options().page_size is not None:
        with jax.default_device(devices[0]):
            backend = resolve_backend(spec.rollout.attention, model.head_dim,
                                      "gpu" if accelerator.kind == "gpu" else None)
        kernel = backend if backend != "gather" else None
    stand_in = kernel == "gpu_paged"
    engine, (decode, decode_args), (prefill, prefill_args) = _engine_programs(
        spec, model, devices, stand_in)
    params, state = decode_args[:2]
    pages = engine.num_pages if engine.page_size is not None else engine.num_slots
    pieces = {"params_bytes": _nbytes(params), "kv_bytes": _nbytes(state.cache),
              "kv_pages": pages, "page_size": engine.page_size or engine.max_len}
    info = {"engine": engine, "kernel": kernel}
    start = time.perf_counter()
    decoded = _compiled(decode, decode_args, devices, (1,))
    prefilled = _compiled(prefill, prefill_args, devices, (1,))
    if not isinstance(decoded, dict) or not isinstance(prefilled, dict):
        info["compile_s"] = time.perf_counter() - start
        refused = [x for x in (decoded, prefilled) if not isinstance(x, dict)]
        pieces["temp_bytes"] = max(refused)
        total = pieces["params_bytes"] + pieces["kv_bytes"] + pieces["temp_bytes"]
        return Part(accelerator, total, pieces), info
    pieces["temp_bytes"] = max(decoded["temp_bytes"], prefilled["temp_bytes"])
    total = max(decoded["device_bytes"], prefilled["device_bytes"] + pieces["kv_bytes"])
    steps = engine.decode_steps
    costs = {}  # a CPU run's: no datasheet, no times predicted
    if accelerator.kind == "tpu":
        costs = {"decode_step": _cost(decoded, per=steps), "prefill_chunk": _cost(prefilled)}
    elif accelerator.kind == "gpu":
        wide = functools.cache(lambda: _engine_programs(
            spec, model.replace(param_dtype="float32"), devices, stand_in))
        costs = {"decode_step": _stand_in_cost(
                     decoded, model, lambda: _compiled(wide()[1][0], wide()[1][1], devices,
                                                       (1,)), per=steps),
                 "prefill_chunk": _stand_in_cost(
                     prefilled, model, lambda: _compiled(wide()[2][0], wide()[2][1], devices,
                                                         (1,)))}
    info["compile_s"] = time.perf_counter() - start
    return Part(accelerator, total, pieces, costs), info


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


def host_part(spec, model, trainer: Part, rollout: Part, runtime_bytes: float) -> Part:
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
    rollout_spec, evaluation = spec.rollout, spec.eval
    per_instance = (rollout.pieces["kv_bytes"] + rollout.pieces["temp_bytes"]) \
        * spec.mesh.devices_per_instance
    eval_positions = rollout_spec.num_slots * (rollout_spec.prompt_bucket
                                               + evaluation.max_new_tokens)
    if evaluation.samples:  # the sampled engine's slots, beside the greedy one's
        eval_positions += (max(rollout_spec.num_slots, evaluation.samples)
                           * (rollout_spec.prompt_bucket + evaluation.max_new_tokens))
    pieces = {"runtime_bytes": runtime_bytes,
              "trainer_bytes": trainer.hbm_bytes_per_device * trainer.accelerator.chips,
              "weight_versions_bytes": HOST_WEIGHT_VERSIONS * weights,
              "instances_bytes": spec.mesh.rollout_instances * per_instance,
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


def check_fits(trainer: Part | None, rollout: Part | None, spec, holds=None) -> None:
    """Raises DoesNotFit naming the part over a chip's HBM, by how much, and what to change.
    holds(accelerator) -> bool, where given, compiles the train step on a bigger slice: the
    trainer's smallest slice is then found by compiling doublings, not by scaling."""
    for side, part in (("trainer", trainer), ("rollout", rollout)):
        if part is None or part.hbm_bytes_per_device <= part.capacity:
            continue
        over = part.hbm_bytes_per_device - part.capacity
        head = (f"the {side} does not fit: {part.hbm_bytes_per_device / 1e9:.1f} GB per "
                f"{part.accelerator.chip.name} chip ({part.accelerator.name}) against its "
                f"{part.capacity / 1e9:.1f} GB of HBM, {over / 1e9:.1f} GB over")
        if side == "trainer":
            _trainer_does_not_fit(part, head, spec, holds)
        _rollout_does_not_fit(part, head, spec.rollout)


def _trainer_does_not_fit(part: Part, head: str, spec, holds=None) -> None:
    p = part.pieces
    state = p["params_bytes"] + p["optimizer_bytes"] + p["policy_copy_bytes"]
    if state >= part.capacity:
        # FSDP splits the float32 master weights and Adam's moments over the chips.
        chips = math.ceil(state * part.accelerator.chips / (0.8 * part.capacity))
        raise DoesNotFit(
            f"{head}: parameters and optimizer state alone are {state / 1e9:.1f} GB "
            f"per chip (float32 master weights {p['params_bytes'] / 1e9:.1f} GB, Adam "
            f"moments {p['optimizer_bytes'] / 1e9:.1f} GB); FSDP splits them: use at "
            f"least {chips} trainer chips")
    raise DoesNotFit(_rows_do_not_fit(part, head, spec, holds))


# The most doublings of the trainer's slice compiled in search of one that holds a row.
ROW_SLICE_DOUBLINGS = 4


def _rows_do_not_fit(part: Part, head: str, spec, holds=None) -> str:
    """The message when no micro-batch count up to one row per chip fits (`part`: the one
    that needed the least, from trainer_part). A row must hold the longest trajectory, and
    more chips split the parameters, the optimizer state and the float32 gradient
    (params-shaped, among the temporaries), never a row's activations. The smallest slice
    that holds it is found by compiling doublings of the slice (`holds`)."""
    p, layout, accelerator = part.pieces, part.layout, part.accelerator
    split = p["params_bytes"] * 2 + p["optimizer_bytes"] + p["policy_copy_bytes"]
    rest = max(part.hbm_bytes_per_device - split, 0.0)
    rows = layout.rows_per_chip(accelerator.chips)
    shorter = ("" if layout.width <= spec.rollout.max_len else
               f", lower train.tokens_per_row to {spec.rollout.max_len:,}")
    tried = (f"packed rows, one per chip at once ({layout.num_microbatches} micro-batches), "
             f"remat '{layout.remat}'" if layout.packed else
             f"of the micro-batch counts up to one row per chip at once, the least is "
             f"train.num_microbatches = {layout.num_microbatches} ({rows} "
             f"row{'s' * (rows > 1)} of {layout.width:,} tokens per chip at once, remat "
             f"'{layout.remat}')")
    text = (f"{head}: {tried}: "
            f"{rest / 1e9:.1f} GB of activations and temporaries beside {split / 1e9:.1f} GB of "
            f"parameters, optimizer state and gradients; a row must hold the longest "
            f"trajectory, rollout.prompt_bucket + rollout.max_new_tokens = "
            f"{spec.rollout.max_len:,} tokens, and FSDP splits the state, not a row")
    remat = ("" if layout.remat == "full" else
             f"set train.remat='full' (now '{layout.remat}'), or ")
    if holds is not None:
        # A refused compile's figures are what the compiler asked for, not a plan, and the
        # layout changes with the chips (fewer micro-batches): compile, do not scale.
        for doubling in range(1, ROW_SLICE_DOUBLINGS + 1):
            bigger = accelerator.with_chips(accelerator.chips << doubling)
            if holds(bigger):
                return (f"{text}: {remat}compiled there, the smallest trainer slice that "
                        f"holds it is {bigger.name} ({bigger.chips} chips){shorter}")
        return (f"{text}: {remat}no {accelerator.chip.name} slice up to {bigger.name} holds "
                f"it (compiled): shorten rollout.max_new_tokens{shorter} or use a chip with "
                f"more HBM")
    return (f"{text}: {remat}use more trainer chips{shorter} (how many is not searched: "
            f"the planner compiles bigger slices only for the placement asked for)")


def _rollout_does_not_fit(part: Part, head: str, rollout) -> None:
    p = part.pieces
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
            + ("" if rollout.page_size else " with rollout.page_size = 16")
            + " or use fewer rollout.num_slots")
    raise DoesNotFit(f"{head}: the decode and prefill temporaries are "
                     f"{p['temp_bytes'] / 1e9:.1f} GB; use fewer rollout.num_slots (now "
                     f"{rollout.num_slots})")


def policy_bytes(model) -> float:
    """The weights rollout receives: every parameter in the model's dtype."""
    import jax.numpy as jnp

    return param_count(model) * jnp.dtype(model.param_dtype).itemsize


def scaled_trainer(part: Part, chips: int) -> Part:
    """The trainer's plan on another chip count: FSDP splits params, moments, the batch and
    its activations evenly, so each piece scales as 1 / chips (the compiled point's), and so
    does the step's work per chip (the gathered weights each chip reads do not shrink: its
    bytes are understated at more chips, overstated at fewer)."""
    ratio = part.accelerator.chips / chips
    pieces = {k: v * ratio for k, v in part.pieces.items()}
    costs = {name: {k: v * ratio for k, v in cost.items()} for name, cost in part.costs.items()}
    return Part(part.accelerator.with_chips(chips), part.hbm_bytes_per_device * ratio, pieces,
                costs, part.layout)
