"""The global consistency protocol: reserve / occupy / consume over per-version virtual buffers.

Terms (see docs/design.md):
  version   number of training steps done; the trainer next consumes buffer `version`.
  eta       the staleness bound η.
  B         batch_size: entries the trainer consumes per step.
  B'        redundant_batch_size: slots per buffer (B' ≥ B); the surplus is aborted once
            B entries have landed.
  V_traj    the oldest weight version any token of the entry was generated with; fixed at
            dispatch.

The invariant every consumed entry satisfies: V_traj ≤ buffer ≤ V_traj + η.

Reserving at dispatch takes a slot in the *highest* PENDING buffer of the entry's window, the
worst case: however long the entry then runs, a slot at or below that buffer exists for it.
Occupying on completion moves it to the *lowest* PENDING buffer at or below its reservation,
so finished work trains as early as the bound allows. Since an entry never lands later than it
reserved, η holds no matter how long it ran.

The manager is thread-safe: the coordinator reserves and occupies while the trainer consumes.
"""

from __future__ import annotations

import enum
import threading
from typing import Any, Iterable

from asyncrl.staleness.errors import StalenessError

EntryId = int | str

_STATE_FORMAT = 1


class BufferStatus(enum.Enum):
    PENDING = "pending"  # has an EMPTY slot
    READY = "ready"  # B entries occupied: the trainer may consume it
    STUCK = "stuck"  # no EMPTY slot, but some slots only RESERVED: training waits on stragglers
    CONSUMED = "consumed"  # already trained on (buffer id < version)


class _EntryState(enum.Enum):
    RESERVED = "reserved"
    OCCUPIED = "occupied"
    CONSUMED = "consumed"
    ABORTED = "aborted"


class _Entry:
    __slots__ = ("v_traj", "state", "buffer", "ended_at")

    def __init__(self, v_traj: int, state: _EntryState, buffer: int, ended_at: int | None = None):
        self.v_traj = v_traj
        self.state = state
        self.buffer = buffer
        # The trainer version when the entry reached a terminal state; old terminal records
        # are pruned so a long run's state stays small.
        self.ended_at = ended_at


class _Buffer:
    __slots__ = ("reserved", "occupied")

    def __init__(self):
        self.reserved: set[EntryId] = set()
        self.occupied: list[EntryId] = []


class StalenessManager:
    """Per-version virtual buffers enforcing V_traj ≤ buffer ≤ V_traj + η for every entry."""

    def __init__(self, eta: int, batch_size: int, redundant_batch_size: int | None = None):
        _check_int("eta", eta, minimum=0)
        _check_int("batch_size", batch_size, minimum=1)
        if redundant_batch_size is None:
            redundant_batch_size = batch_size
        _check_int("redundant_batch_size", redundant_batch_size, minimum=batch_size)
        self.eta = eta
        self.batch_size = batch_size
        self.redundant_batch_size = redundant_batch_size
        self._version = 0
        # Every V_traj ≤ _dead_version can land in no buffer any more (the abort rule).
        self._dead_version = -1
        self._buffers: dict[int, _Buffer] = {}
        self._entries: dict[EntryId, _Entry] = {}
        self._reserved_by_v_traj: dict[int, set[EntryId]] = {}
        self._aborted_by_rule: list[EntryId] = []
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- queries

    @property
    def version(self) -> int:
        return self._version

    @property
    def min_dispatch_version(self) -> int:
        """The oldest instance version that may still dispatch (abort rule)."""
        return self._dead_version + 1

    def can_reserve(self, v_traj: int) -> bool:
        with self._lock:
            return self._reservable_buffer(v_traj) is not None

    def status(self, buffer_id: int) -> BufferStatus:
        with self._lock:
            if buffer_id < self._version:
                return BufferStatus.CONSUMED
            return self._status(buffer_id)

    def buffer_counts(self, buffer_id: int) -> tuple[int, int]:
        """(reserved, occupied) slot counts of a buffer, for metrics and tests."""
        with self._lock:
            buf = self._buffers.get(buffer_id)
            return (0, 0) if buf is None else (len(buf.reserved), len(buf.occupied))

    def in_flight(self) -> dict[EntryId, tuple[int, int]]:
        """Reserved entries: id -> (V_traj, reserved buffer)."""
        with self._lock:
            return {
                i: (e.v_traj, e.buffer)
                for i, e in self._entries.items()
                if e.state is _EntryState.RESERVED
            }

    def v_traj(self, entry_id: EntryId) -> int:
        with self._lock:
            return self._entry(entry_id).v_traj

    def covered(self, entries: int) -> bool:
        """Whether `entries` entries are on their way to the trainer's next buffers (`version`
        on, as many as they fill): a READY buffer counts B', any other its occupied entries,
        and every entry in flight counts wherever it reserved (its V_traj ≤ `version`, and
        occupy lands it in the lowest PENDING buffer, so entries in flight fill these buffers
        first). (The lead on demand, asyncrl/coordinator/admission/staleflow.py.)"""
        with self._lock:
            full = self.redundant_batch_size
            have = sum(len(buf.reserved) for buf in self._buffers.values())
            for b in range(self._version, self._version - (-entries // full)):
                have += full if self._status(b) is BufferStatus.READY else self._counts(b)[1]
            return have >= entries

    # ---------------------------------------------------------------- protocol

    def reserve(self, entry_id: EntryId, v_traj: int) -> int:
        """Reserves the worst-case slot for an entry dispatched at weight version `v_traj`."""
        with self._lock:
            if not isinstance(entry_id, (int, str)) or isinstance(entry_id, bool):
                raise StalenessError(
                    f"entry {entry_id!r}: ids must be int or str (they are saved as JSON), "
                    f"got {type(entry_id).__name__}"
                )
            if entry_id in self._entries:
                state = self._entries[entry_id].state.value
                raise StalenessError(f"entry {entry_id!r}: reserved twice (it is already {state})")
            _check_int("v_traj", v_traj, minimum=0)
            if v_traj > self._version:
                raise StalenessError(
                    f"entry {entry_id!r}: V_traj {v_traj} is newer than the trainer's version "
                    f"{self._version}; no instance can hold those weights"
                )
            buffer_id = self._reservable_buffer(v_traj)
            if buffer_id is None:
                raise StalenessError(
                    f"entry {entry_id!r}: no PENDING buffer in its window "
                    f"[{v_traj}, {v_traj + self.eta}] (trainer version {self._version}, "
                    f"oldest dispatchable version {self._dead_version + 1}); "
                    f"call can_reserve() first or sync the instance"
                )
            self._buffers.setdefault(buffer_id, _Buffer()).reserved.add(entry_id)
            self._entries[entry_id] = _Entry(v_traj, _EntryState.RESERVED, buffer_id)
            self._reserved_by_v_traj.setdefault(v_traj, set()).add(entry_id)
            return buffer_id

    def rebind(self, entry_id: EntryId, v_traj: int) -> bool:
        """Late binding: a reserved entry none of whose tokens exist yet will be generated by
        weights `v_traj` or newer. Its V_traj moves forward and its reservation stays: the
        reserved buffer is one the trainer has not consumed, so it is ≥ the trainer's
        version ≥ `v_traj`, and ≤ the old V_traj + η < `v_traj` + η, inside the new window
        too. (Moving it to a later buffer instead leaves the earlier one waiting for fresh
        entries, and measured slower.) False, nothing changed, unless it is reserved and
        `v_traj` is newer and no newer than the trainer's version."""
        with self._lock:
            entry = self._entry(entry_id)
            _check_int("v_traj", v_traj, minimum=0)
            if (entry.state is not _EntryState.RESERVED or v_traj <= entry.v_traj
                    or v_traj > self._version or entry.buffer < v_traj):
                return False
            self._reserved_by_v_traj[entry.v_traj].discard(entry_id)
            self._reserved_by_v_traj.setdefault(v_traj, set()).add(entry_id)
            entry.v_traj = v_traj
            return True

    def occupy(self, entry_id: EntryId) -> int:
        """Lands a completed entry (its whole group scored) in the lowest buffer it may use."""
        with self._lock:
            entry = self._entry(entry_id)
            if entry.state is not _EntryState.RESERVED:
                raise StalenessError(
                    f"entry {entry_id!r}: cannot occupy, it is {entry.state.value} "
                    f"(only a reserved entry can be occupied)"
                )
            reserved_buffer = self._buffers[entry.buffer]
            reserved_buffer.reserved.discard(entry_id)
            self._reserved_by_v_traj[entry.v_traj].discard(entry_id)
            # The slot just released makes the reserved buffer PENDING, so a target always exists.
            buffers, full, ready = self._buffers, self.redundant_batch_size, self.batch_size
            for target in range(max(entry.v_traj, self._version), entry.buffer + 1):
                buf = buffers.get(target)
                if buf is None:
                    buf = buffers[target] = _Buffer()
                    break
                occupied = len(buf.occupied)
                if occupied < ready and len(buf.reserved) + occupied < full:
                    break
            buf.occupied.append(entry_id)
            entry.state = _EntryState.OCCUPIED
            entry.buffer = target
            if len(buf.occupied) >= self.batch_size:
                self._on_ready(target, buf)
            return target

    def abort(self, entry_id: EntryId) -> None:
        """The caller gives up a reserved entry; its slot is freed. Aborting twice is a no-op."""
        with self._lock:
            entry = self._entry(entry_id)
            if entry.state is _EntryState.ABORTED:
                return
            if entry.state is not _EntryState.RESERVED:
                raise StalenessError(
                    f"entry {entry_id!r}: cannot abort, it is already {entry.state.value}"
                )
            self._release(entry_id, entry)

    def take_aborted(self) -> list[EntryId]:
        """Ids aborted by the abort rule or by redundancy since the last call."""
        with self._lock:
            taken, self._aborted_by_rule = self._aborted_by_rule, []
            return taken

    def consume(self) -> list[EntryId]:
        """Hands buffer `version` to the trainer and advances the version."""
        with self._lock:
            b = self._version
            status = self._status(b)
            if status is not BufferStatus.READY:
                reserved, occupied = self._counts(b)
                raise StalenessError(
                    f"buffer {b}: cannot consume, it is {status.name} "
                    f"({occupied}/{self.batch_size} occupied, {reserved} reserved)"
                )
            buf = self._buffers.pop(b)
            for entry_id in buf.occupied:
                entry = self._entries[entry_id]
                # The invariant, proven on every step. It cannot fail unless the protocol is broken.
                if not entry.v_traj <= b <= entry.v_traj + self.eta:
                    raise StalenessError(
                        f"entry {entry_id!r}: staleness invariant violated, V_traj "
                        f"{entry.v_traj} consumed from buffer {b} with eta {self.eta}"
                    )
                entry.state = _EntryState.CONSUMED
                entry.ended_at = b
            self._version = b + 1
            self._advance_dead_version()
            self._prune_finished()
            return list(buf.occupied)

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, as plain JSON-serialisable data."""
        with self._lock:
            return {
                "format": _STATE_FORMAT,
                "eta": self.eta,
                "batch_size": self.batch_size,
                "redundant_batch_size": self.redundant_batch_size,
                "version": self._version,
                "dead_version": self._dead_version,
                # Occupation order is kept: it is the order the trainer receives the batch in.
                "buffers": [
                    {"id": b, "occupied": list(buf.occupied)}
                    for b, buf in sorted(self._buffers.items())
                ],
                "entries": [
                    [i, e.v_traj, e.state.value, e.buffer, e.ended_at]
                    for i, e in self._entries.items()
                ],
                "aborted_by_rule": list(self._aborted_by_rule),
            }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "StalenessManager":
        try:
            if state.get("format") != _STATE_FORMAT:
                raise StalenessError(
                    f"staleness state: format {state.get('format')!r}, expected {_STATE_FORMAT}"
                )
            sm = cls(state["eta"], state["batch_size"], state["redundant_batch_size"])
            sm._version = state["version"]
            sm._dead_version = state["dead_version"]
            for item in state["buffers"]:
                sm._buffers.setdefault(item["id"], _Buffer()).occupied = list(item["occupied"])
            for entry_id, v_traj, state_name, buffer_id, ended_at in state["entries"]:
                entry = _Entry(v_traj, _EntryState(state_name), buffer_id, ended_at)
                sm._entries[entry_id] = entry
                if entry.state is _EntryState.RESERVED:
                    sm._buffers.setdefault(buffer_id, _Buffer()).reserved.add(entry_id)
                    sm._reserved_by_v_traj.setdefault(v_traj, set()).add(entry_id)
            sm._aborted_by_rule = list(state["aborted_by_rule"])
        except (KeyError, TypeError, ValueError) as e:
            raise StalenessError(f"staleness state is malformed: {type(e).__name__}: {e}") from e
        return sm

    # ---------------------------------------------------------------- internals

    def _entry(self, entry_id: EntryId) -> _Entry:
        entry = self._entries.get(entry_id)
        if entry is None:
            raise StalenessError(
                f"entry {entry_id!r}: unknown (never reserved, or finished long ago and pruned)"
            )
        return entry

    def _counts(self, b: int) -> tuple[int, int]:
        buf = self._buffers.get(b)
        return (0, 0) if buf is None else (len(buf.reserved), len(buf.occupied))

    def _status(self, b: int) -> BufferStatus:
        buf = self._buffers.get(b)
        if buf is None:
            return BufferStatus.PENDING
        if len(buf.occupied) >= self.batch_size:
            return BufferStatus.READY
        if len(buf.reserved) + len(buf.occupied) < self.redundant_batch_size:
            return BufferStatus.PENDING
        return BufferStatus.STUCK

    def _reservable_buffer(self, v_traj: int) -> int | None:
        if v_traj <= self._dead_version or v_traj > self._version:
            return None
        buffers, full, ready = self._buffers, self.redundant_batch_size, self.batch_size
        # Inlined PENDING test: this loop is the protocol's hot path.
        for b in range(v_traj + self.eta, max(v_traj, self._version) - 1, -1):
            buf = buffers.get(b)
            if buf is None:
                return b
            occupied = len(buf.occupied)
            if occupied < ready and len(buf.reserved) + occupied < full:
                return b
        return None

    def _release(self, entry_id: EntryId, entry: _Entry) -> None:
        self._buffers[entry.buffer].reserved.discard(entry_id)
        self._reserved_by_v_traj[entry.v_traj].discard(entry_id)
        entry.state = _EntryState.ABORTED
        entry.ended_at = self._version

    def _abort_by_rule(self, entry_ids: Iterable[EntryId]) -> None:
        for entry_id in list(entry_ids):
            self._release(entry_id, self._entries[entry_id])
            self._aborted_by_rule.append(entry_id)

    def _on_ready(self, b: int, buf: _Buffer) -> None:
        # Redundancy: B entries landed, the surplus reservations are stragglers to drop.
        if buf.reserved:
            self._abort_by_rule(sorted(buf.reserved, key=str))
        self._advance_dead_version()

    def _window_full(self, v: int) -> bool:
        return all(
            b < self._version or self._status(b) is BufferStatus.READY
            for b in range(v, v + self.eta + 1)
        )

    def _advance_dead_version(self) -> None:
        """The abort rule: once buffers [v, v+η] are all READY (or consumed), V_traj = v is dead.

        The dead versions are kept a prefix (every v ≤ dead_version is dead): an entry at an
        older version could still fill a PENDING buffer below a READY one, and refusing it
        there could leave that buffer waiting forever.
        """
        while self._window_full(self._dead_version + 1):
            self._dead_version += 1
            stranded = self._reserved_by_v_traj.get(self._dead_version)
            if stranded:
                self._abort_by_rule(sorted(stranded, key=str))

    def _prune_finished(self) -> None:
        # An entry that ended more than η + 1 versions ago can take part in no call any more.
        horizon = self._version - self.eta - 2
        if horizon < 0:
            return
        stale = [
            i for i, e in self._entries.items() if e.ended_at is not None and e.ended_at < horizon
        ]
        for entry_id in stale:
            del self._entries[entry_id]
        for v in [v for v, ids in self._reserved_by_v_traj.items() if not ids]:
            del self._reserved_by_v_traj[v]


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise StalenessError(f"{name} must be an int ≥ {minimum}, got {value!r}")
