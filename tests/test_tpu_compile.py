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


def test_paged_decode_reads_less_than_contiguous():
    from asyncrl.model import ModelConfig
    from asyncrl.plan.decode_cost import decode_step_bytes

    # head_dim 128: the TPU ragged paged attention kernel needs a multiple of 128.
    config = ModelConfig.tiny(head_dim=128, param_dtype="bfloat16")
    shape = dict(num_seqs=8, max_len=128, mean_len=16, page_size=16, topology="v5e:1x1")
    paged = decode_step_bytes(config, paged=True, **shape)
    contiguous = decode_step_bytes(config, paged=False, **shape)
    for result in (paged, contiguous):
        assert result["corrected_bytes"] >= result["param_bytes"] > 0
        # The scanned program counts one layer's body; unrolled counts both.
        assert result["unrolled_bytes"] > result["xla_bytes"]
    # The kernel reads only the live pages; XLA credits it with next to nothing itself.
    assert paged["kernel_bytes"] >= paged["live_kv_bytes"]
    assert paged["kernel_xla_bytes"] < paged["kernel_bytes"] / 10
    assert paged["bytes_vs_ideal"] < contiguous["bytes_vs_ideal"]
