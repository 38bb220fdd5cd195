"""RemoteInstance without Ray: what an actor sends is applied to the TrajectoryServer in order,
what the server refuses never reaches the coordinator, and the snapshot counts commands the
actor has not applied yet."""

import queue

from asyncrl.coordinator.messages import Extracted, Finished, Synced
from asyncrl.distributed.remote_instance import RemoteInstance, Timeouts
from asyncrl.drivers.threaded import _Reporter
from asyncrl.records import InstanceState
from asyncrl.rollout.messages import Trajectory, Work
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import TrajectoryState


class Method:
    def __init__(self, name, sent):
        self.name, self.sent = name, sent

    def remote(self, *args):
        self.sent.append((self.name, *args))


class FakeActor:
    """Records the commands the stand-in sends (seq, name, args), in order."""

    def __init__(self):
        self.sent = []
        self.command = Method("command", self.sent)


class Publisher:
    def __init__(self):
        self.pull_seconds = []
        self.acknowledged = []

    def pulled(self, transfer_id):
        self.acknowledged.append(transfer_id)

    def offer(self, instance, newer_than):
        return None if newer_than >= 3 else ("handle", instance, 3)


def stand_in(server):
    events, actor = queue.Queue(), FakeActor()
    remote = RemoteInstance(1, actor, server, _Reporter(events), Publisher(),
                            Timeouts(0.1, 1.0, 1.0, 1.0), num_slots=8)
    return remote, actor, events


def drain(events):
    out = []
    while not events.empty():
        out.append(events.get_nowait())
    return out


def group(server, entry, instance, size=2):
    ids = server.add_group(entry, entry, (1, 2), size, 4, v_traj=0)
    for t in ids:
        server.route(t, instance)
    return ids


def report(t, n, reason="stop"):
    return ("report", t, list(range(n)), [0.0] * n, [0.0] * n, [0] * n, reason)


def test_reports_reach_the_server_in_order_and_refused_work_is_dropped_there():
    server = TrajectoryServer()
    remote, actor, events = stand_in(server)
    kept, gone = group(server, 0, 1), group(server, 1, 1)
    server.abort(1)  # aborted while the actor started it
    remote._apply([("start", kept[0], 5), ("start", gone[0], 5), report(kept[0], 3),
                   report(gone[0], 3), ("finished", (kept[0], gone[0])), ("synced", 2)])
    assert server.state(kept[0]) is TrajectoryState.GENERATED
    assert server.record(kept[0]).tokens == [0, 1, 2]
    assert drain(events) == [Finished(1, (kept[0],)), Synced(1, 2)]
    assert actor.sent == [("command", 1, "drop", (gone[0],))]  # the actor frees its slot


def test_a_report_for_work_now_held_elsewhere_is_ignored():
    server = TrajectoryServer()
    remote, _, events = stand_in(server)
    t = group(server, 0, 1, size=1)[0]
    remote._apply([("start", t, 0)])
    server.interrupt(t)  # e.g. this instance was declared failed: re-routed, running on 0
    server.route(t, 0)
    assert server.try_start(t)
    remote._apply([report(t, 2, None), ("extracted", (t,))])
    assert server.state(t) is TrajectoryState.RUNNING and server.record(t).tokens == []
    assert drain(events) == []


def test_queued_work_handed_back_is_passed_on_and_weights_are_offered_on_request():
    server = TrajectoryServer()
    remote, actor, events = stand_in(server)
    t = group(server, 0, 1, size=1)[0]
    remote._apply([("extracted", (t,)), ("want", 7, -1), ("want", 8, 3), ("pulled", 3, "v3/x/#0", 0.5)])
    assert drain(events) == [Extracted(1, (t,))]
    assert actor.sent == [("command", 1, "offer", (7, ("handle", 1, 3))),
                          ("command", 2, "offer", (8, None))]
    assert remote._publisher.pull_seconds == [0.5]
    assert remote._publisher.acknowledged == ["v3/x/#0"]  # what the transport may now let go


def test_the_snapshot_counts_what_the_actor_has_not_applied_yet():
    remote, actor, _ = stand_in(TrajectoryServer())
    work = Work([Trajectory(t, None, 4) for t in (0, 1, 2)])
    remote.submit(work)
    remote.request_sync()
    snapshot = remote.snapshot()
    assert (snapshot.queued, snapshot.syncing) == (3, True)
    # the actor's, after seq 1
    remote._snapshot = InstanceState(instance=1, version=0, running=0, queued=3, kv_tokens=0,
                                     num_slots=8, syncing=False)
    del remote._unacked[1]
    snapshot = remote.snapshot()
    assert (snapshot.queued, snapshot.syncing) == (3, True)  # the sync (seq 2) is still pending
    assert [s[1:3] for s in actor.sent] == [(1, "submit"), (2, "sync")]


def test_a_stuck_engine_the_actor_reports_is_failed_by_the_driver_as_a_dead_actor_is(monkeypatch):
    import ray

    killed = []  # ray.kill itself would start a Ray cluster here, to refuse a fake actor
    monkeypatch.setattr(ray, "kill", lambda actor, no_restart: killed.append(actor))
    remote, actor, events = stand_in(TrajectoryServer())
    # The actor's snapshot, taken while its engine call had run 75 s: passed on as it came.
    remote._snapshot = InstanceState(instance=1, version=0, running=2, queued=0, kv_tokens=9,
                                     num_slots=8, syncing=False, stalled_s=75.0)
    assert remote.snapshot().stalled_s == 75.0
    remote.fail("made no progress for 75 s")  # the driver's watchdog (its actor is killed)
    [failed] = drain(events)
    assert (failed.instance, failed.rejoining) == (1, False)
    assert failed.error == "InstanceLost: rollout instance 1 (Ray actor, pid ?) made no progress for 75 s"
    assert not remote.snapshot().alive and killed == [actor]
    remote.fail("again")
    remote.request_drop((3,))
    assert drain(events) == [] and actor.sent == []  # failed once; nothing more is sent
