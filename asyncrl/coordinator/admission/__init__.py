"""Admission: when new work may start, which scored entries a training step takes, and when
instances load new weights. One registry for the live system and the simulator.

  staleflow     the per-trajectory bound (arXiv 2601.12784): an entry is dispatched only to
                an instance whose version still has a reservable slot in the StalenessManager;
                it occupies the lowest buffer it may once scored; the trainer takes buffer v as
                soon as it is READY. Each instance pulls weights on its own (the sync policy).
  barrier       generate a batch, train it, load the weights on every instance at once
                (slime's `train_async.py` loop): η = 0 is synchronous RL; η ≥ 1 generates the
                next batch while one trains and updates the weights every η steps (η = 1 is
                one-step off-policy). `over_sampling` > 1 launches more than B entries per
                batch and stops the rest once B are scored (slime); with partial rollout their
                tokens are kept and they finish in the next batch, possibly later than η.
  token_bucket  AReaL: admit while accepted + running < (η + policy version + 1)·B, train on the
                B earliest-submitted of the finished, then update every instance at once
                (in-flight work continues on the new weights). The bound counts entries, not
                versions: a long response is trained however late it finishes.
                `drop_stale` adds ROLL's replay-buffer collection: before step v, entries with
                V_traj < v − η are dropped (consumed staleness ≤ η, paid for in wasted work).
  verl          verl's fully-async policy: a per-sync-window sample budget, every instance
                updated together every `trigger_parameter_sync_step` steps (see `Verl`).

`lead` (`staleness.lead`, "auto" or "max") is how far ahead of the trainer StaleFlow starts new
work (asyncrl/coordinator/admission/staleflow.py); the baselines' own rules set theirs, so they
accept it and ignore it.

Only admissions with `bounded = True` promise V_traj ≤ version ≤ V_traj + η; the core checks
it on every consume of theirs. The others' staleness is measured, never prevented.

An admission reads the core through a `CoreView` (asyncrl/coordinator/view.py) and never acts
on it: entries it gives up or hands back go to the core as decisions (`Abort`, `Recycle`,
returned by `on_scored` or taken by `take_aborted`), which the core applies in its step.
"""

from asyncrl.coordinator.admission.barrier import Barrier
from asyncrl.coordinator.admission.base import ADMISSIONS, Abort, Admission, Decision, Recycle
from asyncrl.coordinator.admission.staleflow import LEADS, StaleFlow, check_lead
from asyncrl.coordinator.admission.token_bucket import TokenBucket
from asyncrl.coordinator.admission.verl import Verl
from asyncrl.coordinator.sync import SyncPolicy


def build_admission(name: str, *, eta: int, batch_size: int, redundant_batch_size: int,
                    sync: SyncPolicy, lead: str = "max", shared_cores: bool = False,
                    **params) -> Admission:
    """The admission `name` with its own parameters (`params`, e.g. over_sampling).
    `lead` and `shared_cores` shape StaleFlow's lead; the other admissions have none."""
    factory = ADMISSIONS.get(name)
    check_lead(lead)
    if factory is StaleFlow:
        return StaleFlow(eta=eta, batch_size=batch_size,
                         redundant_batch_size=redundant_batch_size, sync=sync, lead=lead,
                         shared_cores=shared_cores, **params)
    if redundant_batch_size != batch_size:
        raise ValueError(f"batch redundancy needs the staleflow admission, not {name!r}")
    return factory(eta=eta, batch_size=batch_size, **params)


__all__ = ["ADMISSIONS", "Abort", "Admission", "Barrier", "Decision", "LEADS", "Recycle",
           "StaleFlow", "TokenBucket", "Verl", "build_admission"]
