"""llama.cpp GGUF files in: config, dequantised weights and the tokenizer, from one file.

Two llama.cpp conventions are undone here so the one HF RoPE layout in transformer.py serves
every source:
  * convert_hf_to_gguf permutes the q/k rows of `llama`-arch models (it wants interleaved
    RoPE pairs). Qwen2/Qwen3 are stored unpermuted (llama.cpp runs them with NEOX RoPE).
  * tensor names (`blk.N.attn_q.weight`) are mapped back to HF names, then the shared HF
    table in weights.py does the rest, including shape checks.
Quantised tensors (Q4_1, Q8_0, ...) are dequantised to float32 with `gguf.quants`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import gguf
import numpy as np
import tokenizers
from flax import nnx
from tokenizers import decoders, models, pre_tokenizers, processors

from asyncrl.model.config import ARCHITECTURES, ModelConfig
from asyncrl.model.errors import ModelFileError
from asyncrl.model.weights import params_from_hf

_TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(.+)")

# GGUF `tokenizer.ggml.pre` -> the pre-tokenizer of the original tokenizer.json.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(regex: str):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


_PRE_TOKENIZERS = {
    "default": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "smollm": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)]),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
}
_CONTROL, _USER_DEFINED = 3, 4  # gguf.TokenType values


def open_gguf(path: Path) -> gguf.GGUFReader:
    """The file's reader; a ModelFileError naming it if it is missing or not GGUF."""
    if not path.is_file():
        raise ModelFileError(f"{path}: file not found")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError, struct.error, IndexError... on bad bytes
        raise ModelFileError(f"{path}: not a readable GGUF file: {e}") from None


def load_gguf(path: str | os.PathLike, *, param_dtype: str = "float32"
              ) -> tuple[ModelConfig, nnx.State, tokenizers.Tokenizer]:
    """(config, params, tokenizer) from a GGUF file; the graphdef is `graphdef_for(config)`."""
    path = Path(path)
    reader = open_gguf(path)
    meta = _Metadata(reader, path)
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        # llama.cpp stores Llama 3.1+ RoPE scaling only as these per-frequency divisors, not
        # as the factors ModelConfig.rope_scaling holds; ignoring them would load a wrong model.
        raise ModelFileError(f"{path}: tensor 'rope_freqs.weight' (Llama 3 RoPE scaling) is "
                              "not supported from GGUF; load the HF checkpoint instead")
    config = _config(meta, reader, param_dtype)
    by_hf_name = {_hf_name(t.name): t for t in reader.tensors}

    def get(name: str) -> np.ndarray | None:
        tensor = by_hf_name.get(name)
        if tensor is None:
            return None
        try:
            weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as e:
            raise ModelFileError(f"{path}: tensor {tensor.name!r}: {e}") from None
        if config.architecture == "llama":
            if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
                weights = _unpermute(weights, config.num_heads)
            elif name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
                weights = _unpermute(weights, config.num_kv_heads)
        return weights.astype(np.float32)

    _, params = params_from_hf(config, get, str(path))
    return config, params, _tokenizer(meta)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf's `permute`: rows (h, i, pair) back to (h, pair, i)."""
    return w.reshape(heads, -1, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _TOP_LEVEL:
        return _TOP_LEVEL[gguf_name]
    match = _LAYER_NAME.fullmatch(gguf_name)
    if match and match.group(2) in _PER_LAYER:
        return f"model.layers.{match.group(1)}.{_PER_LAYER[match.group(2)]}"
    return gguf_name  # unknown names are kept, so an extra tensor is ignored, not fatal


class _Metadata:
    def __init__(self, reader: gguf.GGUFReader, path: Path):
        self._fields, self.path = reader.fields, path

    def get(self, key: str, default=None):
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def need(self, key: str):
        if key not in self._fields:
            raise ModelFileError(f"{self.path}: GGUF metadata key {key!r} is missing")
        return self._fields[key].contents()


def _config(meta: _Metadata, reader: gguf.GGUFReader, param_dtype: str) -> ModelConfig:
    arch = meta.need("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelFileError(f"{meta.path}: unknown architecture {arch!r} in "
                              f"general.architecture; supported: {sorted(ARCHITECTURES)}")
    heads = int(meta.need(f"{arch}.attention.head_count"))
    hidden = int(meta.need(f"{arch}.embedding_length"))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(f"{arch}.vocab_size") or (len(tokens) if tokens else None)
    if vocab is None:
        raise ModelFileError(f"{meta.path}: neither {arch}.vocab_size nor tokenizer tokens")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    try:
        return ModelConfig(
            vocab_size=int(vocab),
            hidden_dim=hidden,
            num_layers=int(meta.need(f"{arch}.block_count")),
            num_heads=heads,
            num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
            mlp_dim=int(meta.need(f"{arch}.feed_forward_length")),
            rope_theta=_f32(meta.get(f"{arch}.rope.freq_base", 10_000.0)),
            norm_eps=_f32(meta.need(f"{arch}.attention.layer_norm_rms_epsilon")),
            tie_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
            qkv_bias=arch == "qwen2",
            qk_norm=arch == "qwen3",
            param_dtype=param_dtype,
            max_seq_len=int(meta.get(f"{arch}.context_length", 2048)),
            architecture=arch,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
        )
    except ValueError as e:
        raise ModelFileError(f"{meta.path}: {e}") from None


def _f32(value) -> float:
    """GGUF stores float32: read 1e-5, not 9.999999747378752e-06, like the HF config had."""
    return float(str(np.float32(value)))


def _tokenizer(meta: _Metadata) -> tokenizers.Tokenizer:
    """Rebuilds the byte-level BPE tokenizer.json that the GGUF was converted from."""
    kind = meta.need("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelFileError(f"{meta.path}: tokenizer.ggml.model {kind!r} is not supported; "
                              "only byte-level BPE ('gpt2')")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ModelFileError(f"{meta.path}: tokenizer.ggml.pre {pre!r} is not supported; "
                              f"supported: {sorted(_PRE_TOKENIZERS)}")
    tokens = meta.need("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tokenizer = tokenizers.Tokenizer(models.BPE(
        vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
        ignore_merges=pre == "llama-bpe"))  # Llama 3's tokenizer.json sets ignore_merges
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, ...) must never be split by BPE, and decode skips them
    # only when asked to.
    tokenizer.add_special_tokens([
        tokenizers.AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, types) if kind == _CONTROL])
    tokenizer.add_tokens([
        tokenizers.AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, types) if kind == _USER_DEFINED])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
            special_tokens=[(tokens[bos], int(bos))])
    return tokenizer
