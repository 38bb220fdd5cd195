"""The trainer as a jax.distributed group: two CPU processes (one device each, gloo
collectives) train the same 3 steps to the same losses as one process, and the group's
coordinator listens on 127.0.0.1 alone."""

import ipaddress
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest
from ml_collections import ConfigDict

from asyncrl.distributed.trainer_group import GroupError, GroupSettings, settings

ROOT = pathlib.Path(__file__).resolve().parents[2]


def unset(**changes):
    return ConfigDict({"coordinator_address": "", "num_processes": 0, "process_id": -1, **changes})


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
    assert seen == {"127.0.0.1"}, f"the coordinator listened on {seen}"
