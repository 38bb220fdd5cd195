"""Reading train-step metrics one step late, and failing loudly on non-finite values.

`jax.device_get` on step N's metrics blocks until step N has finished. Done right after
dispatching step N, it would leave the device idle while the host waits and then prepares
batch N+1. So the loop dispatches step N+1 first and only then reads step N:

    late = LateMetrics()
    for step, batch in ...:
        state, metrics = trainer.step(state, batch)
        if (done := late.push(step, metrics)) is not None:
            log(*done)                       # step N-1's values, as Python floats
    log(*late.flush())
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax

# Quantities whose non-finite value means the update that produced them is garbage, in the
# order they are checked: a NaN importance weight makes the loss NaN too, so the root cause
# is named first.
FINITE_CHECKS = ("approx_kl", "kl_ref", "loss", "grad_norm")


def check_finite(step: int, metrics: Mapping[str, float]) -> None:
    """FloatingPointError naming the step and the quantity, if any checked value is NaN/Inf."""
    bad = metrics.get("is_weight_nonfinite", 0.0)
    if bad:
        raise FloatingPointError(
            f"step {step}: importance weight is non-finite on {int(bad)} trained tokens "
            f"(behaviour or policy log-probs are NaN/Inf)"
        )
    for name in FINITE_CHECKS:
        if name in metrics and not math.isfinite(metrics[name]):
            raise FloatingPointError(f"step {step}: {name} is {metrics[name]}")


class LateMetrics:
    """Holds step N's device metrics until step N+1 is dispatched, then reads and checks them."""

    def __init__(self):
        self._pending: tuple[int, Any] | None = None

    def push(
        self, step: int, metrics: Mapping[str, jax.Array]
    ) -> tuple[int, dict[str, float]] | None:
        """Queue `step`'s metrics; return the previous step's as floats (None on the first)."""
        previous, self._pending = self._pending, (step, metrics)
        return None if previous is None else _read(*previous)

    def flush(self) -> tuple[int, dict[str, float]] | None:
        """Read whatever is queued (after the last step, or before a checkpoint)."""
        previous, self._pending = self._pending, None
        return None if previous is None else _read(*previous)


def _read(step: int, metrics: Mapping[str, jax.Array]) -> tuple[int, dict[str, float]]:
    host = {name: float(value) for name, value in jax.device_get(dict(metrics)).items()}
    check_finite(step, host)
    return step, host
