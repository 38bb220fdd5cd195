"""Restarting failed instance actors (`distributed.max_instance_restarts`): the rejoin.

The driver respawns them; Ray does not (`max_restarts` stays 0). Ray's restart re-runs the
actor's constructor behind the same handle: the stand-in's command numbers, unacknowledged
commands and refusals would carry over to a process that knows none of them (its first
command, numbered n > 1, would wait forever for number 1), calls in flight at the death would
be retried or dropped by Ray's rules, not the protocol's, and a silent actor, alive to Ray,
would never restart. A fresh actor behind a fresh `RemoteInstance` starts clean: it holds
nothing, numbers its commands from 1, pulls the newest weights as any start does, and the old
stand-in (failed, its actor killed) applies nothing more. Restarts are counted here, per
instance, so the budget and the log lines are the run's, not Ray's.

One restart of instance i:
  1. the failing stand-in `claim`s one of i's restarts and reports Failed(i, rejoining=True);
     the core re-routes what i held;
  2. a thread stops the old stand-in (its poll thread joined: no late report of the old
     actor reaches the server after this) and waits until Ray knows whether the old actor's
     node lives (a whole host may have died with it: `_wait_for_node_verdict`);
  3. a fresh actor from the same spec (index, devices, resources) and a fresh stand-in start
     within `distributed.start_timeout_s`: process, JAX, engine, newest weights;
  4. it takes place i in the driver and the core gets Rejoined(i, version pulled), both under
     the fresh stand-in's lock, so a failure of it is reported after its rejoin.
A start that fails spends another restart; with none left the instance stays dead
(RejoinFailed) and the log says so.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Callable

from asyncrl.distributed.remote_instance import RemoteInstance

log = logging.getLogger(__name__)


class Rejoiner:
    def __init__(self, max_restarts: int, num_instances: int, instances: list, reporter,
                 make_stand_in: Callable[[int], RemoteInstance], start_timeout_s: float):
        """`instances`: the driver's list, where a rejoined stand-in takes its place;
        `make_stand_in(i)`: a fresh actor for instance i, behind a stand-in with this
        Rejoiner."""
        self.max_restarts, self.start_timeout_s = max_restarts, start_timeout_s
        self._instances, self._reporter, self._make = instances, reporter, make_stand_in
        self.restarts = [0] * num_instances  # restarts spent, per instance
        self._lock = threading.Lock()
        self._under_way: set[int] = set()  # failed, a fresh actor not yet in their place
        self._starting: dict[int, RemoteInstance] = {}
        self._threads: list[threading.Thread] = []
        self._closing = False

    def claim(self, i: int) -> bool:
        """Whether a fresh actor will take instance i's place; spends one of its restarts.
        Called by the failing stand-in, before it reports the failure."""
        with self._lock:
            if self._closing:
                return False
            if self.restarts[i] < self.max_restarts:
                self.restarts[i] += 1
                self._under_way.add(i)
                return True
            message = (f"rollout instance {i} stays dead for the rest of the run: its "
                       f"{self.max_restarts} restarts (distributed.max_instance_restarts) "
                       f"are spent")
            log.error("%s", message)
            if i in self._under_way:  # the core waits for this rejoin: it will not come
                self._under_way.discard(i)
                self._reporter.rejoin_failed(i, message)
            return False

    def respawn(self, old: RemoteInstance) -> None:
        """Starts the restart `claim` granted, on its own thread (a start takes minutes)."""
        thread = threading.Thread(target=self._respawn, args=(old,), name=f"rejoin-{old.id}",
                                  daemon=True)
        with self._lock:
            if self._closing:
                return
            self._threads.append(thread)
        thread.start()

    def _respawn(self, old: RemoteInstance) -> None:
        i = old.id
        old.stop()
        began = time.monotonic()
        settled = self._wait_for_node_verdict(old)
        with self._lock:
            if self._closing:
                return
            attempt = self.restarts[i]
            log.warning("rollout instance %d: starting a fresh actor in place of the failed "
                        "one (restart %d of %d, distributed.max_instance_restarts); it has "
                        "%.0f s (distributed.start_timeout_s) to start and pull weights",
                        i, attempt, self.max_restarts, self.start_timeout_s)
            fresh = self._starting[i] = self._make(i)
        if not settled:
            log.warning("rollout instance %d: Ray has not settled whether the failed actor's "
                        "node lives; the fresh actor may be placed on it", i)
        fresh.start()  # a failure calls `claim` again: another restart, or RejoinFailed
        with self._lock:
            self._starting.pop(i, None)
        if not fresh.unless_failed(lambda: self._install(fresh)):
            fresh.stop()  # failed (its actor killed) or the run is stopping
            return
        log.warning("rollout instance %d rejoined: a fresh actor (pid %s) holds weights "
                    "version %d after %.1f s; it takes work once it holds the newest",
                    i, fresh.info.get("pid"), fresh.info["version"], time.monotonic() - began)

    def _wait_for_node_verdict(self, old: RemoteInstance) -> bool:
        """Waits until Ray knows whether the failed actor's node is alive; False if it did
        not learn within distributed.start_timeout_s.

        A host that died with the actor stays alive to Ray until it misses enough heartbeats
        (seconds to tens of seconds): a fresh actor placed there in that window dies with it
        and spends a restart on a host that is gone (seen on emulated hosts: the one restart
        spent ten seconds after a host's kill -9). A task pinned to that node, asking for no
        resources, returns at once from a live node and fails once Ray declares the node dead;
        either way, the scheduler knows by then.
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = old.info.get("node_id")
        if node_id is None:  # it died starting, its node unreported: nothing to ask about
            return True
        probe = _node_probe().options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
        deadline = time.monotonic() + self.start_timeout_s
        while not ray.wait([probe], timeout=1.0)[0]:  # in slices: a closing run does not wait
            with self._lock:
                if self._closing:
                    return True
            if time.monotonic() > deadline:
                return False
        try:
            ray.get(probe)
        except Exception as error:  # the node died (or never answers again): Ray knows
            log.warning("rollout instance %d: the failed actor's node %s is gone (%s)", old.id,
                        old.info.get("node"), type(error).__name__)
        return True

    def _install(self, fresh: RemoteInstance) -> bool:
        with self._lock:
            if self._closing:  # the driver may have stopped its instances already
                return False
            self._under_way.discard(fresh.id)
            self._instances[fresh.id] = fresh
            self._reporter.rejoined(fresh.id, fresh.info["version"])
            return True

    def close(self, timeout_s: float) -> None:
        """No restart after this; one starting is cut short (its actor killed)."""
        import ray

        with self._lock:
            self._closing = True
            starting, threads = list(self._starting.values()), list(self._threads)
        for stand_in in starting:
            try:
                ray.kill(stand_in.actor, no_restart=True)
            except Exception as error:
                log.warning("%s: kill of its restart: %s", stand_in.name, error)
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))


@functools.cache
def _node_probe():
    import ray

    @ray.remote(num_cpus=0, max_retries=0)
    def node_probe() -> bool:
        return True

    return node_probe
