"""Shared fixtures: one tiny trainer on a 2-device 'fsdp' mesh, compiled once per session."""

import jax
import pytest

from asyncrl.train.trainer import Trainer, trainer_mesh
from tests.train.helpers import CONFIG, G, MODEL


@pytest.fixture(scope="session")
def trainer() -> Trainer:
    return Trainer.create(CONFIG, MODEL, trainer_mesh(jax.devices()[:2]), group_size=G)
