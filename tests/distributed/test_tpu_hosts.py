"""TPU VM slices under Ray, read without a TPU: each process alone on a host of a multi-host
slice (an instance actor; worker 0's trainer in the one-slice layout) is told to be a slice of
its own, owning its host's first chips, so that its TPU runtime does not wait for the other
hosts to join it. What a TPU runtime then does with the variables is not tested here (no
TPU): launch/README.md says so."""

import os
import subprocess
import sys

import pytest

from asyncrl.config import ConfigError, resolve, with_overrides
from asyncrl.distributed.cluster import ClusterError, tpu_isolation
from asyncrl.distributed.rollouts import instance_options
from experiments.grpo import get_config

ISOLATION = ("TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_VISIBLE_CHIPS",
             "TPU_PROCESS_PORT", "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID")


def on_tpu_hosts(**changes):
    return with_overrides(get_config("tiny"), {
        "distributed.backend": "ray", "distributed.instance_platform": "tpu",
        "distributed.ray_address": "auto",
        **{k.replace("__", "."): v for k, v in changes.items()}})


def test_each_tpu_instance_actor_is_a_slice_of_its_own_owning_its_hosts_first_chips():
    env = instance_options(on_tpu_hosts(mesh__devices_per_instance=4))["runtime_env"]["env_vars"]
    assert {k: env[k] for k in ISOLATION} == {
        "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
        "TPU_VISIBLE_CHIPS": "0,1,2,3", "TPU_PROCESS_PORT": "8476",
        "TPU_PROCESS_ADDRESSES": "localhost:8476", "CLOUD_TPU_TASK_ID": "0"}
    assert env["JAX_PLATFORMS"] == "tpu"
    eight = instance_options(on_tpu_hosts(mesh__devices_per_instance=8))["runtime_env"]["env_vars"]
    assert eight["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,4,1"
    assert eight["TPU_VISIBLE_CHIPS"] == "0,1,2,3,4,5,6,7"
    # Other platforms are left as their nodes have them.
    cpu = instance_options(on_tpu_hosts(distributed__instance_platform="cpu"))
    assert not set(ISOLATION) & cpu["runtime_env"]["env_vars"].keys()


def test_instances_sharing_a_tpu_host_own_disjoint_chip_blocks_and_runtime_ports():
    c = on_tpu_hosts(mesh__devices_per_instance=2, mesh__rollout_instances=8,
                     distributed__instance_resource="asyncrl_rollout",
                     distributed__instances_per_host=4)
    resolve(c)
    blocks = [instance_options(c, i) for i in range(8)]
    envs = [o["runtime_env"]["env_vars"] for o in blocks]
    # Instance i takes block i mod 4 and asks for that block's resource: Ray puts it on a
    # host whose block is free, whichever host (a restarted instance too).
    assert [o["resources"] for o in blocks] == [{f"asyncrl_rollout_{i % 4}": 1}
                                                for i in range(8)]
    assert [e["TPU_VISIBLE_CHIPS"] for e in envs[:4]] == ["0,1", "2,3", "4,5", "6,7"]
    assert envs[4] == envs[0]
    assert [e["TPU_PROCESS_PORT"] for e in envs[:4]] == ["8476", "8477", "8478", "8479"]
    assert {e["TPU_PROCESS_ADDRESSES"] for e in envs[:4]} == {
        f"localhost:{p}" for p in range(8476, 8480)}
    assert {e["TPU_CHIPS_PER_PROCESS_BOUNDS"] for e in envs} == {"1,2,1"}
    with pytest.raises(ConfigError, match=r"config.distributed.instances_per_host = 8 is not "
                       r"allowed: at most 4 instances of 2 chip\(s\)"):
        resolve(with_overrides(c, {"distributed.instances_per_host": 8}))
    with pytest.raises(ConfigError, match=r"instances_per_host = 2 is not allowed: 1 unless "
                       r"distributed.instance_platform = 'tpu' and an instance_resource"):
        resolve(with_overrides(c, {"distributed.instances_per_host": 2,
                                   "distributed.instance_resource": ""}))
    with pytest.raises(ClusterError, match="chip block 2 of 4 chip"):
        tpu_isolation(4, 2)


def test_an_instance_size_no_tpu_host_holds_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"config.mesh.devices_per_instance = 3 is not allowed: "
                       r"1, 2, 4 or 8 with distributed.instance_platform = 'tpu'"):
        resolve(on_tpu_hosts(mesh__devices_per_instance=3))
    with pytest.raises(ClusterError, match="owns 1, 2, 4 or 8 chips, not 3"):
        tpu_isolation(3)


def test_tpu_instances_on_a_one_machine_ray_head_are_refused():
    # Every instance would own the same first chips of the one host the trainer is on.
    with pytest.raises(ConfigError, match=r"config.distributed.instance_platform = 'tpu' is not "
                       r"allowed: not 'tpu' with distributed.ray_address = 'local'"):
        resolve(on_tpu_hosts(distributed__ray_address="local"))
    resolve(on_tpu_hosts())  # a cluster of hosts: one instance on each


def test_the_launch_scripts_read_the_variables_from_the_command_line():
    # launch/tpu_vms.sh prefixes worker 0's job with them (`env $isolation python -m ...`).
    command = [sys.executable, "-m", "asyncrl.distributed.cluster", "--tpu-isolation=4"]
    out = subprocess.run(command, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout.split()
    assert dict(v.split("=", 1) for v in out) == tpu_isolation(4)
    bad = subprocess.run(command[:-1] + ["--tpu-isolation=6"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == ("error: --tpu-isolation: a TPU process on its host owns "
                          "1, 2, 4 or 8 chips, not 6\n")
