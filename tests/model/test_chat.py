"""Chat formats reproduce the checkpoints' own templates."""

import pytest

from asyncrl.model import format_chat, format_llama3
from asyncrl.model.chat import SMOLLM2_SYSTEM

CONVERSATION = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "2+2?"}]


def test_chatml():
    assert format_chat(CONVERSATION) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_chatml_default_system_only_when_none_given():
    text = format_chat(CONVERSATION[:1], default_system=SMOLLM2_SYSTEM,
                       add_generation_prompt=False)
    assert text == (f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n")
    own = [{"role": "system", "content": "Be terse."}] + CONVERSATION[:1]
    assert format_chat(own, default_system=SMOLLM2_SYSTEM).count("system") == 1


def test_llama3():
    assert format_llama3([{"role": "system", "content": " Be terse. "},
                          {"role": "user", "content": "Hi"}]) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_bad_messages_and_format():
    with pytest.raises(ValueError, match=r"messages\[0\]\.role must be one of .* got 'bot'"):
        format_chat([{"role": "bot", "content": "x"}])
    with pytest.raises(ValueError, match=r"chat_format must be one of \['chatml', 'llama3'\]"):
        format_chat(CONVERSATION, "vicuna")
