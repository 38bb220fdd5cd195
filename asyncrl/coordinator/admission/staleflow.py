"""StaleFlow's admission: the staleness protocol, with per-instance weight sync.

Lead (`staleness.lead`): how far ahead of the trainer new work starts. η is a cap, not a target.

  max   every version with a reservable slot admits new entries (the paper's schedule): the
        rollout runs as far ahead as η allows, so in a trainer-bound run every batch trains
        η versions late although a lead of one would feed the trainer as well.
  auto  lead on demand: new entries start only while the trainer's next L buffers are not
        covered, L ∈ [1, η + 1] being the lead the run has shown it needs (`lead_entries` = L·B').
          - Covered (`StalenessManager.covered(L·B')`): buffers v .. v + L − 1 (v: the trainer's
            next) hold L · B' entries, counting a READY buffer as B', any other by its
            occupied entries, and every entry in flight wherever it reserved (occupy lands
            each in the lowest PENDING buffer, so work in flight fills buffer v first).
          - A new entry is admitted at V_traj = u only if u ≥ P − (L − 1), P the newest
            published weights: with L = 1 only the newest weights start work.
          - Late batches: when the trainer publishes weights v (its step v − 1 done) and
            buffer v is not READY, the batch is late; how late is the time until it turns
            READY (the driver's `now`), against the step before it.
          - While a batch is late, one buffer more is uncovered: work at the newest weights
            starts beside buffer v's stragglers, and what finishes first fills buffer v
            (occupy takes the lowest PENDING buffer with a slot no entry reserved; with
            η ≥ 2 the stragglers reserved a later one), the stragglers moving on within η.
          - L starts at 1. A batch later than `WAIT_TO_GROW` of the step before it says the
            lead is too short: L += 1. A shorter delay is the price of lag 1 and counts, as
            a batch ready in time does, towards `FED_TO_SHORTEN` in a row, after which
            L −= 1.
          - Shared cores (`shared_cores`: the instances run on the CPU, whose cores the
            trainer computes on too; every device of a CPU run is a share of them): L stays
            1 and nothing more starts while a batch is late. There a late batch does not say
            the lead is short: work added in flight takes its cycles from the trainer's step
            (or from the stragglers it waits for), so it slows training about as much as it
            feeds it. Its price where long-tailed responses leave cores idle, and the tries
            that chose it: docs/results.md, issue 29.
        On accelerators a trainer-bound run thus keeps L = 1: buffer v fills with weights
        v − 1 while step v − 1 trains, lag 1, a long-tailed batch's stragglers overtaken
        while it is late. A rollout-bound run (its batches late by much at every step)
        reaches L = η + 1, where this rule admits what `max` does, keeping its throughput.
        Nothing waits forever: while the trainer waits for buffer v, either entries are in
        flight (each lands in buffer v, or is aborted and uncovers it) or buffer v, PENDING
        with nothing reserved, is uncovered and reservable at P; an instance below P that may
        not admit starves and pulls (every sync policy pulls an instance that has no load, or
        no admissible version at a low load).
        Reservations are `max`'s (the highest PENDING buffer ≤ V_traj + η): the reserved
        buffer is only the latest an entry may land in, so stragglers still use up to η.
        Reserving lower would make that buffer wait for the entry however long it runs, the
        straggler wait StaleFlow exists to avoid. Where an entry lands is occupy's choice,
        the lowest PENDING buffer: the lag is set by how much work is in flight, which is what
        `auto` bounds.
"""

from __future__ import annotations

from asyncrl.config_args import ConfigError
from asyncrl.coordinator.admission.base import ADMISSIONS, Admission
from asyncrl.coordinator.sync import SyncContext, SyncPolicy
from asyncrl.staleness import BufferStatus, StalenessError, StalenessManager

LEADS = ("auto", "max")
# `auto` lengthens its lead after a batch later than this share of the train step before it.
# In the simulator's trainer-bound regime (benchmarks/sim_lead.py, η = 2, seed 0, with a buffer
# more started while a batch is late): growing at every late batch gave 45,907 tokens/s at
# mean staleness 1.73, at a share of 0.1 45,072 at 1.13, at 0.2 44,773 at 0.97.
WAIT_TO_GROW = 0.2
# `auto` shortens its lead after this many steps whose batch was in time (or late by less than
# WAIT_TO_GROW): one late batch costs a step part of a batch's rollout, so the lead is tried
# shorter only rarely.
FED_TO_SHORTEN = 4
# Steps of the lead per buffer. Finer steps (4 tried) took 8 waits to reach a rollout-bound
# run's lead, 0.92 of `max`'s throughput in the simulator's latency regime: whole buffers.
LEAD_STEPS_PER_BUFFER = 1


def check_lead(lead) -> None:
    if lead not in LEADS:
        raise ValueError(f"lead must be one of {', '.join(map(repr, LEADS))}, got {lead!r}")


@ADMISSIONS.register("staleflow")
class StaleFlow(Admission):
    def __init__(self, *, eta: int, batch_size: int, redundant_batch_size: int | None = None,
                 sync: SyncPolicy, lead: str = "max", shared_cores: bool = False):
        check_lead(lead)
        self.sm = StalenessManager(eta, batch_size, redundant_batch_size)
        self.sync = sync
        self.lead = lead
        full = self.sm.redundant_batch_size
        self.lead_entries = full  # `auto`'s L, in entries
        self._lead_step = -(-full // LEAD_STEPS_PER_BUFFER)
        self.shared_cores = shared_cores
        self._lead_cap = (1 if shared_cores else eta + 1) * full
        self._fed = 0  # publishes in a row whose next batch was ready
        self._published: int | None = None  # the newest publish seen by this process
        # The driver's clock (not saved: a resumed run measures afresh) when the trainer's
        # next batch was found late at its publish (None: it was in time), when that batch
        # turned READY, and when the trainer took the batch before it.
        self._late_since: float | None = None
        self._ready_at: float | None = None
        self._step_began: float | None = None
        # What the core asks at every step (can a version reserve, is a buffer ready, did the
        # abort rule fire), remembered until the manager changes: every change goes through
        # a hook below, which forgets it. At scale most steps change nothing here.
        self._memo: dict = {}
        self._may_have_aborted = False

    def _changing(self) -> None:
        self._memo.clear()
        self._may_have_aborted = True

    def admits_new(self):
        # No version an instance may hold can reserve: no entry is admitted anywhere, and the
        # core need not look at the instances.
        ok = self._memo.get("any")
        if ok is None:
            sm = self.sm
            ok = self._memo["any"] = any(self.version_admits_new(v) for v in
                                         range(sm.min_dispatch_version, sm.version + 1))
        return ok

    def version_admits_new(self, version):
        ok = self._memo.get(version)
        if ok is None:
            ok = self._memo[version] = self.sm.can_reserve(version) and (
                self.lead == "max" or self._on_demand(version))
        return ok

    def _on_demand(self, version: int) -> bool:
        """`auto`'s rule (the module's docstring), for a reservable version."""
        entries = self.lead_entries
        # The weights that may start work are L's, whatever is added while a batch is late.
        buffers = -(-entries // self.sm.redundant_batch_size)
        if self._late_since is not None and self._ready_at is None and not self.shared_cores:
            entries += self.sm.redundant_batch_size
        return (version >= self.view.latest_version - (buffers - 1)
                and not self.sm.covered(entries))

    def rebind(self, entry, v_traj):
        return self.sm.rebind(entry, v_traj)

    def on_dispatched(self, entry, v_traj):
        self._changing()
        self.sm.reserve(entry, v_traj)

    def on_scored(self, entry):
        self._changing()
        self.sm.occupy(entry)
        if (self._late_since is not None and self._ready_at is None
                and self.sm.status(self.sm.version) is BufferStatus.READY):
            self._ready_at = self.view.now
        return ()  # the abort rule's entries leave through `take_aborted`

    def on_aborted(self, entry):
        self._changing()
        try:
            self.sm.abort(entry)
        except StalenessError:
            pass  # the abort rule took it first

    def take_aborted(self):
        if not self._may_have_aborted:
            return []
        self._may_have_aborted = False
        return self.sm.take_aborted()

    def ready(self, version):
        key = ("ready", version)
        ok = self._memo.get(key)
        if ok is None:
            ok = self._memo[key] = (self.sm.version == version
                                    and self.sm.status(version) is BufferStatus.READY)
        return ok

    def consume(self, version):
        if self.sm.version != version:
            raise StalenessError(f"consume of batch {version}: the protocol is at {self.sm.version}")
        self._changing()
        now = self.view.now
        if self._late_since is not None:
            # Until READY, not until taken: a checkpoint the trainer writes after publishing
            # is no part of the rollout's delay.
            late_s = (now if self._ready_at is None else self._ready_at) - self._late_since
            step_s = None if self._step_began is None else self._late_since - self._step_began
            self._judge(in_time=step_s is not None and late_s <= WAIT_TO_GROW * step_s)
            self._late_since = self._ready_at = None
        self._step_began = now
        return self.sm.consume()  # checks the invariant of every entry

    def _judge(self, in_time: bool) -> None:
        """`auto`'s lead after a batch: shorter after FED_TO_SHORTEN in time, longer after a
        late one."""
        if in_time:
            self._fed += 1
            if self._fed >= FED_TO_SHORTEN and self.lead_entries > self.sm.redundant_batch_size:
                self.lead_entries -= self._lead_step
                self._fed = 0
        else:
            self._fed = 0
            self.lead_entries = min(self.lead_entries + self._lead_step, self._lead_cap)

    def describe(self, version):
        reserved, occupied = self.sm.buffer_counts(version)
        return (f"buffer {version} is {self.sm.status(version).name}: {occupied} of "
                f"{self.sm.batch_size} slots occupied, {reserved} reserved by entries in flight")

    def on_published(self, version):
        self._memo.clear()  # `auto` reads the published version
        # The first publish a process sees starts (or resumes) the run: no step ended there.
        first, self._published = self._published is None, version
        if first or self.lead != "auto" or version != self.sm.version:
            return
        if self.sm.status(version) is BufferStatus.READY:
            self._judge(in_time=True)
        else:
            self._late_since = self.view.now

    def syncs(self, dirty):
        latest, cluster, out = self.view.latest_version, self.view.cluster, []
        for i in dirty:
            # No sync policy pulls weights it holds or is pulling: skip building the view.
            if cluster.version[i] >= latest or cluster.syncing[i]:
                continue
            view = cluster.view(i)
            if self.sync.should_sync(view, SyncContext(latest, self.version_admits_new(view.version))):
                out.append(i)
        return out

    def state_dict(self):
        return {"staleness": self.sm.state_dict(), "lead_entries": self.lead_entries,
                "fed": self._fed}

    def load_state_dict(self, state):
        sm = StalenessManager.from_state_dict(state["staleness"])
        if (sm.eta, sm.batch_size) != (self.sm.eta, self.sm.batch_size):
            # A user's to fix (a run resumed anyway under other values): one line, no traceback.
            raise ConfigError(f"the checkpoint's staleness protocol has η={sm.eta}, "
                              f"B={sm.batch_size}; config.staleness.eta = {self.sm.eta}, "
                              f"config.train.batch_size = {self.sm.batch_size}: resume with the "
                              f"run's own values (its run.json)")
        self.sm = sm
        # A checkpoint of a run on accelerators resumed on a CPU keeps to one buffer.
        self.lead_entries = min(state.get("lead_entries", self.sm.redundant_batch_size),
                                self._lead_cap)
        self._fed = state.get("fed", 0)
        self._changing()
