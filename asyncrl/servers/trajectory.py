"""TrajectoryServer: every trajectory's payload outside the engines.

Because prompt, tokens, both log-probs and the weight version of each token live here, an
engine can be interrupted at any decode step and the trajectory resumed on any eligible
instance by re-prefilling prompt + tokens so far; and a checkpoint holds every finished and
partial trajectory, so a resumed run neither loses nor repeats work.

An *entry* (the unit the staleness protocol reserves, occupies and consumes) is one prompt's
group of G trajectories. Its V_traj is fixed at dispatch and never rises: a partial rollout
finished on newer weights keeps the oldest version.

Thread-safe: rollout instance threads append segments while the coordinator routes and the
trainer consumes.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Sequence

import numpy as np

from asyncrl.records import Trajectory
from asyncrl.staleness import IllegalTransition, LifecycleTracker, TrajectoryState

_S = TrajectoryState
_STATE_FORMAT = 1


# The payload is the engine's own record (`asyncrl.records.Trajectory`), extended, not copied
# field by field: a field added to the payload reaches the engine, the server and a resume.
@dataclasses.dataclass(kw_only=True)
class TrajectoryRecord(Trajectory):
    entry_id: int
    prompt_id: int
    reward: float | None = None
    instance: int | None = None  # where it runs or last ran
    # The instance's decode-step count when it last started running: with the instance's
    # current count, how many tokens it has now (a migration moves the cheapest).
    started_at_step: int = 0
    interruptions: int = 0
    migrations: int = 0


@dataclasses.dataclass
class _Group:
    prompt_id: int
    v_traj: int
    members: list[int]


class TrajectoryServer:
    def __init__(self):
        self._records: dict[int, TrajectoryRecord] = {}
        self._groups: dict[int, _Group] = {}
        self._lifecycle = LifecycleTracker()
        self._held: dict[int, set[int]] = {}  # instance -> trajectories routed to or running on it
        self._next_trajectory_id = 0
        self._lock = threading.RLock()

    # ---------------------------------------------------------------- groups

    def add_group(self, entry_id: int, prompt_id: int, prompt: Sequence[int], group_size: int,
                  max_new_tokens: int, v_traj: int) -> list[int]:
        """Registers a prompt's group; returns the G new trajectory ids."""
        with self._lock:
            if entry_id in self._groups:
                raise IllegalTransition(f"entry {entry_id!r}: added twice")
            if group_size < 1:
                raise ValueError(f"entry {entry_id!r}: group_size must be ≥ 1, got {group_size}")
            prompt_array = np.asarray(prompt, dtype=np.int32)
            ids = list(range(self._next_trajectory_id, self._next_trajectory_id + group_size))
            self._next_trajectory_id += group_size
            for trajectory_id in ids:
                self._records[trajectory_id] = TrajectoryRecord(
                    trajectory_id=trajectory_id, entry_id=entry_id, prompt_id=prompt_id,
                    prompt=prompt_array, max_new_tokens=max_new_tokens)
                self._lifecycle.add(trajectory_id)
            self._groups[entry_id] = _Group(prompt_id, v_traj, ids)
            return ids

    def members(self, entry_id: int) -> list[int]:
        with self._lock:
            return list(self._group(entry_id).members)

    def v_traj(self, entry_id: int) -> int:
        with self._lock:
            return self._group(entry_id).v_traj

    def rebind(self, entry_id: int, v_traj: int) -> None:
        """Late binding: the entry's V_traj moves forward (none of its tokens exist yet)."""
        with self._lock:
            group = self._group(entry_id)
            if v_traj < group.v_traj:
                raise ValueError(f"entry {entry_id}: V_traj may only move forward "
                                 f"({group.v_traj} → {v_traj})")
            group.v_traj = v_traj

    def entries(self) -> list[int]:
        with self._lock:
            return list(self._groups)

    def group_rewarded(self, entry_id: int) -> bool:
        """True once every member is scored: the entry may be occupied."""
        with self._lock:
            return all(self._lifecycle.state(t) is _S.REWARDED for t in self._group(entry_id).members)

    def occupy(self, entry_id: int) -> None:
        with self._lock:
            for t in self._group(entry_id).members:
                self._move(t, _S.OCCUPIED)

    def consume(self, entry_id: int) -> list[TrajectoryRecord]:
        """Hands the group to the trainer and forgets it."""
        with self._lock:
            group = self._groups.pop(entry_id)
            records = []
            for t in group.members:
                self._move(t, _S.CONSUMED)
                self._lifecycle.forget(t)
                records.append(self._records.pop(t))
            return records

    def abort(self, entry_id: int) -> list[tuple[int, int]]:
        """Drops a group (abort rule, redundancy, failed reward, no-signal filter).

        Returns (trajectory, instance) for the members an instance still holds: the caller
        must stop them there.
        """
        with self._lock:
            group = self._groups.pop(entry_id)
            return [held for t in group.members if (held := self._drop(t)) is not None]

    def drop_members(self, entry_id: int, trajectory_ids: Sequence[int]) -> list[tuple[int, int]]:
        """Drops some members of a group (group redundancy: the surplus responses); returns
        (trajectory, instance) for those an instance still holds."""
        with self._lock:
            group = self._group(entry_id)
            for t in trajectory_ids:
                group.members.remove(t)
            return [held for t in trajectory_ids if (held := self._drop(t)) is not None]

    def _drop(self, trajectory_id: int) -> tuple[int, int] | None:
        """Aborts and forgets one trajectory; (id, instance) if an instance may still hold it."""
        instance = self._records[trajectory_id].instance
        live = self._lifecycle.state(trajectory_id) in (_S.ROUTED, _S.RUNNING)
        self._move(trajectory_id, _S.ABORTED)
        self._lifecycle.forget(trajectory_id)
        del self._records[trajectory_id]
        return (trajectory_id, instance) if live else None

    def _move(self, trajectory_id: int, state: TrajectoryState) -> None:
        """Every lifecycle transition, keeping the per-instance index of held work."""
        self._lifecycle.transition(trajectory_id, state)
        instance = self._records[trajectory_id].instance
        if state in (_S.ROUTED, _S.RUNNING):
            self._held.setdefault(instance, set()).add(trajectory_id)
        elif instance is not None:
            self._held.get(instance, set()).discard(trajectory_id)

    def held_by(self, instance: int) -> list[int]:
        """Trajectories routed to or running on `instance`, in id order."""
        with self._lock:
            return sorted(self._held.get(instance, ()))

    # ---------------------------------------------------------------- trajectories

    def record(self, trajectory_id: int) -> TrajectoryRecord:
        """A copy of the trajectory as it stands (safe to read while it keeps growing)."""
        with self._lock:
            return self._records[trajectory_id].copy()

    def state(self, trajectory_id: int) -> TrajectoryState:
        return self._lifecycle.state(trajectory_id)

    def has(self, trajectory_id: int) -> bool:
        """False once the trajectory is consumed or aborted."""
        with self._lock:
            return trajectory_id in self._records

    def has_entry(self, entry_id: int) -> bool:
        with self._lock:
            return entry_id in self._groups

    def entry_of(self, trajectory_id: int) -> int:
        with self._lock:
            return self._records[trajectory_id].entry_id

    def prompt_id(self, entry_id: int) -> int:
        with self._lock:
            return self._group(entry_id).prompt_id

    def instance_of(self, trajectory_id: int) -> int | None:
        with self._lock:
            return self._records[trajectory_id].instance

    def reward(self, trajectory_id: int) -> float | None:
        with self._lock:
            return self._records[trajectory_id].reward

    def progress(self, trajectory_id: int) -> tuple[TrajectoryState, int, int, int]:
        """(state, prompt tokens, tokens generated as last reported, the instance's decode
        step when it last started running), without copying the token lists."""
        with self._lock:
            r = self._records[trajectory_id]
            return (self._lifecycle.state(trajectory_id), len(r.prompt), len(r.tokens),
                    r.started_at_step)

    def in_state(self, state: TrajectoryState) -> list[int]:
        return self._lifecycle.in_state(state)

    def route(self, trajectory_id: int, instance: int) -> None:
        with self._lock:
            record = self._records[trajectory_id]
            previous = self._lifecycle.state(trajectory_id)
            if previous is _S.ROUTED and record.instance is not None:
                self._held.get(record.instance, set()).discard(trajectory_id)
            if previous is _S.INTERRUPTED and record.instance not in (None, instance):
                record.migrations += 1
            record.instance = instance
            self._move(trajectory_id, _S.ROUTED)

    def try_start(self, trajectory_id: int, at_step: int = 0) -> bool:
        """An instance starts generating it at its decode step `at_step`; False if it is gone
        (its entry was aborted) or no longer routed there (it was extracted meanwhile)."""
        with self._lock:
            if trajectory_id not in self._records or self._lifecycle.state(trajectory_id) is not _S.ROUTED:
                return False
            self._records[trajectory_id].started_at_step = at_step
            self._move(trajectory_id, _S.RUNNING)
            return True

    def append(self, trajectory_id: int, tokens: Sequence[int], logprobs: Sequence[float],
               policy_logprobs: Sequence[float], versions: Sequence[int]) -> None:
        """Adds a segment of generated tokens, each with its log-probs and weight version."""
        if not len(tokens) == len(logprobs) == len(policy_logprobs) == len(versions):
            raise ValueError(
                f"trajectory {trajectory_id}: segment fields differ in length (tokens "
                f"{len(tokens)}, logprobs {len(logprobs)}, policy_logprobs "
                f"{len(policy_logprobs)}, versions {len(versions)})")
        with self._lock:
            if self._lifecycle.state(trajectory_id) is not _S.RUNNING:
                raise IllegalTransition(
                    f"trajectory {trajectory_id}: segment appended while "
                    f"{self._lifecycle.state(trajectory_id).name}, not RUNNING")
            record = self._records[trajectory_id]
            record.tokens.extend(int(t) for t in tokens)
            record.logprobs.extend(float(x) for x in logprobs)
            record.policy_logprobs.extend(float(x) for x in policy_logprobs)
            record.versions.extend(int(v) for v in versions)

    def report(self, trajectory_id: int, tokens: Sequence[int], logprobs: Sequence[float],
               policy_logprobs: Sequence[float], versions: Sequence[int],
               finish_reason: str | None) -> bool:
        """An instance hands back a RUNNING trajectory, whole (every token so far, those the
        server already holds from before a resume included), then GENERATED (with a finish
        reason) or INTERRUPTED (None: it stopped part-way, to resume elsewhere). The server
        keeps the tokens it has and appends the rest.

        Atomic, and False if the trajectory is gone or no longer running there: an abort or
        an extraction may race with the report.
        """
        with self._lock:
            if (trajectory_id not in self._records
                    or self._lifecycle.state(trajectory_id) is not _S.RUNNING):
                return False
            held = len(self._records[trajectory_id].tokens)
            if len(tokens) < held:
                raise IllegalTransition(
                    f"trajectory {trajectory_id}: reported {len(tokens)} tokens, fewer than the "
                    f"{held} it already had")
            self.append(trajectory_id, tokens[held:], logprobs[held:], policy_logprobs[held:],
                        versions[held:])
            if finish_reason is None:
                self.interrupt(trajectory_id)
            else:
                self.finish(trajectory_id, finish_reason)
            return True

    def interrupt(self, trajectory_id: int) -> None:
        with self._lock:
            self._move(trajectory_id, _S.INTERRUPTED)
            self._records[trajectory_id].interruptions += 1

    def finish(self, trajectory_id: int, finish_reason: str) -> None:
        with self._lock:
            self._move(trajectory_id, _S.GENERATED)
            self._records[trajectory_id].finish_reason = finish_reason

    def set_reward(self, trajectory_id: int, reward: float) -> None:
        with self._lock:
            self._move(trajectory_id, _S.REWARDED)
            self._records[trajectory_id].reward = float(reward)

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(JSON metadata, flat arrays): every live trajectory, finished or partial, no pickles.

        Token-level fields of all trajectories are concatenated into flat arrays; each record's
        metadata holds its offset and length into them.
        """
        with self._lock:
            meta, offset = [], 0
            prompts, token_fields = [], {k: [] for k in ("tokens", "logprobs", "policy_logprobs", "versions")}
            prompt_offset = 0
            for t, r in self._records.items():
                n = len(r.tokens)
                meta.append({
                    "trajectory_id": t, "entry_id": r.entry_id, "prompt_id": r.prompt_id,
                    "state": self._lifecycle.state(t).value, "max_new_tokens": r.max_new_tokens,
                    "prompt": [prompt_offset, len(r.prompt)], "tokens": [offset, n],
                    "finish_reason": r.finish_reason, "reward": r.reward, "instance": r.instance,
                    "interruptions": r.interruptions, "migrations": r.migrations,
                })
                prompts.append(r.prompt)
                prompt_offset += len(r.prompt)
                offset += n
                for k, values in token_fields.items():
                    values.extend(getattr(r, k))
            json_state = {
                "format": _STATE_FORMAT,
                "next_trajectory_id": self._next_trajectory_id,
                "groups": [[e, g.prompt_id, g.v_traj, g.members] for e, g in self._groups.items()],
                "trajectories": meta,
            }
            arrays = {
                "prompts": np.concatenate(prompts) if prompts else np.zeros(0, np.int32),
                "tokens": np.asarray(token_fields["tokens"], np.int32),
                # float64 so a restore gives back exactly the floats that were saved.
                "logprobs": np.asarray(token_fields["logprobs"], np.float64),
                "policy_logprobs": np.asarray(token_fields["policy_logprobs"], np.float64),
                "versions": np.asarray(token_fields["versions"], np.int32),
            }
            return json_state, arrays

    @classmethod
    def from_state_dict(cls, json_state: dict[str, Any],
                        arrays: dict[str, np.ndarray]) -> "TrajectoryServer":
        if json_state.get("format") != _STATE_FORMAT:
            raise ValueError(f"trajectory state: format {json_state.get('format')!r}, "
                             f"expected {_STATE_FORMAT}")
        server = cls()
        try:
            server._next_trajectory_id = json_state["next_trajectory_id"]
            for entry_id, prompt_id, v_traj, members in json_state["groups"]:
                server._groups[entry_id] = _Group(prompt_id, v_traj, list(members))
            for m in json_state["trajectories"]:
                p0, pn = m["prompt"]
                t0, tn = m["tokens"]
                if p0 + pn > len(arrays["prompts"]) or t0 + tn > len(arrays["tokens"]):
                    raise ValueError(f"trajectory {m['trajectory_id']} points past the saved arrays")
                record = TrajectoryRecord(
                    trajectory_id=m["trajectory_id"], entry_id=m["entry_id"],
                    prompt_id=m["prompt_id"],
                    prompt=np.asarray(arrays["prompts"][p0:p0 + pn], np.int32),
                    max_new_tokens=m["max_new_tokens"],
                    tokens=arrays["tokens"][t0:t0 + tn].tolist(),
                    logprobs=arrays["logprobs"][t0:t0 + tn].tolist(),
                    policy_logprobs=arrays["policy_logprobs"][t0:t0 + tn].tolist(),
                    versions=arrays["versions"][t0:t0 + tn].tolist(),
                    finish_reason=m["finish_reason"], reward=m["reward"], instance=m["instance"],
                    interruptions=m["interruptions"], migrations=m["migrations"])
                server._records[record.trajectory_id] = record
                server._restore_lifecycle(record.trajectory_id, _S(m["state"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"trajectory state is malformed: {type(e).__name__}: {e}") from e
        return server

    def load_state_dict(self, json_state: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Replaces everything this server holds with a checkpoint's state (in place: the
        coordinator, the instances and the driver keep their reference)."""
        restored = type(self).from_state_dict(json_state, arrays)
        with self._lock:
            self._records, self._groups = restored._records, restored._groups
            self._lifecycle, self._held = restored._lifecycle, restored._held
            self._next_trajectory_id = restored._next_trajectory_id

    def _restore_lifecycle(self, trajectory_id: int, state: TrajectoryState) -> None:
        # Replays a legal path to the saved state, so the tracker's rules hold after a restore.
        # No engine holds anything after a restore: ROUTED and RUNNING work comes back
        # INTERRUPTED, to be resumed from its saved tokens.
        path = {
            _S.PENDING: [], _S.ROUTED: [_S.ROUTED, _S.INTERRUPTED],
            _S.RUNNING: [_S.ROUTED, _S.RUNNING, _S.INTERRUPTED],
            _S.INTERRUPTED: [_S.ROUTED, _S.RUNNING, _S.INTERRUPTED],
            _S.GENERATED: [_S.ROUTED, _S.RUNNING, _S.GENERATED],
            _S.REWARDED: [_S.ROUTED, _S.RUNNING, _S.GENERATED, _S.REWARDED],
            _S.OCCUPIED: [_S.ROUTED, _S.RUNNING, _S.GENERATED, _S.REWARDED, _S.OCCUPIED],
        }[state]
        self._lifecycle.add(trajectory_id)
        for step in path:
            self._lifecycle.transition(trajectory_id, step)

    def _group(self, entry_id: int) -> _Group:
        group = self._groups.get(entry_id)
        if group is None:
            raise IllegalTransition(f"entry {entry_id!r}: unknown to the trajectory server")
        return group
