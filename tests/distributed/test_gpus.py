"""GPUs on one GPU VM under Ray, shown on the CPU: a loopback Ray head that declares GPUs (the
ids a CUDA_VISIBLE_DEVICES names; Ray takes a declared count on trust), actors started with
the run's own options, each reading back the GPUs Ray left it and its memory settings. Never
run on a real multi-GPU machine.

Cheap on purpose (this machine has 2 cores): the actors are `gpu_probe.Probe`, which imports
nothing heavy, reserve no CPU, and nothing compiles.
"""

import os

import pytest

from asyncrl.config import with_overrides
from asyncrl.distributed import gpus
from asyncrl.distributed.gpus import Ask, GPUError, check_asks, machine_gpus, split_machine
from experiments.grpo import get_config
from tests.distributed.gpu_probe import Probe


def one_vm(**changes):
    """The tiny run with its instances (and, asked for, trainer followers) as Ray actors on a
    head this process starts."""
    c = with_overrides(get_config("tiny"), {
        "distributed.backend": "ray", "mesh.trainer_devices": 1, "distributed.ray_num_cpus": 1,
        # Ray starts a worker per declared CPU up front; the probes need none.
        "distributed.instance_cpus": 0.0, "distributed.trainer_cpus": 0.0})
    return with_overrides(c, {k.replace("__", "."): v for k, v in changes.items()})


@pytest.fixture
def clean(monkeypatch):
    """This process's environment and split as they were, after the test."""
    saved = dict(os.environ)
    monkeypatch.setattr(gpus, "_split", None)
    for key in [k for k in os.environ
                if k.startswith("RAY_") or k in (gpus.VISIBLE, gpus.MEM_FRACTION)]:
        del os.environ[key]  # the token and GPUs this test declares, not the caller's
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_each_actor_gets_its_own_gpus_and_the_driver_keeps_the_trainers(clean):
    import ray

    from asyncrl.distributed.cluster import connect
    from asyncrl.distributed.gpus import check_cluster
    from asyncrl.distributed.rollouts import instance_options
    from asyncrl.trainer_actors import follower_options

    # A machine of 5 GPUs: the trainer keeps 1, two instances and a follower take one each,
    # and two instances of another run share the last one.
    os.environ[gpus.VISIBLE] = "0,1,2,3,4"
    c = one_vm(mesh__rollout_instances=2, distributed__instance_gpus=1.0,
               distributed__trainer_processes=2, distributed__trainer_gpus=1.0)
    assert split_machine(c.distributed, c.mesh) == gpus.Split(("0",), ("1", "2", "3", "4"))
    assert os.environ[gpus.VISIBLE] == "0"  # this process's JAX would see its trainer's alone
    cluster = connect(c.distributed)
    try:
        assert os.environ[gpus.VISIBLE] == "0"  # put back once the head started
        assert ray.cluster_resources()["GPU"] == 4
        check_cluster(c.distributed, c.mesh)
        probe = ray.remote(Probe)
        actors = [probe.options(**instance_options(c)).remote(i) for i in range(2)]
        actors.append(probe.options(**follower_options(c)).remote(1))
        sharing = one_vm(mesh__rollout_instances=2, distributed__instance_gpus=0.5)
        actors += [probe.options(**instance_options(sharing)).remote(i) for i in range(2)]
        whole0, whole1, follower, half0, half1 = ray.get([a.seen.remote() for a in actors],
                                                         timeout=120)

        # Ray's ids are its head's, this machine's GPUs 1-4: none is the trainer's. Which
        # actor gets which is Ray's choice (it places them concurrently).
        for seen in (whole0, whole1, follower):
            assert seen["visible"] == ",".join(seen["ray_ids"]) and len(seen["ray_ids"]) == 1
            assert seen["fraction"] == "0.75" and seen["noset"] == "0"  # JAX's share, all of it
        wholes = [s["visible"] for s in (whole0, whole1, follower)]
        assert half0["visible"] == half1["visible"] and half0["visible"] not in wholes
        assert sorted([*wholes, half0["visible"]]) == ["1", "2", "3", "4"]  # each its own
        assert half0["fraction"] == half1["fraction"] == "0.375"  # two fit on one GPU
        # One that reserves none would keep every GPU of its node (Ray leaves the variable).
        cpu_only = instance_options(one_vm())["runtime_env"]["env_vars"]
        assert cpu_only[gpus.VISIBLE] == "" and gpus.MEM_FRACTION not in cpu_only

        # More than any node offers: refused naming the field, not left waiting by Ray.
        with pytest.raises(GPUError, match=r"distributed.instance_gpus = 5 for each of 1 actors, "
                           r"but the Ray cluster \(1 nodes\) has room for 0 such actors \(GPUs "
                           r"per node: 4\)"):
            big = one_vm(mesh__rollout_instances=1, distributed__instance_gpus=5.0)
            check_cluster(big.distributed, big.mesh)
    finally:
        cluster.close()


def test_a_split_that_leaves_too_few_gpus_is_refused_before_jax_starts(clean):
    os.environ[gpus.VISIBLE] = "0,1,2"
    c = one_vm(mesh__rollout_instances=2, mesh__trainer_devices=2, distributed__instance_gpus=1.0)
    with pytest.raises(GPUError, match=r"distributed.instance_gpus = 1 for each of 2 actors, but "
                       r"this machine \(3 GPUs, the first mesh.trainer_devices = 2 kept for the "
                       r"job's trainer, so 1 for the Ray head\) has room for 1 such actors"):
        split_machine(c.distributed, c.mesh)
    assert os.environ[gpus.VISIBLE] == "0,1,2" and gpus.ray_gpus() is None  # nothing split
    # Actors that reserve no GPU: nothing to split, the Ray head finds the GPUs itself.
    vm = one_vm()
    assert split_machine(vm.distributed, vm.mesh) is None and os.environ[gpus.VISIBLE] == "0,1,2"


def test_actors_asking_no_gpu_where_gpus_are_offered_are_refused_naming_the_field():
    instances = Ask("distributed.instance_gpus", 0.0, 2, "", "the GPUs of one instance")
    with pytest.raises(GPUError, match=r"distributed.instance_gpus = 0.0 while the cluster "
                       r"offers 2 GPUs: .* set distributed.instance_gpus to the GPUs of one"):
        check_asks([instances], [0.0, 2.0], "the cluster")
    check_asks([instances], [], "the cluster")  # no GPU anywhere: the CPU is what there is
    check_asks([Ask("distributed.instance_gpus", 0.0, 2, "cpu", "")], [2.0], "the cluster")
    # A fraction of a GPU never spans two: three of 0.6 do not fit on two nodes of one GPU.
    with pytest.raises(GPUError, match=r"has room for 2 such actors"):
        check_asks([Ask("distributed.instance_gpus", 0.6, 3, "", "")], [1.0, 1.0], "the cluster")
    followers = Ask("distributed.trainer_gpus", 2.0, 1, "", "")
    instances = Ask("distributed.instance_gpus", 1.0, 2, "", "")
    with pytest.raises(GPUError, match=r"the actors ask 4 GPUs together \(2 × distributed."
                       r"instance_gpus = 1 \+ 1 × distributed.trainer_gpus = 2\), the cluster "
                       r"offers 3"):
        check_asks([instances, followers], [3.0], "the cluster")


def test_the_machines_gpus_are_cuda_visible_devices_else_the_drivers_list(tmp_path):
    for name in ("0000:01:00.0", "0000:02:00.0"):
        (tmp_path / name).mkdir()
    assert machine_gpus({}, str(tmp_path)) == ["0", "1"]
    assert machine_gpus({gpus.VISIBLE: "3,GPU-5f2a"}, str(tmp_path)) == ["3", "GPU-5f2a"]
    assert machine_gpus({gpus.VISIBLE: ""}, str(tmp_path)) == []
    assert machine_gpus({}, str(tmp_path / "absent")) == []
