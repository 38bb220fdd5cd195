"""The step-latency model of a rollout instance: how long one decode step takes.

    t(running, kv_tokens) = a + b·kv_tokens + max(c, d + e·running)        [seconds]

  a  fixed per-step overhead (scheduler, sampling, kernel launches)
  b  seconds per KV-cache token read by attention (memory bound)
  c  the floor of the matmuls: reading the weights once per step (memory bound)
  d, e  the matmuls once the batch is large enough to be compute bound: e seconds per sequence
Every running sequence gains one token per step. Prefill (a new prompt, or re-prefill of a
resumed or migrated trajectory) costs `prefill_s_per_token` per token and stalls decoding.

Routing by marginal throughput (`routing.throughput_optimal`) and the simulator both use this
model, so they agree on what an instance can do. `a` and `c` only matter as a sum when fitted
(see `fit`), and the model is the same either way.

File format (JSON; other top-level sections, such as a simulator profile's, are left alone):
    {"name": str, "source": str,
     "step_latency": {"a": s, "b": s/token, "c": s, "d": s, "e": s/sequence},
     "prefill_s_per_token": s/token}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Iterable, Sequence

import numpy as np

from asyncrl.jsonfile import read_json_object

_COEFFS = ("a", "b", "c", "d", "e")


@dataclasses.dataclass(frozen=True)
class LatencyModel:
    a: float
    b: float
    c: float
    d: float
    e: float
    prefill_s_per_token: float = 0.0
    name: str = ""
    source: str = ""  # where the numbers come from (a datasheet, a profiling run)

    def __post_init__(self):
        for field in (*_COEFFS, "prefill_s_per_token"):
            value = getattr(self, field)
            # d may be negative: it is only the intercept of the compute-bound line.
            minimum = -math.inf if field == "d" else 0.0
            if not _is_number(value) or value < minimum:
                raise ValueError(
                    f"LatencyModel.{field} must be a finite number ≥ {minimum}, got {value!r}")
        if self.a + self.c <= 0:
            raise ValueError(
                f"LatencyModel: a + c must be > 0 (a step takes time), got {self.a + self.c}")

    # ---------------------------------------------------------------- predictions

    def step_time(self, running, kv_tokens):
        """Seconds of one decode step; scalars or numpy arrays of equal shape."""
        if isinstance(running, np.ndarray) or isinstance(kv_tokens, np.ndarray):
            return self.a + self.b * kv_tokens + np.maximum(self.c, self.d + self.e * running)
        return self.a + self.b * kv_tokens + max(self.c, self.d + self.e * running)

    predict = step_time

    def decode_throughput(self, running, kv_tokens):
        """Tokens per second the instance generates in that state (running / step time)."""
        return running / self.step_time(running, kv_tokens)

    def prefill_time(self, tokens: float) -> float:
        return self.prefill_s_per_token * tokens

    def chunk_time(self, running: int, kv_tokens: float, steps: int) -> float:
        """Seconds of `steps` decode steps with a fixed batch; each step adds `running` tokens."""
        alpha = self.a + max(self.c, self.d + self.e * running)
        return steps * alpha + self.b * (steps * kv_tokens + running * steps * (steps - 1) / 2)

    def steps_within(self, running: int, kv_tokens: float, budget: float) -> int:
        """The most whole decode steps (fixed batch) that finish within `budget` seconds."""
        if budget <= 0:
            return 0
        alpha = self.a + max(self.c, self.d + self.e * running)
        quad = self.b * running / 2
        lin = alpha + self.b * kv_tokens - quad
        if quad > 0:
            j = int((-lin + math.sqrt(lin * lin + 4 * quad * budget)) / (2 * quad))
        else:
            j = int(budget / lin)
        # The closed form is exact up to float rounding; settle the last step exactly.
        while self.chunk_time(running, kv_tokens, j + 1) <= budget:
            j += 1
        while j > 0 and self.chunk_time(running, kv_tokens, j) > budget:
            j -= 1
        return j

    # ---------------------------------------------------------------- fitting

    @classmethod
    def fit(
        cls,
        samples: Iterable[Sequence[float]] | np.ndarray,
        *,
        a: float = 0.0,
        prefill_s_per_token: float = 0.0,
        name: str = "",
        source: str = "",
    ) -> "LatencyModel":
        """Least-squares fit to measured (running, kv_tokens, step_seconds) samples.

        max(c, d + e·r) = c + e·max(0, r − r0) with r0 = (c − d)/e, a hinge at r0. For a fixed
        r0 the model is linear in (a + c, b, e); the fit tries each observed batch size as r0
        (and "no knee"), refines the best on a fine grid between its neighbours, and keeps the
        least squared error with b, e ≥ 0. Only a + c is identifiable from step times, so `a`
        is taken as given and c = (a + c) − a.
        """
        if not isinstance(samples, np.ndarray):
            samples = list(samples)
        data = np.asarray(samples, dtype=np.float64)
        if data.ndim != 2 or data.shape[1] != 3:
            raise ValueError(f"fit: samples must be (running, kv_tokens, seconds) triples, "
                             f"got shape {data.shape}")
        if len(data) < 3:
            raise ValueError(f"fit: need ≥ 3 samples, got {len(data)}")
        if not np.all(np.isfinite(data)) or np.any(data < 0):
            raise ValueError("fit: samples must be finite and ≥ 0")
        r, kv, t = data.T
        ones = np.ones_like(r)

        def solve(r0):
            """Least squares at knee r0 (None: no knee) under b, e ≥ 0 and a + c ≥ a: the best
            of the column subsets that satisfy them, as (sse, a + c, b, e); None if none does.
            Every subset is tried: the first feasible one can fit far worse than another (a
            line through the flat and the hinge points with a negative intercept, say)."""
            hinge = np.zeros_like(r) if r0 is None else np.maximum(0.0, r - r0)
            full = np.stack([ones, kv, hinge], axis=1)
            best_here = None
            for cols in ((0, 1, 2), (0, 1), (0, 2), (0,)):
                coef, *_ = np.linalg.lstsq(full[:, cols], t, rcond=None)
                p = dict(zip(cols, coef))
                A, b, e = p[0], p.get(1, 0.0), p.get(2, 0.0)
                if b < 0 or e < 0 or A < a:
                    continue
                sse = float(np.sum((A + b * kv + e * hinge - t) ** 2))
                if best_here is None or sse < best_here[0]:
                    best_here = (sse, A, b, e)
            return best_here

        def best_of(r0s, best=None):
            """The least-error feasible fit over knees r0s, as (sse, a + c, b, e, r0); an
            earlier knee keeps its place unless a later one is better beyond rounding."""
            for r0 in r0s:
                fit = solve(r0)
                if fit is not None and (best is None or fit[0] < best[0] - 1e-18):
                    best = (*fit, r0)
            return best

        knees = np.unique(r)
        if len(knees) > 256:  # a bounded search: quantiles are as good as every value
            knees = np.unique(np.quantile(r, np.linspace(0, 1, 256)))
        best = best_of([None, *(float(k) for k in knees[:-1])])
        if best is None:
            raise ValueError(f"fit: every fit puts the flat step time a + c below the given "
                             f"a = {a} (the fastest measured step is {t.min():.3g}s)")
        if best[4] is not None:
            # The true knee may lie between two observed batch sizes: refine on a fine grid.
            i = int(np.searchsorted(knees, best[4]))
            lo, hi = knees[max(i - 1, 0)], knees[min(i + 1, len(knees) - 1)]
            best = best_of((float(r0) for r0 in np.linspace(lo, hi, 65)), best)
        _, A, b, e, r0 = best
        r0 = 0.0 if r0 is None else r0  # no knee: e = 0, so d = c
        c = A - a
        return cls(a=a, b=float(b), c=float(c), d=float(c - e * r0), e=float(e),
                   prefill_s_per_token=prefill_s_per_token, name=name, source=source)

    # ---------------------------------------------------------------- JSON

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "step_latency": {k: getattr(self, k) for k in _COEFFS},
            "prefill_s_per_token": self.prefill_s_per_token,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "<dict>") -> "LatencyModel":
        """Builds a model from parsed JSON; errors name `where` (the file) and the field."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
        for key in ("step_latency", "prefill_s_per_token"):
            if key not in d:
                raise ValueError(f"{where}: missing field {key!r}")
        coeffs = d["step_latency"]
        if not isinstance(coeffs, dict):
            raise ValueError(
                f"{where}: field 'step_latency' must be an object with keys {', '.join(_COEFFS)}")
        unknown = sorted(set(coeffs) - set(_COEFFS) - {"note"})
        if unknown:
            names = ", ".join(f"step_latency.{k}" for k in unknown)
            raise ValueError(f"{where}: unknown field(s) {names}; expected {', '.join(_COEFFS)}")
        values = {}
        for k in _COEFFS:
            if k not in coeffs:
                raise ValueError(f"{where}: missing field 'step_latency.{k}'")
            if not _is_number(coeffs[k]):
                raise ValueError(
                    f"{where}: field 'step_latency.{k}' must be a finite number, got {coeffs[k]!r}")
            values[k] = float(coeffs[k])
        if not _is_number(d["prefill_s_per_token"]):
            raise ValueError(f"{where}: field 'prefill_s_per_token' must be a finite number, "
                             f"got {d['prefill_s_per_token']!r}")
        for key in ("name", "source"):
            if not isinstance(d.get(key, ""), str):
                raise ValueError(f"{where}: field {key!r} must be a string")
        try:
            return cls(**values, prefill_s_per_token=float(d["prefill_s_per_token"]),
                       name=d.get("name", ""), source=d.get("source", ""))
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LatencyModel":
        path = os.fspath(path)
        return cls.from_dict(read_json_object(path, "latency model file"), where=path)

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")


def _is_number(x: Any) -> bool:
    numeric = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
    return numeric and math.isfinite(x)
