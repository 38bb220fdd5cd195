"""The coordinator's tick against fake instances: races that the end-to-end runs hit by chance."""

import types

from asyncrl.coordinator import build_migration_policy, build_redundancy, build_router, build_sync_policy
from asyncrl.coordinator.loop import Coordinator, Prompt
from asyncrl.rollout.messages import Event, InstanceFailed, Snapshot
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import StalenessManager

GROUP, SLOTS = 2, 4


class FakeInstance:
    def __init__(self, id: int):
        self.id, self.dead, self.work = id, False, []

    def submit(self, work):
        if self.dead:
            raise InstanceFailed(f"rollout instance {self.id} has failed; route elsewhere")
        self.work.append(work)

    def request_sync(self): ...
    def request_drop(self, trajectory_ids): ...
    def request_extract(self, count): ...

    def snapshot(self):
        # Always empty (it starts work at once); a dead one died after this snapshot was taken.
        return Snapshot(version=0, running=0, queued=0, kv_tokens=0, num_slots=SLOTS,
                        syncing=False, alive=True, idle_s=0.0)


class NoRewards:
    def submit(self, *args, **kwargs): ...
    def poll(self):
        return []


def make_coordinator(instances):
    prompts = (Prompt(i, (1, 2, 3), {}) for i in range(1000))
    return Coordinator(
        staleness=StalenessManager(1, 4), trajectories=TrajectoryServer(),
        parameters=types.SimpleNamespace(latest_version=0), instances=instances,
        rewards=NoRewards(), prompts=prompts, decode=str, reward_name="exact_answer",
        group_size=GROUP, max_new_tokens=4, router=build_router("round_robin", None),
        sync=build_sync_policy("greedy"), migration=build_migration_policy("none"),
        redundancy=build_redundancy("none"), eta=1)


def test_work_for_an_instance_that_died_after_its_snapshot_goes_to_a_live_one():
    healthy, dying = FakeInstance(0), FakeInstance(1)
    dying.dead = True  # its "failed" event has not reached the coordinator yet
    coordinator = make_coordinator([healthy, dying])

    coordinator.tick()
    assert coordinator.counters.failed_instances == 1
    coordinator.tick()  # the rejected group is re-routed as resumes

    assert dying.work == []
    routed = [t.trajectory_id for w in healthy.work for t in w.trajectories]
    entries = coordinator.server.entries()
    members = [t for e in entries for t in coordinator.server.members(e)]
    assert sorted(routed) == sorted(members), "a reserved trajectory was left on no instance"
    assert {coordinator.server.record(t).instance for t in routed} == {0}

    # The late event names nothing the instance held; the failure is counted once.
    coordinator.events.put(Event("failed", 1, lost_ids=(), error=RuntimeError("fault")))
    coordinator.tick()
    assert coordinator.counters.failed_instances == 1
