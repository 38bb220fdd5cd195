"""The watchdog every weight pull runs under: jax.experimental.transfer's own timeout is not
heeded when a sender goes silent (asyncrl/distributed/transport.py), so a pull runs in a
thread that is waited for at most a bound, and the error names what was pulled."""

from __future__ import annotations

import threading
from typing import Any, Callable


class TransportTimeout(TimeoutError):
    """A pull that did not finish in time; the message names version, id and receiver."""


def watched(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """fn() in a thread, waited for at most timeout_s; TransportTimeout naming `what` after.

    A pull blocked in C++ cannot be interrupted: its thread is a daemon, abandoned, and the
    caller treats the instance as failed (its process is then replaced)."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as error:  # re-raised in the caller's thread
            box["error"] = error

    thread = threading.Thread(target=target, name=f"pull {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TransportTimeout(f"{what}: not done after {timeout_s:.1f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
