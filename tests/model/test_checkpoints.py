"""Loaders and exporter against transformers: same logits from HF folders, GGUF files and exports.

Each family (Llama untied / tied, Qwen2 with q/k/v bias, Qwen3 with q/k norm) is built once
per module with transformers on PyTorch CPU; everything else compares against its logits.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from asyncrl.model import (
    ModelFileError,
    apply,
    export_hf,
    graphdef_for,
    load_gguf,
    load_hf,
)
from tests.model import checkpoints

TOLERANCE = 1e-4  # max |Δlogit| in float32
apply_jit = jax.jit(apply, static_argnums=0)


@pytest.fixture(scope="module")
def tokenizer():
    return checkpoints.build_tokenizer()


@pytest.fixture(scope="module")
def tokens(tokenizer):
    ids = tokenizer.encode("What is the capital of France? Paris, 0123.").ids
    ids = (ids * 2)[:12]
    return np.array([ids, ids[::-1]], np.int32)


@pytest.fixture(scope="module", params=sorted(checkpoints.FAMILIES))
def family(request, tmp_path_factory, tokenizer, tokens):
    name = request.param
    model = checkpoints.build_hf_model(name, tokenizer.get_vocab_size())
    folder = checkpoints.save_hf(model, tokenizer, tmp_path_factory.mktemp(name))
    return name, model, folder, checkpoints.torch_logits(model, tokens)


def _logits(config, params, tokens):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    logits, _ = apply_jit(graphdef_for(config), params, jnp.asarray(tokens), positions)
    return np.asarray(logits)


def test_load_hf_matches_transformers(family, tokens):
    name, model, folder, expected = family
    config, params, _ = load_hf(folder)
    assert config.architecture == model.config.model_type
    assert (config.rope_scaling is not None) == (name == "llama3_rope")
    assert config.tie_embeddings == model.config.tie_word_embeddings
    assert ("lm_head" in params) != config.tie_embeddings
    assert np.abs(_logits(config, params, tokens) - expected).max() <= TOLERANCE


def test_load_gguf_matches_transformers(family, tokens, tokenizer, tmp_path):
    name, model, folder, expected = family
    path = checkpoints.write_gguf(model, tokenizer, tmp_path / f"{name}.gguf")
    if name == "llama3_rope":
        with pytest.raises(ModelFileError, match=r"tensor 'rope_freqs\.weight' \(Llama 3 RoPE"):
            load_gguf(path)
        return
    config, params, gguf_tokenizer = load_gguf(path)
    hf_config, _, _ = load_hf(folder)
    assert config == hf_config  # same metadata, so also the same compiled apply
    assert np.abs(_logits(config, params, tokens) - expected).max() <= TOLERANCE
    for text in ["What is the capital of France?", "<|im_start|>user\nhi 42<|im_end|>\n"]:
        assert gguf_tokenizer.encode(text).ids == tokenizer.encode(text).ids


def test_export_loads_in_transformers(family, tokens, tokenizer, tmp_path):
    name, model, folder, expected = family
    config, params, _ = load_hf(folder)
    export_hf(tmp_path, config, params, tokenizer)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(reloaded) is type(model)
    assert np.abs(checkpoints.torch_logits(reloaded.eval(), tokens) - expected).max() <= TOLERANCE
    again, params_again, tokenizer_again = load_hf(tmp_path)
    assert again == config
    assert tokenizer_again.encode("Paris").ids == tokenizer.encode("Paris").ids


# -- bad inputs: each error names the file and the tensor ---------------------------------------


@pytest.fixture
def llama_copy(tmp_path, tokenizer):
    model = checkpoints.build_hf_model("llama", tokenizer.get_vocab_size())
    return checkpoints.save_hf(model, tokenizer, tmp_path / "ckpt")


def _rewrite(folder, change):
    path = folder / "model.safetensors"
    tensors = safetensors.numpy.load_file(str(path))
    change(tensors)
    safetensors.numpy.save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_tensor(llama_copy):
    _rewrite(llama_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelFileError, match=r"ckpt: missing tensor "
                       r"'model\.layers\.1\.mlp\.up_proj\.weight' \(expected shape \(96, 64\)\)"):
        load_hf(llama_copy)


def test_shape_mismatch(llama_copy):
    def shrink(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((16, 64), np.float32)
    _rewrite(llama_copy, shrink)
    with pytest.raises(ModelFileError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight' "
                       r"has shape \(16, 64\), expected \(32, 64\)"):
        load_hf(llama_copy)


def test_unknown_architecture(llama_copy):
    path = llama_copy / "config.json"
    hf = json.loads(path.read_text())
    hf.update(architectures=["MambaForCausalLM"], model_type="mamba")
    path.write_text(json.dumps(hf))
    with pytest.raises(ModelFileError, match=r"config\.json: unknown architecture: "
                       r"architectures=\['MambaForCausalLM'\].*supported: \['LlamaForCausalLM'"):
        load_hf(llama_copy)


def test_truncated_safetensors(llama_copy):
    path = llama_copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match=r"model\.safetensors: not a readable safetensors "
                       r"file \(truncated or corrupt\?\)"):
        load_hf(llama_copy)


def test_missing_files(llama_copy, tmp_path):
    (llama_copy / "tokenizer.json").unlink()
    with pytest.raises(ModelFileError, match=r"tokenizer\.json: tokenizer file not found"):
        load_hf(llama_copy)
    with pytest.raises(ModelFileError, match=r"config\.json: file not found"):
        load_hf(tmp_path / "nowhere")


def test_sharded_checkpoint(llama_copy, tokens):
    """model.safetensors.index.json + shards, as save_pretrained writes for big models."""
    expected = _logits(*load_hf(llama_copy)[:2], tokens)
    tensors = safetensors.numpy.load_file(str(llama_copy / "model.safetensors"))
    (llama_copy / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for shard, members in shards.items():
        safetensors.numpy.save_file({n: tensors[n] for n in members}, str(llama_copy / shard),
                                    metadata={"format": "pt"})
    index = {"weight_map": {n: s for s, members in shards.items() for n in members}}
    (llama_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    config, params, _ = load_hf(llama_copy)
    np.testing.assert_array_equal(_logits(config, params, tokens), expected)
    shutil.move(llama_copy / "model-00002-of-00002.safetensors", llama_copy / "elsewhere")
    with pytest.raises(ModelFileError, match=r"model-00002-of-00002\.safetensors: shard listed"):
        load_hf(llama_copy)


def test_truncated_gguf(tmp_path, tokenizer):
    model = checkpoints.build_hf_model("qwen3", tokenizer.get_vocab_size())
    path = checkpoints.write_gguf(model, tokenizer, tmp_path / "m.gguf")
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(ModelFileError, match=r"m\.gguf: not a readable GGUF file"):
        load_gguf(path)
