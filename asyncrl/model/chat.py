"""Chat templates: messages -> the prompt string a chat model was trained on.

A checkpoint's own Jinja template is the reference. `ChatTemplate.from_checkpoint` reads it from
an HF folder (chat_template.jinja, else tokenizer_config.json's "chat_template") or a GGUF file
(metadata `tokenizer.chat_template`) and renders it as transformers' `apply_chat_template`
does. Two hardcoded formats, ChatML (SmolLM2, Qwen2.5, Qwen3) and Llama 3, serve checkpoints
that ship no template. `resolve_chat_template` uses one only when the config names it: a missing
template is an error, never a silent fallback.

    render = resolve_chat_template("auto", default_policy_path())
    prompt = render(prompt_messages(question, BOXED_SYSTEM_PROMPT))
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Callable, Mapping, Sequence

import gguf
import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from asyncrl.model.errors import ModelFileError

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}
Renderer = Callable[[Sequence[Message]], str]  # messages -> prompt text, generation prompt included
_ROLES = ("system", "user", "assistant")

# The system prompts the checkpoints' own templates insert when the caller gives none.
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QWEN2_5_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# Asks for the answer where the math rewards look for it; Qwen2.5-Math's wording.
BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def prompt_messages(question: str, system_prompt: str = "") -> list[dict[str, str]]:
    """The one-turn conversation a task prompt is: the system prompt if any, then the question."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": question}]


def _checked(messages: Sequence[Message]) -> list[tuple[str, str]]:
    out = []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES:
            raise ValueError(f"messages[{i}].role must be one of {_ROLES}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a str, got {type(content).__name__}")
        out.append((role, content))
    return out


# ------------------------------------------------------------------------------ named formats


def format_chatml(messages: Sequence[Message], *, add_generation_prompt: bool = True,
                  default_system: str | None = None) -> str:
    """`<|im_start|>role\\ncontent<|im_end|>\\n` per message, then the assistant header."""
    turns = _checked(messages)
    if default_system is not None and (not turns or turns[0][0] != "system"):
        turns.insert(0, ("system", default_system))
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def format_llama3(messages: Sequence[Message], *, add_generation_prompt: bool = True,
                  default_system: str | None = None) -> str:
    """Llama 3 headers; like Meta's template, contents are stripped and BOS is in the text."""
    turns = _checked(messages)
    if default_system is not None and (not turns or turns[0][0] != "system"):
        turns.insert(0, ("system", default_system))
    text = "<|begin_of_text|>" + "".join(
        f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}<|eot_id|>"
        for role, content in turns)
    if add_generation_prompt:
        text += "<|start_header_id|>assistant<|end_header_id|>\n\n"
    return text


CHAT_FORMATS: dict[str, Callable[..., str]] = {
    "chatml": format_chatml,
    "llama3": format_llama3,
}
# The token that ends an assistant turn in each format.
END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>"}
# The formats as Jinja, for a checkpoint that must carry the template its prompts were
# rendered with (asyncrl.export): each renders what its function above renders, called as a
# run calls it (no default system turn). Llama 3's writes <|begin_of_text|> as text, as the
# function does, whatever the tokenizer's bos_token.
NAMED_TEMPLATES = {
    "chatml": "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
              "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "llama3": "{{ '<|begin_of_text|>' }}{% for message in messages %}{{ '<|start_header_id|>' + "
              "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
              "'<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
}


def format_chat(messages: Sequence[Message], chat_format: str = "chatml", **kwargs) -> str:
    if chat_format not in CHAT_FORMATS:
        raise ValueError(f"chat_format must be one of {sorted(CHAT_FORMATS)}, "
                         f"got {chat_format!r}")
    return CHAT_FORMATS[chat_format](messages, **kwargs)


# ------------------------------------------------------------------------- checkpoint templates


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for transformers' training
    masks and renders as its body; without the tag, templates that use it would not parse."""

    tags = frozenset({"generation"})

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own filter escapes <, >, & and ' for HTML; templates mean plain JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    """transformers' chat-template environment (utils/chat_template_utils.py). Sandboxed, because
    a template from the Hub is untrusted code; trim_blocks and lstrip_blocks decide every
    newline and indent of the prompt, so they must match what the model was trained with."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_JINJA = _environment()
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"  # transformers' file for it; wins over the config's entry
# The named special tokens transformers hands every template (SPECIAL_TOKENS_ATTRIBUTES).
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                   "mask_token")


class ChatTemplate:
    """A checkpoint's Jinja chat template, rendered as transformers' `apply_chat_template` does.

    source: the file the template came from; every error names it.
    special_tokens: {"bos_token": ..., "eos_token": ...}, the variables the template may use.
    """

    def __init__(self, text: str, source: str | os.PathLike,
                 special_tokens: Mapping[str, str] | None = None):
        self.text, self.source = text, str(source)
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _JINJA.from_string(text)
        except jinja2.TemplateSyntaxError as e:
            raise ModelFileError(f"{self.source}: chat template does not parse (template line "
                                  f"{e.lineno}): {e.message}") from None

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike) -> ChatTemplate:
        """From a .gguf file or an HF folder; a ModelFileError naming the file if it has none."""
        path = Path(path)
        return _from_gguf(path) if path.suffix == ".gguf" else _from_hf_folder(path)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        turns = [{"role": role, "content": content} for role, content in _checked(messages)]
        try:
            # tools and documents are passed as None, not left undefined, as transformers does:
            # templates test `tools is not none`, which an undefined variable passes.
            return self._template.render(messages=turns, tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt,
                                         **self.special_tokens)
        except jinja2.TemplateError as e:  # raise_exception() in the template, or a bad lookup
            raise ValueError(f"{self.source}: chat template: {e}") from None


def _no_template(where: str) -> ModelFileError:
    return ModelFileError(
        f"{where}, so the checkpoint has no chat template; name one instead: one of "
        f"{sorted(CHAT_FORMATS)}, or '' for raw prompts")


def _from_hf_folder(folder: Path) -> ChatTemplate:
    if not folder.is_dir():
        raise ModelFileError(f"{folder}: neither a checkpoint folder nor a .gguf file")
    config_path = folder / TOKENIZER_CONFIG
    config = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelFileError(f"{config_path}: invalid JSON: {e}") from None
    special = {}
    for name in _SPECIAL_TOKENS:
        token = config.get(name)
        if isinstance(token, dict):  # an AddedToken, saved as its fields
            token = token.get("content")
        if isinstance(token, str):
            special[name] = token
    template_file = folder / TEMPLATE_FILE
    if template_file.is_file():
        return ChatTemplate(template_file.read_text(encoding="utf-8"), template_file, special)
    if not config_path.is_file():
        raise _no_template(f"{config_path}: file not found")
    text = config.get("chat_template")
    if text is None:
        raise _no_template(f"{config_path}: no 'chat_template' key, and no {TEMPLATE_FILE} "
                           "beside it")
    if isinstance(text, list):  # [{"name", "template"}, ...]: transformers renders "default"
        named = {t.get("name"): t.get("template") for t in text if isinstance(t, dict)}
        if "default" not in named:
            raise ModelFileError(f"{config_path}: chat_template names {sorted(map(str, named))} "
                                  "but none is 'default'")
        text = named["default"]
    if not isinstance(text, str):
        raise ModelFileError(f"{config_path}: chat_template must be a string or a list of "
                              f"{{name, template}}, got {type(text).__name__}")
    return ChatTemplate(text, config_path, special)


def _from_gguf(path: Path) -> ChatTemplate:
    from asyncrl.model.gguf_loader import open_gguf  # JAX-free config checks import this module

    reader = open_gguf(path)
    key = gguf.Keys.Tokenizer.CHAT_TEMPLATE
    if key not in reader.fields:
        raise _no_template(f"{path}: no GGUF metadata key {key!r}")
    # llama.cpp gives its templates bos_token and eos_token, looked up in the token list.
    tokens = reader.fields.get(gguf.Keys.Tokenizer.LIST)
    special = {}
    for name, id_key in (("bos_token", gguf.Keys.Tokenizer.BOS_ID),
                         ("eos_token", gguf.Keys.Tokenizer.EOS_ID)):
        if tokens is not None and id_key in reader.fields:
            special[name] = tokens.contents(int(reader.fields[id_key].contents()))
    return ChatTemplate(reader.fields[key].contents(), f"{path} ({key})", special)


# ------------------------------------------------------------------------------ selection

# The config values `resolve_chat_template` accepts, from the registry so the list cannot drift.
CHAT_TEMPLATE_SETTINGS = ("auto", *CHAT_FORMATS, "")


def resolve_chat_template(setting: str, checkpoint: str | os.PathLike | None
                          ) -> Renderer | None:
    """The renderer a config's chat-template setting names; None for '' (raw prompts).

    'auto': the checkpoint's own template (.gguf file or HF folder), an error naming the file if
    it has none. 'chatml' / 'llama3': that format whatever the checkpoint ships. checkpoint is
    None for a randomly initialised policy, which only '' and the named formats fit.
    """
    if setting == "":
        return None
    if setting in CHAT_FORMATS:
        return CHAT_FORMATS[setting]
    if setting != "auto":
        raise ValueError(f"chat template must be one of {list(CHAT_TEMPLATE_SETTINGS)}, "
                         f"got {setting!r}")
    if checkpoint is None:
        raise ValueError("chat template 'auto' reads the checkpoint's template, but the policy "
                         f"has no checkpoint; name one of {sorted(CHAT_FORMATS)}, or '' for raw "
                         "prompts")
    return ChatTemplate.from_checkpoint(checkpoint).render


def chat_template_text(setting: str, checkpoint: str | os.PathLike | None) -> str | None:
    """The Jinja text of the template `resolve_chat_template(setting, checkpoint)` renders
    with, for a checkpoint written out; None for raw prompts. Errors as that function's."""
    if setting in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[setting]
    render = resolve_chat_template(setting, checkpoint)
    return None if render is None else render.__self__.text  # ChatTemplate.render, bound
