"""Routing: which rollout instance takes a request (a group's trajectories, or a resumed one).

Eligibility is the staleness rule, and is the same for every router:
  * a trajectory of an entry with V_traj may only run on an instance of version ≥ V_traj
    (every token must come from weights at least as new as the entry's oldest);
  * a new entry takes V_traj = the version of the instance it lands on, so it may only go to
    an instance whose version still has a reservable buffer slot (`can_reserve(version)`);
  * the instance must have a free slot (queued work counts against it).
Pending work is served oldest V_traj first (`PendingQueue`): it has the nearest deadline.

Routers only choose among eligible instances:
  round_robin         cycle through them;
  least_loaded        fewest running + queued per slot;
  throughput_optimal  the largest marginal gain in tokens/s under the step-latency model;
  version_first       PSRL's router: the newest weights first, then the largest gain, and a
                      request waits unless its gain is ≥ `threshold` (0.2) of its gain on an
                      empty instance and its KV fits beside what the instance holds.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Any, Callable

import numpy as np

from asyncrl.coordinator.latency import LatencyModel
from asyncrl.registry import Registry
from asyncrl.coordinator.view import ClusterView

ROUTERS = Registry("router")
# How a new group is placed: all its responses on one instance, or each routed on its own
# (PSRL's: a group's long responses spread over several KV caches). The entry's V_traj is
# then the oldest version among the instances its responses went to.
DISPATCH_MODES = Registry("dispatch mode")
DISPATCH_MODES.add("group", False)
DISPATCH_MODES.add("per_response", True)
# When an entry's V_traj is fixed: at dispatch (the version of the instance it was routed
# to), or late (PSRL's dynamic version tag: while none of its responses has started, each
# weight sync of the instances holding it moves V_traj to the oldest of their versions).
BINDINGS = Registry("binding")
BINDINGS.add("dispatch", False)
BINDINGS.add("late", True)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """What is being routed: `num_seqs` trajectories, each prefilling `prefill_tokens`."""

    num_seqs: int = 1
    prefill_tokens: int = 0  # prompt, plus tokens so far when a partial rollout resumes
    v_traj: int | None = None  # None: a new entry, V_traj is the chosen instance's version


# -------------------------------------------------------------------- eligibility


def eligible_new(cluster: ClusterView, can_reserve: Callable[[int], bool]) -> np.ndarray:
    """Mask of instances that may take a new entry: a free slot and a reservable version.

    `can_reserve` is `StalenessManager.can_reserve`; it is asked once per distinct version.
    """
    free = cluster.running + cluster.queued < cluster.num_slots
    if not free.any():  # a full cluster: the common case at scale, decided without sorting
        return free
    versions = cluster.version[free]
    lo = versions.min()
    if lo == versions.max():  # one version among the free (most steps): no sorting either
        return free if can_reserve(int(lo)) else np.zeros_like(free)
    versions = np.unique(versions)
    ok = [v for v in versions.tolist() if can_reserve(v)]
    if len(ok) == len(versions):
        return free
    return free & np.isin(cluster.version, ok)


def eligible_resume(cluster: ClusterView, v_traj: int) -> np.ndarray:
    """Mask of instances that may continue a trajectory of an entry with this V_traj."""
    return (cluster.version >= v_traj) & (cluster.running + cluster.queued < cluster.num_slots)


class PendingQueue:
    """Work waiting for a slot, served oldest V_traj first, then first come first served."""

    def __init__(self):
        self._heap: list[tuple[int, int, Any]] = []
        self._order = itertools.count()

    def push(self, item: Any, v_traj: int) -> None:
        heapq.heappush(self._heap, (v_traj, next(self._order), item))

    def pop(self) -> Any:
        return heapq.heappop(self._heap)[2]

    def peek_v_traj(self) -> int:
        return self._heap[0][0]

    def remove_if(self, predicate: Callable[[Any], bool]) -> list[Any]:
        """Takes out the items matching `predicate` and returns them in serving order; O(n)."""
        kept, removed = [], []
        for entry in self._heap:
            (removed if predicate(entry[2]) else kept).append(entry)
        if removed:
            heapq.heapify(kept)
            self._heap = kept
        return [entry[2] for entry in sorted(removed)]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return (entry[2] for entry in sorted(self._heap))


# -------------------------------------------------------------------- routers


class Router:
    """Chooses one eligible instance for a request, or None if none is eligible."""

    needs_latency = False  # built with the fitted step-latency model

    def choose(self, cluster: ClusterView, eligible: np.ndarray, request: Request) -> int | None:
        raise NotImplementedError


@ROUTERS.register("round_robin")
class RoundRobin(Router):
    """The next eligible instance after the last one chosen, cyclically."""

    def __init__(self, latency: LatencyModel | None = None):
        del latency  # every router is built with the same arguments; this one needs none
        self._next = 0

    def choose(self, cluster, eligible, request):
        idx = np.flatnonzero(eligible)
        if len(idx) == 0:
            return None
        pos = np.searchsorted(idx, self._next)
        pick = int(idx[pos % len(idx)])
        self._next = pick + 1
        return pick


@ROUTERS.register("least_loaded")
class LeastLoaded(Router):
    """Fewest (running + queued) per slot; ties go to the lowest index."""

    def __init__(self, latency: LatencyModel | None = None):
        del latency

    def choose(self, cluster, eligible, request):
        idx = np.flatnonzero(eligible)
        if len(idx) == 0:
            return None
        load = (cluster.running[idx] + cluster.queued[idx]) / cluster.num_slots[idx]
        return int(idx[np.argmin(load)])


@ROUTERS.register("throughput_optimal")
class ThroughputOptimal(Router):
    """Maximal marginal throughput: argmax over eligible i of tput_i(after) − tput_i(before).

    tput(n, kv) = n / t(n, kv) with the step-latency model. Queued work counts as running up
    to the slot limit, with the instance's mean KV per sequence; requests beyond the slots
    add nothing now. The gain is large where the batch is small and the KV cache light, so
    the router fills cheap capacity first and stops adding where steps grow long.
    """

    needs_latency = True

    def __init__(self, latency: LatencyModel):
        if latency is None:
            raise ValueError("throughput_optimal routing needs a latency model")
        self.latency = latency

    def choose(self, cluster, eligible, request):
        idx = np.flatnonzero(eligible)
        if len(idx) == 0:
            return None
        gain, _ = _marginal_gain(self.latency, cluster, idx, request)
        return int(idx[np.argmax(gain)])


def _marginal_gain(model: LatencyModel, cluster: ClusterView, idx: np.ndarray,
                   request: Request) -> tuple[np.ndarray, np.ndarray]:
    """Tokens/s an instance gains by taking the request, and the KV it would then hold."""
    running = cluster.running[idx].astype(np.float64)
    slots = cluster.num_slots[idx]
    load = running + cluster.queued[idx]
    prefill = float(max(request.prefill_tokens, 1))
    per_seq = np.where(running > 0, cluster.kv_tokens[idx] / np.maximum(running, 1), prefill)
    n0 = np.minimum(load, slots)
    kv0 = n0 * per_seq
    n1 = np.minimum(load + request.num_seqs, slots)
    kv1 = kv0 + (n1 - n0) * prefill
    gain = n1 / model.step_time(n1, kv1) - n0 / model.step_time(n0, kv0)
    return gain, load * per_seq + request.num_seqs * prefill


@ROUTERS.register("version_first")
class VersionFirst(Router):
    """PSRL's routing: among eligible instances whose marginal gain is worth it and whose KV
    cache has room, the newest version (its entries get the most buffers to land in), then
    the largest gain. None (the request waits for a better moment) when no instance
    qualifies: a request squeezed onto a saturated engine gains little now and, in a
    KV-bound engine, evicts a running sequence that must be re-prefilled later.

    Worth it: gain ≥ `threshold` × the request's gain on an empty instance. Room: the KV the
    instance holds and has queued (its mean per sequence) plus the request's prefill ≤ its
    reported KV capacity. An idle instance always qualifies, so work never waits forever.
    """

    needs_latency = True

    def __init__(self, latency: LatencyModel, threshold: float = 0.2):
        if latency is None:
            raise ValueError("version_first routing needs a latency model")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"version_first: threshold must be in [0, 1], got {threshold}")
        self.latency, self.threshold = latency, threshold

    def choose(self, cluster, eligible, request):
        idx = np.flatnonzero(eligible)
        if len(idx) == 0:
            return None
        gain, kv_after = _marginal_gain(self.latency, cluster, idx, request)
        n = request.num_seqs
        empty = n / self.latency.step_time(n, n * float(max(request.prefill_tokens, 1)))
        idle = cluster.running[idx] + cluster.queued[idx] == 0
        ok = idle | ((gain >= self.threshold * empty) & (kv_after <= cluster.kv_capacity[idx]))
        if not ok.any():
            return None
        version = np.where(ok, cluster.version[idx], -1)
        best = ok & (version == version.max())
        return int(idx[np.argmax(np.where(best, gain, -np.inf))])


def router_needs_latency(name: str) -> bool:
    return getattr(ROUTERS.get(name), "needs_latency", False)


def build_router(name: str, latency: LatencyModel | None) -> Router:
    return ROUTERS.build(name, latency=latency)


def place_each_response(router: Router, cluster: ClusterView, eligible: np.ndarray, launch: int,
                        prompt_tokens: int) -> list[int] | None:
    """Routes each response of a new group on its own, counting each placement in the view
    before the next. None (the view unchanged) if the first has nowhere to go: the group
    waits. A later response with nowhere better to go joins the one before it, as a whole
    group would (queued beyond the free slots)."""
    targets = []
    request = Request(1, prompt_tokens)
    for _ in range(launch):
        target = router.choose(cluster, eligible, request)
        if target is None:
            if not targets:
                return None
            target = targets[-1]
        targets.append(target)
        cluster.queued[target] += 1
    return targets
