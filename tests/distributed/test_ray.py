"""The Ray backend on one loopback-only Ray cluster (one per module): addresses, the remote
engine against the local one, named and watched weight pulls, and a run that loses both
instances to kill -9 and gets them back."""

import json
import logging
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
import ray
from jax.sharding import Mesh, SingleDeviceSharding

from asyncrl.config import ConfigError, resolve, validate, with_overrides
from asyncrl.coordinator.messages import Finished
from asyncrl.distributed.actor import InstanceActor, InstanceSpec
from asyncrl.distributed.cluster import actor_environment, is_loopback, reported_addresses, start_local
from asyncrl.distributed.remote_instance import RemoteInstance, Timeouts
from asyncrl.distributed.rollouts import WeightPublisher
from asyncrl.distributed.transport import (TransportMismatch, TransportTimeout, WeightHandle,
                                           make_receiver, make_sender, pull_watched)
from asyncrl.drivers.threaded import _Reporter
from asyncrl.metrics import read_metrics
from asyncrl.model import ShardingRules, graphdef_for, shardings_for
from asyncrl.policy import load_policy
from asyncrl.records import Trajectory
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.instance import RolloutInstance
from asyncrl.rollout.messages import Work
from asyncrl.run import run
from asyncrl.servers.trajectory import TrajectoryServer
from experiments.grpo import get_config
from tests.test_system import assert_every_entry_accounted_once

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tiny(**changes):
    return with_overrides(get_config("tiny"), {k.replace("__", "."): v for k, v in changes.items()})


@pytest.fixture(scope="module")
def ray_cluster():
    # One per module, and so one per xdist worker that runs its tests: `-n 2` may split the
    # module over both (--dist=loadgroup would keep it on one, but pytest-xdist 3.8 under
    # pytest 9.2 ignores xdist_group marks: pytest-dev/pytest-xdist#1386).
    saved = dict(os.environ)
    cluster = start_local(num_cpus=2, object_store_mb=512)
    yield cluster
    cluster.close()
    os.environ.clear()
    os.environ.update(saved)


def test_every_address_ray_reports_is_loopback_and_a_token_guards_it(ray_cluster):
    addresses = reported_addresses()
    assert len(addresses) == 2  # the one node, the GCS
    assert all(is_loopback(a) for a in addresses), addresses
    assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64


# ---------------------------------------------------------------------------- transports


def tree_spec(tree, device):
    shardings = jax.tree.map(lambda _: SingleDeviceSharding(device), tree)
    expected = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    return shardings, expected


@pytest.mark.parametrize("name", ["object_store", "jax_transfer"])
def test_each_pull_gets_the_weights_its_id_names_whatever_the_order(ray_cluster, name):
    kwargs = {"host": "127.0.0.1"} if name == "jax_transfer" else {}
    sender, receiver = make_sender(name, **kwargs), make_receiver(name, **kwargs)
    weights = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(5, np.int32)}
    sender.stage(1, weights)
    first = sender.offer("r")
    sender.stage(2, jax.tree.map(lambda x: x * 2, weights))
    second, third = sender.offer("r"), sender.offer("r")
    assert len({first.transfer_id, second.transfer_id, third.transfer_id}) == 3
    shardings, expected = tree_spec(weights, jax.devices()[0])
    # Pulled in the opposite order to the offers: each still gets its own version.
    got_second, _ = pull_watched(receiver, second, shardings, expected, 30, "r")
    got_first, _ = pull_watched(receiver, first, shardings, expected, 30, "r")
    np.testing.assert_array_equal(got_first["a"], weights["a"])
    np.testing.assert_array_equal(got_second["a"], 2 * weights["a"])
    np.testing.assert_array_equal(got_second["b"], 2 * weights["b"])
    pull_watched(receiver, third, shardings, expected, 30, "r")  # one offer, one pull: no leftovers
    wrong = {"a": np.zeros((3, 2), np.float32), "b": weights["b"]}
    with pytest.raises(TransportMismatch, match=r"r: weights v2/r/#2 array 0 is \(\(2, 3\), 'float32'\)"):
        pull_watched(receiver, third, *tree_spec(wrong, jax.devices()[0]), 30, "r")
    receiver.close()
    sender.close()


@ray.remote(num_cpus=0)
def never_done():
    time.sleep(600)


def test_a_pull_whose_data_never_comes_times_out_naming_version_id_and_receiver(ray_cluster):
    weights = {"a": np.zeros(3, np.float32)}
    stuck = never_done.remote()
    handle = WeightHandle(7, "v7/instance1/#3", (((3,), "float32"),), stuck)
    start = time.monotonic()
    with pytest.raises(TransportTimeout, match=r"pull of weights version 7 \(transfer id "
                       r"v7/instance1/#3\) by rollout instance 1: not done after 1.0 s"):
        pull_watched(make_receiver("object_store"), handle, *tree_spec(weights, jax.devices()[0]),
                     1.0, "rollout instance 1")
    assert time.monotonic() - start < 5
    ray.cancel(stuck, force=True)


# ---------------------------------------------------------------------------- the remote engine


def wait_finished(events: queue.Queue, ids, timeout_s: float, what: str):
    left, deadline = set(ids), time.monotonic() + timeout_s
    while left:
        try:
            event = events.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise AssertionError(f"{what}: trajectories {sorted(left)} not finished in {timeout_s} s")
        if isinstance(event, Finished):
            left -= set(event.trajectory_ids)


def generate(instance_factory, c, prompts):
    """Runs two groups through a fresh instance; the server's records afterwards."""
    server, events = TrajectoryServer(), queue.Queue()
    instance = instance_factory(server, _Reporter(events))
    instance.start()
    all_ids = []
    for entry, prompt in enumerate(prompts):
        ids = server.add_group(entry, entry, prompt, c.rollout.group_size, c.rollout.max_new_tokens, 0)
        for t in ids:
            server.route(t, 0)
        instance.submit(Work([Trajectory.of(server.record(t)) for t in ids]))
        all_ids += ids
    try:
        wait_finished(events, all_ids, 180, type(instance).__name__)
    finally:
        instance.stop()
    return [server.record(t) for t in all_ids]


def test_the_remote_engine_draws_the_local_engines_tokens(ray_cluster):
    c = tiny(rollout__max_new_tokens=12, rollout__group_size=4, rollout__num_slots=8)
    policy = load_policy(c.model)
    prompts = [(1, 5, 6, 7), (1, 9, 4)]
    spec = resolve(c)
    max_len, sampling, rules = spec.rollout.max_len, spec.rollout.sampling(), ShardingRules.replicated()
    local_mesh = Mesh(np.asarray(jax.devices()[1:2]), ("tp",))

    def local(server, reporter):
        engine = Engine(graphdef_for(policy.config), policy.config, num_slots=c.rollout.num_slots, max_len=max_len,
                        prompt_buckets=(c.rollout.prompt_bucket,), sampling=sampling, seed=c.seed,
                        mesh=local_mesh, rules=rules)
        params = jax.device_put(policy.params, shardings_for(policy.params, local_mesh, rules))
        return RolloutInstance(0, engine, lambda newer: (0, params) if newer < 0 else None,
                               server, reporter)

    def remote(server, reporter):
        # Device to device through jax.experimental.transfer, laid out for the actor's mesh.
        layout = shardings_for(policy.params, Mesh(np.asarray(jax.devices()[:1]), ("tp",)), rules)
        publisher = WeightPublisher(make_sender("jax_transfer", layout, host="127.0.0.1"))
        publisher.push(0, policy.params)
        spec = InstanceSpec(policy.config, c.rollout.num_slots, max_len, c.rollout.prompt_bucket,
                            sampling, c.seed, True, 1, "jax_transfer", "127.0.0.1", 60.0)
        actor = ray.remote(InstanceActor).options(
            num_cpus=0, max_concurrency=4, max_restarts=0,
            runtime_env={"env_vars": actor_environment(1, "cpu")}).remote(0, spec)
        return RemoteInstance(0, actor, server, reporter, publisher,
                              Timeouts(0.2, 60.0, 240.0, 30.0), c.rollout.num_slots)

    here, there = generate(local, c, prompts), generate(remote, c, prompts)
    assert sum(len(r.tokens) for r in here) > 2 * len(here)  # real responses, not all 1 token
    for a, b in zip(here, there):
        assert (a.trajectory_id, a.tokens, a.versions, a.finish_reason) == \
            (b.trajectory_id, b.tokens, b.versions, b.finish_reason)
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6, atol=1e-6)


@ray.remote(num_cpus=0, max_concurrency=4)
class Silent:
    """Starts, then never answers a poll: a hung process, as the driver sees it."""

    def start(self):
        return {"pid": os.getpid()}

    def command(self, *args):
        pass

    def poll(self, wait_s):
        time.sleep(3600)


def test_a_silent_instance_fails_on_its_heartbeat_and_is_killed(ray_cluster):
    events, actor = queue.Queue(), Silent.remote()
    remote = RemoteInstance(3, actor, TrajectoryServer(), _Reporter(events), None,
                            Timeouts(0.1, 1.0, 120.0, 5.0), num_slots=8)
    remote.start()  # answers: the heartbeat starts counting now
    started = time.monotonic()
    failed = events.get(timeout=60)
    assert time.monotonic() - started < 20
    assert failed.instance == 3 and re.search(
        r"InstanceLost: rollout instance 3 \(Ray actor, pid \d+\) sent no snapshot for \d+\.\d s "
        r"\(distributed.heartbeat_timeout_s = 1.0\)", failed.error), failed.error
    assert not remote.snapshot().alive
    # ray.kill only asks for the kill: a call made at once may still be answered (seen under
    # load in CI), so the actor must be dead within a deadline, not at the first call.
    deadline = time.monotonic() + 30
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            ray.get(actor.start.remote(), timeout=30)
            time.sleep(0.1)


# ---------------------------------------------------------------------------- a run, kill -9


def test_killed_instance_actors_have_their_work_rerouted_and_rejoin_on_the_newest_weights(
        ray_cluster, tmp_path, caplog):
    # Instance 1 dies first: its work goes to instance 0. Then instance 0 dies too: every
    # batch after that comes from the fresh actors that rejoined in their place, so the run
    # completing proves they took work; their own counts say so too.
    killed = {}

    def kill_both_mid_run(rollouts):
        def killer():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and len(killed) < 2:
                pids = rollouts.pids()
                if 1 not in killed and pids[1] and rollouts.core.version >= 2 and rollouts.server.held_by(1):
                    os.kill(pids[1], signal.SIGKILL)
                    killed[1] = dict(pid=pids[1], held=len(rollouts.server.held_by(1)), at=time.time())
                elif 1 in killed and rollouts.core.counters.failed_instances == 1 \
                        and rollouts.server.held_by(0):
                    os.kill(pids[0], signal.SIGKILL)
                    killed[0] = dict(pid=pids[0], held=len(rollouts.server.held_by(0)), at=time.time())
                time.sleep(0.02)

        threading.Thread(target=killer, daemon=True).start()

    caplog.set_level(logging.WARNING, logger="asyncrl.distributed")
    steps = 6
    results = run(tiny(train__steps=steps, eval__heldout_size=8, distributed__backend="ray",
                       distributed__heartbeat_timeout_s=30.0, distributed__max_instance_restarts=1),
                  tmp_path, on_built=kill_both_mid_run)
    assert len(killed) == 2, f"killed only {killed}"
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert results["steps"] == steps
    last = rows[-1]
    assert last["failed_instances"] == 2 and last["rejoined_instances"] == 2
    assert last["rerouted_after_failure"] >= 1
    for i in (0, 1):
        assert last[f"instance{i}_restarts"] == 1
        # Counted by the stand-in of the actor now in place i: the one that rejoined.
        assert last[f"instance{i}_finished"] > 0, f"instance {i} did nothing after it rejoined"
        failed = [r for r in caplog.records
                  if f"rollout instance {i} (Ray actor, pid {killed[i]['pid']})" in r.message]
        assert failed, caplog.text
        noticed_s = failed[0].created - killed[i]["at"]
        assert noticed_s < 10, f"the dead actor of instance {i} was noticed late"
        rejoined = [r for r in caplog.records if f"rollout instance {i} rejoined: a fresh actor" in r.message]
        assert rejoined, caplog.text
        print(f"kill -9 of instance {i} (pid {killed[i]['pid']}, holding {killed[i]['held']}) noticed "
              f"after {noticed_s:.2f} s; rejoined after {rejoined[0].created - killed[i]['at']:.1f} s")
    lags = [lag for r in rows for lag in r["staleness"]]
    assert all(0 <= lag <= 2 for lag in lags)  # η = 2 held throughout
    entries = [e for r in rows for e in r["entries"]]
    assert len(entries) == len(set(entries)) == steps * 8, "an entry was consumed twice"
    protocol = results["protocol"]
    accounted = set(entries) | set(protocol["unconsumed"]) | set(protocol["aborted"])
    assert accounted == set(range(protocol["next_entry_id"])), "an entry was lost"


# ---------------------------------------------------------------------------- the trainer as actors


def test_trainer_processes_are_checked_naming_the_field():
    with pytest.raises(ConfigError, match=r"config.distributed.trainer_processes = 0 is not "
                       r"allowed: expected an int ≥ 1"):
        validate(tiny(distributed__backend="ray", distributed__trainer_processes=0), 8)
    with pytest.raises(ConfigError, match=r"config.distributed.trainer_processes = 2 is not "
                       r"allowed: 1 with distributed.backend='local'"):
        validate(tiny(distributed__trainer_processes=2), 8)
    for field, value in [("num_processes", 2), ("process_id", 0),
                         ("coordinator_address", "127.0.0.1:1234")]:
        with pytest.raises(ConfigError, match=rf"config.distributed.trainer_processes = 2 is not "
                           rf"allowed: 1 when distributed.{field} is set"):
            validate(tiny(distributed__backend="ray", distributed__trainer_processes=2,
                          **{f"distributed__{field}": value}), 8)
    for field in ("trainer_cpus", "trainer_gpus"):
        with pytest.raises(ConfigError, match=rf"config.distributed.{field} = -1.0 is not allowed"):
            validate(tiny(**{f"distributed__{field}": -1.0}), 8)
    validate(tiny(distributed__backend="ray", distributed__trainer_processes=2), 8)


def test_the_driver_runs_its_trainer_group_with_a_follower_it_starts_as_a_ray_actor(tmp_path):
    # A process of its own: the driver joins jax.distributed before its JAX backend starts,
    # which in this test process has long started. It starts its own loopback Ray head.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")  # trainer part, evaluation
    command = [sys.executable, "-m", "asyncrl.main", "--config=experiments/grpo.py:tiny",
               f"--workdir={tmp_path}", "--config.train.steps=2", "--config.eval.heldout_size=8",
               "--config.distributed.backend=ray", "--config.distributed.trainer_processes=2",
               # One instance: a second one compiling beside the follower took this test from
               # ~50 s alone to ~170 s in the loaded suite, and tests nothing of the group.
               "--config.mesh.rollout_instances=1",
               # the follower and the instance, one CPU each, on a machine that may have two
               "--config.distributed.ray_num_cpus=3"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    (tmp_path / "run.log").write_text(done.stderr)  # whole, for a failure's earlier lines
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert results["steps"] == 2 and "after" in results
    # One trainer mesh: this process's device 0 and a device of the follower's process.
    other = re.search(r"trainer \[0,(\d+)\]", results["placement"])
    assert other and int(other.group(1)) >= 2, results["placement"]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert_every_entry_accounted_once(rows, results["protocol"])
    group = re.search(r"trainer group of 2 processes: coordinator (\S+):\d+; Ray reports "
                      r"([^;]+); process 1: pid \d+ on (\S+)", done.stderr)
    assert group, done.stderr[-4000:]
    addresses = [group.group(1), *group.group(2).split(", "), group.group(3)]
    assert all(is_loopback(a) for a in addresses), addresses
    assert "trainer group process 1: " in done.stderr  # the follower's own line, via Ray


def test_a_sigterm_after_ray_starts_reaches_the_runs_handler():
    # ray.init installs its own SIGTERM handler in the driver, which ends the process at once
    # (exit -6, no checkpoint); the handler the run installed must still be the one called.
    script = (
        "import os, signal, threading\n"
        "from asyncrl.distributed.cluster import start_local\n"
        "stop = threading.Event()\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())\n"
        "cluster = start_local(num_cpus=1, object_store_mb=128)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert stop.wait(10), 'the handler was not called'\n"
        "cluster.close()\n"
        "print('checkpointed')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "checkpointed" in done.stdout, done.stderr[-3000:]


def test_an_unreachable_ray_address_is_one_error_line_within_a_minute(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.main", "--config=experiments/grpo.py:tiny",
         "--config.distributed.backend=ray", "--config.distributed.ray_address=127.0.0.1:1",
         f"--workdir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert time.monotonic() - start < 60 + 30  # the minute, and the imports on a loaded host
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert "127.0.0.1:1 (distributed.ray_address)" in errors[0]
    assert "Traceback" not in done.stderr
