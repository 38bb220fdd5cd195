"""Which rollout instances the core may give work: failed ones leave, restarted ones rejoin.

  dead       failed: never eligible (they look permanently full); what they held was re-routed
  rejoining  dead, and their driver is starting a fresh instance in their place: while one
             is, losing every instance need not end the run
  warming    rejoined, but on weights older than the newest published when they rejoined:
             they pull those first and get no work until they hold them

A rejoined instance starts empty (its old work went elsewhere when it failed) and its version
is the one its driver says it pulled, never more: every entry routed to it takes V_traj from
that version, so overstating it would let tokens from older weights into a newer V_traj.
"""

from __future__ import annotations

from asyncrl.coordinator.view import ClusterView


class Membership:
    def __init__(self):
        self.dead: set[int] = set()
        self.rejoining: set[int] = set()
        self.warming: dict[int, int] = {}  # instance -> the version it must hold for work

    def fail(self, cluster: ClusterView, i: int, rejoining: bool) -> bool:
        """Retires instance i; False if it already was (a late report of the same failure)."""
        if rejoining:
            # A driver's duplicate report may come first and not know of the restart.
            self.rejoining.add(i)
        if i in self.dead:
            return False
        self.dead.add(i)
        self.warming.pop(i, None)
        cluster.queued[i], cluster.running[i] = cluster.num_slots[i], 0
        return True

    def give_up(self, i: int) -> None:
        self.rejoining.discard(i)

    def none_left(self, num_instances: int) -> bool:
        return len(self.dead) == num_instances and not self.rejoining

    def rejoin(self, cluster: ClusterView, i: int, version: int, latest: int) -> bool:
        """Instance i is back, empty, on weights `version`; True if it must pull `latest`
        before it takes work."""
        if i not in self.dead:
            raise ValueError(f"rollout instance {i} rejoined, but the coordinator has no "
                             f"failure of it: a driver reports a rejoin only after `Failed`")
        self.dead.discard(i)
        self.rejoining.discard(i)
        cluster.version[i] = version
        cluster.running[i] = cluster.queued[i] = cluster.kv_tokens[i] = 0
        cluster.syncing[i] = False
        if version >= latest:
            return False
        self.warming[i] = latest
        cluster.queued[i] = cluster.num_slots[i]
        return True

    def hold_back(self, cluster: ClusterView, i: int) -> None:
        """After news of instance i (a snapshot, a sync): keeps a warming one out of routing
        until it holds its target version."""
        target = self.warming.get(i)
        if target is None:
            return
        if cluster.version[i] >= target:
            del self.warming[i]
            cluster.queued[i] = 0  # it was given nothing while warming
        else:
            cluster.queued[i] = cluster.num_slots[i]
