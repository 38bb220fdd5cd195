"""One control flow: a simulated run of a live config takes the live run's decisions.

Both build their core with one builder from one `coordinator` schema
(asyncrl/coordinator/build.py, config.py), so what can still tell them apart is the rest of
the simulator's side: calibrate's mapping of the run config to a sim config (η, lead,
instances, slots, batch, group), the simulator's own TrajectoryServer (made cheaper, its
effects unchanged) and its prompt source. A core is built (a) as the live system builds it
(`core_from_config` on the tiny run config of experiments/grpo.py and its baselines, with the
live TrajectoryServer) and (b) as a simulated run of that config builds it
(`Cluster(simulator_config(...)).core`, with its server). Both are driven by the same seeded
script: a fake cluster that applies their commands and reports back, with an instance
failure, migrations (Extract, then Extracted), aborts (a reward that fails, the abort rule, a
surplus stopped), and a restart from a checkpoint (state_dicts). The command streams must be
identical, for every admission: each takes its own paths through the server.
"""

from __future__ import annotations

import random

import pytest

from asyncrl.config import resolve
from asyncrl.drivers.rollouts import core_from_config
from asyncrl.coordinator.messages import (BatchReady, Dispatch, Drop, Extract, Extracted, Failed,
                                          Finished, InstanceState, Prompt, Published, Score,
                                          Scored, Sync, Synced)
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.sim import calibrate
from asyncrl.sim.cluster import Cluster

PROMPT_LEN = 7
ROUNDS, FAIL_AT, RESTART_AT = 120, 70, 90


class Prompts:
    """Prompt g is PROMPT_LEN tokens, like the simulator's prompts of constant length."""

    def __init__(self):
        self.next_id = 0

    def __iter__(self):
        return self

    def __next__(self) -> Prompt:
        self.next_id += 1
        return self.get(self.next_id - 1)

    def get(self, prompt_id: int) -> Prompt:
        return Prompt(prompt_id, tuple(range(1, PROMPT_LEN + 1)))


def live_core(c):
    server = TrajectoryServer()
    return core_from_config(resolve(c), server, Prompts()), server


def sim_core(c, tmp_path):
    calibration = calibrate.Calibration(
        profile={"name": "test", "model": "-", "hardware": "-", "source": "-",
                 "step_latency": {"a": 0.0, "b": 0.0, "c": 0.01, "d": 0.0, "e": 0.0},
                 "prefill_s_per_token": 1e-4, "instance": {"num_slots": c.rollout.num_slots},
                 "weights_bytes": 0.0,
                 "network": {"weight_bandwidth_bytes_per_s": 1.0, "weight_sync_overhead_s": 0.1},
                 "trainer": {"gpu_s_per_token": 0.0, "step_overhead_s": 1.0},
                 "reward": {"latency_s": 0.0}},
        lengths={"cap": 8, "bins": [[1, 8, 1]]}, prompt_length=float(PROMPT_LEN))
    sim = calibrate.simulator_config(c, calibration, tmp_path, steps=4)
    cluster = Cluster(sim)
    return cluster.core, cluster.server


class FakeCluster:
    """Applies commands to instances that run, finish, hand back and fail as a seeded script
    says, and reports what happened as events. It reads nothing of the core but its commands
    and `take_batch`, so two cores given the same commands see the same events."""

    def __init__(self, core, server, num_instances: int, num_slots: int, seed: int):
        self.core, self.server, self.slots = core, server, num_slots
        self.rng = random.Random(seed)
        self.n = num_instances
        self.version = [0] * num_instances
        self.queued: list[list[int]] = [[] for _ in range(num_instances)]
        self.running: list[list[int]] = [[] for _ in range(num_instances)]
        self.steps = [0] * num_instances
        self.dead: set[int] = set()
        self.latest = 0
        self.events: list = [Published(0)]
        self.scores: list[int] = []
        self.training: list[tuple[int, int]] = []  # (round it publishes at, version)
        self.log: list = []

    def restart(self, core, server) -> None:
        """A resumed run: fresh instances hold nothing; the trainer publishes the weights of
        every batch taken before the checkpoint (it saved them once trained)."""
        self.core, self.server = core, server
        self.queued = [[] for _ in range(self.n)]
        self.running = [[] for _ in range(self.n)]
        self.scores, self.training = [], []
        self.latest = core.version
        self.events = [Published(self.latest)]
        self.events += [Failed(i, "lost before the checkpoint") for i in sorted(self.dead)]

    def step(self, r: int) -> None:
        events, self.events = self.events, []
        for t in self.scores:  # scored one round after Score; one reward fails
            events.append(Scored(t, None, "timeout") if t == 21 else Scored(t, float(t % 3 == 0)))
        self.scores = []
        for due, version in [x for x in self.training if x[0] == r]:
            self.latest = max(self.latest, version)
            events.append(Published(version))
        self.training = [x for x in self.training if x[0] != r]
        if r == FAIL_AT:
            self.dead.add(1)
            self.queued[1], self.running[1] = [], []
            events.append(Failed(1, "RuntimeError: fault injected by the script"))
        for i in range(self.n):
            if i not in self.dead:
                events += self._run(i, r)
        for i in range(self.n):
            if i not in self.dead:
                events.append(InstanceState(
                    instance=i, version=self.version[i], running=len(self.running[i]),
                    queued=len(self.queued[i]), kv_tokens=10 * len(self.running[i]),
                    num_slots=self.slots, syncing=False, decode_steps=self.steps[i]))
        commands = self.core.step(float(r), events)
        self.log += [(r, command) for command in commands]
        for command in commands:
            self._apply(command, r)

    def _run(self, i: int, r: int) -> list:
        """Starts queued work, then finishes some: instance 0 quickly, the others slowly until
        round 40 (so instance 0 starves while 1 holds work, and migration moves some)."""
        while self.queued[i] and len(self.running[i]) < self.slots:
            t = self.queued[i].pop(0)
            if self.server.try_start(t, self.steps[i]):
                self.running[i].append(t)
        self.steps[i] += 1
        share = 0.6 if i == 0 or r > 40 else 0.05
        done = [t for t in self.running[i] if self.rng.random() < share]
        finished = []
        for t in done:
            self.running[i].remove(t)
            k = 1 + t % 4
            if self.server.report(t, [5] * k, [-1.0] * k, [-1.0] * k, [self.version[i]] * k, "stop"):
                finished.append(t)
        return [Finished(i, tuple(finished))] if finished else []

    def _apply(self, command, r: int) -> None:
        i = getattr(command, "instance", None)
        if i is not None and i in self.dead:
            return
        if isinstance(command, Dispatch):
            self.queued[i] += command.trajectory_ids
        elif isinstance(command, Sync):
            self.version[i] = self.latest
            self.events.append(Synced(i, self.latest))
        elif isinstance(command, Extract):
            handed = [t for t in command.trajectory_ids if t in self.queued[i]]
            self.queued[i] = [t for t in self.queued[i] if t not in handed]
            for t in command.trajectory_ids:
                if t in self.running[i]:
                    self.running[i].remove(t)
                    if self.server.report(t, [5], [-1.0], [-1.0], [self.version[i]], None):
                        handed.append(t)
            if handed:
                self.events.append(Extracted(i, tuple(sorted(handed))))
        elif isinstance(command, Drop):
            ids = set(command.trajectory_ids)
            self.queued[i] = [t for t in self.queued[i] if t not in ids]
            self.running[i] = [t for t in self.running[i] if t not in ids]
        elif isinstance(command, Score):
            self.scores.append(command.trajectory_id)
        elif isinstance(command, BatchReady):
            if self.core.batch_ready(command.version):
                self.core.take_batch(command.version)
                self.training.append((r + 3, command.version + 1))


def drive(build, c) -> list[tuple[int, object]]:
    """(round, command) for every command the core issued over the script."""
    core, server = build()
    world = FakeCluster(core, server, c.mesh.rollout_instances, c.rollout.num_slots, seed=5)
    for r in range(ROUNDS):
        if r == RESTART_AT:  # a checkpoint, then a fresh process resumes from it
            state, (meta, arrays) = core.state_dict(), server.state_dict()
            next_prompt = core.prompts.next_id if hasattr(core.prompts, "next_id") else core.prompts._next
            core, server = build()
            server.load_state_dict(meta, arrays)
            core.load_state_dict(state)
            if hasattr(core.prompts, "next_id"):
                core.prompts.next_id = next_prompt
            else:
                core.prompts._next = next_prompt
            world.restart(core, server)
        world.step(r)
    return world.log


def _staleflow(arg):
    # `max`: the script's aborts and drops need the work in flight that η allows.
    from experiments import grpo
    c = grpo.get_config(arg)
    c.staleness.lead = "max"
    return c


def _staleflow_auto(arg):
    from experiments import grpo
    c = grpo.get_config(arg)
    c.staleness.lead = "auto"
    return c


def _verl(arg):
    from experiments import grpo
    c = grpo.get_config(arg)
    c.coordinator.admission = "verl"
    c.coordinator.migration = "none"
    return c


def _slime_without_partial_rollout(arg):
    from experiments.baselines import barrier
    c = barrier.get_config(arg)
    c.coordinator.partial_rollout = False  # the surplus is aborted, not recycled
    return c


def _roll(arg):
    from experiments.baselines import token_bucket
    c = token_bucket.get_config(arg)
    c.coordinator.admission_params.token_bucket.drop_stale = True
    return c


def _baseline(name):
    def get(arg):
        import importlib
        return importlib.import_module(f"experiments.baselines.{name}").get_config(arg)
    return get


CONFIGS = {"staleflow": _staleflow, "staleflow_auto": _staleflow_auto, "sync": _baseline("sync"), "one_step": _baseline("one_step_off"),
           "slime": _baseline("barrier"), "slime_no_partial": _slime_without_partial_rollout,
           "areal": _baseline("token_bucket"), "roll": _roll, "verl": _verl}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_live_and_simulated_cores_issue_the_same_commands(name, tmp_path):
    c = CONFIGS[name]("tiny")
    c.staleness.eta = {"sync": 0, "one_step": 1}.get(name, 1)
    live = drive(lambda: live_core(c), c)
    sim = drive(lambda: sim_core(c, tmp_path), c)
    kinds = {type(command).__name__ for _, command in live}
    # The script's drops (a failed reward while its group runs) need max's work in flight.
    expected = {"Dispatch", "Sync", "Score", "BatchReady"} | ({"Drop"} if name != "staleflow_auto" else set())
    assert expected <= kinds, kinds
    trained = [x.version for r, x in live if isinstance(x, BatchReady)]
    assert len(trained) >= 6 and max(r for r, x in live if isinstance(x, BatchReady)) > RESTART_AT
    assert len(sim) == len(live)
    for k, (a, b) in enumerate(zip(live, sim)):
        assert a == b, f"command {k}: live {a} vs simulated {b}"


def test_the_script_migrates_aborts_and_resumes():
    # What the StaleFlow script exercises; the comparison above is only as strong as this.
    c = CONFIGS["staleflow"]("tiny")
    c.staleness.eta = 1
    log = drive(lambda: live_core(c), c)
    moved = [x for _, x in log if isinstance(x, Extract)]
    resumed = [x for _, x in log if isinstance(x, Dispatch) and x.resume]
    assert moved and any(x.instance == 0 for x in resumed), "no migration to the starving instance"
    assert any(isinstance(x, Drop) for _, x in log)  # the failed reward's group was dropped
    assert not [x for r, x in log if r >= FAIL_AT and isinstance(x, (Dispatch, Sync, Extract))
                and x.instance == 1]  # nothing goes to the failed instance any more
