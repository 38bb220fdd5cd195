"""A speed-measuring test runs alone: the neighbour worker's tests wait for it, and it is not
starved by them."""

import threading
import time

from tests.host_share import host_share


def _enter_after(exclusive: bool, lock_dir, entered: list, hold_s: float = 0.0):
    def body():
        with host_share(exclusive, lock_dir):
            entered.append((exclusive, time.monotonic()))
            time.sleep(hold_s)
    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_shared_tests_overlap_but_wait_for_an_owner(tmp_path):
    entered = []
    with host_share(False, tmp_path):
        neighbour = _enter_after(False, tmp_path, entered)  # two ordinary tests run side by side
        neighbour.join(timeout=5)
        assert len(entered) == 1

        owner = _enter_after(True, tmp_path, entered, hold_s=0.3)
        time.sleep(0.2)
        assert len(entered) == 1  # the owner waits for the test that is running
        late = _enter_after(False, tmp_path, entered)
        time.sleep(0.2)
        assert len(entered) == 1  # and a test arriving after the owner does not jump ahead
    owner.join(timeout=5)
    late.join(timeout=5)
    (owner_in, owner_at), (late_exclusive, late_at) = entered[1:]
    assert owner_in and not late_exclusive
    assert late_at >= owner_at + 0.3  # the late test started only once the owner had finished
