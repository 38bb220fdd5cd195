"""asyncrl.model: one NNX decoder for the Llama family, its loaders and chat formatting.

    config = ModelConfig.tiny()
    graphdef, params = init_params(config, seed=0)
    logits, cache = apply(graphdef, params, tokens, positions, KVCache.init(config, B, S))

    config, params, tokenizer = load_gguf(default_policy_path())
    graphdef = graphdef_for(config)
    render = resolve_chat_template("auto", default_policy_path())
"""

# Resolved on first use (PEP 562): config checks import `asyncrl.model.remat` and
# `asyncrl.model.chat` for their names without loading JAX through this package.

import importlib

_EXPORTS = {
    "ARCHITECTURES": "asyncrl.model.config",
    "BOXED_SYSTEM_PROMPT": "asyncrl.model.chat",
    "CACHE_AXES": "asyncrl.model.sharding",
    "CHAT_TEMPLATE_SETTINGS": "asyncrl.model.chat",
    "ChatTemplate": "asyncrl.model.chat",
    "Decoder": "asyncrl.model.transformer",
    "END_OF_TURN": "asyncrl.model.chat",
    "KVCache": "asyncrl.model.transformer",
    "Llama3RopeScaling": "asyncrl.model.config",
    "ModelConfig": "asyncrl.model.config",
    "ModelFileError": "asyncrl.model.errors",
    "PagedKVCache": "asyncrl.model.paged",
    "REMAT_POLICIES": "asyncrl.model.remat",
    "ShardingRules": "asyncrl.model.sharding",
    "abstract_params": "asyncrl.model.transformer",
    "apply": "asyncrl.model.transformer",
    "apply_hidden": "asyncrl.model.transformer",
    "auto_mesh": "asyncrl.model.sharding",
    "default_policy_path": "asyncrl.model.loading",
    "export_hf": "asyncrl.model.loading",
    "format_chat": "asyncrl.model.chat",
    "format_chatml": "asyncrl.model.chat",
    "format_llama3": "asyncrl.model.chat",
    "graphdef_for": "asyncrl.model.transformer",
    "hf_tensor_names": "asyncrl.model.weights",
    "init_params": "asyncrl.model.transformer",
    "init_sharded": "asyncrl.model.sharding",
    "load_gguf": "asyncrl.model.gguf_loader",
    "load_hf": "asyncrl.model.loading",
    "load_tokenizer": "asyncrl.model.loading",
    "prompt_messages": "asyncrl.model.chat",
    "resolve_chat_template": "asyncrl.model.chat",
    "shardings_for": "asyncrl.model.sharding",
    "unembed": "asyncrl.model.transformer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__():
    return __all__
