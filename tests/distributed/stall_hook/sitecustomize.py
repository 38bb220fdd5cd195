"""Test-only, for tests/distributed/test_hosts.py: an engine that gets stuck mid-decode on an
emulated host, while its Ray actor goes on answering polls, as a hung device call would.

Every process on the emulated hosts has this folder on PYTHONPATH, so Python imports this
module at start. It does nothing unless ASYNCRL_TEST_STALL_MARKER names a file: once
asyncrl.rollout.slots is imported, each `Slots.step` (a decode step) looks for that file, and
the first step to see it removes it (one process, one step: a restarted actor decodes
normally) and never returns. Importing nothing at start keeps every other process as it was.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

MARKER = os.environ.get("ASYNCRL_TEST_STALL_MARKER", "")


def _stall_once(step):
    def stalling_step(*args, **kwargs):
        if os.path.exists(MARKER):
            try:
                os.remove(MARKER)
            except FileNotFoundError:  # another process took it
                return step(*args, **kwargs)
            while True:
                time.sleep(60)
        return step(*args, **kwargs)

    return stalling_step


class _AfterSlotsImport(importlib.abc.MetaPathFinder):
    """Wraps `Slots.step` when asyncrl.rollout.slots is first imported."""

    def find_spec(self, name, path, target=None):
        if name != "asyncrl.rollout.slots":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.Slots.step = _stall_once(module.Slots.step)

        spec.loader.exec_module = exec_module
        return spec


if MARKER:
    sys.meta_path.insert(0, _AfterSlotsImport())
