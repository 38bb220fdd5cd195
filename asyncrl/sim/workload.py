"""Prompt and response lengths, from named distributions.

  constant   every sample the same (closed-form tests);
  lognormal  exp(N(log median, sigma)), rounded, clipped to [1, cap];
  bimodal    a mixture of two lognormals, the long one a `long_fraction` tail, clipped to cap
             (a model that either answers or thinks at length);
  empirical  a histogram from a JSON file: {"cap", "bins": [[lo, hi, weight], ...]}; a bin
             draws uniformly from [lo, hi), a bin with lo == hi is a point mass (responses
             cut at the cap). `asyncrl/sim/data/long_cot_math.json` is one shaped like long
             chain-of-thought math training.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from asyncrl.jsonfile import read_json_object
from asyncrl.registry import Registry

LENGTHS = Registry("length distribution")

DATA_DIR = os.path.join(os.path.dirname(__file__), "data")


class LengthDistribution:
    cap: int

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        raise NotImplementedError

    def mean(self) -> float:
        raise NotImplementedError


@LENGTHS.register("constant")
@dataclasses.dataclass(frozen=True)
class Constant(LengthDistribution):
    value: int

    def __post_init__(self):
        _check_positive_int("constant.value", self.value)

    @property
    def cap(self) -> int:
        return self.value

    def sample(self, rng, size):
        return np.full(size, self.value, dtype=np.int64)

    def mean(self):
        return float(self.value)


@LENGTHS.register("lognormal")
@dataclasses.dataclass(frozen=True)
class LogNormal(LengthDistribution):
    median: float
    sigma: float
    cap: int

    def __post_init__(self):
        _check_positive_int("lognormal.cap", self.cap)
        if not (self.median > 0 and self.sigma >= 0):
            raise ValueError(
                f"lognormal: need median > 0 and sigma ≥ 0, got {self.median}, {self.sigma}")

    def sample(self, rng, size):
        x = rng.lognormal(math.log(self.median), self.sigma, size)
        return np.clip(np.rint(x), 1, self.cap).astype(np.int64)

    def mean(self):
        # Exact mean of the clipped variable would need the truncated moments; sampling is
        # plenty for reporting.
        return float(self.sample(np.random.default_rng(0), 200_000).mean())


@LENGTHS.register("bimodal")
@dataclasses.dataclass(frozen=True)
class Bimodal(LengthDistribution):
    short_median: float
    long_median: float
    long_fraction: float
    cap: int
    short_sigma: float = 0.5
    long_sigma: float = 0.4

    def __post_init__(self):
        _check_positive_int("bimodal.cap", self.cap)
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ValueError(f"bimodal: long_fraction must be in [0, 1], got {self.long_fraction}")
        if not (0 < self.short_median <= self.long_median):
            raise ValueError(f"bimodal: need 0 < short_median ≤ long_median, "
                             f"got {self.short_median}, {self.long_median}")

    def sample(self, rng, size):
        long = rng.random(size) < self.long_fraction
        median = np.where(long, self.long_median, self.short_median)
        sigma = np.where(long, self.long_sigma, self.short_sigma)
        x = np.exp(np.log(median) + sigma * rng.standard_normal(size))
        return np.clip(np.rint(x), 1, self.cap).astype(np.int64)

    def mean(self):
        return float(self.sample(np.random.default_rng(0), 200_000).mean())


@LENGTHS.register("empirical")
class Empirical(LengthDistribution):
    def __init__(self, path: str):
        if not os.path.isabs(path) and not os.path.exists(path):
            path = os.path.join(DATA_DIR, path)  # bare names refer to the shipped data
        self.path = path
        d = read_json_object(path, "empirical length histogram")
        for key in ("cap", "bins"):
            if key not in d:
                raise ValueError(f"{path}: missing field {key!r}")
        self.cap = d["cap"]
        _check_positive_int(f"{path}: field 'cap'", self.cap)
        bins = np.asarray(d["bins"], dtype=np.float64)
        if bins.ndim != 2 or bins.shape[1] != 3 or len(bins) == 0:
            raise ValueError(f"{path}: field 'bins' must be a non-empty list of [lo, hi, weight]")
        lo, hi, w = bins.T
        bad = np.any(lo < 1) or np.any(hi < lo) or np.any(hi > self.cap) or np.any(w < 0)
        if bad or w.sum() <= 0:
            raise ValueError(
                f"{path}: field 'bins' needs 1 ≤ lo ≤ hi ≤ cap and weights ≥ 0, not all 0")
        self._lo, self._hi = lo.astype(np.int64), hi.astype(np.int64)
        self._p = w / w.sum()

    def sample(self, rng, size):
        b = rng.choice(len(self._p), size=size, p=self._p)
        lo, hi = self._lo[b], self._hi[b]
        width = np.maximum(hi - lo, 1)
        return np.where(hi > lo, lo + rng.integers(0, width), lo).astype(np.int64)

    def mean(self):
        mid = np.where(self._hi > self._lo, (self._lo + self._hi - 1) / 2, self._lo)
        return float(np.dot(self._p, mid))


def build_lengths(spec) -> LengthDistribution:
    """From a config: `spec.name` plus that distribution's fields."""
    params = {k: v for k, v in dict(spec).items() if k != "name"}
    try:
        return LENGTHS.build(spec["name"], **params)
    except TypeError as err:
        raise ValueError(
            f"length distribution {spec['name']!r}: bad parameters {params} ({err})") from None


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int ≥ 1, got {value!r}")
