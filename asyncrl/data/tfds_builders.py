"""Math datasets as TensorFlow Datasets builders over local files, read without TensorFlow.

`prepare(path, kind, data_dir)` turns a file of one of `asyncrl.data.math_data`'s formats
(GSM8K, MATH / DAPO-style, or prompts with named fields) into an ArrayRecord dataset under
`data_dir` once, then reads it with `builder.as_data_source()`: random access from disk, no
TensorFlow in the process, the same interface as the in-memory `MathDataset`, so
`math_data.ShuffledCursor` (grain) walks either.

    dataset = prepare("gsm8k/train.jsonl", "gsm8k", data_dir=workdir / "tfds")
    cursor = ShuffledCursor(dataset, seed=0)      # its state_dict() goes in every checkpoint

Rows are parsed by `math_data.read_problems`, the one parser: a malformed row fails the
prepare with the file and line, or with `skip_malformed=True` is skipped, counted and
logged; the count and the first messages are kept in the prepared data's metadata, so a
later run that reuses it still reports them.

When to prepare again: the builder config is named by the file's stem, its SHA-256, the
skip flag and (for `prompts`) the fields read, so an unchanged file reuses what is on disk
(hashing it is the only read), and a changed one is prepared afresh beside the old one (which
is left in place). Bump `VERSION` when the parser changes what a row becomes: prepared data
of another version is not reused.

Each record: prompt_id (int, = its index), question (text), answer (text, the reference
the reward compares with) and source_line (int, the file's 1-based line or parquet row).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import pathlib
import re
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds

from asyncrl.data import math_data
from asyncrl.data.arithmetic import Problem

log = logging.getLogger(__name__)

_QUESTION_BATCH = 1024  # records read at once by `PreparedDataset.questions`


class _QuietCustomConfig(logging.Filter):
    """Every config here is a custom one (named by the file's hash), which TFDS reports as an
    absl warning on each builder made; that line says nothing, the rest of absl's do."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Using custom data configuration")


logging.getLogger("absl").addFilter(_QuietCustomConfig())


@dataclasses.dataclass(eq=False)
class SourceFile(tfds.core.BuilderConfig):
    """The builder config: which local file, read how. `name` keys the prepared data."""

    path: str = ""
    skip_malformed: bool = False
    sha256: str = ""
    fields: math_data.Fields = math_data.Fields()  # read by the `prompts` format only


class _FileBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """One local file → one 'train' split, in file order (no TFDS shuffle: record i must be
    prompt i). Registration is skipped: a builder is only usable with a `SourceFile` config,
    never by name from the TFDS catalogue."""

    KIND: ClassVar[str]
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "First version."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=f"{self.KIND} problems from a local file (asyncrl.data.math_data).",
            features=tfds.features.FeaturesDict({
                "prompt_id": np.int64,
                "question": tfds.features.Text(),
                "answer": tfds.features.Text(),
                "source_line": np.int64,
            }),
            metadata=tfds.core.MetadataDict(),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict]]]:
        del dl_manager  # the file is local: nothing to download
        return {"train": self._generate_examples()}

    def _generate_examples(self) -> Iterator[tuple[int, dict[str, Any]]]:
        config = self.builder_config
        skipped = math_data.Skipped()
        for problem, line in math_data.read_problems(config.path, self.KIND, config.skip_malformed,
                                                     skipped, config.fields):
            yield problem.prompt_id, {"prompt_id": problem.prompt_id,
                                      "question": problem.question,
                                      "answer": problem.answer, "source_line": line}
        # Written with dataset_info once generation ends, read back whenever it is reused.
        self.info.metadata.update(skipped=skipped.count, errors=skipped.errors,
                                  source=config.path, sha256=config.sha256)


class Gsm8kFile(_FileBuilder, skip_registration=True):
    name = "asyncrl_gsm8k"
    KIND = "gsm8k"


class MathFile(_FileBuilder, skip_registration=True):
    name = "asyncrl_math"
    KIND = "math"


class PromptsFile(_FileBuilder, skip_registration=True):
    name = "asyncrl_prompts"
    KIND = "prompts"


BUILDERS: dict[str, type[_FileBuilder]] = {b.KIND: b for b in (Gsm8kFile, MathFile, PromptsFile)}


class PreparedDataset:
    """Random access to a prepared file: `MathDataset`'s interface, read from disk."""

    def __init__(self, builder: _FileBuilder):
        self.path = builder.builder_config.path
        self.kind = builder.KIND
        self.data_dir = str(builder.data_dir)  # where the ArrayRecord files are
        metadata = builder.info.metadata
        self.skipped = int(metadata["skipped"])  # malformed rows passed over
        self.errors = tuple(metadata["errors"])  # the first few of their messages
        self._source = builder.as_data_source(split="train")

    def __len__(self) -> int:
        return len(self._source)

    def _record(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"{self.path}: problem index must be in [0, {len(self)}), got {index}")
        return self._source[index]

    def __getitem__(self, index: int) -> Problem:
        record = self._record(index)
        return Problem(int(record["prompt_id"]), record["question"].decode("utf-8"),
                       record["answer"].decode("utf-8"), self.kind)

    def take(self, start: int, count: int) -> list[Problem]:
        return [self[i] for i in range(start, start + count)]

    def questions(self) -> Iterator[str]:
        """Every question in order, read in batches: record by record costs twice the time,
        which checking a large train file against its held-out file would feel."""
        for start in range(0, len(self), _QUESTION_BATCH):
            batch = range(start, min(start + _QUESTION_BATCH, len(self)))
            yield from (r["question"].decode("utf-8") for r in self._source.__getitems__(batch))

    def source_line(self, index: int) -> int:
        """The 1-based line (JSONL) or row (parquet) problem `index` came from."""
        return int(self._record(index)["source_line"])

    def __repr__(self) -> str:
        return (f"PreparedDataset({self.path!r}, {self.kind}, {len(self)} problems, "
                f"{self.skipped} skipped, at {self.data_dir!r})")


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def builder_for(path: str | pathlib.Path, kind: str, data_dir: str | pathlib.Path,
                skip_malformed: bool = False,
                fields: math_data.Fields = math_data.Fields()) -> _FileBuilder:
    """The builder of `path`'s prepared data under `data_dir`, prepared or not."""
    if kind not in BUILDERS:
        raise ValueError(f"tfds builders: kind must be one of {sorted(BUILDERS)}, got {kind!r}")
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise math_data.MissingDataFile(f"tfds builders: no such file {str(path)!r}")
    sha256 = _sha256(path)
    stem = re.sub(r"[^a-z0-9]+", "_", path.stem.lower()).strip("_") or "data"
    name = f"{stem}_{sha256[:16]}_{'skip' if skip_malformed else 'strict'}"
    if kind == "prompts":  # other fields make other problems of the same file
        name += "_" + hashlib.sha256(repr(dataclasses.astuple(fields)).encode()).hexdigest()[:8]
    config = SourceFile(name=name, path=str(path), skip_malformed=skip_malformed, sha256=sha256,
                        fields=fields, description=f"{path} (sha256 {sha256})")
    return BUILDERS[kind](config=config, data_dir=str(data_dir), file_format="array_record")


def prepare(path: str | pathlib.Path, kind: str, data_dir: str | pathlib.Path,
            skip_malformed: bool = False,
            fields: math_data.Fields = math_data.Fields()) -> PreparedDataset:
    """Prepares `path` under `data_dir` unless that is done already, and opens it."""
    builder = builder_for(path, kind, data_dir, skip_malformed, fields)
    # is_prepared() alone warns about a folder that is not there yet.
    if builder.data_path.exists() and builder.is_prepared():
        log.info("%s: reusing the data prepared at %s", path, builder.data_dir)
    else:
        log.info("%s: preparing %s data at %s", path, kind, builder.data_dir)
        builder.download_and_prepare()
    dataset = PreparedDataset(builder)
    if dataset.skipped:  # logged at every open, not only by the prepare that skipped them
        log.warning("%s: %d malformed rows were skipped when it was prepared; first: %s",
                    dataset.path, dataset.skipped, dataset.errors[0])
    return dataset
