import jax
import pytest


@pytest.fixture(scope="module", autouse=True)
def strict_rank_promotion():
    """Broadcasts in the model must be explicit, so trainers may turn this check on."""
    with jax.numpy_rank_promotion("raise"):
        yield
