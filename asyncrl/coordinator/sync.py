"""Weight sync: when one rollout instance pulls newer weights. Per instance, no global barrier.

A pull costs the instance its transfer time, and (partial rollout) a re-prefill of the
trajectories it interrupts, whose KV was computed by the old weights. Not pulling costs
nothing until the instance's version runs out of reservable buffer slots: then it can take
no new entries and starves as its running trajectories finish.

  greedy     pull as soon as a newer version exists (fresh weights, most interruptions);
  when_idle  pull only when the instance would otherwise starve: nothing running, or no new
             entry can land at its version (or the abort rule forbids it) while its load has
             fallen to `low_watermark` of its slots. Fewer, cheaper interruptions; entries
             stay as stale as η allows, never more.
  kv_aware   PSRL's: pull once nothing waits in the instance's queue and its KV cache is
             under `kv_threshold` of its capacity (a pull re-prefills what the cache holds,
             so it is cheapest then); otherwise as when_idle, so no instance starves.
"""

from __future__ import annotations

import dataclasses
import math

from asyncrl.registry import Registry
from asyncrl.coordinator.view import InstanceView

SYNC_POLICIES = Registry("sync policy")


@dataclasses.dataclass(frozen=True, slots=True)
class SyncContext:
    """What the policy needs besides the instance: the newest weights and the staleness state."""

    latest_version: int  # newest version the parameter server holds
    can_dispatch_new: bool  # StalenessManager.can_reserve(instance.version)


class SyncPolicy:
    def should_sync(self, instance: InstanceView, ctx: SyncContext) -> bool:
        raise NotImplementedError


@SYNC_POLICIES.register("greedy")
class Greedy(SyncPolicy):
    def should_sync(self, instance, ctx):
        return ctx.latest_version > instance.version and not instance.syncing


@SYNC_POLICIES.register("when_idle")
class WhenIdle(SyncPolicy):
    def __init__(self, low_watermark: float = 0.5):
        if not 0.0 <= low_watermark <= 1.0:
            raise ValueError(f"when_idle: low_watermark must be in [0, 1], got {low_watermark}")
        self.low_watermark = low_watermark

    def should_sync(self, instance, ctx):
        if ctx.latest_version <= instance.version or instance.syncing:
            return False
        if instance.load == 0:
            return True
        # Still able to take new entries at its version: routing keeps it busy, stay.
        if ctx.can_dispatch_new:
            return False
        return instance.load <= self.low_watermark * instance.num_slots


@SYNC_POLICIES.register("kv_aware")
class KVAware(WhenIdle):
    def __init__(self, kv_threshold: float = 0.3, low_watermark: float = 0.5):
        super().__init__(low_watermark)
        if not 0.0 <= kv_threshold <= 1.0:
            raise ValueError(f"kv_aware: kv_threshold must be in [0, 1], got {kv_threshold}")
        self.kv_threshold = kv_threshold

    def should_sync(self, instance, ctx):
        if ctx.latest_version <= instance.version or instance.syncing:
            return False
        capacity = instance.kv_capacity
        # An unlimited cache has no "light": a pull there costs the re-prefill of whatever it
        # holds, so when_idle decides.
        if instance.queued == 0 and math.isfinite(capacity) and (
                instance.kv_tokens <= self.kv_threshold * capacity):
            return True
        return super().should_sync(instance, ctx)


def build_sync_policy(name: str, **kwargs) -> SyncPolicy:
    return SYNC_POLICIES.build(name, **kwargs)
