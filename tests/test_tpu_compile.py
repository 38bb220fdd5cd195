"""Compiling for a TPU topology from this host: topology names, and the decode step's bytes.

Needs libtpu (the TPU compiler), not a TPU: the tiny model's decode step is compiled for a
v5e chip and measured with XLA's cost analysis.
"""

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed: compiling for a TPU topology needs the TPU compiler")


def test_topology_names():
    from asyncrl.plan.tpu_compile import topology_devices

    assert len(topology_devices("v5e:1x1")) == 1
    assert len(topology_devices("v5e:2x2")) == 4
    assert topology_devices("v5e:1x1")[0].platform == "tpu"
    for bad in ("v5e", "v5e:2", "tpu:2x2", "v5e:0x1", "v99z:1x1"):
        with pytest.raises(ValueError, match="topology"):
            topology_devices(bad)


def test_decode_bytes_count_every_layer_and_the_kernels_blocks():
    from asyncrl.model import ModelConfig
    from asyncrl.plan.decode_cost import decode_step_bytes

    # head_dim 128: the TPU paged attention kernel needs a multiple of 128.
    config = ModelConfig.tiny(head_dim=128, param_dtype="bfloat16", max_seq_len=4096)
    page = 16 * 2 * config.num_kv_heads * 128 * 2  # one page of K and V, bf16
    for max_len in (128, 4096):
        shape = dict(num_seqs=8, max_len=max_len, mean_len=20, page_size=16,
                     topology="v5e:1x1")
        paged = decode_step_bytes(config, paged=True, **shape)
        contiguous = decode_step_bytes(config, paged=False, **shape)
        for result in (paged, contiguous):
            assert result["corrected_bytes"] >= result["param_bytes"] > 0
            # XLA counts the layer loop's body once; every layer is counted here.
            assert result["bytes"] > result["xla_bytes"]
        # The kernel copies each row's live pages: 20 positions are 2 pages, whatever
        # max_len. XLA credits it with next to nothing itself.
        assert paged["kernel_kv_bytes"] == config.num_layers * 8 * 2 * page
        assert paged["kernel_xla_bytes"] < paged["kernel_bytes"] / 10
    # With rows far shorter than max_len, the paged step reads less than the contiguous one.
    assert paged["bytes_vs_ideal"] < contiguous["bytes_vs_ideal"]


@pytest.mark.parametrize("topology", ["v5e:1x1", "v6e:1x1"])
def test_the_paged_decode_kernel_compiles_at_long_lengths_and_large_pages(topology):
    """The shapes JAX's ragged kernel could not hold in VMEM: 7B's heads (4 kv, 7 query
    heads each), bf16, 32k positions in pages of 64 and of 16; its VMEM use does not grow
    with the length (two buffers of a block), and Mosaic lowers the bf16 strided loads."""
    import functools

    import jax
    import jax.numpy as jnp

    from asyncrl.model.paged_tpu import paged_decode
    from asyncrl.plan.tpu_compile import compile_for, topology_devices

    shape = jax.ShapeDtypeStruct
    for page_size in (64, 16):
        width = 32768 // page_size
        args = (shape((8, 28, 128), jnp.bfloat16),
                shape((2, 8 * width, page_size, 8, 128), jnp.bfloat16),
                shape((8, width), jnp.int32), shape((8,), jnp.int32), shape((), jnp.int32))
        compile_for(functools.partial(paged_decode, sm_scale=0.1), args,
                    topology_devices(topology))
