"""A trainer group's weight shards as one service: every process stages and serves its own
buckets (asyncrl/distributed/weight_shards.py), and process 0 answers pullers for the whole
group, asking the other processes through jax.distributed's key-value store: the control
channel the group already has, which a follower answers from a thread while its main thread
is inside the group's collectives (a Ray call to a follower actor would queue behind them).

    service = ShardService(layout, host)          # every process, once the group has formed
    service.stage(version, policy_leaves)         # every process, after each step
    offers = service.offers(version, requester)   # process 0: every bucket, from its owner
    service.acknowledge(offers)                   # process 0: the puller has them
    service.acknowledge(offers, "abandoned")      # ... or gave up: each owner drains its own
    weights = service.fetch(version, device)      # process 0: the whole model, pulled, checked
    service.close()

The run (distributed.transport = 'shards') makes one per trainer process
(`for_trainer`, from asyncrl.distributed.trainer_ops) and stages every version there instead
of gathering; process 0's transport (asyncrl.distributed.transport `ShardSender`) offers what
an instance asks for; process 0's evaluations `fetch` the weights like an instance would
(`Weights`, what the run loop holds in place of host arrays).

Requests are numbered; process 0 writes `asyncrl/shards/request/<n>` and waits for each
owner's `asyncrl/shards/answer/<n>/<process>` (at most `timeout_s`), deleting both once read,
so the store holds only the request in flight. One request at a time (a lock).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading

import jax

from asyncrl.distributed import weight_shards as ws

log = logging.getLogger(__name__)

PREFIX = "asyncrl/shards/"


class ServiceTimeout(TimeoutError):
    """A trainer process did not answer process 0's request in time; names it."""


_current: list["ShardService"] = []  # this process's, once the trainer made it


def current() -> "ShardService":
    if not _current:
        raise RuntimeError("distributed.transport = 'shards': no weight shard service in this "
                           "process (the trainer makes it with the first version it stages)")
    return _current[0]


def for_trainer(leaves, host: str, dtype, bucket_bytes: int = ws.DEFAULT_BUCKET_BYTES,
                timeout_s: float = 60.0) -> "ShardService":
    """This process's service for the trainer's `leaves` (the master weights, sent in the
    policy's `dtype`), made once; every process of the group makes its own."""
    if not _current:
        treedef = jax.tree.structure(leaves)
        service = ShardService(ws.plan_layout(jax.tree.leaves(leaves), bucket_bytes, dtype), host,
                               timeout_s=timeout_s)
        service.treedef = treedef
        _current.append(service)
    return _current[0]


def close_current() -> None:
    """Stops this process's service (the run is over): a next run makes its own."""
    while _current:
        _current[0].close()


class Weights:
    """A version the group staged, on process 0 in place of host arrays: `fetch` them onto a
    device when something here needs them (an evaluation)."""

    def __init__(self, service: "ShardService", version: int):
        self.service, self.version = service, version

    def fetch(self, device):
        leaves = self.service.fetch(self.version, device)
        return jax.tree.unflatten(self.service.treedef, leaves)


class ShardService:
    def __init__(self, layout: ws.Layout, host: str = "127.0.0.1", client=None,
                 process: int | None = None, timeout_s: float = 60.0):
        from jax._src import distributed

        self.layout = layout
        self.holder = ws.ShardHolder(host)
        self.process = jax.process_index() if process is None else process
        self.owners = [p for p in layout.processes if p != 0]
        # A group of one process has no store, and needs none.
        self.client = client if client is not None or not self.owners else \
            distributed.global_state.client
        self.treedef = None
        self.timeout_s = timeout_s
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._owner_of: dict[str, int] = {}  # a holder's address -> its process
        self._thread = None
        if self.process != 0 and self.process in self.owners:
            self._thread = threading.Thread(target=self._serve, daemon=True,
                                            name=f"weight shards of process {self.process}")
            self._thread.start()

    def stage(self, version: int, leaves) -> dict[int, jax.Array]:
        """This process's buckets of `leaves` as `version`, after retiring what no offer is
        out for (one staged version beside the trainer's own shards); the buckets, their
        staging dispatched."""
        self.holder.retire()
        buckets = ws.stage_buckets(self.layout, version, jax.tree.leaves(leaves))
        self.holder.stage(version, buckets)
        return buckets

    # ---------------------------------------------------------------- every owner

    def _answer(self, request: dict) -> dict:
        kind = request["kind"]
        if kind == "offer":
            offers = self.holder.offer(request["version"], self.layout.bucket_ids(self.process),
                                       request["requester"])
            return {"address": self.holder.address, "offers": offers}
        uuids = request["uuids"].get(str(self.process), [])
        (self.holder.pulled if kind == "pulled" else self.holder.abandoned)(uuids)
        return {"address": self.holder.address}

    def _serve(self) -> None:
        for number in itertools.count():
            key = f"{PREFIX}request/{number}"
            while not self._stopped.is_set():
                try:
                    raw = self.client.blocking_key_value_get(key, 500)
                    break
                except Exception:  # not there yet (deadline), or the group is leaving
                    continue
            else:
                return
            try:
                answer = self._answer(json.loads(raw))
            except Exception as error:  # told to process 0, which raises it there
                answer = {"error": f"{type(error).__name__}: {error}"}
            self.client.key_value_set(f"{PREFIX}answer/{number}/{self.process}",
                                      json.dumps(answer))

    # ---------------------------------------------------------------- process 0

    def _ask(self, request: dict) -> dict[int, dict]:
        with self._lock:
            number = next(self._numbers)
            key = f"{PREFIX}request/{number}"
            if self.owners:
                self.client.key_value_set(key, json.dumps(request))
            answers = {0: self._answer(request)} if 0 in self.layout.processes else {}
            try:
                for process in self.owners:
                    answer_key = f"{PREFIX}answer/{number}/{process}"
                    try:
                        raw = self.client.blocking_key_value_get(answer_key,
                                                                 int(self.timeout_s * 1000))
                    except Exception as error:
                        raise ServiceTimeout(
                            f"trainer process {process} did not answer the {request['kind']} "
                            f"request for version {request.get('version')} in "
                            f"{self.timeout_s:.0f} s ({error})") from None
                    self.client.key_value_delete(answer_key)
                    answers[process] = json.loads(raw)
                    if "error" in answers[process]:
                        raise RuntimeError(f"trainer process {process}: "
                                           f"{answers[process]['error']}")
            finally:
                if self.owners:
                    self.client.key_value_delete(key)
            return answers

    def offers(self, version: int, requester: str) -> list[tuple[str, dict[int, int]]] | None:
        """Every bucket of `version` from the process that owns it, for one pull by
        `requester`; None while a process has not staged it (what was offered is drained)."""
        answers = self._ask({"kind": "offer", "version": version, "requester": requester})
        self._owner_of.update({a["address"]: p for p, a in answers.items()})
        offers = [(a["address"], {int(b): u for b, u in a["offers"].items()})
                  for _, a in sorted(answers.items()) if a["offers"] is not None]
        if len(offers) < len(answers):
            if offers:
                self.acknowledge(offers, "abandoned")
            return None
        return offers

    def acknowledge(self, offers, kind: str = "pulled") -> None:
        """The puller has these offers (`pulled`), or gave them up (`abandoned`)."""
        uuids: dict[str, list[int]] = {}
        for address, ids in offers:
            uuids.setdefault(str(self._owner_of[address]), []).extend(ids.values())
        self._ask({"kind": kind, "uuids": uuids})

    def fetch(self, version: int, device) -> list[jax.Array]:
        """Process 0: every bucket of `version` pulled onto `device`, checked, assembled."""
        offers = ws.wait_for_offers(lambda: self.offers(version, "process 0"), self.timeout_s,
                                    f"weights version {version} for process 0")
        got: dict = {}
        try:
            ws.pull_buckets(self.holder, offers, self.layout, version, device, got,
                            timeout_s=self.timeout_s)
        finally:
            self.settle(offers, got)
        return ws.assemble(self.layout, got)

    def settle(self, offers, got) -> None:
        """Acknowledges the offers of the buckets in `got` and abandons the others."""
        for kind, keep in (("pulled", True), ("abandoned", False)):
            part = [(a, {b: u for b, u in ids.items() if (b in got) == keep})
                    for a, ids in offers]
            if any(ids for _, ids in part):
                self.acknowledge(part, kind)

    def close(self) -> None:
        if self in _current:
            _current.remove(self)
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(5)
        self.holder.close()
