"""Compile for a Cloud TPU topology on a host without one, and read what XLA reports.

libtpu compiles for chips it cannot see: `jax.experimental.topologies` describes a topology's
chips as compile-only devices, and a jit lowered with shardings on them goes through the real
TPU compiler (its layouts, fusions and memory-space assignment). So a CPU-only machine can ask
what a program would need on a TPU (`memory_analysis`) and what XLA estimates it costs
(`cost_analysis`), though nothing can run.

How far XLA's cost figures can be taken at their word (libtpu 0.0.42.1, JAX 0.10.2):
  - A while loop's body is counted once, whatever its trip count: a model whose layers run
    under `jax.lax.scan` reads as one layer. `analysis` adds what the loops' further
    iterations cost (asyncrl/plan/hlo_cost.py).
  - A Pallas kernel (a `tpu_custom_call`) counts no flops and no bytes when it declares no
    `pl.CostEstimate`; `custom_call_bytes` measures what a given kernel is credited with,
    and asyncrl/plan/kernel_cost.py counts what it moves.
  - 'bytes accessed' adds up each top-level op's operands and outputs in every memory space:
    a buffer the compiler stages through VMEM (a layout ending in S(1) in
    `compiled.as_text()`) counts again at each hop, so it overstates HBM traffic, by an
    amount that shifts with the compiler's staging choices; `analysis` estimates it
    (vmem_bytes).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from asyncrl.host_devices import quiet_libtpu_without_tpu
from asyncrl.plan.hlo_cost import Program

# Chips one host of each generation holds, as (x, y, z). A topology no larger than this fits
# one host; libtpu's default (2x2x1) would reject 1x1 and split 2x4 across two hosts.
_HOST_BOUNDS = {"v4": (2, 2, 1), "v5p": (2, 2, 1), "v5e": (2, 4, 1), "v6e": (2, 4, 1)}
_DEFAULT_HOST_BOUNDS = (2, 2, 1)
_TOPOLOGY_NAME = re.compile(r"(v\d+[a-z]*):(\d+)x(\d+)(?:x(\d+))?")


@functools.lru_cache(maxsize=None)
def topology_devices(name: str) -> tuple[jax.Device, ...]:
    """The compile-only devices of a TPU topology such as "v5e:1x1", "v5e:2x2", "v5p:2x2x1".

    The host bounds are chosen so that a topology that fits one host is one host (libtpu's
    default would refuse "v5e:1x1"); a larger one is split into hosts of the generation's size.
    Cached: libtpu hands out new device objects on every call, and a mesh must not mix them.
    """
    match = _TOPOLOGY_NAME.fullmatch(name.strip())
    if match is None:
        raise ValueError(f"TPU topology must look like 'v5e:2x2' or 'v5p:2x2x1' "
                         f"(generation:XxY[xZ]), got {name!r}")
    generation = match.group(1)
    dims = tuple(int(d) for d in match.groups("1")[1:])
    if min(dims) < 1:
        raise ValueError(f"TPU topology {name!r} has a zero dimension")
    host = _HOST_BOUNDS.get(generation, _DEFAULT_HOST_BOUNDS)
    bounds = tuple(min(d, h) for d, h in zip(dims, host))
    # libtpu, started on a host with no TPU, logs a page of warnings; the topology is given.
    quiet_libtpu_without_tpu()
    # libtpu locks /tmp/libtpu_lockfile so two processes cannot drive one TPU; compiling
    # drives none, and parallel test workers or plans must not refuse each other.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies
        topology = topologies.get_topology_desc(platform="tpu", topology_name=name.strip(),
                                                chips_per_host_bounds=bounds)
    except Exception as error:  # libtpu missing, unknown generation, indivisible shape
        raise ValueError(f"cannot describe TPU topology {name!r} (chips per host {bounds}): "
                         f"{error}") from error
    return tuple(topology.devices)


def replicated(devices: Sequence[jax.Device]) -> NamedSharding:
    """Every argument whole on every device: the default `compile_for` gives an argument."""
    return NamedSharding(Mesh(np.asarray(devices), ("devices",)), PartitionSpec())


def _abstract(leaf, sharding):
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
        return leaf
    placed = getattr(leaf, "sharding", None)
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                sharding=sharding if placed is None else placed)


def compile_for(fn: Callable, args: Sequence[Any], devices: Sequence[jax.Device],
                donate_argnums: int | Sequence[int] = ()) -> jax.stages.Compiled:
    """Compiles fn(*args) for `devices` (from `topology_devices`) without running it.

    args: pytrees of arrays or ShapeDtypeStructs; a leaf without a sharding is replicated over
    `devices`. Bind static arguments with functools.partial.

    Two things make this more than jit(fn).lower(*args).compile():
      - the compile runs under `jax.default_device(devices[0])`: Pallas' Mosaic lowering and
        the model's trace-time choices (`asyncrl.model.attention.target_platform`) read the default
        device to learn what they compile for, and it is otherwise this host's CPU;
      - fn is traced afresh on every call: jit's trace cache is keyed on the function, not on
        trace-time switches such as `unrolled_layers` or the default device, so a function
        traced before would come back with its old program.
    """
    sharding = replicated(devices)
    args = jax.tree.map(lambda leaf: _abstract(leaf, sharding), tuple(args))

    @functools.wraps(fn)
    def fresh(*fn_args):
        return fn(*fn_args)

    with jax.default_device(devices[0]):
        return jax.jit(fresh, donate_argnums=donate_argnums).lower(*args).compile()


def analysis(compiled: jax.stages.Compiled) -> dict[str, float]:
    """XLA's cost and memory analyses of one compiled program, per device, in one flat dict.

    flops, transcendentals, bytes_accessed: XLA's estimates with every loop run its trip
    count (XLA counts a loop's body once: what the further iterations add is counted by
    XLA's rules in asyncrl/plan/hlo_cost.py); xla_flops, xla_bytes_accessed: XLA's own;
    vmem_bytes: what the program's top-level ops write into VMEM, loops counted likewise;
    moved_bytes: the bytes by the same rules, loops counted, a fused scatter counted as the
    update it writes in place (XLA:CPU counts its whole operand and result).
    argument / output / alias / temp / generated_code bytes: the buffers the program needs;
    device_bytes = argument + output - alias + temp, what must fit in one device's memory
    while it runs (outputs aliased to donated arguments take no extra room).
    """
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
        cost = cost[0] if cost else {}
    text = compiled.as_text()
    program = Program(text)
    once, looped = program.cost(loops=False), program.cost(loops=True)
    xla = {"flops": float(cost.get("flops", 0.0)),
           "transcendentals": float(cost.get("transcendentals", 0.0)),
           "bytes_accessed": float(cost.get("bytes accessed", 0.0))}
    result = {**{key: value + getattr(looped, key) - getattr(once, key)
                 for key, value in xla.items()},
              "xla_flops": xla["flops"], "xla_bytes_accessed": xla["bytes_accessed"],
              "vmem_bytes": looped.vmem_bytes,
              "moved_bytes": Program(text, in_place=True).cost().bytes_accessed}
    memory = compiled.memory_analysis()
    if memory is not None:
        sizes = {name: int(getattr(memory, f"{name}_size_in_bytes"))
                 for name in ("argument", "output", "alias", "temp", "generated_code")}
        result.update({f"{name}_bytes": size for name, size in sizes.items()})
        result["device_bytes"] = (sizes["argument"] + sizes["output"] - sizes["alias"]
                                  + sizes["temp"])
    return result


def custom_call_bytes(call: Callable, args: Sequence[Any],
                      devices: Sequence[jax.Device]) -> float:
    """The bytes XLA's cost analysis credits to one call of `call(x, *rest)`, a kernel whose
    output has its first argument's shape and dtype.

    Measured rather than assumed: a program running the call twice in a row (the second on
    the first's output) less one running it once. The ops around the calls (layout copies at
    the program's edges) are the same in both and cancel. With libtpu 0.0.42.1 a Pallas
    kernel without a cost estimate comes out at 0; measuring keeps a correction built on this
    right if a later libtpu credits the kernel with, say, its operands' full size.
    """
    def chained(times):
        def run(x, *rest):
            for _ in range(times):
                x = call(x, *rest)
            return x
        return run

    once, twice = (analysis(compile_for(chained(n), args, devices))["xla_bytes_accessed"]
                   for n in (1, 2))
    return twice - once
