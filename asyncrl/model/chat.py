"""Chat formatting: messages -> the prompt string a chat model was trained on.

Two hardcoded formats cover the default policies: ChatML (SmolLM2, Qwen2.5, Qwen3) and
Llama 3. Reading the Jinja template from a checkpoint's tokenizer config is a later step; these
functions reproduce those templates for plain {role, content} messages.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}
_ROLES = ("system", "user", "assistant")

# The system prompts the checkpoints' own templates insert when the caller gives none.
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QWEN2_5_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


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


def format_chat(messages: Sequence[Message], chat_format: str = "chatml", **kwargs) -> str:
    if chat_format not in CHAT_FORMATS:
        raise ValueError(f"chat_format must be one of {sorted(CHAT_FORMATS)}, "
                         f"got {chat_format!r}")
    return CHAT_FORMATS[chat_format](messages, **kwargs)
