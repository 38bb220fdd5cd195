"""Accelerators a run can be planned for: Cloud TPU accelerator types and GPU counts.

    v5litepod-8, v5e-8   8 TPU v5e chips          v5p-16   8 TPU v5p chips (counted in cores)
    v6e-8                8 TPU v6e (Trillium)     v4-16    8 TPU v4 chips (counted in cores)
    8xH100, 1xH200       GPUs of one machine
    cpu                  this host's CPU, split into the run's devices (a local CPU run: the
                         trainer and the instances are one process, their "HBM" is its memory)

Slices one can rent (`rentable`), their hosts (`Accelerator.hosts`) and the runtime image each
generation's TPU VMs boot (`RUNTIME_VERSIONS`) are what the launch scripts build from a plan
(asyncrl/plan/launch_plan.py); a plan only recommends slices one can rent.

Per-chip figures are the vendors' datasheets (dense bf16, HBM capacity and bandwidth); they
are what a roofline prediction divides by, and the planner prints them with its figures.
"""

from __future__ import annotations

import dataclasses
import re

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    bf16_flops_per_s: float
    source: str


CHIPS = {
    "v4": Chip("TPU v4", 32 * GIB, 1.2e12, 275e12, "cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("TPU v5e", 16 * GIB, 8.19e11, 197e12, "cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", 95 * GIB, 2.765e12, 459e12, "cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e", 32 * GIB, 1.64e12, 918e12, "cloud.google.com/tpu/docs/v6e"),
    "H100": Chip("NVIDIA H100 SXM", 80e9, 3.35e12, 989e12, "NVIDIA H100 datasheet"),
    "H200": Chip("NVIDIA H200 SXM", 141e9, 4.8e12, 989e12, "NVIDIA H200 datasheet"),
    "A100": Chip("NVIDIA A100 SXM 80GB", 80e9, 2.039e12, 312e12, "NVIDIA A100 datasheet"),
}
# Accelerator-type prefixes that count TensorCores (two per chip), not chips.
_CORES_PER_CHIP = {"v4": 2, "v5p": 2}
# The TPU VM runtime image per generation (cloud.google.com/tpu/docs/runtimes): v4 boots the
# base Ubuntu image, v5e, v5p and v6e images of their own.
RUNTIME_VERSIONS = {"v4": "tpu-ubuntu2204-base", "v5e": "v2-alpha-tpuv5-lite",
                    "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}
# Chips on one host of a slice: v5e and v6e slices of up to 8 chips are one host, bigger ones
# hosts of 4; v4 and v5p hosts hold 4; a GPU VM 8.
_HOST_CHIPS = {"v4": 4, "v5p": 4, "v5e": 4, "v6e": 4}
_ONE_HOST_UP_TO = {"v5e": 8, "v6e": 8}
GPUS_PER_MACHINE = 8
_TPU = re.compile(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)")
_GPU = re.compile(r"(\d+)x(H100|H200|A100)")


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """`chips` of one kind; `topology` names them for `asyncrl.plan.tpu_compile` (TPU only)."""

    name: str
    kind: str  # "tpu" | "gpu"
    generation: str  # a CHIPS key
    chips: int

    @property
    def chip(self) -> Chip:
        return host_chip() if self.kind == "cpu" else CHIPS[self.generation]

    @property
    def topology(self) -> str:
        """The chips as a TPU topology: 2D for v5e / v6e, 3D for v4 / v5p, of this many chips."""
        if self.kind != "tpu":
            raise ValueError(f"{self.name} is not a TPU")
        return topology_of(self.generation, self.chips)

    @property
    def hosts(self) -> tuple[int, int]:
        """(hosts, chips per host) of a slice or of GPU machines of 8 (fewer: one machine)."""
        if self.kind == "gpu":
            per = min(self.chips, GPUS_PER_MACHINE)
        elif self.kind == "tpu":
            per = (self.chips if self.chips <= _ONE_HOST_UP_TO.get(self.generation, 0)
                   else min(self.chips, _HOST_CHIPS[self.generation]))
        else:
            per = self.chips
        return -(-self.chips // per), per

    def with_chips(self, chips: int) -> "Accelerator":
        """The same kind with another chip count (a split of a slice between two jobs)."""
        if self.kind == "gpu":
            return Accelerator(f"{chips}x{self.generation}", "gpu", self.generation, chips)
        if self.kind == "cpu":
            return Accelerator("cpu", "cpu", "cpu", chips)
        per = _CORES_PER_CHIP.get(self.generation, 1)
        return Accelerator(f"{self.generation}-{chips * per}", "tpu", self.generation, chips)


def parse(name: str) -> Accelerator:
    """'v5litepod-8', 'v5e-8', 'v5p-16', 'v6e-8', 'v4-16', '8xH100', '1xH200'."""
    text = name.strip()
    if text == "cpu":  # one host: its device count is the run's layout (asyncrl.plan)
        return Accelerator("cpu", "cpu", "cpu", 1)
    tpu, gpu = _TPU.fullmatch(text), _GPU.fullmatch(text)
    if tpu:
        generation = "v5e" if tpu.group(1) == "v5litepod" else tpu.group(1)
        count = int(tpu.group(2))
        per = _CORES_PER_CHIP.get(generation, 1)
        if count < per or count % per:
            raise ValueError(f"{name!r}: {generation} accelerator types count TensorCores, "
                             f"{per} per chip: expected a multiple of {per}")
        accelerator = Accelerator(text, "tpu", generation, count // per)
        topology_of(generation, accelerator.chips)  # a count no slice comes in fails here
        return accelerator
    if gpu:
        if int(gpu.group(1)) < 1:
            raise ValueError(f"{name!r}: expected at least one GPU")
        return Accelerator(text, "gpu", gpu.group(2), int(gpu.group(1)))
    raise ValueError(f"accelerator {name!r}: expected a Cloud TPU accelerator type "
                     f"(v5litepod-8 / v5e-8, v5p-16, v6e-8, v4-16), GPUs as NxTYPE (8xH100, "
                     f"1xH200, 4xA100), or cpu")


def rentable(accelerator: Accelerator) -> bool:
    """Whether Cloud TPU sells a slice of this size (v5e and v6e: 1, 4, 8 chips and powers of
    two from 16; v4 and v5p: 4 chips and powers of two above), or a GPU count fills whole
    machines of 8 (or is one machine's, up to 8). The compiler takes any power of two (a 2-chip
    v6e compiles), so `parse` accepts those for planning; a plan recommends only these."""
    chips = accelerator.chips
    if accelerator.kind == "gpu":
        return chips <= GPUS_PER_MACHINE or chips % GPUS_PER_MACHINE == 0
    if accelerator.kind != "tpu":
        return True
    if chips & (chips - 1):
        return False
    if accelerator.generation in _ONE_HOST_UP_TO:
        return chips != 2
    return chips >= 4


def host_chip(meminfo: str = "/proc/meminfo") -> Chip:
    """This host as the one "chip" of a CPU run: its memory is what every device holds.
    No datasheet: the bandwidth and FLOP figures are 0 (a CPU plan predicts no times)."""
    try:
        with open(meminfo) as f:
            total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration):
        raise ValueError(f"cpu: cannot read this host's memory size from {meminfo}") from None
    return Chip("CPU host", float(total), 0.0, 0.0, meminfo)


def topology_of(generation: str, chips: int) -> str:
    """A slice shape of `chips` chips: as square as the generation's torus allows."""
    if chips < 1 or chips & (chips - 1):
        raise ValueError(f"{generation}: slices come in powers of two chips, got {chips}")
    if generation in ("v4", "v5p"):
        dims = [1, 1, 1]
        for i in range(chips.bit_length() - 1):
            dims[i % 3] *= 2
        if chips >= 8:  # 2x2x2, 2x2x4, 2x4x4, 4x4x4, ... as Cloud TPU names them
            dims = sorted(dims)
        elif chips < 4:  # the smallest 3D slice is 2x2x1; fewer is part of one host
            dims = [1, 1, chips]
        return f"{generation}:{dims[0]}x{dims[1]}x{dims[2]}"
    side = 1
    while (2 * side) ** 2 <= chips:
        side *= 2
    return f"{generation}:{side}x{chips // side}"
