"""The trainer as a jax.distributed group: two CPU processes (one device each, gloo
collectives) train the same 3 steps to the same losses as one process, and the group's
coordinator listens on 127.0.0.1 alone; two `python -m asyncrl.main` processes run (and
resume) one post-training job, process 0 leading and process 1 following its trainer."""

import ipaddress
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from ml_collections import ConfigDict

from asyncrl.config import ConfigError, validate
from asyncrl.distributed.trainer_group import (GroupError, GroupSettings, check_gloo_reachable,
                                               settings)
from asyncrl.metrics import read_metrics
from tests.test_system import assert_every_entry_accounted_once, tiny

ROOT = pathlib.Path(__file__).resolve().parents[2]


def unset(**changes):
    return ConfigDict({"coordinator_address": "", "num_processes": 0, "process_id": -1,
                       "heartbeat_timeout_s": 60.0, **changes})


def test_settings_come_from_flags_then_the_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert settings(unset(), {}).num_processes == 1  # nothing set: no group
    assert settings(unset(), env) == GroupSettings("10.0.0.1:1234", 4, 3)
    assert settings(unset(coordinator_address="127.0.0.1:9", num_processes=2, process_id=0), env) \
        == GroupSettings("127.0.0.1:9", 2, 0)
    with pytest.raises(GroupError, match="process id 5 is not in \\[0, 4\\)"):
        settings(unset(process_id=5), env)
    with pytest.raises(GroupError, match="needs its coordinator's 'host:port'"):
        settings(unset(num_processes=2, process_id=0), {})


def test_a_cpu_group_across_hosts_on_a_host_named_for_loopback_is_refused_naming_the_fix():
    # gloo hands the other processes the address this host's name resolves to: loopback
    # (a stock /etc/hosts) cannot be reached from another host.
    with pytest.raises(GroupError, match="this host's name 'localhost' resolves to 127.0.0.1, "
                       "a loopback address.*Map 'localhost' to this host's address"):
        check_gloo_reachable("10.0.0.1:1234", hostname="localhost")
    with pytest.raises(GroupError, match="'no-such-host.invalid' does not resolve"):
        check_gloo_reachable("10.0.0.1:1234", hostname="no-such-host.invalid")
    check_gloo_reachable("127.0.0.1:1234", hostname="localhost")  # one machine: no matter


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_on(port: int) -> set[str]:
    """Addresses with a TCP socket listening on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for name, width in (("tcp", 4), ("tcp6", 16)):
        path = pathlib.Path(f"/proc/net/{name}")
        for line in path.read_text().splitlines()[1:] if path.exists() else []:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))
            ip = ipaddress.ip_address(raw)
            found.add(str(getattr(ip, "ipv4_mapped", None) or ip))
    return found


def group_check(env_changes: dict) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1", **env_changes}
    return subprocess.Popen([sys.executable, "-m", "asyncrl.distributed.trainer_group", "--steps=3"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_train_like_one():
    port = free_port()
    group = {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2"}
    processes = [group_check({**group, "JAX_PROCESS_ID": str(i)}) for i in range(2)]
    seen = set()
    while any(p.poll() is None for p in processes):
        seen |= listening_on(port)
        time.sleep(0.2)
    pair = [result(p) for p in processes]
    alone = result(group_check({}))  # after the pair: two cores, no third compile beside them
    assert [r["processes"] for r in pair] == [2, 2] and [r["devices"] for r in pair] == [2, 2]
    assert alone["processes"] == alone["devices"] == 1
    assert pair[0]["losses"] == pair[1]["losses"]
    assert pair[0]["losses"] == pytest.approx(alone["losses"], rel=1e-5, abs=1e-6)
    # Process 0 gets the weights one process would have trained; the follower no host copy.
    assert pair[0]["weights_abs_sum"] == pytest.approx(alone["weights_abs_sum"], rel=1e-5)
    assert pair[1]["weights_abs_sum"] is None
    assert seen == {"127.0.0.1"}, f"the coordinator listened on {seen}"


def main_process(workdir, port: int, process_id: int, *flags: str, devices: int = 3
                 ) -> subprocess.Popen:
    """One process of a two-process run; 3 CPU devices each: process 0 puts its trainer part
    on one and an instance on each other, process 1 gives the trainer its first."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    command = [sys.executable, "-m", "asyncrl.main", "--config=experiments/grpo.py:tiny",
               f"--workdir={workdir}", "--config.eval.heldout_size=8",
               "--config.distributed.num_processes=2",
               f"--config.distributed.process_id={process_id}",
               f"--config.distributed.coordinator_address=127.0.0.1:{port}", *flags]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def run_pair(workdir, *flags: str) -> list[str]:
    port = free_port()
    processes = [main_process(workdir, port, i, *flags) for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    for i, (p, output) in enumerate(zip(processes, outputs)):
        assert p.returncode == 0, f"process {i}:\n{output[-3000:]}"
    return outputs


def test_two_main_processes_run_and_resume_one_job(tmp_path):
    run_pair(tmp_path, "--config.train.steps=3")
    results = json.loads((tmp_path / "results.json").read_text())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert "after" in results and results["steps"] == 3
    assert "trainer [0,2048]" in results["placement"]  # one mesh over both processes
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert all(0 <= lag <= 2 for r in rows for lag in r["staleness"])  # eta = 2: none beyond
    assert_every_entry_accounted_once(rows, results["protocol"])
    assert (tmp_path / "checkpoints" / "3").is_dir()

    lead, follower = run_pair(tmp_path, "--config.train.steps=4")
    assert "resumed from" in lead and "checkpoints/3" in lead
    assert "resumed from" in follower  # restored the same sharded state
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["steps"] == 4 and "after" in results
    assert_every_entry_accounted_once(rows, results["protocol"])
    assert (tmp_path / "checkpoints" / "4").is_dir()


def test_a_group_with_too_few_local_devices_is_refused_naming_the_field():
    # Process 0 holds its trainer part and both instances: 3 devices of its own, whatever
    # the group has in total.
    with pytest.raises(ConfigError, match=r"config.mesh = '1 \+ 2 × 1' is not allowed: needs 3 "
                       r"devices, process 0 of the trainer group of 2 \(distributed.num_processes"):
        validate(tiny(), device_count=2, processes=2, process_index=0)
    with pytest.raises(ConfigError, match=r"config.mesh.trainer_devices = 2 is not allowed: at "
                       r"most the 1 local devices of trainer-group process 1 \(distributed.process_id"):
        validate(tiny(mesh__trainer_devices=2), device_count=1, processes=2, process_index=1)
    validate(tiny(), device_count=1, processes=2, process_index=1)  # a follower: its trainer part
    # The batch splits over every process's trainer devices: 128 sequences, 2 × 3 devices.
    with pytest.raises(ConfigError, match=r"config.train.num_microbatches = 1 .* "
                       r"mesh.trainer_devices \(3\) × 2 processes"):
        validate(tiny(mesh__trainer_devices=3), device_count=8, processes=2, process_index=0)


def test_a_group_whose_processes_have_unequal_device_counts_is_refused_by_both(tmp_path):
    # JAX's multi-process helpers and Orbax's barriers need equal counts: said before them.
    port = free_port()
    processes = [main_process(tmp_path, port, i, devices=3 - 2 * i) for i in range(2)]
    for i, p in enumerate(processes):
        output = p.communicate(timeout=300)[0]
        assert p.returncode != 0, f"process {i}:\n{output[-3000:]}"
        assert "every process needs the same number of devices (process 0: 3, process 1: 1)" \
            in output, f"process {i}:\n{output[-3000:]}"
        assert "Traceback" not in output, output[-3000:]
