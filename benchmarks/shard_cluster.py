"""Driving benchmarks/shard_node.py processes: a trainer group of two and rollout hosts, on
loopback or on emulated hosts (tests/distributed/test_weight_shards.py), for the tests and
benchmarks/transport.py. Each node answers one JSON line per command (`Node.ask`)."""

from __future__ import annotations

import base64
import json
import pathlib
import pickle
import subprocess
import sys
import threading
import time

from asyncrl.distributed import weight_shards as ws

ROOT = pathlib.Path(__file__).resolve().parents[1]
NODE = str(ROOT / "benchmarks" / "shard_node.py")


class Node:
    """One shard_node.py process; `popen(argv, env, **kwargs)` starts it (on a host)."""

    def __init__(self, popen, name: str, address: str, role: str, *args: str):
        self.name = name
        self.process = popen([sys.executable, NODE, role, f"--host={address}", *args],
                             {"PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.answers: list[dict] = []
        self.lock = threading.Condition()
        self.errors: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.errors.extend(self.process.stderr),
                         daemon=True).start()
        self.ready = self.next(timeout_s=300)

    def _read(self):
        for line in self.process.stdout:
            if line.startswith("@@ "):
                with self.lock:
                    self.answers.append(json.loads(line[3:]))
                    self.lock.notify_all()

    def next(self, skip_progress: bool = True, timeout_s: float = 300) -> dict:
        """The next answer (progress lines, `got`, skipped unless asked for)."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while True:
                while self.answers:
                    answer = self.answers.pop(0)
                    if not (skip_progress and "got" in answer):
                        return answer
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise RuntimeError(f"{self.name}: no answer; its stderr: "
                                       + "".join(self.errors)[-3000:])
                self.lock.wait(min(left, 1.0))

    def send(self, **command) -> None:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def ask(self, **command) -> dict:
        self.send(**command)
        answer = self.next()
        if "error" in answer and "ok" not in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer

    @property
    def address(self) -> str:
        return self.ready["address"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


def free_port() -> int:
    """A loopback port nothing listens on now (the trainer group's coordinator)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_trainers(popens, names: list[str], addresses: list[str], coordinator: str,
                   *args: str) -> list[Node]:
    """The two trainer processes, started together (each waits for the other to join);
    `popens`: how each is started (`Node`)."""
    nodes: dict[int, Node] = {}
    errors = []

    def start(i):
        try:
            nodes[i] = Node(popens[i], names[i], addresses[i], "trainer",
                            f"--coordinator={coordinator}", f"--process-id={i}", *args)
        except Exception as error:  # re-raised below, on the caller's thread
            errors.append(error)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for node in nodes.values():
            node.close()
        raise errors[0]
    return [nodes[0], nodes[1]]


def layout_of(trainers) -> ws.Layout:
    return pickle.loads(base64.b64decode(trainers[0].ready["layout"]))


def stage(trainers, version: int) -> list[dict]:
    for node in trainers:
        node.send(cmd="stage", version=version)
    return [node.next() for node in trainers]


def trainer_offers(trainers, layout, version, requester, buckets=None):
    offers = []
    for process in layout.processes:
        ids = [b for b in layout.bucket_ids(process) if buckets is None or b in buckets]
        if ids:
            answer = trainers[process].ask(cmd="offer", version=version, buckets=ids,
                                           requester=requester)
            offers.append((trainers[process].address, answer["offers"]))
    return offers


def holder_offers(node, layout, version, requester, buckets=None):
    ids = [b for b in layout.bucket_ids() if buckets is None or b in buckets]
    answer = node.ask(cmd="offer", version=version, buckets=ids, requester=requester)
    return [(node.address, answer["offers"])]


def acknowledge(nodes, offers, command: str = "pulled") -> None:
    by_address = {n.address: n for n in nodes}
    for address, ids in offers:
        by_address[address].ask(cmd=command, uuids=list(ids.values()))


def pull_version(trainers, rollouts, layout, version, fanout: int, layout_b64: str = "",
                 **pull) -> list[dict]:
    """Every rollout host pulls `version` down the relay tree (`ws.parent`), a level at a
    time (the hosts of one level at once); their answers, in host order. `layout_b64`: the
    layout as the nodes get it (default: the trainers' sharded one)."""
    answers: dict[int, dict] = {}
    levels: dict[int, list[int]] = {}
    for h in range(len(rollouts)):
        up, depth = ws.parent(h, fanout), 0
        while up is not None:
            up, depth = ws.parent(up, fanout), depth + 1
        levels.setdefault(depth, []).append(h)
    for depth in sorted(levels):
        sent = []
        for h in levels[depth]:
            up = ws.parent(h, fanout)
            offers = (trainer_offers(trainers, layout, version, rollouts[h].name) if up is None
                      else holder_offers(rollouts[up], layout, version, rollouts[h].name))
            rollouts[h].send(cmd="pull", version=version, offers=offers,
                             layout=layout_b64 or trainers[0].ready["layout"], **pull)
            sent.append((h, offers))
        for h, offers in sent:
            answers[h] = rollouts[h].next()
            if not answers[h].get("ok"):
                raise RuntimeError(f"{rollouts[h].name}: {answers[h]}")
            acknowledge([*trainers, *rollouts], offers)
    return [answers[h] for h in range(len(rollouts))]
