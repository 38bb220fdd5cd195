"""A run's trained policy as a Hugging Face folder that transformers and vLLM load.

    out = export_run(c, "runs/grpo", "runs/grpo/hf", step=None, overwrite=False)

The folder (asyncrl.model.loading.export_hf): model.safetensors and config.json; tokenizer.json
and tokenizer_config.json converted from the policy's source (an HF folder's kept as they are,
a GGUF file's rebuilt from its metadata, the tiny preset's character tokenizer as it is);
generation_config.json: the token ids and the run's sampling (config.rollout's temperature,
top_p, top_k and max_new_tokens).

The chat template is the one the run's prompts were rendered with: config.task.chat_template
wins over the source's own, since the trained policy answers in that format. 'auto': the
source's template (an HF folder's, or a GGUF's tokenizer.chat_template); 'chatml' / 'llama3':
that format as Jinja, whatever the source ships; '': none (the source's dropped), and the
tokenizer starts a text with BOS, as the run's raw prompts did. The run's system prompt and
instruction were part of its messages, not of the template: a line says so when it had them.
"""

from __future__ import annotations

import pathlib
import shutil

import jax
import tokenizers
from tokenizers import processors

from asyncrl.config import resolve
from asyncrl.config_args import ConfigError
from asyncrl.errors import UserError
from asyncrl.model.chat import chat_template_text
from asyncrl.model.loading import EXPORT_FILES, EXPORT_REQUIRED, export_hf
from asyncrl.run_checkpoint import checked_path, load_params, trainer_checkpoint



def export_run(c, checkpoint: str, out: str | pathlib.Path, step: int | None = None,
               overwrite: bool = False) -> pathlib.Path:
    """Writes `checkpoint`'s policy (its latest step, or `step`) to `out`, printing what it
    wrote. `out` not empty is refused unless it holds an earlier export (the files this writes
    and no others) and `overwrite`; it is replaced only once the new folder is whole, so a
    failed export loses nothing."""
    # The export reads the model, the prompt's template and the sampling: the task's data
    # files need not be on this machine.
    c = resolve(c, local_files=False)
    out = pathlib.Path(out)
    # Before the restore: a refusal costs nothing. The folder written is the resolved one:
    # `.` has no name to put the partial folder beside.
    target = _check_out(out, overwrite, require_trainer_checkpoint(checkpoint))
    policy, params, _ = load_params(c, checkpoint, step)
    template = _chat_template(c, policy.source)
    tokenizer = policy.tokenizer if template is not None else _starting_with_bos(
        policy.tokenizer, policy.config.bos_token_id)
    source = policy.source if policy.source is not None and policy.source.is_dir() else None
    partial = target.with_name(f".{target.name}.partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        export_hf(partial, policy.config, jax.device_get(params), tokenizer,
                  chat_template=template, tokenizer_source=source, generation=_generation(c))
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    except OSError as error:
        raise UserError(f"--out={out}: cannot write {error.filename or out}: "
                        f"{error.strerror or error}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    _report(c, out, template, policy.source)
    return out


def require_trainer_checkpoint(checkpoint: str) -> pathlib.Path:
    """`--checkpoint` as a path, refused unless it is a run's trainer checkpoint."""
    if checkpoint == "embedded" or trainer_checkpoint(checked_path(checkpoint)) is None:
        raise UserError(f"--checkpoint={checkpoint} is a model, not a run's checkpoint: export "
                        f"writes a run's trained weights (a run folder, its checkpoints folder "
                        f"or one step folder in it)")
    return pathlib.Path(checkpoint)


def _check_out(out: pathlib.Path, overwrite: bool, checkpoint: pathlib.Path) -> pathlib.Path:
    """`out` resolved, once it is a folder writing may replace: a new or empty one, or (with
    `overwrite`) an export's, the files only this command writes there."""
    target = out.resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out={out} is a file, not a folder")
    if pathlib.Path.cwd().is_relative_to(target):
        raise UserError(f"--out={out} is {target}, the current folder or one holding it, "
                        f"which writing there would replace; choose a folder of its own, e.g. "
                        f"--out=hf")
    if checkpoint.resolve().is_relative_to(target):
        raise UserError(f"--out={out} holds the checkpoint {checkpoint}, which writing there "
                        f"would replace; choose a folder of its own, e.g. --out={out / 'hf'}")
    held = sorted(target.iterdir()) if target.is_dir() else []
    if not held:
        return target
    foreign = [path for path in held
               if path.name not in EXPORT_FILES or path.is_symlink() or not path.is_file()]
    missing = EXPORT_REQUIRED - {path.name for path in held}
    if foreign or missing:
        shown = foreign or held
        listed = ", ".join(path.name + ("/" if path.is_dir() else "") for path in shown[:5])
        more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
        why = "which no export writes" if foreign else f"but no {' or '.join(sorted(missing))}"
        raise UserError(f"--out={out} holds {listed}{more}, {why}: --overwrite replaces only "
                        f"an earlier export's folder ({', '.join(sorted(EXPORT_FILES))}; "
                        f"{' and '.join(sorted(EXPORT_REQUIRED))} among them); choose another --out")
    if not overwrite:
        raise UserError(f"--out={out} holds an export already; choose another --out, or pass "
                        f"--overwrite to replace it (once the new folder is written)")
    return target


def _chat_template(c, source: pathlib.Path | None) -> str | None:
    try:
        return chat_template_text(c.task.chat_template, source)
    except UserError:
        raise  # a source without the template 'auto' reads: the message names the file
    except ValueError as error:
        raise ConfigError(f"config.task.chat_template: {error}") from None


def _starting_with_bos(tokenizer: tokenizers.Tokenizer, bos: int | None) -> tokenizers.Tokenizer:
    """`tokenizer`, encoding a text with BOS first, as the run encoded a raw prompt
    (asyncrl/policy.py): `tokenizer(text)` in transformers, and vLLM's completions, then give
    the model the tokens it was trained on."""
    if bos is None:
        return tokenizer
    tokenizer = tokenizers.Tokenizer.from_str(tokenizer.to_str())  # the policy's unchanged
    token = tokenizer.id_to_token(bos)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{token} $A", pair=f"{token} $A $B", special_tokens=[(token, bos)])
    return tokenizer


def _generation(c) -> dict:
    """generation_config.json's defaults: the run's rollout sampling and response cap."""
    rollout = c.rollout
    if rollout.temperature == 0:
        sampling = {"do_sample": False}
    else:
        # top_k 0 (off) written, not left out: transformers reads a missing top_k as 50.
        sampling = {"do_sample": True, "temperature": rollout.temperature,
                    "top_p": rollout.top_p, "top_k": rollout.top_k}
    return {**sampling, "max_new_tokens": rollout.max_new_tokens}


def _report(c, out: pathlib.Path, template: str | None, source: pathlib.Path | None) -> None:
    for path in sorted(out.iterdir()):
        size = path.stat().st_size
        print(f"wrote {path} ({size / 2**20:.1f} MiB)" if size >= 2**20 else
              f"wrote {path} ({size / 2**10:.1f} KiB)")
    setting = c.task.chat_template
    if template is None:
        print("chat template: none, the run's prompts were raw (config.task.chat_template=''); "
              "the tokenizer starts a text with BOS, as the run did")
    elif setting == "auto":
        print(f"chat template: {source}'s own (config.task.chat_template='auto'), the one the "
              f"run's prompts were rendered with")
    else:
        print(f"chat template: {setting!r} (config.task.chat_template), the one the run's "
              f"prompts were rendered with, over any template of its source")
    extras = [f"system prompt {c.task.system_prompt!r}"] if c.task.system_prompt else []
    if c.task.instruction:
        extras.append(f"instruction {c.task.instruction!r} after each question")
    if extras:
        print(f"the run's prompts also carried its {' and '.join(extras)}: put them in the "
              f"messages to prompt the model as it was trained")
    print(f"exported to {out}: transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}), "
          f"or `vllm serve {out}`", flush=True)
