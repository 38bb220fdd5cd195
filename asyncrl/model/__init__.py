"""asyncrl.model: one NNX decoder for the Llama family, its loaders and chat formatting.

    config = ModelConfig.tiny()
    graphdef, params = init_params(config, seed=0)
    logits, cache = apply(graphdef, params, tokens, positions, KVCache.init(config, B, S))

    config, params, tokenizer = load_gguf(default_policy_path())
    graphdef = graphdef_for(config)
    render = resolve_chat_template("auto", default_policy_path())
"""

from asyncrl.model.chat import (
    BOXED_SYSTEM_PROMPT,
    CHAT_TEMPLATE_SETTINGS,
    END_OF_TURN,
    ChatTemplate,
    format_chat,
    format_chatml,
    format_llama3,
    prompt_messages,
    resolve_chat_template,
)
from asyncrl.model.config import ARCHITECTURES, Llama3RopeScaling, ModelConfig
from asyncrl.model.gguf_loader import load_gguf
from asyncrl.model.loading import default_policy_path, export_hf, load_hf, load_tokenizer
from asyncrl.model.sharding import (
    CACHE_AXES,
    ShardingRules,
    auto_mesh,
    init_sharded,
    shardings_for,
)
from asyncrl.model.transformer import (
    REMAT_POLICIES,
    Decoder,
    KVCache,
    abstract_params,
    apply,
    apply_hidden,
    graphdef_for,
    init_params,
    unembed,
)
from asyncrl.model.weights import CheckpointError, hf_tensor_names

__all__ = [
    "ARCHITECTURES",
    "BOXED_SYSTEM_PROMPT",
    "CACHE_AXES",
    "CHAT_TEMPLATE_SETTINGS",
    "END_OF_TURN",
    "ChatTemplate",
    "CheckpointError",
    "Decoder",
    "KVCache",
    "Llama3RopeScaling",
    "ModelConfig",
    "REMAT_POLICIES",
    "ShardingRules",
    "abstract_params",
    "apply",
    "apply_hidden",
    "auto_mesh",
    "default_policy_path",
    "export_hf",
    "format_chat",
    "format_chatml",
    "format_llama3",
    "graphdef_for",
    "hf_tensor_names",
    "init_params",
    "init_sharded",
    "load_gguf",
    "load_hf",
    "load_tokenizer",
    "prompt_messages",
    "resolve_chat_template",
    "shardings_for",
    "unembed",
]
