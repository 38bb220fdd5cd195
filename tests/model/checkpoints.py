"""Tiny reference checkpoints for the model tests, built with transformers and gguf.

The HF folders come from `transformers` itself (`save_pretrained`), and the GGUF files are
written the way llama.cpp's convert_hf_to_gguf writes them (its tensor names, its q/k row
permutation for llama-arch models), so the loaders are tested against the real formats, not
against our own exporter.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "What is the capital of France? The capital of France is Paris.",
    "Asynchronous reinforcement learning keeps every accelerator busy.",
    "Grouped-query attention shares keys and values across heads.",
] * 8

FAMILIES = {
    # name: (transformers config class, extra kwargs)
    "llama": (transformers.LlamaConfig, {"tie_word_embeddings": False}),
    "llama_tied": (transformers.LlamaConfig, {"tie_word_embeddings": True}),
    "llama3_rope": (transformers.LlamaConfig, {"tie_word_embeddings": True, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    "qwen2": (transformers.Qwen2Config, {"tie_word_embeddings": True}),
    "qwen3": (transformers.Qwen3Config, {"tie_word_embeddings": False}),
}


def build_tokenizer() -> tokenizers.Tokenizer:
    """A byte-level BPE like SmolLM2's and Qwen's, trained on a few lines (~300 tokens)."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_CORPUS, trainer)
    return tokenizer


def build_hf_model(family: str, vocab_size: int, seed: int = 0, max_positions: int = 128):
    """A random 2-layer model whose every weight (norms and biases too) is non-trivial."""
    config_cls, extra = FAMILIES[family]
    extra = {"rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}} | extra
    config = config_cls(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        max_position_embeddings=max_positions, bos_token_id=1, eos_token_id=2,
        initializer_range=0.1, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Norm weights of exactly 1 and biases of 0 would hide a misplaced norm or bias.
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def save_hf(model, tokenizer: tokenizers.Tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def torch_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens).long()).logits.float().numpy()


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.LlamaModel.permute, verbatim in numpy."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_gguf(model, tokenizer: tokenizers.Tokenizer, path: Path,
               chat_template: str | None = None) -> Path:
    """F32 GGUF in llama.cpp's layout, with the byte-level BPE tokenizer in its metadata (and
    the chat template, when given)."""
    c = model.config
    arch = c.model_type
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)

    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL_TOKENS
                            else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(c.bos_token_id)
    writer.add_eos_token_id(c.eos_token_id)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    if c.rope_parameters["rope_type"] == "llama3":
        # convert_hf_to_gguf keeps Llama 3 RoPE scaling only as this tensor of divisors.
        writer.add_tensor("rope_freqs.weight", np.ones(c.head_dim // 2, np.float32))

    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    if c.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for name, w in state.items():
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            gguf_name = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            gguf_name = f"blk.{layer}.{_GGUF_NAMES[rest]}"
        # Only llama-arch GGUFs are permuted; llama.cpp runs Qwen2/3 with NEOX RoPE instead.
        if arch == "llama" and "self_attn.q_proj." in name:
            w = _llama_cpp_permute(w, c.num_attention_heads)
        elif arch == "llama" and "self_attn.k_proj." in name:
            w = _llama_cpp_permute(w, c.num_key_value_heads)
        writer.add_tensor(gguf_name, np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

