"""The coordinator core against scripted events: no threads, no engine, no clock.

Each test plays the part of a driver: it feeds events, applies nothing, and reads the
commands the core returns, with a TrajectoryServer standing where instances write tokens.
"""

import pytest

from asyncrl.coordinator import build_migration_policy, build_redundancy, build_router, build_sync_policy
from asyncrl.coordinator.admission import build_admission
from asyncrl.coordinator.core import AdmissionMismatch, Core
from asyncrl.coordinator.records import AllInstancesFailed
from asyncrl.coordinator.messages import (BatchReady, Dispatch, Drop, Extract, Extracted, Failed,
                                          Finished, InstanceState, Prompt, Published, Rejoined,
                                          RejoinFailed, Score, Scored, Sync, Synced)
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import StalenessError

GROUP, SLOTS = 2, 8


class Prompts:
    def __init__(self):
        self.next_id = 0

    def __next__(self):
        prompt = self.get(self.next_id)
        self.next_id += 1
        return prompt

    def get(self, prompt_id):
        return Prompt(prompt_id, (1, 2, 3))


def make_core(admission="staleflow", *, instances=2, eta=1, batch=2, router="round_robin",
              migration="none", sync="greedy", **params):
    server = TrajectoryServer()
    core = Core(admission=build_admission(admission, eta=eta, batch_size=batch,
                                          redundant_batch_size=batch,
                                          sync=build_sync_policy(sync), **params),
                server=server, prompts=Prompts(), num_instances=instances, num_slots=SLOTS,
                eta=eta, group_size=GROUP, max_new_tokens=4, router=build_router(router, None),
                redundancy=build_redundancy("none"), migration=build_migration_policy(migration))
    return core, server


def state(i, version=0, running=0, queued=0, syncing=False, steps=0):
    return InstanceState(instance=i, version=version, running=running, queued=queued,
                         kv_tokens=10 * running, num_slots=SLOTS, syncing=syncing,
                         decode_steps=steps)


def of(kind, commands):
    return [c for c in commands if isinstance(c, kind)]


def generate(server, t, instance, tokens=2, version=0, finish="stop"):
    """What an instance does with a dispatched trajectory: start it and report it."""
    assert server.try_start(t, at_step=0)
    n = len(server.record(t).tokens) + tokens
    assert server.report(t, list(range(n)), [-0.5] * n, [-0.5] * n, [version] * n, finish)


def finish_group(core, server, dispatch, reward=1.0, now=0.0):
    """Generates and scores every trajectory of a dispatched group; returns the commands."""
    for t in dispatch.trajectory_ids:
        generate(server, t, dispatch.instance)
    out = core.step(now, [Finished(dispatch.instance, dispatch.trajectory_ids)])
    assert [c.trajectory_id for c in of(Score, out)] == list(dispatch.trajectory_ids)
    return core.step(now, [Scored(t, reward) for t in dispatch.trajectory_ids])


def test_staleflow_dispatches_up_to_the_window_and_announces_a_ready_buffer():
    core, server = make_core(eta=1, batch=2)
    out = core.step(0.0, [state(0), state(1)])
    groups = of(Dispatch, out)
    # η = 1, B = 2: buffers 0 and 1 take 4 entries at version 0, alternating instances.
    assert [(d.instance, d.entry, d.resume) for d in groups] == [
        (0, 0, False), (1, 1, False), (0, 2, False), (1, 3, False)]
    assert all(len(d.trajectory_ids) == GROUP for d in groups)
    assert core.step(0.0, [state(0, queued=4), state(1, queued=4)]) == []  # nothing may land
    # Reserved worst case: entries 0, 1 in buffer 1 (the highest their η allows), 2, 3 in
    # buffer 0. Finished first, 0 and 1 still cannot land lower: buffer 0 has no free slot.
    assert BatchReady(0) not in finish_group(core, server, groups[0])
    finish_group(core, server, groups[1])
    finish_group(core, server, groups[2])
    out = finish_group(core, server, groups[3])
    assert BatchReady(0) in out
    batch = core.take_batch(0)
    assert batch.entries == [2, 3] and batch.staleness == [0, 0]
    assert [len(g) for g in batch.groups] == [GROUP, GROUP]
    assert core.take_batch(1).staleness == [1, 1]  # 0 and 1 waited in buffer 1
    with pytest.raises(StalenessError, match="batch 2 is not ready: buffer 2 is PENDING"):
        core.take_batch(2)


def test_a_failed_instance_has_its_work_resumed_elsewhere_and_counts_once():
    core, server = make_core(eta=1, batch=2)
    groups = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    on_one = [t for d in groups if d.instance == 1 for t in d.trajectory_ids]
    running = on_one[0]
    generate(server, running, 1, finish=None)  # part-way when the instance died: interrupted
    server.route(running, 1)  # ...and re-routed there, then it fails before starting it
    out = core.step(0.0, [Failed(1, "device fault"), state(0, queued=4)])
    resumed = of(Dispatch, out)
    assert sorted(t for d in resumed for t in d.trajectory_ids) == sorted(on_one)
    assert all(d.instance == 0 and d.resume for d in resumed)
    assert core.counters.failed_instances == 1 and core.counters.rerouted_after_failure == 4
    assert server.record(running).tokens == [0, 1]  # its partial tokens are kept
    core.step(0.0, [Failed(1, "the late event of the same failure")])
    assert core.counters.failed_instances == 1
    with pytest.raises(AllInstancesFailed, match="every rollout instance has failed"):
        core.step(0.0, [Failed(0, "the last one")])


def test_migration_moves_queued_work_first_then_the_fewest_tokens_to_the_starving_instance():
    core, server = make_core(eta=0, batch=2, migration="balance")
    groups = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    assert [d.instance for d in groups] == [0, 1]  # η = 0: one buffer of 2, no more entries
    queued_member, started = groups[0].trajectory_ids[1], groups[0].trajectory_ids[0]
    assert server.try_start(started, at_step=2)
    # Instance 0 is overloaded (its snapshot: 1 running, 15 queued), instance 1 starves and
    # may take no new entry: balance moves half the gap, the cheapest first.
    out = core.step(1.0, [state(0, running=1, queued=15, steps=5), state(1)])
    (extract,) = of(Extract, out)
    assert extract.instance == 0 and extract.trajectory_ids == (queued_member, started)
    # The instance hands them back: the running one with its 3 tokens, the queued one as is.
    assert server.report(started, [7, 8, 9], [-0.5] * 3, [-0.5] * 3, [0] * 3, None)
    out = core.step(1.5, [Extracted(0, extract.trajectory_ids), state(0), state(1)])
    assert {(d.instance, d.trajectory_ids, d.resume) for d in of(Dispatch, out)} == {
        (1, (started,), True), (1, (queued_member,), True)}
    assert core.counters.migrated == 2 and server.record(started).migrations == 1
    assert server.record(started).tokens == [7, 8, 9]


def test_an_extraction_the_failed_instance_never_answered_is_not_taken_for_a_later_migration():
    core, _ = make_core(eta=0, batch=2, migration="balance")
    first, _ = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    out = core.step(1.0, [state(0, running=0, queued=16, steps=5), state(1)])
    (extract,) = of(Extract, out)
    assert extract.instance == 0 and set(extract.trajectory_ids) <= set(first.trajectory_ids)
    # Instance 0 dies before handing them back: its work resumes on instance 1.
    out = core.step(1.1, [Failed(0, "device fault"), state(1)])
    assert {t for d in of(Dispatch, out) for t in d.trajectory_ids} == set(first.trajectory_ids)
    # Later that entry is extracted from instance 1 for another reason: not a migration.
    core.extract_entry(first.entry)
    (again,) = of(Extract, core.step(1.2, [state(1, queued=4)]))
    assert again.instance == 1
    core.step(1.3, [Extracted(1, again.trajectory_ids), state(1)])
    assert core.counters.migrated == 0


def test_a_failed_reward_aborts_the_group_where_it_runs_and_retries_the_prompt():
    core, server = make_core(eta=1, batch=2)
    groups = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    first = groups[0]
    generate(server, first.trajectory_ids[0], 0)
    server.try_start(first.trajectory_ids[1], at_step=0)  # the other member still runs
    core.step(0.0, [Finished(0, first.trajectory_ids[:1])])
    out = core.step(0.0, [Scored(first.trajectory_ids[0], None, "timeout"), state(0), state(1)])
    assert Drop(0, first.trajectory_ids[1:]) in out  # only where it runs, only what is live
    retried = of(Dispatch, out)
    assert len(retried) == 1 and server.prompt_id(retried[0].entry) == 0  # the same prompt
    assert core.counters.reward_failures == 1 and core.aborted_ids == [0]


def test_entries_the_protocol_aborts_are_dropped_on_the_instance_holding_them():
    # Batch redundancy (B' = 2 slots, B = 1): once one entry lands, the other is surplus.
    server = TrajectoryServer()
    core = Core(admission=build_admission("staleflow", eta=0, batch_size=1, redundant_batch_size=2,
                                          sync=build_sync_policy("greedy")),
                server=server, prompts=Prompts(), num_instances=2, num_slots=SLOTS, eta=0,
                group_size=GROUP, max_new_tokens=4, router=build_router("round_robin", None))
    first, second = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    assert (first.instance, second.instance) == (0, 1)
    server.try_start(second.trajectory_ids[0], at_step=0)
    out = finish_group(core, server, first)
    assert BatchReady(0) in out and Drop(1, second.trajectory_ids) in out
    assert core.aborted_ids == [second.entry] and not server.has_entry(second.entry)


def test_barrier_at_eta_zero_trains_each_batch_with_the_weights_it_was_generated_with():
    core, server = make_core("barrier", eta=0, batch=2)
    out = core.step(0.0, [state(0), state(1)])
    batch0 = of(Dispatch, out)
    assert len(batch0) == 2  # exactly B: no more until the batch is trained and loaded
    for d in batch0:
        out = finish_group(core, server, d)
    assert BatchReady(0) in out and core.take_batch(0).staleness == [0, 0]
    assert of(Dispatch, core.step(0.0, [state(0), state(1)])) == []  # waits for weights 1
    out = core.step(0.0, [Published(1)])
    assert of(Sync, out) == [Sync(0), Sync(1)]  # every instance at once
    assert of(Dispatch, core.step(0.0, [Synced(0, 1), state(0, version=1)])) == []
    out = core.step(0.0, [Synced(1, 1), state(1, version=1)])
    assert [core.server.v_traj(d.entry) for d in of(Dispatch, out)] == [1, 1]


def test_token_bucket_trains_the_earliest_submitted_and_waits_for_the_update():
    core, server = make_core("token_bucket", eta=1, batch=2, instances=1)
    out = core.step(0.0, [state(0)])
    groups = of(Dispatch, out)
    assert len(groups) == 4  # (η + version + 1)·B = 4 admitted
    for d in reversed(groups[1:]):  # finished in reverse submission order
        finish_group(core, server, d)
    assert core.take_batch(0).entries == [1, 2]  # the earliest submitted among the finished
    finish_group(core, server, groups[0])
    core.step(0.0, [state(0)])
    assert not core.batch_ready(1)  # weights 1 are not loaded yet
    assert of(Sync, core.step(0.0, [Published(1)])) == [Sync(0)]
    out = core.step(0.0, [Synced(0, 1), state(0, version=1)])
    batch = core.take_batch(1)
    assert batch.entries == [0, 3] and batch.staleness == [1, 1]


def test_state_dict_resumes_partial_and_generated_work():
    core, server = make_core(eta=1, batch=2)
    groups = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    partial, done = groups[0].trajectory_ids
    generate(server, partial, 0, finish=None)
    generate(server, done, 0)
    core.step(0.0, [Finished(0, (done,))])
    meta, arrays = server.state_dict()
    saved = core.state_dict()

    again, again_server = make_core(eta=1, batch=2)
    again_server.load_state_dict(meta, arrays)
    again.load_state_dict(saved)
    out = again.step(0.0, [state(0), state(1)])
    assert Score(done) in out  # generated, never scored: scored again
    resumed = {t for d in of(Dispatch, out) if d.resume for t in d.trajectory_ids}
    assert partial in resumed and again_server.record(partial).tokens == [0, 1]
    assert again.next_entry_id == core.next_entry_id == 4
    assert not any(d.entry < 4 and not d.resume for d in of(Dispatch, out))  # none re-created


def test_responses_the_reward_raised_on_are_counted_and_the_count_survives_a_resume():
    core, server = make_core(eta=1, batch=2)
    (dispatch, *_) = of(Dispatch, core.step(0.0, [state(0)]))
    first, second = dispatch.trajectory_ids[:2]
    for t in (first, second):
        generate(server, t, 0)
    core.step(0.0, [Scored(first, 0.0, "TimeoutError: parsing took over 5 s"), Scored(second, 1.0)])
    assert core.counters.reward_errors == 1 and core.counters.reward_failures == 0
    meta, arrays = server.state_dict()
    saved = core.state_dict()
    again, again_server = make_core(eta=1, batch=2)
    again_server.load_state_dict(meta, arrays)
    again.load_state_dict(saved)
    assert again.counters.reward_errors == 1


def test_a_checkpoint_of_another_admission_is_refused_naming_both():
    # A run resumed anyway (--resume_anyway) under another schedule: the barrier's
    # bookkeeping is not StaleFlow's, and a KeyError from deep inside would say nothing.
    core, server = make_core(eta=1, batch=2)
    core.step(0.0, [state(0)])
    meta, arrays = server.state_dict()
    saved = core.state_dict()
    barrier, barrier_server = make_core("barrier", eta=1, batch=2)
    barrier_server.load_state_dict(meta, arrays)
    with pytest.raises(AdmissionMismatch, match=r"written by StaleFlow, this config's "
                                                r"coordinator.admission runs Barrier"):
        barrier.load_state_dict(saved)


def test_barrier_over_sampling_trains_the_first_b_and_recycles_the_rest_into_the_next_batch():
    core, server = make_core("barrier", eta=1, batch=2, over_sampling=2.0, recycle=True)
    launched = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    assert len(launched) == 4  # 2·B entries for batch 0
    for t in launched[3].trajectory_ids:
        server.try_start(t, at_step=0)  # a straggler, still running when batch 0 is complete
    finish_group(core, server, launched[0])
    out = finish_group(core, server, launched[2])
    assert BatchReady(0) in out
    # The batch is complete: the surplus stops; its partial rollouts are handed back, kept.
    assert [d.instance for d in launched] == [0, 1, 0, 1]
    assert of(Extract, out) == [Extract(1, launched[1].trajectory_ids),
                                Extract(1, launched[3].trajectory_ids)]
    assert core.take_batch(0).entries == [0, 2]
    assert core.counters.aborted_entries == 0  # recycled, not dropped


def test_barrier_over_sampling_without_recycling_drops_the_surplus_where_it_runs():
    core, server = make_core("barrier", eta=1, batch=2, over_sampling=2.0, recycle=False)
    launched = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    for t in launched[3].trajectory_ids:
        server.try_start(t, at_step=0)  # a straggler, still running when batch 0 is complete
    finish_group(core, server, launched[0])
    out = finish_group(core, server, launched[2])
    assert BatchReady(0) in out
    # The admission only decides (it reads the core through a view it cannot act on); the
    # core drops the surplus on the instance holding it, counts it and never trains it.
    assert of(Drop, out) == [Drop(1, launched[1].trajectory_ids),
                             Drop(1, launched[3].trajectory_ids)]
    assert core.counters.aborted_entries == 2 and core.aborted_ids == [1, 3]
    assert core.take_batch(0).entries == [0, 2]
    view = core.admission.view
    assert not any(hasattr(view, name) for name in ("abort_entry", "extract_entry", "server"))
    with pytest.raises(AttributeError):
        view.version = 5


def test_token_bucket_with_drop_stale_drops_what_fell_out_of_the_window():
    # ROLL: before step v, entries with V_traj < v - η are dropped, running or finished.
    core, server = make_core("token_bucket", eta=1, batch=1, instances=1, drop_stale=True)
    first, straggler = of(Dispatch, core.step(0.0, [state(0)]))  # (η + 0 + 1)·B = 2 at v0
    for t in straggler.trajectory_ids:
        server.try_start(t, at_step=0)
    finish_group(core, server, first)
    assert core.take_batch(0).staleness == [0]
    core.step(0.0, [Published(1), state(0)])
    (fresh,) = of(Dispatch, core.step(0.0, [Synced(0, 1), state(0, version=1)]))
    finish_group(core, server, fresh)
    assert core.take_batch(1).entries == [fresh.entry]  # the straggler (v0) is still in the window
    core.step(0.0, [Published(2), state(0, version=1)])
    out = core.step(0.0, [Synced(0, 2), state(0, version=2)])
    out += core.step(0.0, [state(0, version=2)])
    assert Drop(0, straggler.trajectory_ids) in out  # V_traj 0 < 2 - 1: out of the window
    assert straggler.entry in core.aborted_ids


def test_a_bounded_admission_that_breaks_the_bound_is_caught_at_consume():
    core, server = make_core("barrier", eta=0, batch=1, instances=1)
    (d,) = of(Dispatch, core.step(0.0, [state(0)]))
    finish_group(core, server, d)
    core.admission.scored[1] = core.admission.scored.pop(0)  # a broken admission: wrong batch
    core.version = 1
    core.admission.updated = 1
    with pytest.raises(StalenessError, match="V_traj 0 consumed at version 1 breaks the bound"):
        core.take_batch(1)


def test_per_response_dispatch_spreads_a_group_over_instances():
    server = TrajectoryServer()
    core = Core(admission=build_admission("staleflow", eta=2, batch_size=2, redundant_batch_size=2,
                                          sync=build_sync_policy("greedy")),
                server=server, prompts=Prompts(), num_instances=2, num_slots=SLOTS, eta=2,
                group_size=2, max_new_tokens=4, router=build_router("least_loaded", None),
                dispatch="per_response")
    commands = core.step(0.0, [state(0), state(1)])
    for entry in range(2):
        # Least-loaded places the two responses on the two instances, one each.
        placed = [d for d in of(Dispatch, commands) if d.entry == entry]
        assert sorted((d.instance, len(d.trajectory_ids)) for d in placed) == [(0, 1), (1, 1)]
        for d in placed:
            assert [server.instance_of(t) for t in d.trajectory_ids] == [d.instance]
    with pytest.raises(ValueError, match="registered: group, per_response"):
        Core(admission=build_admission("staleflow", eta=1, batch_size=1, redundant_batch_size=1,
                                       sync=build_sync_policy("greedy")),
             server=TrajectoryServer(), prompts=Prompts(), num_instances=1, num_slots=SLOTS,
             eta=1, group_size=2, max_new_tokens=4, router=build_router("least_loaded", None),
             dispatch="per_group")


def _late_core(binding):
    server = TrajectoryServer()
    core = Core(admission=build_admission("staleflow", eta=1, batch_size=1, redundant_batch_size=1,
                                          sync=build_sync_policy("greedy")),
                server=server, prompts=Prompts(), num_instances=1, num_slots=SLOTS, eta=1,
                group_size=GROUP, max_new_tokens=4, router=build_router("least_loaded", None),
                binding=binding)
    return core, server


@pytest.mark.parametrize("binding", ["dispatch", "late"])
def test_late_binding_moves_v_traj_forward_until_a_response_starts(binding):
    core, server = _late_core(binding)
    # B = 1, η = 1: entry 0 reserves buffer 1, entry 1 buffer 0; both queue on instance 0.
    first, second = of(Dispatch, core.step(0.0, [state(0)]))
    for t in second.trajectory_ids:  # entry 1 runs, finishes and is scored: batch 0 trains
        generate(server, t, 0)
    core.step(1.0, [Finished(0, second.trajectory_ids)])
    core.step(2.0, [Scored(t, 1.0) for t in second.trajectory_ids])
    core.take_batch(0)
    # Entry 0 never started: once the instance holds version 1, late binding moves it there.
    core.step(3.0, [Published(1), Synced(0, 1), state(0, version=1, queued=2)])
    late = binding == "late"
    assert server.v_traj(first.entry) == (1 if late else 0) and core.rebound == int(late)


def test_a_started_response_pins_v_traj_under_late_binding():
    core, server = _late_core("late")
    first, second = of(Dispatch, core.step(0.0, [state(0)]))
    for t in second.trajectory_ids:
        generate(server, t, 0)
    core.step(1.0, [Finished(0, second.trajectory_ids)])
    core.step(2.0, [Scored(t, 1.0) for t in second.trajectory_ids])
    core.take_batch(0)
    assert server.try_start(first.trajectory_ids[0], at_step=0)
    core.step(3.0, [Published(1), Synced(0, 1), state(0, version=1, running=1, queued=1)])
    assert server.v_traj(first.entry) == 0 and core.rebound == 0


def test_the_manager_rebinds_only_forward():
    from asyncrl.staleness import StalenessManager
    sm = StalenessManager(eta=1, batch_size=1)
    sm.reserve("a", 0)
    assert not sm.rebind("a", 0)  # not newer
    assert not sm.rebind("a", 1)  # version 1 does not exist yet (the trainer is at 0)
    sm.occupy("a")
    sm.consume()
    sm.reserve("b", 0)
    assert sm.rebind("b", 1) and sm.v_traj("b") == 1  # its reservation (buffer 1) stays
    assert sm.occupy("b") == 1  # never below its V_traj


# ---------------------------------------------------------------------------- rejoin


class Instances:
    """Plays the instances: each generates what it is given at once, with the weights it
    holds, and checks that no token is older than its entry's V_traj."""

    def __init__(self, core, server, held):
        self.core, self.server, self.held = core, server, held  # instance -> version it holds
        self.alive, self.floor = set(held), {}  # floor: the version an instance must hold for work
        self.events, self.batches, self.given = [], [], {i: [] for i in held}

    def apply(self, commands):
        for c in commands:
            if isinstance(c, Dispatch):
                v = self.held[c.instance]
                assert c.instance in self.alive, f"work for dead instance {c.instance}"
                assert v >= self.floor.get(c.instance, 0) and v >= self.server.v_traj(c.entry)
                for t in c.trajectory_ids:
                    generate(self.server, t, c.instance, version=v)
                self.given[c.instance].append(c)
                self.events.append(Finished(c.instance, c.trajectory_ids))
            elif isinstance(c, Sync):
                self.held[c.instance] = self.core.latest_version
                self.events.append(Synced(c.instance, self.held[c.instance]))
            elif isinstance(c, Score):
                self.events.append(Scored(c.trajectory_id, float(c.trajectory_id % 3)))
            elif isinstance(c, BatchReady):
                self.batches.append(self.core.take_batch(c.version))
                self.events.append(Published(c.version + 1))

    def step(self, *extra):
        events, self.events = [*self.events, *extra, *(state(i, self.held[i]) for i in sorted(self.alive))], []
        out = self.core.step(0.0, events)
        self.apply(out)
        return out

    def until_version(self, version):
        for _ in range(100):
            if self.core.version >= version:
                return
            self.step()
        raise AssertionError(f"stuck before batch {version}: {self.core.describe_wait(self.core.version)}")


def test_a_rejoined_instance_starts_empty_and_gets_work_only_on_the_newest_weights():
    eta = 2  # V_traj 1 could still land at version 2: only the rejoin's pull keeps it off 1
    core, server = make_core(eta=eta, batch=2)
    play = Instances(core, server, {0: 0, 1: 0})
    first = core.step(0.0, [state(0), state(1)])
    lost = sorted(t for d in of(Dispatch, first) if d.instance == 1 for t in d.trajectory_ids)
    play.apply([c for c in first if not (isinstance(c, Dispatch) and c.instance == 1)])
    play.alive.discard(1)  # killed before it ran anything: its work goes to instance 0
    out = play.step(Failed(1, "kill -9", rejoining=True))
    assert sorted(t for d in of(Dispatch, out) if d.resume for t in d.trajectory_ids) == lost
    assert all(d.instance == 0 for d in of(Dispatch, out))
    assert core.counters.failed_instances == 1
    assert core.counters.rerouted_after_failure == len(lost) > 0
    play.until_version(2)

    # Its fresh actor pulled version 1 at its start; version 2 was published (the event is
    # heard in this step, before the rejoin): it must pull 2 before it is given anything
    # (`play` checks each dispatch against `floor`).
    assert [e for e in play.events if isinstance(e, Published)] == [Published(2)]
    play.held[1], play.floor[1] = 1, 2
    play.alive.add(1)
    out = play.step(Rejoined(1, 1))
    assert core.latest_version == 2 and Sync(1) in out
    assert 1 not in core.dead and core.counters.rejoined_instances == 1
    assert not [d for d in of(Dispatch, out) if d.instance == 1]
    before = len(play.given[1])
    play.until_version(6)
    assert len(play.given[1]) > before, "the rejoined instance was never given work"
    assert core.counters.failed_instances == 1 and core.counters.rejoined_instances == 1

    # Every entry consumed once, or still in flight, or aborted; each within η, and no token
    # from weights older than its entry's V_traj.
    consumed = [e for b in play.batches for e in b.entries]
    assert len(consumed) == len(set(consumed)) == 6 * 2
    assert set(consumed) | set(server.entries()) | set(core.aborted_ids) == set(range(core.next_entry_id))
    for batch in play.batches:
        for v, group in zip(batch.v_traj, batch.groups):
            assert v <= batch.version <= v + eta
            assert all(min(r.versions) >= v for r in group)


def test_the_run_waits_for_a_restart_when_every_instance_is_down_and_ends_if_none_comes():
    core, server = make_core(instances=1, eta=1, batch=2)
    play = Instances(core, server, {0: 0})
    first = core.step(0.0, [state(0)])
    held = sorted(t for d in of(Dispatch, first) for t in d.trajectory_ids)
    play.alive.discard(0)
    assert play.step(Failed(0, "kill -9", rejoining=True)) == []  # waiting, not failing
    assert "0 of 1 instances alive (1 restarting)" in core.describe_wait(0)
    play.alive.add(0)
    out = play.step(Rejoined(0, 0))
    assert sorted(t for d in of(Dispatch, out) if d.resume for t in d.trajectory_ids) == held
    play.until_version(2)
    with pytest.raises(ValueError, match="rollout instance 0 rejoined, but the coordinator has no failure"):
        core.step(0.0, [Rejoined(0, 2)])
    play.alive.discard(0)
    core.step(0.0, [Failed(0, "kill -9 again", rejoining=True)])
    with pytest.raises(AllInstancesFailed, match="every rollout instance has failed and none is "
                       "restarting; the last: restarts spent"):
        core.step(0.0, [RejoinFailed(0, "restarts spent")])


def test_lead_auto_starts_only_the_work_that_feeds_the_trainer():
    core, server = make_core(eta=2, batch=2, lead="auto")
    groups = of(Dispatch, core.step(0.0, [Published(0), state(0), state(1)]))
    # `max` would start (η + 1)·B = 6 entries; `auto` covers the trainer's next buffer only.
    assert len(groups) == 2
    for d in groups:
        finish_group(core, server, d)
    assert core.take_batch(0).staleness == [0, 0]
    # Step 0 trains (10 s): the next buffer is filled with weights 0, at lag 1.
    groups = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    assert len(groups) == 2
    for d in groups:
        finish_group(core, server, d)
    out = core.step(10.0, [Published(1)])  # batch 1 was ready when the step ended: fed
    assert not of(Dispatch, out) and sorted(s.instance for s in of(Sync, out)) == [0, 1]
    assert core.take_batch(1).staleness == [1, 1]
    # Weights 1 exist: nothing starts on weights 0, however free those instances are.
    assert not of(Dispatch, core.step(10.0, [state(0), state(1)]))
    late = of(Dispatch, core.step(10.0, [Synced(0, 1), Synced(1, 1)]))
    assert len(late) == 2 and {server.v_traj(d.entry) for d in late} == {1}

    def wait_for_batch(version, published_at, waited_s):
        """Step `version` − 1 ends before its batch is ready (its entries, dispatched at
        weights `version` − 1, run on): the trainer waits, and work at the newest weights
        starts beside them, one buffer more; it finishes first and fills the batch (lag 0),
        the stragglers moving on to the next (reserved there: `version` − 1 + η)."""
        out = core.step(published_at, [Published(version), state(0, version=version - 1, queued=2),
                                       state(1, version=version - 1, queued=2)])
        assert core.admission.lead_entries == 2 and not of(Dispatch, out)  # not yet synced
        fresh = of(Dispatch, core.step(published_at, [Synced(0, version), Synced(1, version)]))
        assert len(fresh) == 2 and {server.v_traj(d.entry) for d in fresh} == {version}
        for d in fresh:
            finish_group(core, server, d, now=published_at + waited_s)
        assert core.take_batch(version).staleness == [0, 0]

    def stragglers_land(dispatched, version, at):
        for d in dispatched:
            finish_group(core, server, d, now=at)
        core.step(at, [Published(version)])  # the batch was ready when the step ended
        assert core.take_batch(version).staleness == [2, 2]  # within η
        return of(Dispatch, core.step(at, [Synced(0, version), Synced(1, version)]))

    # Step 1 took 10 s; a 1 s wait is the price of lag 1: the lead stays one buffer.
    wait_for_batch(2, published_at=20.0, waited_s=1.0)
    assert core.admission.lead_entries == 2
    late = stragglers_land(late, 3, at=31.0)
    assert len(late) == 2
    # Step 3 took 10 s again and the trainer then waits 4 s: the lead grows by a buffer.
    wait_for_batch(4, published_at=41.0, waited_s=4.0)
    assert core.admission.lead_entries == 4
    assert core.admission.state_dict()["lead_entries"] == 4
    # A checkpoint of the longer lead resumed on a CPU keeps to one buffer.
    resumed, _ = make_core(eta=2, batch=2, lead="auto", shared_cores=True)
    resumed.admission.load_state_dict(core.admission.state_dict())
    assert resumed.admission.lead_entries == 2


def test_lead_auto_on_a_cpu_holds_one_buffer_and_starts_nothing_more_while_the_trainer_waits():
    # The instances decode on the cores the trainer computes on: work added in flight would
    # slow the step (or the stragglers) the trainer waits for.
    core, server = make_core(eta=2, batch=2, lead="auto", shared_cores=True)
    for d in of(Dispatch, core.step(0.0, [Published(0), state(0), state(1)])):
        finish_group(core, server, d)
    core.take_batch(0)
    stragglers = of(Dispatch, core.step(0.0, [state(0), state(1)]))
    assert len(stragglers) == 2
    core.step(10.0, [Published(1), state(0, queued=2), state(1, queued=2)])  # the trainer waits
    assert not of(Dispatch, core.step(10.0, [Synced(0, 1), Synced(1, 1)]))
    for d in stragglers:  # a wait as long as the step: on accelerators the lead would grow
        finish_group(core, server, d, now=20.0)
    assert core.take_batch(1).staleness == [1, 1]
    assert core.admission.lead_entries == 2


def test_lead_is_checked_by_name():
    with pytest.raises(ValueError, match="lead must be one of 'auto', 'max', got 'min'"):
        make_core(lead="min")
