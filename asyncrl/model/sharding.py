"""Logical axis names -> mesh axes, declared once per mesh kind.

Every parameter carries `logical_axes` metadata (see transformer.py). A `ShardingRules`
maps those names to mesh axes; `shardings_for` turns a params State (concrete or from
`abstract_params`) or a `KVCache` into a matching pytree of `NamedSharding`s, ready for
`jax.device_put` or `jax.jit(..., out_shardings=...)`.

The model relies on GSPMD propagation (no per-op `out_sharding`), so shardings are built on
an Auto-typed view of the mesh: `jax.make_mesh` now defaults to Explicit axes, under which
einsums over a sharded contraction dim are rejected as ambiguous. Call `apply` outside any
`jax.set_mesh(explicit_mesh)` context.

A rule that names a mesh axis the mesh does not have, or a dimension the axis does not divide
(e.g. 2 kv heads on tp=4), falls back to replicating that dimension: always correct, at worst
redundant, so one rule set serves every model size.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from asyncrl.model.config import ModelConfig
from asyncrl.model.paged import PagedKVCache
from asyncrl.model.transformer import KVCache, abstract_params, init_params

MeshAxes = str | tuple[str, ...] | None

# Cache leaves are plain arrays, not Params, so their logical axes are declared here.
CACHE_AXES = ("layers", "batch", "cache_seq", "kv_heads", "head_dim")
# A page pool [L, P, page_size, 2K, H]: kv heads split as the weights' are (each device keeps
# its heads' interleaved key / value pairs); pages are shared by all rows, so never split.
PAGE_AXES = ("layers", None, None, "kv_heads", "head_dim")


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Mesh axis (or axes, or None = replicated) for each logical axis name."""

    layers: MeshAxes = None
    vocab: MeshAxes = None
    embed: MeshAxes = None
    heads: MeshAxes = None
    kv_heads: MeshAxes = None
    head_dim: MeshAxes = None
    mlp: MeshAxes = None
    batch: MeshAxes = None
    cache_seq: MeshAxes = None

    @classmethod
    def replicated(cls) -> "ShardingRules":
        return cls()

    @classmethod
    def fsdp(cls, axis: str = "fsdp") -> "ShardingRules":
        """Trainer mesh: every weight split along D, the batch split over the same devices."""
        return cls(embed=axis, batch=axis)

    @classmethod
    def tensor_parallel(cls, axis: str = "tp") -> "ShardingRules":
        """Rollout mesh: Megatron-style heads / mlp / vocab split; the batch replicated."""
        return cls(vocab=axis, heads=axis, kv_heads=axis, mlp=axis)

    def mesh_axes(self, logical: str | None) -> MeshAxes:
        if logical is None:
            return None
        if logical not in _FIELDS:
            raise ValueError(f"unknown logical axis {logical!r}; known: {sorted(_FIELDS)}")
        return getattr(self, logical)

    def spec(self, logical_axes, shape, mesh: Mesh) -> PartitionSpec:
        """PartitionSpec for one array, replicating any dim the rule cannot split evenly."""
        used: set[str] = set()
        spec = []
        for name, size in zip(logical_axes, shape, strict=True):
            axes = self.mesh_axes(name)
            axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
            axes = tuple(a for a in axes if a in mesh.shape and a not in used)
            ways = 1
            for a in axes:
                ways *= mesh.shape[a]
            if not axes or size % ways:
                spec.append(None)
                continue
            used.update(axes)
            spec.append(axes[0] if len(axes) == 1 else axes)
        return PartitionSpec(*spec)


_FIELDS = {f.name for f in dataclasses.fields(ShardingRules)}


def auto_mesh(mesh: Mesh) -> Mesh:
    """The same devices and axis names with every axis Auto (sharding by propagation)."""
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * mesh.devices.ndim)


def shardings_for(tree: Any, mesh: Mesh, rules: ShardingRules) -> Any:
    """NamedSharding pytree matching `tree`: params, optimiser state, a KVCache, or any pytree
    holding them (concrete or abstract). Leaves without logical axes are replicated."""
    mesh = auto_mesh(mesh)

    def one(node):
        if isinstance(node, KVCache):
            return jax.tree.map(
                lambda x: NamedSharding(mesh, rules.spec(CACHE_AXES, x.shape, mesh)), node)
        if isinstance(node, PagedKVCache):
            return jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), node).replace(
                pages=NamedSharding(mesh, rules.spec(PAGE_AXES, node.pages.shape, mesh)))
        if isinstance(node, nnx.Variable):
            axes = node.get_metadata().get("logical_axes")
            spec = (PartitionSpec() if axes is None
                    else rules.spec(axes, node.get_value().shape, mesh))
            return node.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, (nnx.Variable, KVCache, PagedKVCache)))


def init_sharded(config: ModelConfig, seed: int, mesh: Mesh, rules: ShardingRules):
    """(graphdef, params) initialised straight into their shards; nothing lands on device 0."""
    graphdef, abstract = abstract_params(config)
    shardings = shardings_for(abstract, mesh, rules)
    params = jax.jit(lambda: init_params(config, seed)[1], out_shardings=shardings)()
    return graphdef, params
