"""The run's rollouts, one class for every deployment: the coordinator core, the trajectory
server, the reward pool, the data cursor and the threaded driver, built here once; where the
instances run and how weights reach them come in as two constructor arguments.

    Rollouts(c, policy, data, instances, parameters)
      instances:  an InstanceSet, the backend: threads on this host's meshes
                  (asyncrl.drivers.local.LocalInstances) or Ray actors
                  (asyncrl.distributed.rollouts.RayInstances); it attaches its instances
                  to the driver and adds its own figures
      parameters: where the trainer's versions go (the driver pushes each one there): a
                  ParameterServer, or the Ray transport's WeightPublisher

The run picks a backend by name (asyncrl.run.rollouts_for); checkpoints, accounting and the
figures mean the same in both.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from asyncrl.coordinator.admission import StaleFlow
from asyncrl.coordinator.build import RunShape, build_core
from asyncrl.coordinator.core import Core
from asyncrl.coordinator.records import PromptSource
from asyncrl.coordinator.messages import Published
from asyncrl.drivers.threaded import ThreadedDriver
from asyncrl.policy import Policy, PromptStream
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.train.checkpoint import ResumeData


class WeightStore(Protocol):
    """Where published versions go: `push` after each train step, and the latencies of the
    pushes and of the instances' pulls."""

    push_seconds: Sequence[float]
    pull_seconds: Sequence[float]

    def push(self, version: int, params) -> None: ...


class InstanceSet(Protocol):
    """A rollout backend: the instances, wherever they run, as the driver sees them."""

    # The instances decode on the CPU, whose cores the trainer computes on too.
    shared_cores: bool

    def attach(self, driver: ThreadedDriver) -> None:
        """Adds the instances to `driver.instances`, reporting to `driver.reporter`, writing
        to `driver.server` and pulling from `driver.parameters`. Once, before `start`."""

    def figures(self, instances: Sequence[Any]) -> dict[str, float]:
        """The backend's own figures, beside those every backend has."""

    def pids(self, instances: Sequence[Any]) -> list[int | None]:
        """Each instance's process id (None until it has one)."""

    def stopping(self) -> None:
        """Before the driver stops: nothing may join it any more."""

    def close(self) -> None:
        """After the driver stopped, or when the rollouts' build failed: whatever the
        backend holds (a transport, a cluster) goes."""


class Rollouts:
    def __init__(self, spec, policy: Policy, data, instances: InstanceSet,
                 parameters: WeightStore):
        """`spec`: the run's (asyncrl.config.RunSpec). Owns `instances` from here on: a build
        that fails closes it, as `stop` does."""
        self.reward, self.policy, self.task, self.cursor = (spec.task.reward, policy, data.train,
                                                             data.cursor)
        self.instance_set, self.parameters = instances, parameters
        self.max_len = spec.rollout.max_len
        self.server = TrajectoryServer()
        with contextlib.ExitStack() as undo:  # a failed build undoes what it built, last first
            undo.callback(instances.close)
            self.rewards = spec.rewards.pool()
            undo.callback(self.rewards.close)
            prompts = PromptStream(policy, spec.task, spec.rollout.prompt_bucket, data.train,
                                   data.cursor)
            self.core = core_from_config(spec, self.server, prompts,
                                         shared_cores=instances.shared_cores)
            # What a user should know about the run's lead before its first step (the run
            # shows it above the progress bar); None: nothing beyond the config.
            admission, self.lead_note = self.core.admission, None
            if isinstance(admission, StaleFlow) and admission.lead == "auto" \
                    and admission.shared_cores:
                self.lead_note = ("staleness.lead=auto: the trainer and the rollout instances "
                                  "share this host's CPU cores, so new rollouts start one batch "
                                  "ahead at most (lag 1); --config.staleness.lead=max starts "
                                  "them as far ahead as η allows")
            self.driver = ThreadedDriver(self.core, self.server, parameters, self.rewards,
                                         self._reward_request,
                                         stall_timeout_s=spec.rollout.stall_timeout_s)
            instances.attach(self.driver)
            undo.pop_all()

    @property
    def instances(self) -> list:
        return self.driver.instances

    def _reward_request(self, trajectory_id: int) -> tuple[str, str, dict[str, Any]]:
        record = self.server.record(trajectory_id)
        answer = self.task[record.prompt_id].answer
        return self.reward, self.policy.decode(record.tokens), {"answer": answer}

    # ---------------------------------------------------------------- running

    def start(self, params, version: int) -> None:
        """Publishes the starting weights, then starts the instances and the coordinator."""
        self.parameters.push(version, params)
        self.driver.events.put(Published(version))
        self.driver.start()

    def wait_batch(self, version: int, timeout_s: float, stop_requested):
        return self.driver.wait_batch(version, timeout_s, stop_requested)

    def publish(self, version: int, params) -> None:
        self.driver.publish(version, params)

    def stop(self) -> None:
        try:
            self.instance_set.stopping()  # first: no instance joins a stopping driver
            self.driver.stop()
            self.rewards.close()
        finally:
            self.instance_set.close()

    def pids(self) -> list[int | None]:
        """Each instance's process id, once started (tests kill one)."""
        return self.instance_set.pids(self.instances)

    # ---------------------------------------------------------------- checkpoints

    def resume_data(self) -> ResumeData:
        """Everything beside the TrainState a resume needs, as of one consistent moment."""
        with self.driver.paused():
            meta, arrays = self.server.state_dict()
            return ResumeData({"cursor": self.cursor.state_dict()}, self.core.state_dict(),
                              meta, arrays)

    def restore(self, resume: ResumeData) -> None:
        """Rewinds to a checkpoint's state; before `start`."""
        self.cursor.load_state_dict(resume.data_state["cursor"])
        self.server.load_state_dict(resume.trajectories, resume.trajectory_arrays)
        self.core.load_state_dict(resume.coordinator)

    # ---------------------------------------------------------------- figures

    def accounting(self) -> dict[str, Any]:
        """Where every dispatched entry ended: a resumed run can prove nothing was lost."""
        with self.driver.paused():
            return {"next_entry_id": self.core.next_entry_id, "version": self.core.version,
                    "unconsumed": sorted(self.server.entries()),
                    "aborted": sorted(self.core.aborted_ids)}

    def figures(self) -> dict[str, float]:
        """Instance idle fractions, the coordinator's counters, push/pull latency and the
        per-part costs a simulator profile is calibrated from; then the backend's own."""
        snapshots = [i.snapshot() for i in self.instances]
        figures = {f"instance{i}_idle_frac": s.idle_s / max(s.idle_s + s.busy_s, 1e-9)
                   for i, s in enumerate(snapshots)}
        figures.update({k: float(v) for k, v in dataclasses.asdict(self.core.counters).items()})
        pulls, pushes = list(self.parameters.pull_seconds), list(self.parameters.push_seconds)
        figures["pull_s_mean"] = float(np.mean(pulls)) if pulls else 0.0
        figures["push_s_mean"] = float(np.mean(pushes)) if pushes else 0.0
        decode_steps = sum(s.decode_steps for s in snapshots)
        figures["decode_step_s_mean"] = sum(s.decode_s for s in snapshots) / max(decode_steps, 1)
        # The counts behind the means since the start: two rows give a window's own means
        # (asyncrl.sim.calibrate leaves the first steps' compiles out that way).
        figures["decode_steps"] = float(decode_steps)
        # A paged cache's pressure: sequences handed back for want of pages, pool in use now.
        figures["kv_preemptions"] = float(sum(s.preemptions for s in snapshots))
        figures["kv_pages_used_frac"] = (sum(s.kv_pages_used for s in snapshots)
                                         / max(sum(s.kv_pages for s in snapshots), 1))
        prefill_tokens = sum(s.prefill_tokens for s in snapshots)
        figures["prefill_s_per_token"] = sum(s.prefill_s for s in snapshots) / max(prefill_tokens, 1)
        figures["prefill_tokens"] = float(prefill_tokens)
        figures.update(self.instance_set.figures(self.instances))
        return figures


def core_from_config(spec, server: TrajectoryServer, prompts: PromptSource, *,
                     shared_cores: bool = False) -> Core:
    """The live run's core: its `coordinator` section, sized by its staleness, train, mesh
    and rollout sections; whether the instances share the trainer's CPU cores, the rollout
    backend knows (`InstanceSet.shared_cores`)."""
    shape = RunShape(eta=spec.staleness.eta, lead=spec.staleness.lead,
                     batch_size=spec.train.batch_size, num_instances=spec.mesh.rollout_instances,
                     num_slots=spec.rollout.num_slots, group_size=spec.rollout.group_size,
                     max_new_tokens=spec.rollout.max_new_tokens, shared_cores=shared_cores)
    return build_core(spec.coordinator, shape, server, prompts)
