"""Unit tests of the reserve / occupy / consume protocol, one primitive and state at a time."""

import json

import pytest

from asyncrl.staleness import BufferStatus, StalenessError, StalenessManager


def fill_and_consume(sm: StalenessManager, prefix: str = "warm") -> list:
    """Completes one buffer with entries dispatched at the current version and consumes it."""
    ids = [f"{prefix}{sm.version}-{i}" for i in range(sm.batch_size)]
    for i in ids:
        sm.reserve(i, sm.version)
    for i in ids:
        sm.occupy(i)
    return sm.consume()


def test_worked_example_reserve_high_occupy_low():
    # DESIGN.md: η = 1; six entries reserved at V1 land in buffer 2; the first to finish is
    # occupied into buffer 1.
    sm = StalenessManager(eta=1, batch_size=6)
    fill_and_consume(sm)
    assert sm.version == 1
    assert [sm.reserve(f"e{i}", 1) for i in range(6)] == [2] * 6
    assert sm.status(2) is BufferStatus.STUCK
    assert sm.occupy("e3") == 1
    assert sm.buffer_counts(1) == (0, 1)
    assert sm.buffer_counts(2) == (5, 0)
    assert sm.status(2) is BufferStatus.PENDING


def test_buffer_states_pending_stuck_ready_consumed():
    sm = StalenessManager(eta=0, batch_size=2)
    assert sm.status(0) is BufferStatus.PENDING
    sm.reserve("a", 0)
    sm.reserve("b", 0)
    assert sm.status(0) is BufferStatus.STUCK
    sm.occupy("a")
    assert sm.status(0) is BufferStatus.STUCK
    sm.occupy("b")
    assert sm.status(0) is BufferStatus.READY
    assert sm.consume() == ["a", "b"]
    assert sm.status(0) is BufferStatus.CONSUMED
    assert sm.status(1) is BufferStatus.PENDING


def test_reserve_fills_highest_pending_then_lower():
    sm = StalenessManager(eta=2, batch_size=1)
    assert [sm.reserve(i, 0) for i in range(3)] == [2, 1, 0]
    assert not sm.can_reserve(0)
    with pytest.raises(StalenessError, match=r"entry 3: no PENDING buffer in its window \[0, 2\]"):
        sm.reserve(3, 0)


def test_occupy_never_lands_later_than_reserved():
    sm = StalenessManager(eta=2, batch_size=2)
    assert sm.reserve("slow", 0) == 2
    for i in range(4):
        sm.reserve(i, 0)
    for i in range(4):
        assert sm.occupy(i) in (0, 1)
    assert sm.occupy("slow") == 2


def test_consume_requires_ready_and_goes_in_order():
    sm = StalenessManager(eta=1, batch_size=1)
    sm.reserve("a", 0)  # reserves buffer 1
    sm.reserve("b", 0)  # reserves buffer 0
    with pytest.raises(StalenessError, match=r"buffer 0: cannot consume, it is STUCK"):
        sm.consume()
    # Buffer 0 is held by the straggler "b", so "a" lands in 1; 1 is READY but must wait.
    assert sm.occupy("a") == 1
    assert sm.status(1) is BufferStatus.READY
    with pytest.raises(StalenessError, match=r"buffer 0: cannot consume, it is STUCK"):
        sm.consume()
    assert sm.occupy("b") == 0
    assert sm.consume() == ["b"]
    assert sm.consume() == ["a"]
    assert sm.version == 2


def test_eta_zero_only_same_version():
    sm = StalenessManager(eta=0, batch_size=2)
    fill_and_consume(sm)
    with pytest.raises(StalenessError, match="no PENDING buffer"):
        sm.reserve("old", 0)
    assert sm.reserve("new", 1) == 1


def test_abort_frees_the_slot_and_is_idempotent():
    sm = StalenessManager(eta=0, batch_size=1)
    sm.reserve("a", 0)
    assert not sm.can_reserve(0)
    sm.abort("a")
    sm.abort("a")
    assert sm.can_reserve(0)
    with pytest.raises(StalenessError, match=r"entry 'a': cannot occupy, it is aborted"):
        sm.occupy("a")


def test_abort_rule_aborts_stranded_entries_and_blocks_old_dispatch():
    sm = StalenessManager(eta=1, batch_size=2)
    fill_and_consume(sm)  # version 1
    # Buffers 1 and 2 fill up with entries dispatched at version 1.
    for i in range(4):
        sm.reserve(f"x{i}", 1)
    for i in range(4):
        sm.occupy(f"x{i}")
    assert sm.status(1) is BufferStatus.READY and sm.status(2) is BufferStatus.READY
    # Window [1, 2] is full: version 1 (and 0) can land nowhere any more.
    assert sm.min_dispatch_version == 2
    assert not sm.can_reserve(1)
    assert sm.take_aborted() == []


def test_redundancy_aborts_surplus_when_ready():
    sm = StalenessManager(eta=0, batch_size=2, redundant_batch_size=3)
    for i in "abc":
        sm.reserve(i, 0)
    assert sm.status(0) is BufferStatus.STUCK
    sm.occupy("b")
    sm.occupy("a")
    assert sm.status(0) is BufferStatus.READY
    assert sm.take_aborted() == ["c"]
    assert sm.take_aborted() == []
    with pytest.raises(StalenessError, match=r"entry 'c': cannot occupy, it is aborted"):
        sm.occupy("c")
    assert sm.consume() == ["b", "a"]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda sm: sm.occupy("ghost"), r"entry 'ghost': unknown"),
        (lambda sm: sm.abort(7), r"entry 7: unknown"),
        (lambda sm: sm.reserve("a", 0), r"entry 'a': reserved twice \(it is already reserved\)"),
        (lambda sm: (sm.occupy("a"), sm.occupy("a")), r"entry 'a': cannot occupy, it is occupied"),
        (lambda sm: sm.reserve("n", 3), r"entry 'n': V_traj 3 is newer than the trainer's version 0"),
        (lambda sm: sm.reserve(("t",), 0), r"ids must be int or str"),
        (lambda sm: sm.consume(), r"buffer 0: cannot consume, it is PENDING \(0/4 occupied, 0 reserved\)"),
        (lambda sm: (sm.occupy("a"), sm.abort("a")), r"entry 'a': cannot abort, it is already occupied"),
    ],
)
def test_bad_calls_name_the_entry_and_the_problem(call, message):
    sm = StalenessManager(eta=1, batch_size=4)
    sm.reserve("a", 0)
    with pytest.raises(StalenessError, match=message):
        call(sm)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(eta=-1, batch_size=4), r"eta must be an int ≥ 0, got -1"),
        (dict(eta=1, batch_size=0), r"batch_size must be an int ≥ 1, got 0"),
        (dict(eta=1, batch_size=4, redundant_batch_size=3), r"redundant_batch_size must be an int ≥ 4, got 3"),
        (dict(eta=1.5, batch_size=4), r"eta must be an int ≥ 0, got 1.5"),
    ],
)
def test_bad_construction(kwargs, message):
    with pytest.raises(StalenessError, match=message):
        StalenessManager(**kwargs)


def test_state_dict_round_trips_through_json():
    sm = StalenessManager(eta=2, batch_size=3, redundant_batch_size=4)
    fill_and_consume(sm)
    for i in range(6):
        sm.reserve(i, 1)
    sm.reserve("old", 0)
    sm.occupy(2)
    sm.occupy(4)
    sm.abort(5)
    state = json.loads(json.dumps(sm.state_dict()))
    restored = StalenessManager.from_state_dict(state)
    assert restored.state_dict() == sm.state_dict()
    # The restored manager continues exactly like the original would.
    assert [sm.occupy(i) for i in (0, 1, 3)] == [restored.occupy(i) for i in (0, 1, 3)]
    assert sm.consume() == restored.consume()
    assert sm.take_aborted() == restored.take_aborted()


def test_from_state_dict_rejects_malformed_state():
    with pytest.raises(StalenessError, match="format None, expected 1"):
        StalenessManager.from_state_dict({})
    state = StalenessManager(eta=1, batch_size=1).state_dict()
    del state["entries"]
    with pytest.raises(StalenessError, match="malformed: KeyError"):
        StalenessManager.from_state_dict(state)


def test_finished_entries_are_pruned_so_state_stays_small():
    sm = StalenessManager(eta=1, batch_size=4)
    for _ in range(50):
        fill_and_consume(sm)
    assert len(sm.state_dict()["entries"]) <= 4 * (sm.eta + 3)
