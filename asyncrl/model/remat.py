"""What a layer keeps for the backward pass; the rest is recomputed there.

A training forward otherwise stores ~16k floats per token per layer at SmolLM2's shapes
(3.9 GB for one micro-batch of 16 x 128 tokens), the largest share of a train step's memory.
Each entry gives JAX's checkpoint policy when called, so the registry's names can be checked
(config validation) without importing JAX.
"""

from asyncrl.registry import Registry

REMAT_POLICIES = Registry("remat policy")


@REMAT_POLICIES.register("none")
def _keep_everything():  # fastest, most memory
    return None


@REMAT_POLICIES.register("dots")
def _keep_projections():  # the projections' outputs; norms, activations, scores recomputed
    import jax
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable


@REMAT_POLICIES.register("full")
def _keep_layer_inputs():
    import jax
    return jax.checkpoint_policies.nothing_saveable
