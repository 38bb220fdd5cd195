"""The host half of decoding: which trajectory each engine slot holds, which pages, and the
tokens the device has drawn but the host has not read yet.

A rollout instance (and an evaluation) composes an `Engine`, which only holds device state,
with one `Slots`:

    slots = Slots(engine)
    state = engine.init_decode_state()
    state = slots.start(params, state, [Trajectory(7, prompt, 64)], [0], version=3)
    state = slots.step(params, state, version=3)
    finished = slots.pop_finished()

Slot lifecycle:

    EMPTY --start--> RUNNING --(stop token / max_new_tokens / max_len)--> FINISHED
      ^                 |                                                    |
      +---- extract ----+---------- pop_finished / extract / free ----------+

Reading runs one call behind the device: `step` only dispatches and queues its outputs; the
records are brought up to date (one `device_get` for everything queued) by the methods that
read them, so a caller may dispatch several steps before reading any; `pop_finished(behind=1)`
leaves the newest dispatch queued, so the host works while the device computes it.

Paged engines: a sequence takes pages as it grows (`reserve="on_demand"`) or its whole budget's
at start (`"budget"`: partial rollout off, a sequence never moves). Start is admitted by free
pages (`admits`), and a dispatch the pool cannot carry raises OutOfPages until `preempt` hands
sequences back, partial, to resume here or elsewhere.
"""

from __future__ import annotations

import collections
from typing import Sequence

import jax
import numpy as np

from asyncrl.rollout.engine import DecodeState, Engine
from asyncrl.rollout.messages import Trajectory
from asyncrl.rollout.pages import PREEMPTION, OutOfPages, PageTable

RESERVE = ("on_demand", "budget")


class Slots:
    """Host records of one engine's slots, for one decode state at a time."""

    def __init__(self, engine: Engine, *, reserve: str = "on_demand",
                 preemption: str = "newest"):
        if reserve not in RESERVE:
            raise ValueError(f"reserve must be one of {RESERVE}, got {reserve!r}")
        if preemption not in PREEMPTION:
            raise ValueError(f"preemption must be one of {PREEMPTION}, got {preemption!r}")
        self.engine, self.reserve, self.preemption = engine, reserve, preemption
        self.num_slots = engine.num_slots
        self.pages = (None if engine.page_size is None else PageTable(
            engine.num_slots, engine.num_pages, engine.page_size, engine.pages_per_row))
        self._records: list[Trajectory | None] = [None] * engine.num_slots
        # (tokens, logprobs, policy_logprobs, valid, done) on device, owners, version.
        self._pending: collections.deque = collections.deque()

    # -- starting and stepping -------------------------------------------------------------------

    def start(self, params, decode_state: DecodeState, trajectories: Sequence[Trajectory],
              slots: Sequence[int], *, version: int) -> DecodeState:
        """Starts `trajectories` in empty `slots` (donates decode_state): the fresh members of
        a GRPO group, which share their prompt's prefill (and its full pages), or one partial
        trajectory to resume (its prompt and tokens so far prefilled again). Their tokens are
        tagged `version`. The records kept are copies: read them back from `pop_finished` or
        `extract`."""
        slots, trajectories = [int(s) for s in slots], list(trajectories)
        if not trajectories or len(slots) != len(trajectories):
            raise ValueError(f"{len(trajectories)} trajectories for {len(slots)} slots {slots}")
        for s in slots:
            if not 0 <= s < self.num_slots:
                raise ValueError(f"slot {s} out of range [0, {self.num_slots})")
            if self._records[s] is not None:
                raise ValueError(f"slot {s} holds trajectory {self._records[s].trajectory_id}; "
                                 f"pop_finished, extract or free it first")
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots must be distinct, got {slots}")
        first = trajectories[0]
        if any(t.tokens for t in trajectories):
            if len(trajectories) != 1:
                raise ValueError("a partial trajectory resumes alone, not in a group")
            if first.finished:
                raise ValueError(f"trajectory {first.trajectory_id} already finished "
                                 f"({first.finish_reason}); nothing to resume")
        elif not all(np.array_equal(t.prompt, first.prompt) for t in trajectories):
            raise ValueError("a group's members share one prompt")
        records = [t.copy() for t in trajectories]
        sequence = np.concatenate([np.asarray(first.prompt, np.int32),
                                   np.asarray(first.tokens, np.int32)])
        token_index = len(first.tokens)
        budget_left = max(r.max_new_tokens for r in records) - token_index
        if not self.admits(sequence.size, len(records), budget_left):
            raise OutOfPages(f"{self.pages.free} free pages cannot hold a prefix of "
                             f"{sequence.size} positions for {len(records)} sequences beside "
                             f"the running ones; check `admits` first")
        prefix = self.engine.prefill(
            params, sequence, trajectory_ids=[r.trajectory_id for r in records],
            max_new_tokens=[r.max_new_tokens for r in records], token_index=token_index)
        if self.pages is None:
            decode_state = self.engine.insert(prefix, decode_state, slots)
        else:
            shared, private = self.pages.group_pages(prefix.length, len(records))
            decode_state = self.engine.insert(prefix, decode_state, slots,
                                              pages=(shared, private))
            for g, (slot, record) in enumerate(zip(slots, records)):
                limit = self._position_limit(prefix.length, record.max_new_tokens - token_index)
                self.pages.assign(slot, shared + private[g:g + 1], prefix.length, limit)
                if self.reserve == "budget":
                    self.pages.reserve_all(slot)
        for s, record in zip(slots, records):
            self._records[s] = record
        self._pending.append(((prefix.tokens, prefix.logprobs, prefix.policy_logprobs, None,
                               prefix.done), tuple(records), int(version)))
        return decode_state

    def dispatch_kind(self) -> str:
        """What the next `step` runs, as compiled programs go: 'decode', or on pages
        'decode/<columns>' (the page-table columns it will send, `engine.live_width` of the
        table once topped up): a kind not run before compiles first."""
        if self.pages is None:
            return "decode"
        from asyncrl.rollout.engine import pow2_width

        short = self.pages.shortfall(self.engine.decode_steps, self._running_slots())
        held = max((len(p.pages) + short.get(slot, 0) for slot, p in self.pages.slots.items()),
                   default=0)
        return f"decode/{pow2_width(held, self.pages.width)}"

    def step(self, params, decode_state: DecodeState, *, version: int) -> DecodeState:
        """One engine dispatch (its `decode_steps` steps) with `params`; its tokens are tagged
        `version` (donates decode_state). Paged: raises OutOfPages, dispatching nothing, when
        the running sequences' next pages do not fit; `preempt` makes room."""
        table = None
        if self.pages is not None:
            self.pages.top_up(self.engine.decode_steps, self._running_slots())
            table = self.pages.table
        decode_state, result = self.engine.generate(params, decode_state, table)
        outputs = (result.tokens, result.logprobs, result.policy_logprobs, result.valid,
                   result.done)
        self._pending.append((outputs, tuple(self._records), int(version)))
        return decode_state

    # -- pages -----------------------------------------------------------------------------------

    def admits(self, length: int, group: int = 1, budget: int | None = None) -> bool:
        """Whether a prefix of `length` positions for `group` sequences with `budget` tokens
        each to draw fits in the free pages through its first dispatch, beside what the
        running sequences need for their next one. Always True for a contiguous cache."""
        table, engine = self.pages, self.engine
        if table is None:
            return True
        budget = engine.max_new_tokens if budget is None else budget
        full, partial = divmod(length, engine.page_size)
        held = full + (1 if partial else 0)
        ahead = engine.max_len if self.reserve == "budget" else engine.decode_steps
        grow = table.pages_for(min(self._position_limit(length, budget), length + ahead)) - held
        need = full + group * ((1 if partial else 0) + max(grow, 0))
        if need > table.num_pages:  # waiting would never help
            raise OutOfPages(f"a prefix of {length} positions for {group} sequences needs {need} "
                             f"pages through its first dispatch; the pool has {table.num_pages}")
        running = sum(table.shortfall(engine.decode_steps, self._running_slots()).values())
        return need + running <= table.free

    def preempt(self) -> list[Trajectory]:
        """Hands back running sequences, partial, until the next dispatch's pages fit (their
        records: resume them here or elsewhere). Empty when nothing needs to move. Waits for
        the device only when the pages seem short: records not yet read count as running,
        which can only overstate the need."""
        if self.pages is None:
            return []
        if self._pages_short():
            self._sync()
        victims = []
        while self._pages_short():
            running = self._running_slots()
            held = self.pages.slots
            if self.preemption == "newest":
                victim = max(running, key=lambda s: held[s].order)
            else:
                victim = max(running, key=lambda s: len(held[s].pages))
            victims.append(self.extract(victim))
        return victims

    def _pages_short(self) -> bool:
        running = self._running_slots()
        short = sum(self.pages.shortfall(self.engine.decode_steps, running).values())
        return bool(running) and short > self.pages.free

    def kv_pages(self) -> tuple[int, int]:
        """(used, total) pages; a contiguous cache counts one page of max_len per slot."""
        if self.pages is None:
            return sum(r is not None for r in self._records), self.num_slots
        return self.pages.used, self.pages.num_pages

    def _position_limit(self, length: int, budget_left: int) -> int:
        """Positions a sequence prefilled to `length` can ever write (its last token is drawn,
        never fed back)."""
        return min(self.engine.max_len, length + budget_left)

    def _running_slots(self) -> list[int]:
        return [s for s, r in enumerate(self._records) if r is not None and not r.finished]

    # -- records ---------------------------------------------------------------------------------

    def free_slots(self) -> list[int]:
        return [s for s, record in enumerate(self._records) if record is None]

    def records(self) -> list[Trajectory | None]:
        """The record in each slot as of the last read; no device wait (for monitoring)."""
        return list(self._records)

    def running(self) -> dict[int, Trajectory]:
        """slot -> record of every trajectory still generating."""
        self._sync()
        return {s: r for s, r in enumerate(self._records) if r is not None and not r.finished}

    def pop_finished(self, *, behind: int = 0) -> list[Trajectory]:
        """Finished trajectories, in slot order; their slots become free. `behind`=1 leaves
        the newest dispatch unread: called right after `step`, it waits for the dispatch
        before, so the host's work (reading, reporting, refilling) runs while the device
        computes the newest one. A trajectory that finished in the unread dispatch comes
        out of the next call, its slot idle for the dispatch in between."""
        self._sync(behind)
        done = []
        for s, record in enumerate(self._records):
            if record is not None and record.finished:
                done.append(record)
                self._vacate(s)
        return done

    def extract(self, slot: int) -> Trajectory:
        """Removes the trajectory in `slot`, running (then partial) or finished, and returns it."""
        self._sync()
        record = self._records[slot]
        if record is None:
            raise ValueError(f"slot {slot} is empty")
        self._vacate(slot)
        return record

    def free(self, slot: int) -> None:
        """Drops whatever `slot` holds (an aborted trajectory)."""
        self._vacate(slot)

    def _vacate(self, slot: int) -> None:
        # Its pages may go to another sequence at once: dispatches already queued still run
        # before any start that reuses them (each takes the state the previous one returned),
        # and later ones send this row's table empty, so its writes are dropped.
        self._records[slot] = None
        if self.pages is not None:
            self.pages.release_slot(slot)

    def _sync(self, behind: int = 0) -> None:
        """Appends queued dispatches' tokens to their owners' records (one device_get): all,
        or all but the newest `behind` decode dispatches and what was queued after them."""
        read = len(self._pending)
        for _ in range(behind):  # back to before the newest decode dispatch not yet left
            read = next((i for i in range(read - 1, -1, -1) if _is_decode(self._pending[i])),
                        0)
        if read == 0:
            return
        pending = [self._pending.popleft() for _ in range(read)]
        host = jax.device_get([outputs for outputs, _, _ in pending])
        stops = set(self.engine.stop_tokens)
        for outputs, (_, owners, version) in zip(host, pending):
            tokens, logprobs, policy_logprobs, valid, done = outputs
            if valid is None:  # a start's first tokens: one row, every member real
                tokens, logprobs, policy_logprobs, done = (
                    x[None] for x in (tokens, logprobs, policy_logprobs, done))
                valid = np.ones_like(done)
            for step in range(tokens.shape[0]):  # a dispatch's decode steps, in order
                for i, record in enumerate(owners):
                    # Owners are a snapshot from dispatch time: a slot freed or refilled since
                    # then still credits the trajectory that was in it.
                    if record is None or record.finished or not valid[step, i]:
                        continue
                    token = int(tokens[step, i])
                    record.tokens.append(token)
                    record.logprobs.append(float(logprobs[step, i]))
                    record.policy_logprobs.append(float(policy_logprobs[step, i]))
                    record.versions.append(version)
                    if done[step, i]:
                        record.finish_reason = "stop" if token in stops else "length"


def _is_decode(entry) -> bool:
    """A queued decode dispatch, not a start's first tokens (which carry no `valid`)."""
    (_, _, _, valid, _), _, _ = entry
    return valid is not None
