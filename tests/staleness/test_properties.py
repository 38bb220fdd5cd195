"""Property tests: random interleavings of dispatch, completion, aborts, syncs and consumes.

A small model of the system drives the real StalenessManager: instances hold a weight version
no newer than the trainer's, dispatch when the protocol admits it, and entries complete in any
order. Whatever the interleaving, the invariant holds, nothing is consumed twice or lost, and
when every trajectory eventually completes the trainer keeps making progress.
"""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.staleness import BufferStatus, StalenessError, StalenessManager

EXAMPLES = 1000
OPS = ("dispatch", "complete", "abort", "consume", "sync", "checkpoint")


class Harness:
    def __init__(self, eta: int, batch_size: int, redundant: int | None, instances: int):
        self.sm = StalenessManager(eta, batch_size, redundant)
        self.eta = eta
        self.instance_versions = [0] * instances
        self.v_traj: dict[int, int] = {}
        self.in_flight: list[int] = []
        self.occupied: set[int] = set()
        self.consumed: dict[int, int] = {}  # entry -> buffer it trained in
        self.aborted: set[int] = set()
        self.next_id = 0

    # Each action returns whether it changed anything, so the drain loop can detect a stall.
    def dispatch(self, instance: int) -> bool:
        v = self.instance_versions[instance]
        if not self.sm.can_reserve(v):
            return False
        self.sm.reserve(self.next_id, v)
        self.v_traj[self.next_id] = v
        self.in_flight.append(self.next_id)
        self.next_id += 1
        return True

    def complete(self, index: int) -> bool:
        if not self.in_flight:
            return False
        entry = self.in_flight.pop(index % len(self.in_flight))
        buffer_id = self.sm.occupy(entry)
        assert self.v_traj[entry] <= buffer_id <= self.v_traj[entry] + self.eta
        self.occupied.add(entry)
        self.collect_aborted()
        return True

    def abort(self, index: int) -> bool:
        if not self.in_flight:
            return False
        entry = self.in_flight.pop(index % len(self.in_flight))
        self.sm.abort(entry)
        self.aborted.add(entry)
        return True

    def consume(self) -> bool:
        b = self.sm.version
        if self.sm.status(b) is not BufferStatus.READY:
            try:
                self.sm.consume()
            except StalenessError:
                return False
            raise AssertionError(f"buffer {b} was consumed while {self.sm.status(b)}")
        batch = self.sm.consume()
        assert len(batch) == self.sm.batch_size
        for entry in batch:
            assert entry not in self.consumed, f"entry {entry} consumed twice"
            assert entry not in self.aborted, f"aborted entry {entry} consumed"
            assert self.v_traj[entry] <= b <= self.v_traj[entry] + self.eta
            if self.eta == 0:
                assert self.v_traj[entry] == b
            self.occupied.remove(entry)
            self.consumed[entry] = b
        self.collect_aborted()
        return True

    def sync(self, instance: int, target: int) -> bool:
        # An instance pulls some version between its own and the trainer's newest.
        old = self.instance_versions[instance]
        new = old + target % (self.sm.version - old + 1)
        self.instance_versions[instance] = new
        return new != old

    def checkpoint(self) -> bool:
        self.sm = StalenessManager.from_state_dict(json.loads(json.dumps(self.sm.state_dict())))
        return False

    def collect_aborted(self) -> None:
        for entry in self.sm.take_aborted():
            assert entry in self.in_flight, f"abort rule aborted {entry}, which was not in flight"
            self.in_flight.remove(entry)
            self.aborted.add(entry)

    def check_nothing_lost(self) -> None:
        flight = set(self.in_flight)
        for entry in range(self.next_id):
            places = sum(entry in where for where in (self.consumed, self.occupied, self.aborted, flight))
            assert places == 1, f"entry {entry} is in {places} places"
        assert set(self.sm.in_flight()) == flight


configs = st.tuples(
    st.integers(0, 4),  # eta
    st.integers(1, 8),  # batch size
    st.integers(0, 4),  # redundant surplus
    st.integers(1, 4),  # instances
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, data=st.data())
def test_random_interleavings_keep_the_invariant_and_lose_nothing(config, data):
    eta, batch_size, surplus, instances = config
    h = Harness(eta, batch_size, batch_size + surplus if surplus else None, instances)
    ops = data.draw(
        st.lists(
            st.tuples(st.sampled_from(OPS), st.integers(0, 63), st.integers(0, 63)),
            max_size=200,
        )
    )
    for op, a, b in ops:
        if op == "dispatch":
            h.dispatch(a % instances)
        elif op == "complete":
            h.complete(a)
        elif op == "abort" and b % 4 == 0:  # aborts are rarer than completions
            h.abort(a)
        elif op == "consume":
            h.consume()
        elif op == "sync":
            h.sync(a % instances, b)
        elif op == "checkpoint":
            h.checkpoint()
        h.check_nothing_lost()
    assert h.sm.version == len(h.consumed) // batch_size


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, data=st.data())
def test_trainer_always_progresses_when_trajectories_complete(config, data):
    eta, batch_size, surplus, instances = config
    h = Harness(eta, batch_size, batch_size + surplus if surplus else None, instances)
    # A random prefix leaves the system in an arbitrary state (no caller aborts here: an
    # aborted entry is re-dispatched as a new one by the coordinator, which dispatch models).
    for op, a, b in data.draw(
        st.lists(st.tuples(st.sampled_from(OPS[:2] + OPS[3:]), st.integers(0, 63), st.integers(0, 63)), max_size=120)
    ):
        {"dispatch": lambda: h.dispatch(a % instances), "complete": lambda: h.complete(a),
         "consume": h.consume, "sync": lambda: h.sync(a % instances, b),
         "checkpoint": h.checkpoint}[op]()
    # Then the system runs on: instances sync whenever they cannot dispatch, every entry
    # completes, and the trainer consumes whatever is READY. It must reach 3 more versions.
    target = h.sm.version + 3
    order = data.draw(st.lists(st.integers(0, 63), min_size=1, max_size=16))
    for step in range(20 * (eta + 2) * batch_size * 4):
        if h.sm.version >= target:
            break
        progressed = h.consume()
        for i in range(instances):
            if not h.dispatch(i):
                h.instance_versions[i] = h.sm.version  # pull the newest weights
        progressed |= h.complete(order[step % len(order)])
        h.check_nothing_lost()
    assert h.sm.version >= target, (
        f"deadlock at version {h.sm.version}: buffer status {h.sm.status(h.sm.version)}, "
        f"in flight {h.sm.in_flight()}"
    )
