import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from asyncrl.servers.parameters import ParameterServer


@pytest.fixture(scope="module")
def meshes():
    devices = np.array(jax.devices())
    assert len(devices) >= 6, "tests/conftest.py should fake 8 CPU devices"
    trainer = Mesh(devices[:2], ("fsdp",))
    rollout = [Mesh(devices[2:4], ("tp",)), Mesh(devices[4:6], ("tp",))]
    return trainer, rollout


def params_on(mesh, scale):
    tree = {"w": jnp.arange(16.0).reshape(4, 4) * scale, "b": jnp.ones(4) * scale}
    return jax.device_put(tree, {"w": NamedSharding(mesh, P(mesh.axis_names[0])),
                                 "b": NamedSharding(mesh, P())})


def replicated(mesh):
    return {"w": NamedSharding(mesh, P()), "b": NamedSharding(mesh, P())}


def test_pull_lands_on_the_instance_mesh_with_the_pushed_values(meshes):
    trainer, (mesh_a, _) = meshes
    server = ParameterServer()
    assert server.pull("a", replicated(mesh_a)) is None
    server.push(1, params_on(trainer, 2.0))
    version, params = server.pull("a", replicated(mesh_a))
    assert version == 1
    assert params["w"].sharding.device_set == set(mesh_a.devices.flat)
    np.testing.assert_array_equal(params["w"], np.arange(16.0).reshape(4, 4) * 2)
    assert server.pull("a", replicated(mesh_a), newer_than=1) is None
    assert server.held_versions() == {"a": 1}
    assert len(server.push_seconds) == 1 and len(server.pull_seconds) == 1


def test_pushed_version_survives_the_trainer_donating_its_buffers(meshes):
    trainer, (mesh_a, _) = meshes
    server = ParameterServer()
    params = params_on(trainer, 1.0)
    server.push(1, params)
    step = jax.jit(lambda p: jax.tree.map(lambda x: x + 100, p), donate_argnums=0)
    params = step(params)  # the trainer's next step reuses the pushed buffers
    _, pulled = server.pull("a", replicated(mesh_a))
    np.testing.assert_array_equal(pulled["b"], np.ones(4))


def test_old_versions_are_freed_and_versions_must_increase(meshes):
    trainer, (mesh_a, mesh_b) = meshes
    server = ParameterServer()
    for v in range(1, 4):
        server.push(v, params_on(trainer, float(v)))
    assert server.stored_versions() == [3]
    with pytest.raises(ValueError, match="push of version 3: versions must increase, latest is 3"):
        server.push(3, params_on(trainer, 0.0))


def test_concurrent_pulls_and_pushes_always_see_a_whole_version(meshes):
    trainer, rollout = meshes
    server = ParameterServer()
    server.push(0, params_on(trainer, 0.0))
    seen, errors = [], []

    last = 9

    def puller(i):
        mesh = rollout[i % 2]
        newest = -1
        # Pull until the last push is seen, not a fixed count: on a loaded host the pullers
        # could otherwise finish before the first push and test nothing concurrent.
        deadline = time.monotonic() + 120
        while newest < last:
            if time.monotonic() > deadline:
                errors.append(("never saw the last version", newest))
                return
            got = server.pull(i, replicated(mesh), newer_than=-1)
            version, params = got
            # Every leaf of a pulled tree belongs to the same version.
            if not (np.all(np.asarray(params["b"]) == version) and
                    np.asarray(params["w"])[0, 1] == version):
                errors.append((version, params))
            if version < newest:
                errors.append(("went back", version, newest))
            newest = version
            seen.append(version)

    threads = [threading.Thread(target=puller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for v in range(1, last + 1):
        server.push(v, params_on(trainer, float(v)))
    for t in threads:
        t.join()
    assert not errors
    assert seen.count(last) >= len(threads)


@pytest.fixture(scope="module")
def colocated():
    """The trainer's mesh and two instances' meshes on one device, as placement lays them."""
    device = np.array(jax.devices()[:1])
    return Mesh(device, ("fsdp",)), [Mesh(device, ("tp",)), Mesh(device, ("tp",))]


def pointer(x):
    return x.addressable_shards[0].data.unsafe_buffer_pointer()


def test_a_colocated_pull_is_a_reference_to_the_servers_copy(colocated):
    trainer, (mesh_a, mesh_b) = colocated
    server = ParameterServer()
    params = params_on(trainer, 3.0)
    server.push(1, params)
    _, on_a = server.pull("a", replicated(mesh_a))
    _, on_b = server.pull("b", replicated(mesh_b))
    for name in ("w", "b"):
        # Both instances read the one copy the push made; the trainer's buffer is not it.
        assert pointer(on_a[name]) == pointer(on_b[name]) != pointer(params[name])
    np.testing.assert_array_equal(on_a["w"], np.arange(16.0).reshape(4, 4) * 3)


def test_a_colocated_reference_outlives_donation_and_newer_versions(colocated):
    trainer, (mesh_a, _) = colocated
    server = ParameterServer()
    params = params_on(trainer, 1.0)
    server.push(1, params)
    _, held = server.pull("a", replicated(mesh_a))
    step = jax.jit(lambda p: jax.tree.map(lambda x: x + 100, p), donate_argnums=0)
    params = step(params)  # the trainer's step donates the buffers it pushed from
    server.push(2, params)  # version 1 leaves the server while instance "a" still decodes
    assert server.stored_versions() == [2]
    assert not held["b"].is_deleted()
    np.testing.assert_array_equal(held["b"], np.ones(4))
    _, newer = server.pull("a", replicated(mesh_a), newer_than=1)
    np.testing.assert_array_equal(newer["b"], np.ones(4) + 100)


def test_on_a_cpu_host_instances_on_other_devices_share_the_published_copy(meshes):
    # Each "device" of a CPU is this process's memory: a replicated pull reads the server's
    # buffers, however many instances pull, and stays whole after the trainer donates and
    # the server moves on. What is sharded on the target is still a transfer.
    trainer, (mesh_a, mesh_b) = meshes
    server = ParameterServer()
    one_device = Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    params = jax.device_put({"w": jnp.arange(16.0).reshape(4, 4), "b": jnp.ones(4)},
                            replicated(one_device))
    server.push(1, params)
    _, on_a = server.pull("a", replicated(mesh_a))
    _, on_b = server.pull("b", replicated(mesh_b))
    published = jax.tree.leaves(server._versions[1].params)
    for a, b, p in zip(jax.tree.leaves(on_a), jax.tree.leaves(on_b), published):
        trainers = {pointer(x) for x in jax.tree.leaves(params)}
        assert {pointer(a), pointer(b)} == {pointer(p)} != trainers
        assert all(s.data.unsafe_buffer_pointer() == pointer(p) for s in a.addressable_shards)
        assert a.sharding.device_set == set(mesh_a.devices.flat)
    nbytes = sum(x.nbytes for x in published)
    assert (server.shared_bytes, server.copied_bytes) == (2 * nbytes, 0)
    params = jax.jit(lambda p: jax.tree.map(lambda x: x + 100, p), donate_argnums=0)(params)
    server.push(2, params)
    assert server.stored_versions() == [2]
    np.testing.assert_array_equal(on_a["w"], np.arange(16.0).reshape(4, 4))
    np.testing.assert_array_equal(jax.jit(lambda t: t["b"] * 2)(on_b), np.full(4, 2.0))
    sharded = {"w": NamedSharding(mesh_a, P("tp")), "b": NamedSharding(mesh_a, P())}
    _, split = server.pull("a", sharded)
    np.testing.assert_array_equal(split["w"], np.arange(16.0).reshape(4, 4) + 100)
    assert server.copied_bytes == split["w"].nbytes
