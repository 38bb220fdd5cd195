"""ModelConfig: the hyper-parameters of one Llama-family decoder, presets and HF import.

Every supported family (Llama / SmolLM2, Qwen2, Qwen3) is the same decoder with a few
switches (`qkv_bias`, `qk_norm`, `tie_embeddings`, `rope_scaling`), so one frozen dataclass
describes them all. It is hashable on purpose: it rides in the NNX graphdef, which `jax.jit`
treats as static.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

# architecture name -> (HF class name, HF model_type). The single source for what loaders,
# exporters and error messages accept, so the lists cannot drift apart.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}
PARAM_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """HF rope_type 'llama3' (Llama 3.1 / 3.2): low frequencies slowed down by `factor`."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_len: int

    def to_hf(self, theta: float) -> dict[str, Any]:
        return {"rope_type": "llama3", "rope_theta": theta, "factor": self.factor,
                "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_len}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder. Letters as in transformer.py: V, D, L, N, K, H, F."""

    vocab_size: int  # V
    hidden_dim: int  # D
    num_layers: int  # L
    num_heads: int  # N
    num_kv_heads: int  # K
    head_dim: int  # H (not always D / N: Qwen3-0.6B has D=1024, N=16, H=128)
    mlp_dim: int  # F
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: bias on the q, k and v projections (not on o)
    qk_norm: bool = False  # Qwen3: RMSNorm over H on q and k, before RoPE
    param_dtype: str = "float32"
    max_seq_len: int = 2048
    architecture: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_dim", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "mlp_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"ModelConfig.norm_eps must be > 0, got {self.norm_eps!r}")
        if self.param_dtype not in PARAM_DTYPES:
            raise ValueError(f"ModelConfig.param_dtype must be one of {PARAM_DTYPES}, "
                             f"got {self.param_dtype!r}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"ModelConfig.architecture must be one of {sorted(ARCHITECTURES)}, "
                             f"got {self.architecture!r}")
        if not isinstance(self.eos_token_ids, tuple):
            # A list would make the config unhashable and break jit's static graphdef.
            raise ValueError(f"ModelConfig.eos_token_ids must be a tuple of ints, "
                             f"got {self.eos_token_ids!r}")
        for name in ("tie_embeddings", "qkv_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelConfig.{name} must be a bool, "
                                 f"got {getattr(self, name)!r}")

    @property
    def num_groups(self) -> int:  # G: query heads per kv head
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # -- presets: each lists the checkpoint's config.json values ----------------------------------

    @classmethod
    def tiny(cls, **changes) -> ModelConfig:
        """For tests: compiles in about a second on CPU."""
        return cls(vocab_size=256, hidden_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=16, mlp_dim=128, max_seq_len=128, bos_token_id=1,
                   eos_token_ids=(2,)).replace(**changes)

    @classmethod
    def smollm2_135m(cls, **changes) -> ModelConfig:
        """HuggingFaceTB/SmolLM2-135M-Instruct (ChatML; <|im_start|>=1, <|im_end|>=2)."""
        return cls(vocab_size=49152, hidden_dim=576, num_layers=30, num_heads=9,
                   num_kv_heads=3, head_dim=64, mlp_dim=1536, rope_theta=100_000.0,
                   norm_eps=1e-5, tie_embeddings=True, max_seq_len=8192,
                   architecture="llama", bos_token_id=1, eos_token_ids=(2,)).replace(**changes)

    @classmethod
    def qwen2_5_0_5b(cls, **changes) -> ModelConfig:
        """Qwen/Qwen2.5-0.5B-Instruct (<|endoftext|>=151643, <|im_end|>=151645)."""
        return cls(vocab_size=151936, hidden_dim=896, num_layers=24, num_heads=14,
                   num_kv_heads=2, head_dim=64, mlp_dim=4864, rope_theta=1_000_000.0,
                   norm_eps=1e-6, tie_embeddings=True, qkv_bias=True, max_seq_len=32768,
                   architecture="qwen2", bos_token_id=151643,
                   eos_token_ids=(151645, 151643)).replace(**changes)

    @classmethod
    def qwen2_5_1_5b(cls, **changes) -> ModelConfig:
        """Qwen/Qwen2.5-1.5B-Instruct."""
        return cls.qwen2_5_0_5b(hidden_dim=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                                head_dim=128, mlp_dim=8960).replace(**changes)

    @classmethod
    def qwen2_5_7b(cls, **changes) -> ModelConfig:
        """Qwen/Qwen2.5-7B-Instruct (untied unembedding, a larger vocabulary)."""
        return cls.qwen2_5_0_5b(vocab_size=152064, hidden_dim=3584, num_layers=28,
                                num_heads=28, num_kv_heads=4, head_dim=128, mlp_dim=18944,
                                tie_embeddings=False).replace(**changes)

    @classmethod
    def qwen3_8b(cls, **changes) -> ModelConfig:
        """Qwen/Qwen3-8B."""
        return cls.qwen3_0_6b(hidden_dim=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                              head_dim=128, mlp_dim=12288, tie_embeddings=False).replace(**changes)

    @classmethod
    def llama3_1_8b(cls, **changes) -> ModelConfig:
        """meta-llama/Llama-3.1-8B-Instruct."""
        return cls.llama3_2_1b(hidden_dim=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                               head_dim=128, mlp_dim=14336, tie_embeddings=False,
                               rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 8192)
                               ).replace(**changes)

    @classmethod
    def qwen3_0_6b(cls, **changes) -> ModelConfig:
        """Qwen/Qwen3-0.6B."""
        return cls(vocab_size=151936, hidden_dim=1024, num_layers=28, num_heads=16,
                   num_kv_heads=8, head_dim=128, mlp_dim=3072, rope_theta=1_000_000.0,
                   norm_eps=1e-6, tie_embeddings=True, qk_norm=True, max_seq_len=40960,
                   architecture="qwen3", bos_token_id=151643,
                   eos_token_ids=(151645, 151643)).replace(**changes)

    @classmethod
    def llama3_2_1b(cls, **changes) -> ModelConfig:
        """meta-llama/Llama-3.2-1B-Instruct (<|eot_id|>=128009 ends a turn)."""
        return cls(vocab_size=128256, hidden_dim=2048, num_layers=16, num_heads=32,
                   num_kv_heads=8, head_dim=64, mlp_dim=8192, rope_theta=500_000.0,
                   norm_eps=1e-5, tie_embeddings=True, max_seq_len=131072,
                   architecture="llama", bos_token_id=128000,
                   eos_token_ids=(128001, 128008, 128009),
                   rope_scaling=Llama3RopeScaling(32.0, 1.0, 4.0, 8192)).replace(**changes)

    # -- HF interop -------------------------------------------------------------------------------

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], **changes) -> ModelConfig:
        """Reads a transformers `config.json` dict (v4 or v5 layout)."""
        architecture = _architecture_of(hf)
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu'")
        if hf.get("mlp_bias"):
            raise ValueError("mlp_bias=true is not supported")
        if architecture == "llama" and hf.get("attention_bias"):
            raise ValueError("Llama attention_bias=true (bias on o_proj too) is not supported")
        if hf.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true is not supported")

        def need(key):
            if key not in hf:
                raise ValueError(f"config is missing required key {key!r}")
            return hf[key]

        # transformers v5 moved rope_theta and rope_scaling into `rope_parameters`.
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_theta = hf.get("rope_theta") or rope.get("rope_theta")
        if rope_theta is None:
            raise ValueError("config has neither rope_theta nor rope_parameters.rope_theta")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")
            missing = [k for k in keys if k not in rope]
            if missing:
                raise ValueError(f"rope type 'llama3' needs {missing} in rope_parameters")
            scaling = Llama3RopeScaling(*(float(rope[k]) for k in keys[:3]), int(rope[keys[3]]))
        elif rope_type == "default":
            scaling = None
        else:
            raise ValueError(f"rope type {rope_type!r} is not supported; "
                             "only 'default' and 'llama3'")
        num_heads, hidden = need("num_attention_heads"), need("hidden_size")
        eos = hf.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        # Qwen config.json files omit tie_word_embeddings when true; transformers' own default
        # is true for Qwen and false for Llama.
        tie_default = architecture != "llama"
        return cls(
            vocab_size=need("vocab_size"),
            hidden_dim=hidden,
            num_layers=need("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hidden // num_heads,
            mlp_dim=need("intermediate_size"),
            rope_theta=float(rope_theta),
            norm_eps=float(need("rms_norm_eps")),
            tie_embeddings=bool(hf.get("tie_word_embeddings", tie_default)),
            qkv_bias=architecture == "qwen2",
            qk_norm=architecture == "qwen3",
            max_seq_len=hf.get("max_position_embeddings") or 2048,
            architecture=architecture,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            rope_scaling=scaling,
        ).replace(**changes)

    def to_hf_config(self) -> dict[str, Any]:
        """The config.json that transformers needs to rebuild this model."""
        hf_class, model_type = ARCHITECTURES[self.architecture]
        eos = list(self.eos_token_ids)
        rope = (self.rope_scaling.to_hf(self.rope_theta) if self.rope_scaling
                else {"rope_type": "default", "rope_theta": self.rope_theta})
        hf = {
            "architectures": [hf_class],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_dim,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.mlp_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,  # v4 readers
            "rope_parameters": rope,  # v5 readers
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_seq_len,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "torch_dtype": self.param_dtype,
            "dtype": self.param_dtype,
        }
        if self.rope_scaling:
            hf["rope_scaling"] = rope  # v4 readers
        if self.architecture == "llama":
            hf.update(attention_bias=False, mlp_bias=False)
        return hf


def _architecture_of(hf: Mapping[str, Any]) -> str:
    by_class = {hf_class: name for name, (hf_class, _) in ARCHITECTURES.items()}
    by_type = {model_type: name for name, (_, model_type) in ARCHITECTURES.items()}
    classes = hf.get("architectures") or []
    for hf_class in classes:
        if hf_class in by_class:
            return by_class[hf_class]
    if not classes and hf.get("model_type") in by_type:
        return by_type[hf["model_type"]]
    raise ValueError(f"unknown architecture: architectures={classes!r}, "
                     f"model_type={hf.get('model_type')!r}; supported: {sorted(by_class)} "
                     f"(model_type {sorted(by_type)})")


# What config.model.preset may name: the classmethods that build a ModelConfig from its name
# alone (read from the class, so the list cannot drift from it).
PRESETS = tuple(name for name, member in vars(ModelConfig).items()
                if isinstance(member, classmethod) and not name.startswith(("_", "from_")))
