"""Splitting a CPU host into several XLA devices, so the trainer mesh and the rollout meshes are
real and disjoint on a machine without accelerators. Import-light on purpose: the flag only
takes effect if it is set before JAX is first imported, so callers run it before that.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def split_cpu_host(count: int) -> None:
    """Makes the CPU platform `count` devices, unless XLA_FLAGS already sets a count (the
    caller's choice wins). It does not affect GPU or TPU platforms."""
    quiet_libtpu_without_tpu()
    if cpu_device_count() is None:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} {_DEVICE_FLAG}={count}".strip()


def cpu_device_count(environ=os.environ) -> int | None:
    """The CPU device count XLA_FLAGS sets (None: not set), e.g. to give another process of
    this job the same."""
    for flag in environ.get("XLA_FLAGS", "").split():
        if flag.startswith(_DEVICE_FLAG + "="):
            return int(flag.split("=", 1)[1])
    return None


_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips are PCI devices of Google's vendor id


def quiet_libtpu_without_tpu() -> None:
    """With libtpu installed (requirements-test.txt brings it, to compile for TPUs) on a host
    without a TPU, JAX's TPU backend looks for this host's TPU type and worker addresses and
    prints a page of warnings before falling back. Saying what it asks for keeps it quiet.
    Never on a TPU host: there the runtime reads its own topology, and setting one of these
    would stop JAX from setting the rest."""
    import glob

    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == _GOOGLE_PCI_VENDOR:
                    return
        except OSError:
            continue
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
