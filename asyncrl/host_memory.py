"""glibc malloc settings for a run whose devices are this host's CPU.

XLA:CPU allocates every device buffer (weights, Adam moments, a step's temporaries, KV) with
the C allocator. glibc serves a request of at least its mmap threshold from a fresh mapping,
returned to the system when freed; smaller ones come from per-thread arenas, which keep freed
memory for reuse. The threshold starts at 128 KiB but rises to the size of any mapped block
that is freed, up to 32 MiB: after the first train step frees its temporaries, buffers of up
to 32 MiB land in arenas, and the arenas of XLA's many threads fragment. In the default
SmolLM2 run these settings took 0.3-0.4 GB off the resident memory (docs/results.md).
Import-light: `asyncrl.main` calls it before JAX allocates anything.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

# Blocks of 1 MiB and up are mapped, and unmapped when freed: every weight, moment and
# activation of a real model, and none of the Python objects. Fixing it also stops glibc
# raising it. Its cost is a page fault per first touch of a mapped page (docs/results.md).
MMAP_THRESHOLD = 1 << 20
# The top of a heap is given back to the system once 8 MiB of it are free (glibc's default
# after the threshold has risen is twice the threshold: 64 MiB held per arena).
TRIM_THRESHOLD = 8 << 20
# Arenas: glibc's default is 8 per core, each keeping its own free memory; XLA's thread
# pools make that many. Small blocks are all that remain in arenas, so few arenas suffice.
ARENA_MAX = 2

# The environment variables glibc reads for the same settings: a value the caller set wins.
_ENV = {M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_", M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_",
        M_ARENA_MAX: "MALLOC_ARENA_MAX"}


def tune_host_malloc(environ=os.environ) -> dict[str, int]:
    """Sets glibc's mmap threshold, trim threshold and arena count for XLA:CPU buffers.

    Returns the settings applied ({} on a C library other than glibc, where they do not
    exist). One set in the environment (MALLOC_MMAP_THRESHOLD_, ...) is left as it is.
    Raises OSError if glibc refuses a setting.
    """
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return {}
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    applied = {}
    for param, value, name in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD, "mmap_threshold"),
                               (M_TRIM_THRESHOLD, TRIM_THRESHOLD, "trim_threshold"),
                               (M_ARENA_MAX, ARENA_MAX, "arena_max")):
        if _ENV[param] in environ:
            continue
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) != 1:
            raise OSError(f"glibc mallopt refused {name} = {value}")
        applied[name] = value
    return applied
