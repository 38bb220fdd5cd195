"""Weights served where they live (asyncrl/distributed/weight_shards.py).

In this process, on 8 CPU devices: the bucket layout covers every byte of every leaf once, a
round trip through a transfer server gives the weights back bit for bit, a bucket of another
version or a damaged one is refused by name, and an offer nobody pulls is drained.

Across hosts emulated in network namespaces (launch/emulated_hosts.py), as plain processes
(benchmarks/shard_node.py) each bound to its host's own address: a trainer group of two
processes on two hosts holding a 256 MB float32 model sharded over both, three rollout hosts
pulling it in bfloat16 through a relay tree. Needs root and iproute2 (CI runs as root):
without them the tests fail, naming what is missing.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from asyncrl.distributed import weight_shards as ws
from benchmarks import shard_cluster as sc
from tests.distributed.test_hosts import hosts_up

ROOT = pathlib.Path(__file__).resolve().parents[2]
FANOUT = 2  # the trainer serves each version to at most two hosts


# ------------------------------------------------------------------ in this process


def _leaves(mesh):
    key = jax.random.PRNGKey(0)
    return [
        jax.device_put(jax.random.normal(key, (64, 48)), NamedSharding(mesh, P("fsdp"))),
        jax.device_put(jnp.arange(10, dtype=jnp.float32), NamedSharding(mesh, P())),
        jax.device_put(jax.random.normal(key, (8, 16, 5)).astype(jnp.bfloat16),
                       NamedSharding(mesh, P(None, "fsdp"))),
    ]


@pytest.fixture(scope="module")
def four():
    mesh = Mesh(np.asarray(jax.devices()[:4]), ("fsdp",))
    return mesh, _leaves(mesh)


def test_the_layout_carries_every_byte_of_every_leaf_once_in_bounded_buckets(four):
    mesh, leaves = four
    for bucket_bytes in (4, 100, 1000, 1 << 20):
        layout = ws.plan_layout(leaves, bucket_bytes, "bfloat16")
        covered = {}
        for bucket in layout.buckets:
            assert 0 < bucket.nbytes <= bucket_bytes
            assert sum(s.hi - s.lo for s in bucket.segments) == bucket.nbytes
            for s in bucket.segments:
                covered.setdefault((s.leaf, s.box), []).append((s.lo, s.hi))
        for i, leaf in enumerate(leaves):
            # The replicated leaf travels once; each sharded one once per shard.
            boxes = {ws._box(index, leaf.shape)
                     for index in leaf.sharding.devices_indices_map(leaf.shape).values()}
            assert {box for (j, box) in covered if j == i} == boxes
            for box in boxes:
                ranges = sorted(covered[(i, box)])
                size = int(np.prod([b - a for a, b in box])) * 2  # bfloat16
                assert ranges[0][0] == 0 and ranges[-1][1] == size
                assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert layout.nbytes == sum(x.size * 2 for x in leaves)


def test_a_round_trip_through_a_transfer_server_is_bit_identical_and_torn_buckets_are_named(four):
    mesh, leaves = four
    layout = ws.plan_layout(leaves, 256, "bfloat16")
    holder = ws.ShardHolder()
    holder.stage(3, ws.stage_buckets(layout, 3, leaves))
    offers = ws.offers_from_trainer(layout, {0: holder}, 3, "test")
    got = ws.pull_buckets(holder, offers, layout, 3, jax.devices()[5])
    holder.pulled([u for _, ids in offers for u in ids.values()])
    out = ws.assemble(layout, got, [NamedSharding(Mesh(np.asarray(jax.devices()[4:6]), ("tp",)),
                                                  P())] * len(leaves))
    for got_leaf, leaf in zip(out, leaves):
        want = np.asarray(leaf.astype(jnp.bfloat16))
        assert got_leaf.dtype == jnp.bfloat16 and got_leaf.shape == leaf.shape
        assert np.array_equal(np.asarray(got_leaf).view(np.uint16), want.view(np.uint16))
        assert {d.id for d in got_leaf.sharding.device_set} == {4, 5}
    with pytest.raises(ws.TornWeights, match=r"bucket 0 of version 4 from h: it is bucket 0 "
                                             r"of version 3"):
        ws.verify(got[0], layout, 0, 4, "h")
    with pytest.raises(ws.TornWeights, match=r"bucket 2 of version 3 from h: it is bucket 1"):
        ws.verify(got[1], layout, 2, 3, "h")
    with pytest.raises(ws.TornWeights, match="damaged in transit"):
        ws.verify(got[1].at[7].add(1), layout, 1, 3, "h")
    with pytest.raises(ws.TornWeights, match=r"assembling without bucket\(s\) \[0\]"):
        ws.assemble(layout, {b: a for b, a in got.items() if b})
    assert holder.offer(2, [0], "test") is None  # a version it never held


def test_an_offer_no_one_pulls_is_drained_and_staging_keeps_one_version(four):
    mesh, leaves = four
    layout = ws.plan_layout(leaves, 512, "bfloat16")
    holder = ws.ShardHolder()
    holder.stage(1, ws.stage_buckets(layout, 1, leaves))
    one = holder.staged_bytes()
    ghost = holder.offer(1, layout.bucket_ids(), "a puller that died")
    holder.stage(2, ws.stage_buckets(layout, 2, leaves))
    assert holder.staged_bytes() == 2 * one  # version 1 stays while offers of it are out
    holder.abandoned(list(ghost.values()))
    assert holder.staged_bytes() == one and holder.holds(2) and not holder.holds(1)
    holder.stage(3, ws.stage_buckets(layout, 3, leaves))
    assert holder.staged_bytes() == one  # nothing out: the new version replaces the old
    # A puller that died mid-pull took one of its offers: draining that one would wait for
    # ever, so it is given up after the drain timeout and the others are still drained.
    holder.drain_timeout_s = 2.0
    offers = holder.offer(3, layout.bucket_ids(), "a puller that died mid-pull")
    taken = layout.bucket_ids()[0]
    ws.pull_buckets(holder, [(holder.address, {taken: offers[taken]})], layout, 3,
                    jax.devices()[1])
    holder.stage(4, ws.stage_buckets(layout, 4, leaves))
    start = time.monotonic()
    holder.abandoned(list(offers.values()))
    assert time.monotonic() - start < 30 and holder.staged_bytes() == one


def test_the_relay_tree_bounds_what_the_trainer_serves():
    assert [ws.parent(h, 2) for h in range(7)] == [None, None, 0, 0, 1, 1, 2]
    assert [ws.parent(h, 1) for h in range(4)] == [None, 0, 1, 2]
    for hosts in range(1, 40):
        for fanout in (1, 2, 3):
            parents = [ws.parent(h, fanout) for h in range(hosts)]
            assert sum(p is None for p in parents) == min(fanout, hosts)
            assert all(p is None or p < h for h, p in enumerate(parents))
            assert max([parents.count(h) for h in range(hosts)]) <= fanout


# ------------------------------------------------------------------ across emulated hosts


@pytest.fixture(scope="module")
def cluster():
    hosts = hosts_up(5, "tests/distributed/test_weight_shards.py")
    nodes = []
    try:
        def on(host):
            return lambda argv, env, **kwargs: hosts.popen(host, argv, env, **kwargs)

        address = lambda i: hosts.host(f"h{i}").address  # noqa: E731
        trainers = sc.start_trainers([on("h0"), on("h1")], ["h0", "h1"], [address(0), address(1)],
                                     f"{address(0)}:{sc.free_port()}")
        nodes += trainers
        # h4 pauses after each bucket it pulls: the relay test kills its holder meanwhile.
        rollouts = [sc.Node(on(f"h{i}"), f"h{i}", address(i), "rollout", "--timeout-s=10",
                            *(["--pause-s=0.3"] if i == 4 else [])) for i in range(2, 5)]
        nodes += rollouts
        yield hosts, trainers, rollouts
    finally:
        for node in nodes:
            node.close()
        hosts.down()


def test_every_rollout_host_gets_the_trainers_weights_and_no_trainer_process_holds_the_model(
        cluster):
    hosts, trainers, rollouts = cluster
    layout = sc.layout_of(trainers)
    model_bytes = trainers[0].ready["model_bytes"]
    assert model_bytes >= 256 * 2**20 and layout.nbytes == model_bytes // 2  # bfloat16
    for version in (1, 2):
        assert [s["staged"] for s in sc.stage(trainers, version)] == [version, version]
        # Each host checks every value it assembled against the model's function
        # (shard_node.check) before it answers ok.
        answers = sc.pull_version(trainers, rollouts, layout, version, FANOUT)
        assert all(a["nbytes"] == layout.nbytes for a in answers)
    largest_bucket = max(b.size for b in layout.buckets)
    for process, node in enumerate(trainers):
        stats = node.ask(cmd="stats")
        shard = node.ready["shard_bytes"]  # its float32 master shards
        own = sum(b.size for b in layout.buckets if b.process == process)
        # Served twice per version (the two hosts of the tree's first level), whatever the
        # number of hosts; the third pulled from the first.
        count = len(layout.bucket_ids(process))
        assert stats["served"] == {"1": 2 * count, "2": 2 * count}
        # Its master shards, one staged version of them in bfloat16 (the one before is
        # retired before the next is staged: no offer of it was out) and a bucket: never the
        # bfloat16 model a gather would add.
        bound = shard + own + largest_bucket
        assert stats["peak_bytes"] <= bound < shard + layout.nbytes, (stats, bound)
        assert stats["staged_bytes"] == own


def test_a_relay_lost_mid_pull_its_child_resumes_from_another_holder_and_the_host_returns(
        cluster):
    hosts, trainers, rollouts = cluster
    layout = sc.layout_of(trainers)
    everyone = [*trainers, *rollouts]
    version = 3
    assert [s["staged"] for s in sc.stage(trainers, version)] == [version, version]
    first, second, child = rollouts  # the child pulls from the first (ws.parent(2, 2) == 0)
    for node in (first, second):
        offers = sc.trainer_offers(trainers, layout, version, node.name)
        assert node.ask(cmd="pull", version=version, offers=offers,
                        layout=trainers[0].ready["layout"])["ok"]
        sc.acknowledge(everyone, offers)
    offers = sc.holder_offers(first, layout, version, child.name)
    # Each pull names the layout: this test may run on another worker than the one before.
    child.send(cmd="pull", version=version, offers=offers, layout=trainers[0].ready["layout"])
    assert "got" in child.next(skip_progress=False)  # one bucket in, then its holder dies
    hosts.kill(first.name)
    failed = child.next(timeout_s=60)
    assert failed["ok"] is False and 0 < len(failed["missing"]) < len(layout.buckets), failed
    # The rest from the other holder of the version; the trainer serves nothing more.
    rest = sc.holder_offers(second, layout, version, child.name, set(failed["missing"]))
    assert child.ask(cmd="pull", version=version, offers=rest,
                     layout=trainers[0].ready["layout"])["ok"]
    sc.acknowledge(everyone, rest)
    for process, node in enumerate(trainers):
        assert node.ask(cmd="stats")["served"][str(version)] == \
            2 * len(layout.bucket_ids(process))
    # The host comes back (a fresh process) and pulls the newest version.
    rollouts[0] = sc.Node(lambda argv, env, **kw: hosts.popen(first.name, argv, env, **kw),
                          first.name, hosts.host(first.name).address, "rollout",
                          "--timeout-s=10")
    assert [s["staged"] for s in sc.stage(trainers, version + 1)] == [version + 1] * 2
    sc.pull_version(trainers, rollouts, layout, version + 1, FANOUT)


def test_process_0_answers_for_the_group_through_its_key_value_store():
    """asyncrl/distributed/shard_service.py on loopback: a puller that talks to process 0
    alone gets every bucket, each from the process that owns it."""
    def popen(argv, env, **kwargs):
        return subprocess.Popen(argv, env={**os.environ, **env}, **kwargs)

    loop = "127.0.0.1"
    trainers = sc.start_trainers([popen, popen], ["p0", "p1"], [loop, loop],
                                 f"{loop}:{sc.free_port()}", "--rows=256", "--bucket-mb=0.25",
                                 "--service")
    receiver = sc.Node(popen, "receiver", loop, "rollout")
    try:
        layout = sc.layout_of(trainers)
        assert layout.processes == [0, 1]
        assert [s["staged"] for s in sc.stage(trainers, 1)] == [1, 1]
        offers = trainers[0].ask(cmd="group_offer", version=1, requester="receiver")["offers"]
        assert {address for address, _ in offers} == {t.address for t in trainers}
        assert receiver.ask(cmd="pull", version=1, offers=offers,
                            layout=trainers[0].ready["layout"])["ok"]
        trainers[0].ask(cmd="group_ack", offers=offers, kind="pulled")
        for process, node in enumerate(trainers):
            assert node.ask(cmd="stats")["served"] == {"1": len(layout.bucket_ids(process))}
        # Process 1 has not staged version 2 yet: no offer, and process 0's is drained.
        trainers[0].send(cmd="stage", version=2)
        assert trainers[0].next()["staged"] == 2
        one = trainers[0].ask(cmd="stats")["staged_bytes"]
        assert trainers[0].ask(cmd="group_offer", version=2, requester="receiver")["offers"] is None
        assert trainers[0].ask(cmd="stats")["staged_bytes"] == one
        trainers[1].send(cmd="stage", version=2)
        assert trainers[1].next()["staged"] == 2
        offers = trainers[0].ask(cmd="group_offer", version=2, requester="receiver")["offers"]
        assert receiver.ask(cmd="pull", version=2, offers=offers)["ok"]
        trainers[0].ask(cmd="group_ack", offers=offers, kind="pulled")
    finally:
        for node in [*trainers, receiver]:
            node.close()


def test_the_run_under_ray_serves_a_trainer_groups_weights_where_they_live(tmp_path):
    """The whole thing: the tiny job with its trainer a group of two processes (the driver
    and a follower actor) and two instance actors, weights moved by distributed.transport =
    'shards': every trainer process stages its own shards, instances and process 0's
    evaluations pull them bucket by bucket, checked (asyncrl/distributed/shard_service.py)."""
    from asyncrl.metrics import read_metrics
    from tests.test_system import assert_every_entry_accounted_once

    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.main", "--config=experiments/grpo.py:tiny",
         f"--workdir={tmp_path}", "--config.train.steps=2", "--config.eval.heldout_size=8",
         "--config.distributed.backend=ray", "--config.distributed.trainer_processes=2",
         "--config.distributed.transport=shards",
         # Logical CPUs: the follower and both instances each ask for one, on two cores.
         "--config.distributed.ray_num_cpus=4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert results["steps"] == 2 and "after" in results and "before" in results
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0 <= lag <= 2 for r in rows for lag in r["staleness"])  # eta = 2
    assert_every_entry_accounted_once(rows, results["protocol"])
    last = rows[-1]
    assert last["failed_instances"] == 0 and last["pull_s_mean"] > 0
    assert last["instance0_finished"] > 0 and last["instance1_finished"] > 0
