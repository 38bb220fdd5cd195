"""ModelConfig validation, presets and HF config import."""

import pytest

from asyncrl.model import ModelConfig


@pytest.mark.parametrize("preset", ["tiny", "smollm2_135m", "qwen2_5_0_5b", "qwen3_0_6b",
                                    "llama3_2_1b"])
def test_presets_round_trip_through_hf_config(preset):
    config = getattr(ModelConfig, preset)()
    assert ModelConfig.from_hf_config(config.to_hf_config()) == config
    hash(config)  # it rides in the graphdef, which jit treats as static


def test_qwen3_head_dim_is_not_hidden_over_heads():
    config = ModelConfig.qwen3_0_6b()
    assert config.head_dim * config.num_heads != config.hidden_dim
    assert config.qk_norm and not config.qkv_bias and config.num_groups == 2


@pytest.mark.parametrize("change, message", [
    (dict(num_heads=5), r"num_heads \(5\) must be a multiple of num_kv_heads \(2\)"),
    (dict(param_dtype="float16"), r"param_dtype must be one of \('float32', 'bfloat16'\), "
                                  r"got 'float16'"),
    (dict(hidden_dim=0), r"hidden_dim must be a positive int, got 0"),
    (dict(architecture="gemma"), r"architecture must be one of \['llama', 'qwen2', 'qwen3'\]"),
    (dict(eos_token_ids=[2]), r"eos_token_ids must be a tuple of ints, got \[2\]"),
    (dict(head_dim=15), r"head_dim must be even for RoPE, got 15"),
])
def test_validation_names_field_value_and_choices(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.tiny(**change)


def test_from_hf_config_rejects_unknown_architecture():
    hf = ModelConfig.tiny().to_hf_config() | {"architectures": ["GemmaForCausalLM"],
                                               "model_type": "gemma"}
    with pytest.raises(ValueError, match=r"unknown architecture: architectures="
                       r"\['GemmaForCausalLM'\], model_type='gemma'; supported: "):
        ModelConfig.from_hf_config(hf)


def test_from_hf_config_reads_v4_and_v5_rope_layouts():
    hf = ModelConfig.tiny().to_hf_config()
    v4 = {k: v for k, v in hf.items() if k != "rope_parameters"} | {"rope_theta": 123.0}
    v5 = {k: v for k, v in hf.items() if k != "rope_theta"} | {
        "rope_parameters": {"rope_type": "default", "rope_theta": 456.0}}
    assert ModelConfig.from_hf_config(v4).rope_theta == 123.0
    assert ModelConfig.from_hf_config(v5).rope_theta == 456.0
    partial = hf | {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}
    with pytest.raises(ValueError, match=r"rope type 'llama3' needs \['low_freq_factor', "):
        ModelConfig.from_hf_config(partial)
    yarn = hf | {"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0}}
    with pytest.raises(ValueError, match=r"rope type 'yarn' is not supported; only 'default' "
                       r"and 'llama3'"):
        ModelConfig.from_hf_config(yarn)
