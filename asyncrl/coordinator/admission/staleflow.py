"""StaleFlow's admission: the staleness protocol, with per-instance weight sync."""

from __future__ import annotations

from asyncrl.coordinator.admission.base import ADMISSIONS, Admission
from asyncrl.coordinator.sync import SyncContext, SyncPolicy
from asyncrl.staleness import BufferStatus, StalenessError, StalenessManager


@ADMISSIONS.register("staleflow")
class StaleFlow(Admission):
    def __init__(self, *, eta: int, batch_size: int, redundant_batch_size: int | None = None,
                 sync: SyncPolicy):
        self.sm = StalenessManager(eta, batch_size, redundant_batch_size)
        self.sync = sync
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
            ok = self._memo[version] = self.sm.can_reserve(version)
        return ok

    def on_dispatched(self, entry, v_traj):
        self._changing()
        self.sm.reserve(entry, v_traj)

    def on_scored(self, entry):
        self._changing()
        self.sm.occupy(entry)

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
        return self.sm.consume()  # checks the invariant of every entry

    def describe(self, version):
        reserved, occupied = self.sm.buffer_counts(version)
        return (f"buffer {version} is {self.sm.status(version).name}: {occupied} of "
                f"{self.sm.batch_size} slots occupied, {reserved} reserved by entries in flight")

    def syncs(self, dirty):
        core, latest = self.core, self.core.latest_version
        cluster, out = core.cluster, []
        for i in dirty:
            # No sync policy pulls weights it holds or is pulling: skip building the view.
            if cluster.version[i] >= latest or cluster.syncing[i]:
                continue
            view = cluster.view(i)
            if self.sync.should_sync(view, SyncContext(latest, self.version_admits_new(view.version))):
                out.append(i)
        return out

    def state_dict(self):
        return {"staleness": self.sm.state_dict()}

    def load_state_dict(self, state):
        sm = StalenessManager.from_state_dict(state["staleness"])
        if (sm.eta, sm.batch_size) != (self.sm.eta, self.sm.batch_size):
            raise ValueError(f"the checkpoint's staleness protocol has η={sm.eta}, B={sm.batch_size}; "
                             f"the config has η={self.sm.eta}, B={self.sm.batch_size}")
        self.sm = sm
        self._changing()
