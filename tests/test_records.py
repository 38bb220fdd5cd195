"""The records every layer shares: one instance state, built by name and passed on as it was
reported; one trajectory payload, which the server's record extends; one event sink, which
the threaded driver, a Ray actor's outbox and the simulated cluster implement alike."""

import inspect
import queue

import numpy as np
import pytest

from asyncrl.coordinator.messages import Failed, Finished, Synced
from asyncrl.drivers.threaded import ThreadedDriver, _Reporter
from asyncrl.records import EventSink, InstanceState, Trajectory
from asyncrl.servers.trajectory import TrajectoryRecord, TrajectoryServer
from asyncrl.sim.cluster import Cluster


def outbox():
    from asyncrl.distributed.actor import Outbox  # loads JAX: only this case pays for it

    return Outbox


@pytest.mark.parametrize("sink", [lambda: _Reporter, outbox, lambda: Cluster],
                         ids=["threaded", "ray", "sim"])
@pytest.mark.parametrize("call", ["finished", "extracted", "synced", "failed"])
def test_every_sink_takes_each_call_of_the_interface_alike(sink, call):
    def parameters(method):  # names and defaults: what a caller relies on
        return [(p.name, p.default) for p in inspect.signature(method).parameters.values()]

    assert parameters(getattr(sink(), call)) == parameters(getattr(EventSink, call))


def test_the_threaded_reporter_and_the_simulated_cluster_make_the_same_events():
    events = queue.Queue()
    live = _Reporter(events)
    sim = Cluster.__new__(Cluster)  # its sink alone: no profile, no core
    sim._events, sim._finished = [], {}
    for sink in (live, sim):
        sink.synced(2, 5)
        sink.failed(1, RuntimeError("lost"), rejoining=True)
    assert [events.get_nowait() for _ in range(2)] == sim._events == [
        Synced(2, 5), Failed(1, "RuntimeError: lost", True)]
    live.finished(3, [7, 8])
    sim.finished(3, [7, 8])
    assert events.get_nowait() == Finished(3, (7, 8)) and sim._finished == {3: [7, 8]}


def test_an_instance_state_is_built_by_name_only():
    with pytest.raises(TypeError):
        InstanceState(0, 1, 2, 3, 4, 8, False)  # a new figure must not shift the others
    state = InstanceState.starting(3, num_slots=8)
    assert (state.instance, state.version, state.num_slots, state.alive) == (3, -1, 8, True)


class _Instance:
    def __init__(self, state):
        self.id, self.state = state.instance, state

    def snapshot(self):
        return self.state


class _NoRewards:
    def poll(self):
        return []


def test_the_threaded_driver_hands_the_core_each_live_instance_state_as_reported():
    alive = InstanceState(instance=0, version=2, running=1, queued=0, kv_tokens=9, num_slots=4,
                          syncing=False, idle_s=1.5)
    dead = InstanceState(instance=1, version=2, running=0, queued=0, kv_tokens=0, num_slots=4,
                         syncing=False, alive=False)
    driver = ThreadedDriver(None, TrajectoryServer(), None, _NoRewards(), None, tick_s=0.0)
    driver.instances = [_Instance(alive), _Instance(dead)]
    events = driver._gather()
    assert len(events) == 1 and events[0] is alive


def test_the_server_record_extends_the_payload_the_engine_is_handed():
    server = TrajectoryServer()
    [t] = server.add_group(0, 5, [1, 2, 3], 1, 8, 0)
    server.route(t, 0)
    assert server.try_start(t) and server.report(t, [4], [-0.5], [-0.4], [0], None)
    record = server.record(t)
    assert isinstance(record, TrajectoryRecord) and isinstance(record, Trajectory)
    payload = Trajectory.of(record)
    assert type(payload) is Trajectory
    assert (payload.trajectory_id, payload.tokens, payload.versions) == (t, [4], [0])
    np.testing.assert_array_equal(payload.prompt, [1, 2, 3])
    record.tokens.append(9)  # a copy: the server's own record does not grow with it
    assert server.record(t).tokens == [4]
