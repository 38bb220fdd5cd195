"""Rollouts in this process: an engine per rollout mesh, each driven by its own thread, the
trajectory and parameter servers, the reward pool and the coordinator core, wired together.

    trainer ──publish v──► ParameterServer ──pull──► RolloutInstance[i] (own mesh, thread)
       ▲                                                  │ tokens        │ events
       │ wait_batch                                       ▼               ▼
    ThreadedDriver ◄── Core (admission, routing, sync, migration) ◄── TrajectoryServer, rewards
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from asyncrl.coordinator.build import core_from_config
from asyncrl.coordinator.messages import Published
from asyncrl.drivers.threaded import ThreadedDriver
from asyncrl.model import ShardingRules, graphdef_for, shardings_for
from asyncrl.policy import Policy, PromptStream
from asyncrl.rewards import RewardPool
from asyncrl.rollout.engine import Engine, KVOptions
from asyncrl.rollout.instance import RolloutInstance
from asyncrl.model.sampling import SamplingParams
from asyncrl.servers.parameters import ParameterServer
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.train.checkpoint import ResumeData


class LocalRollouts:
    def __init__(self, c, policy: Policy, meshes, data):
        self.c, self.policy, self.task, self.cursor = c, policy, data.train, data.cursor
        self.server = TrajectoryServer()
        self.parameters = ParameterServer()
        self.rewards = RewardPool(c.rewards.workers, c.rewards.timeout_s,
                                  plugins=tuple(c.rewards.plugins))
        self.core = core_from_config(c, self.server, PromptStream(c, policy, data.train, data.cursor))
        self.driver = ThreadedDriver(self.core, self.server, self.parameters, self.rewards,
                                     self._reward_request)
        graphdef, rules = graphdef_for(policy.config), ShardingRules.replicated()
        sampling = SamplingParams.of_rollout(c.rollout)
        self.max_len = c.rollout.prompt_bucket + c.rollout.max_new_tokens
        kv = KVOptions.of_rollout(c.rollout)
        for i, mesh in enumerate(meshes):
            engine = Engine(graphdef, policy.config, num_slots=c.rollout.num_slots,
                            max_len=self.max_len, prompt_buckets=(c.rollout.prompt_bucket,),
                            sampling=sampling, seed=c.seed, mesh=mesh, rules=rules,
                            **kv.engine_kwargs())
            shardings = shardings_for(policy.params, mesh, rules)

            def pull(newer_than, instance=i, shardings=shardings):
                return self.parameters.pull(instance, shardings, newer_than=newer_than)

            self.driver.instances.append(RolloutInstance(
                i, engine, pull, self.server, self.driver.reporter,
                partial_rollout=c.coordinator.partial_rollout, preemption=kv.preemption))

    @property
    def instances(self) -> list[RolloutInstance]:
        return self.driver.instances

    def _reward_request(self, trajectory_id: int) -> tuple[str, str, dict[str, Any]]:
        record = self.server.record(trajectory_id)
        answer = self.task[record.prompt_id].answer
        return self.c.task.reward, self.policy.decode(record.tokens), {"answer": answer}

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
        self.driver.stop()
        self.rewards.close()

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
        per-part costs a simulator profile is calibrated from."""
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
        return figures
