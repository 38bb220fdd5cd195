import io
import json
import threading

import numpy as np
import pytest

from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import IllegalTransition, TrajectoryState as S


def run_segment(server, t, tokens, version, instance=0):
    server.route(t, instance)
    assert server.try_start(t)
    server.append(t, tokens, [-0.5] * len(tokens), [-0.4] * len(tokens), [version] * len(tokens))


def test_partial_trajectory_survives_interruption_and_migration():
    server = TrajectoryServer()
    (t,) = server.add_group(entry_id=7, prompt_id=3, prompt=[1, 2, 3], group_size=1,
                            max_new_tokens=16, v_traj=4)
    run_segment(server, t, [10, 11], version=4, instance=0)
    server.interrupt(t)
    run_segment(server, t, [12], version=5, instance=1)  # resumed elsewhere on newer weights
    server.finish(t, "stop")
    record = server.record(t)
    assert record.tokens == [10, 11, 12]
    assert record.versions == [4, 4, 5]
    assert (record.interruptions, record.migrations, record.instance) == (1, 1, 1)
    assert server.v_traj(7) == 4  # V_traj stays the oldest version


def test_group_occupies_only_when_every_member_is_rewarded():
    server = TrajectoryServer()
    ids = server.add_group(0, 0, [5], group_size=3, max_new_tokens=4, v_traj=0)
    for i, t in enumerate(ids):
        run_segment(server, t, [i], version=0)
        server.finish(t, "length")
        assert not server.group_rewarded(0)
        server.set_reward(t, float(i))
    assert server.group_rewarded(0)
    server.occupy(0)
    records = server.consume(0)
    assert [r.reward for r in records] == [0.0, 1.0, 2.0]
    assert server.entries() == []


def test_abort_returns_members_still_held_with_their_instance():
    server = TrajectoryServer()
    a, b, c = server.add_group(1, 1, [5], group_size=3, max_new_tokens=4, v_traj=0)
    run_segment(server, a, [1], version=0, instance=2)
    server.route(b, 1)  # queued there, never started
    assert server.held_by(2) == [a] and server.held_by(1) == [b]
    assert server.abort(1) == [(a, 2), (b, 1)]  # c was never routed: nobody holds it
    assert server.held_by(2) == server.held_by(1) == []
    with pytest.raises(IllegalTransition, match="entry 1: unknown"):
        server.members(1)


def test_an_instance_reports_whole_trajectories_and_the_server_keeps_what_it_had():
    server = TrajectoryServer()
    (t,) = server.add_group(0, 0, [5], group_size=1, max_new_tokens=8, v_traj=0)
    run_segment(server, t, [1, 2], version=0)
    server.interrupt(t)
    server.route(t, 1)
    assert server.try_start(t, at_step=40)
    # Resumed elsewhere: the instance reports every token, the old two included.
    assert server.report(t, [1, 2, 3], [-0.5, -0.5, -0.1], [-0.4, -0.4, -0.2], [0, 0, 1], "stop")
    record = server.record(t)
    assert (record.tokens, record.versions, record.started_at_step) == ([1, 2, 3], [0, 0, 1], 40)
    assert server.state(t) is S.GENERATED and server.held_by(1) == []
    # A late report of a trajectory no longer running there (extracted, finished) is refused.
    assert not server.report(t, [1, 2, 3, 4], [0.0] * 4, [0.0] * 4, [1] * 4, "stop")
    assert server.progress(t) == (S.GENERATED, 1, 3, 40)


def test_only_a_routed_trajectory_can_start():
    server = TrajectoryServer()
    (t,) = server.add_group(0, 0, [5], group_size=1, max_new_tokens=8, v_traj=0)
    assert not server.try_start(t)  # pending: routed nowhere yet
    server.route(t, 0)
    server.interrupt(t)  # handed back from the queue before it started
    assert not server.try_start(t)


def test_illegal_use_is_refused():
    server = TrajectoryServer()
    (t,) = server.add_group(0, 0, [5], group_size=1, max_new_tokens=4, v_traj=0)
    with pytest.raises(IllegalTransition, match=f"trajectory {t}: segment appended while PENDING"):
        server.append(t, [1], [0.0], [0.0], [0])
    with pytest.raises(IllegalTransition, match="illegal transition PENDING -> REWARDED"):
        server.set_reward(t, 1.0)
    server.route(t, 0)
    assert server.try_start(t)
    with pytest.raises(ValueError, match="segment fields differ in length"):
        server.append(t, [1, 2], [0.0], [0.0], [0])
    with pytest.raises(IllegalTransition, match="entry 0: added twice"):
        server.add_group(0, 0, [5], group_size=1, max_new_tokens=4, v_traj=0)


def test_state_round_trips_through_json_and_npz_with_running_work_interrupted():
    server = TrajectoryServer()
    g0 = server.add_group(0, 10, [1, 2], group_size=2, max_new_tokens=8, v_traj=0)
    g1 = server.add_group(1, 11, [3, 4, 5], group_size=2, max_new_tokens=8, v_traj=1)
    run_segment(server, g0[0], [7, 8], version=0)
    server.finish(g0[0], "stop")
    server.set_reward(g0[0], 1.0)
    run_segment(server, g0[1], [9], version=1)  # still running at the checkpoint
    server.route(g1[0], 1)

    meta, arrays = server.state_dict()
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    restored = TrajectoryServer.from_state_dict(json.loads(json.dumps(meta)), dict(np.load(buffer)))

    for t in g0 + g1:
        before, after = vars(server.record(t)), vars(restored.record(t))
        np.testing.assert_array_equal(after.pop("prompt"), before.pop("prompt"))
        assert after == before
    assert restored.state(g0[0]) is S.REWARDED
    assert restored.state(g0[1]) is S.INTERRUPTED
    assert restored.state(g1[0]) is S.INTERRUPTED
    assert restored.state(g1[1]) is S.PENDING
    assert restored.v_traj(1) == 1
    # New groups continue the id sequence: nothing is reused.
    assert restored.add_group(2, 12, [1], 1, 4, 1) == [max(g0 + g1) + 1]


def test_concurrent_segments_from_many_threads_are_all_kept():
    server = TrajectoryServer()
    ids = server.add_group(0, 0, [1], group_size=8, max_new_tokens=1000, v_traj=0)
    for t in ids:
        server.route(t, 0)
        assert server.try_start(t)

    def stream(t):
        for i in range(200):
            server.append(t, [i], [0.0], [0.0], [0])

    threads = [threading.Thread(target=stream, args=(t,)) for t in ids]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(server.record(t).tokens == list(range(200)) for t in ids)
