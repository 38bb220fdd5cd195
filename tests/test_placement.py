"""Where the trainer and the rollout instances run: disjoint slices, or shared devices."""

import jax
import ml_collections
import pytest

from asyncrl.placement import describe_layout, devices_needed, place


def mesh_config(t, k, d, colocate):
    return ml_collections.ConfigDict({"trainer_devices": t, "rollout_instances": k,
                                      "devices_per_instance": d, "colocate": colocate})


def ids(mesh):
    return [d.id for d in mesh.devices.flat]


def test_disjoint_meshes_take_consecutive_slices():
    trainer, rollouts = place(mesh_config(2, 3, 2, False), jax.devices()[:8])
    assert ids(trainer) == [0, 1]
    assert [ids(m) for m in rollouts] == [[2, 3], [4, 5], [6, 7]]
    assert devices_needed(mesh_config(2, 3, 2, False)) == 8


def test_colocated_on_one_device_every_mesh_is_that_device():
    config = mesh_config(1, 2, 1, True)
    assert devices_needed(config) == 1
    trainer, rollouts = place(config, jax.devices()[:1])
    assert ids(trainer) == [0] and [ids(m) for m in rollouts] == [[0], [0]]
    assert rollouts[0].axis_names == ("tp",) and trainer.axis_names == ("fsdp",)
    assert describe_layout(trainer, rollouts) == "colocated: trainer [0], instance0 [0], instance1 [0]"


def test_colocated_instances_spread_round_robin_over_the_trainers_devices():
    trainer, rollouts = place(mesh_config(4, 3, 2, True), jax.devices()[:8])
    assert ids(trainer) == [0, 1, 2, 3]  # the devices past trainer_devices stay unused
    assert [ids(m) for m in rollouts] == [[0, 1], [2, 3], [0, 1]]
    _, rollouts = place(mesh_config(3, 4, 1, True), jax.devices()[:3])
    assert [ids(m) for m in rollouts] == [[0], [1], [2], [0]]


def test_too_few_devices_is_an_error_not_an_empty_mesh():
    with pytest.raises(ValueError, match="placement needs 3 devices, got 1"):
        place(mesh_config(1, 2, 1, False), jax.devices()[:1])
    with pytest.raises(ValueError, match="an instance's 2 devices must come from the trainer's 1"):
        place(mesh_config(1, 1, 2, True), jax.devices()[:2])
