"""Our parameter layout <-> HF tensor names and shapes, shared by every loader and exporter.

HF stores a linear layer as `weight [out, in]`; we store einsum-ready weights with the input
dims first and heads split out (q: [D, N, H], o: [N, H, D]) and layers stacked (leading L).
One table describes the correspondence; `params_from_hf` and `params_to_hf` both read it, so
loading and export cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from asyncrl.model.config import ModelConfig
from asyncrl.model.errors import ModelFileError
from asyncrl.model.transformer import abstract_params


@dataclasses.dataclass(frozen=True)
class _Entry:
    path: tuple[str, ...]  # our State path
    hf_name: str  # `{i}` for the layer index when per_layer
    per_layer: bool
    in_dims: int  # >0: a linear layer whose first in_dims dims of ours are HF's `in` axis


def _table(config: ModelConfig) -> list[_Entry]:
    layer = "model.layers.{i}."
    entries = [
        _Entry(("embed",), "model.embed_tokens.weight", False, 0),
        _Entry(("final_norm", "scale"), "model.norm.weight", False, 0),
        _Entry(("blocks", "attn_norm", "scale"), layer + "input_layernorm.weight", True, 0),
        _Entry(("blocks", "mlp_norm", "scale"), layer + "post_attention_layernorm.weight", True, 0),
        _Entry(("blocks", "attn", "q"), layer + "self_attn.q_proj.weight", True, 1),
        _Entry(("blocks", "attn", "k"), layer + "self_attn.k_proj.weight", True, 1),
        _Entry(("blocks", "attn", "v"), layer + "self_attn.v_proj.weight", True, 1),
        _Entry(("blocks", "attn", "o"), layer + "self_attn.o_proj.weight", True, 2),
        _Entry(("blocks", "mlp", "gate"), layer + "mlp.gate_proj.weight", True, 1),
        _Entry(("blocks", "mlp", "up"), layer + "mlp.up_proj.weight", True, 1),
        _Entry(("blocks", "mlp", "down"), layer + "mlp.down_proj.weight", True, 1),
    ]
    if not config.tie_embeddings:
        entries.append(_Entry(("lm_head",), "lm_head.weight", False, 0))
    if config.qkv_bias:
        entries += [_Entry(("blocks", "attn", f"{x}_bias"), layer + f"self_attn.{x}_proj.bias",
                           True, 0) for x in "qkv"]
    if config.qk_norm:
        entries += [_Entry(("blocks", "attn", f"{x}_norm", "scale"),
                           layer + f"self_attn.{x}_norm.weight", True, 0) for x in "qk"]
    return entries


def hf_tensor_names(config: ModelConfig) -> list[str]:
    """Every HF tensor name the config needs (what a loader must find)."""
    return [e.hf_name.format(i=i) for e in _table(config)
            for i in (range(config.num_layers) if e.per_layer else [0])]


def _hf_shape(entry: _Entry, ours: tuple[int, ...]) -> tuple[int, ...]:
    if entry.in_dims:
        return (math.prod(ours[entry.in_dims:]), math.prod(ours[:entry.in_dims]))
    if entry.path[-1].endswith("_bias"):
        return (math.prod(ours),)
    return ours


def _to_ours(entry: _Entry, hf: np.ndarray, ours: tuple[int, ...]) -> np.ndarray:
    return hf.T.reshape(ours) if entry.in_dims else hf.reshape(ours)


def _to_hf(entry: _Entry, ours: np.ndarray) -> np.ndarray:
    shape = _hf_shape(entry, ours.shape)
    if entry.in_dims:
        return np.ascontiguousarray(ours.reshape(shape[::-1]).T)
    return ours.reshape(shape)


def _find(state: nnx.State, path: tuple[str, ...]) -> nnx.Variable:
    node = state
    for key in path:
        node = node[key]
    return node


def params_from_hf(config: ModelConfig, get: Callable[[str], np.ndarray | None],
                   source: str) -> tuple[nnx.GraphDef, nnx.State]:
    """Builds (graphdef, params) from HF-named tensors; `get(name)` returns None if absent.

    `source` (a file or folder) goes into every error message.
    """
    graphdef, abstract = abstract_params(config)
    dtype = jnp.dtype(config.param_dtype)
    for entry in _table(config):
        variable = _find(abstract, entry.path)
        full = variable.get_value().shape
        one = full[1:] if entry.per_layer else full
        expected = _hf_shape(entry, one)
        layers = []
        for i in range(config.num_layers) if entry.per_layer else [0]:
            name = entry.hf_name.format(i=i)
            tensor = get(name)
            if tensor is None:
                raise ModelFileError(f"{source}: missing tensor {name!r} (expected shape "
                                      f"{expected}) for a {config.architecture} model")
            if tuple(tensor.shape) != expected:
                raise ModelFileError(f"{source}: tensor {name!r} has shape "
                                      f"{tuple(tensor.shape)}, expected {expected}")
            layers.append(_to_ours(entry, np.asarray(tensor), one).astype(dtype))
        value = np.stack(layers) if entry.per_layer else layers[0]
        variable.set_value(jnp.asarray(value))
    return graphdef, abstract


def params_to_hf(config: ModelConfig, params: nnx.State) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, array) for every tensor, on the host, in the param dtype."""
    for entry in _table(config):
        value = np.asarray(jax.device_get(_find(params, entry.path).get_value()))
        if entry.per_layer:
            for i in range(config.num_layers):
                yield entry.hf_name.format(i=i), _to_hf(entry, value[i])
        else:
            yield entry.hf_name, _to_hf(entry, value)
