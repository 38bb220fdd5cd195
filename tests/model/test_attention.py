"""Training attention without the score matrix: every implementation this host can run (the
Pallas kernels in Pallas' interpreter) against dense attention, in values and in gradients;
blockwise's memory; the refusals; the TPU kernel compiled for a TPU from this host."""

import functools
import importlib.util
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from asyncrl.config_args import ConfigError
from asyncrl.model.attention import attend
from asyncrl.model.attention_names import ATTENTION_IMPLS
from asyncrl.train.section import TrainSection
from experiments.grpo import get_config

# Grouped-query heads (K < N); T = 40 is no multiple of blockwise's block (16 here), of
# splash's 128 or of flash_gpu's 64-token tiles, so every implementation pads a tail.
B, T, K, G, H, BLOCK = 2, 40, 2, 2, 16, 16
# Row 0: two trajectories and a padding tail (segment 0); row 1: one and a longer tail.
SEGMENTS = np.asarray([[1] * 15 + [2] * 20 + [0] * 5, [3] * 28 + [0] * 12], np.int32)
RUNNABLE_HERE = [n for n in ATTENTION_IMPLS if n not in ("dense", "cudnn")]  # cudnn: GPU only


def _positions(segments):
    """Each trajectory's positions from 0; the padding's all 0 (its queries are don't-care)."""
    positions = np.zeros_like(segments)
    for row, ids in enumerate(segments):
        for s in set(ids.tolist()) - {0}:
            positions[row, ids == s] = np.arange(np.sum(ids == s))
    return positions


def _inputs(dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, T, K, G, H)).astype(dtype)
    k, v = (jax.random.normal(key, (B, T, K, H)).astype(dtype) for key in keys[1:3])
    # The loss weighs real tokens only, as the trainer's does: padding outputs are don't-care.
    weights = jax.random.normal(keys[3], (B, T, K, G, H)) * (SEGMENTS != 0)[..., None, None, None]
    return q, k, v, weights


def _packed():
    return _positions(SEGMENTS), SEGMENTS


def _unpacked():
    """One trajectory per row, right-padded (segment_ids None): positions rise along the row."""
    return np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)), None


def _value_and_grads(impl, layout, dtype=jnp.float32, mesh=None):
    q, k, v, weights = _inputs(dtype)
    positions, segments = layout()

    def loss(q, k, v):
        out = attend(q, k, v, positions=positions, segment_ids=segments, impl=impl,
                     dtype=dtype, mesh=mesh, interpret=True, block=BLOCK)
        return jnp.sum(out.astype(jnp.float32) * weights), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


@functools.cache
def _dense(layout, dtype):
    return _value_and_grads("dense", layout, dtype)


def _assert_matches_dense(impl, layout, out, grads, dtype=jnp.float32, tol=2e-5):
    want_out, want_grads = _dense(layout, dtype)
    assert out.dtype == dtype and [g.dtype for g in grads] == [dtype] * 3
    assert bool(jnp.all(jnp.isfinite(out))), f"{impl}: a non-finite output (padding queries?)"
    real = (SEGMENTS != 0)[..., None, None, None]
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    np.testing.assert_allclose(f32(out) * real, f32(want_out) * real, atol=tol, rtol=tol)
    for name, got, want in zip("qkv", grads, want_grads):
        np.testing.assert_allclose(f32(got), f32(want), atol=tol, rtol=tol, err_msg=f"d{name}")


@pytest.mark.parametrize("layout", [_packed, _unpacked], ids=["packed", "unpacked"])
@pytest.mark.parametrize("impl", RUNNABLE_HERE)
def test_matches_dense_attention_in_values_and_gradients(impl, layout):
    out, grads = _value_and_grads(impl, layout)
    _assert_matches_dense(impl, layout, out, grads)


def test_blockwise_in_bfloat16_matches_dense_to_bfloat16_rounding():
    out, grads = _value_and_grads("blockwise", _packed, jnp.bfloat16)
    _assert_matches_dense("blockwise", _packed, out, grads, jnp.bfloat16, tol=3e-2)


@pytest.mark.parametrize("impl", ["splash", "flash_gpu"])
def test_kernels_run_per_row_shard_on_the_trainer_mesh(impl):
    mesh = Mesh(np.asarray(jax.devices()[:2]), ("fsdp",))
    q, k, v, _ = _inputs()
    positions, segments = _packed()
    traced = jax.make_jaxpr(lambda q, k, v: attend(
        q, k, v, positions=positions, segment_ids=segments, impl=impl, dtype=jnp.float32,
        mesh=mesh, interpret=True))(q, k, v)
    assert "shard_map" in str(traced)
    rows = NamedSharding(mesh, PartitionSpec("fsdp"))
    out = jax.jit(lambda q, k, v: attend(
        q, k, v, positions=positions, segment_ids=segments, impl=impl, dtype=jnp.float32,
        mesh=mesh, interpret=True))(*jax.device_put((q, k, v), rows))
    assert out.sharding.is_equivalent_to(rows, out.ndim)
    _assert_matches_dense(impl, _packed, out, _value_and_grads(impl, _packed, mesh=mesh)[1])


def test_blockwise_gradient_holds_far_less_than_the_score_matrix():
    length = 2048
    row = jax.ShapeDtypeStruct((1, length), jnp.int32)
    q = jax.ShapeDtypeStruct((1, length, 1, 2, 16), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, length, 1, 16), jnp.float32)
    temp = {}
    for impl in ("dense", "blockwise"):
        def loss(q, k, v, positions, segments, impl=impl):
            return jnp.sum(attend(q, k, v, positions=positions, segment_ids=segments,
                                  impl=impl, dtype=jnp.float32))
        compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, kv, kv, row, row).compile()
        temp[impl] = compiled.memory_analysis().temp_size_in_bytes
    print(f"gradient temporaries at T={length}: dense {temp['dense'] / 2**20:.1f} MiB, "
          f"blockwise {temp['blockwise'] / 2**20:.1f} MiB")
    # dense's float32 scores alone: 2 heads x T x T x 4 bytes = 32 MiB
    assert temp["dense"] > 2 * length * length * 4
    assert temp["blockwise"] < temp["dense"] / 4


@pytest.mark.parametrize("impl, layout, message", [
    ("splash", _packed, "splash runs on TPU only and this step is compiled for CPU"),
    ("flash_gpu", _unpacked, "flash_gpu runs on GPU only and this step is compiled for CPU"),
    ("cudnn", _unpacked, "cudnn runs on GPU only"),
    ("cudnn", _packed, "cudnn takes no segment ids, so it cannot run packed rows"),
    ("flash", _packed, "one of auto, dense, blockwise, splash, flash_gpu, cudnn"),
])
def test_what_this_platform_cannot_run_is_one_line_naming_the_field(impl, layout, message):
    q, k, v, _ = _inputs()
    positions, segments = layout()
    with pytest.raises(ConfigError) as error:  # interpret mode off: the kernels for real
        attend(q, k, v, positions=positions, segment_ids=segments, impl=impl,
               dtype=jnp.float32)
    text = str(error.value)
    assert text.startswith(f"config.train.attention = {impl!r} is not allowed: ")
    assert message in text and "\n" not in text


def test_the_config_defaults_to_auto_and_refuses_an_unknown_name():
    train = get_config().train
    assert TrainSection.from_node(train, "train").attention == "auto"
    train.attention = "flash"
    with pytest.raises(ConfigError, match=r"^config.train.attention = 'flash' is not allowed"):
        TrainSection.from_node(train, "train").check()


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed: compiling for a TPU topology needs it")
def test_auto_compiles_splash_for_a_tpu_from_this_host_per_row_shard():
    """The real Mosaic kernels (not the interpreter), for a v5e chip and a 2x2 slice whose
    mesh splits the rows: forward, dq and dkv kernels, and no rows gathered across chips."""
    from asyncrl.plan.tpu_compile import compile_for, topology_devices
    for topology, batch in (("v5e:1x1", 1), ("v5e:2x2", 4)):
        devices = topology_devices(topology)
        mesh = Mesh(np.asarray(devices), ("fsdp",))
        rows = NamedSharding(mesh, PartitionSpec("fsdp"))
        shape = lambda *dims, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(  # noqa: E731
            (batch, 200, *dims), dtype, sharding=rows)

        def loss(q, k, v, positions, segments):
            out = attend(q, k, v, positions=positions, segment_ids=segments, impl="auto",
                         dtype=jnp.bfloat16, mesh=mesh)
            return jnp.sum(out.astype(jnp.float32))

        compiled = compile_for(jax.grad(loss, (0, 1, 2)), (
            shape(K, G, 64), shape(K, 64), shape(K, 64), shape(dtype=jnp.int32),
            shape(dtype=jnp.int32)), devices)
        text = compiled.as_text()
        kernels = set(re.findall(r"splash_mha_(fwd|dq|dkv)_segmented", text))
        assert kernels == {"fwd", "dq", "dkv"}, topology
        assert "all-gather" not in text, topology


def test_a_run_asks_before_loading_whether_its_attention_runs_here():
    from asyncrl.model.attention import check_runs_here

    assert check_runs_here("auto", packed=True) == "blockwise"  # this CPU
    with pytest.raises(ConfigError, match=r"config.train.attention = 'splash' is not allowed: "
                                          r"splash runs on TPU only"):
        check_runs_here("splash", packed=False)
    with pytest.raises(ConfigError, match=r"cudnn takes no segment ids"):
        check_runs_here("cudnn", packed=True)
