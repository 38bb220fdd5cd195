"""Checkpoint chat templates render exactly what transformers' apply_chat_template renders."""

import json

import gguf
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from asyncrl.model import (
    BOXED_SYSTEM_PROMPT,
    ChatTemplate,
    ModelFileError,
    default_policy_path,
    format_chatml,
    format_llama3,
    prompt_messages,
    resolve_chat_template,
)
from asyncrl.model.chat import SMOLLM2_SYSTEM

transformers = pytest.importorskip("transformers")

# Verbatim from the checkpoints' tokenizer_config.json (SmolLM2's is also in its GGUF).
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3 = (  # Meta-Llama-3-8B-Instruct
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# Qwen2.5-Instruct's (tool prompt shortened): indented, whitespace-controlled blocks, so
# trim_blocks and lstrip_blocks decide every newline.
QWEN2_5 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# The helpers transformers adds to Jinja: tojson without HTML escaping, strftime_now,
# loop controls, {% generation %} blocks; `tools` passed as none, not left undefined; and a
# template that leans on the *_blocks trimming.
HELPERS = """{% set ns = namespace(n=0) %}
{% for message in messages %}
  {% if message.role == 'assistant' %}
    {% generation %}{{ message.content | tojson }}{% endgeneration %}
  {% else %}
    {{ bos_token }}[{{ message.role }}] {{ message | tojson(sort_keys=True) }}
  {% endif %}
  {% set ns.n = ns.n + 1 %}
  {% if ns.n == 3 %}{% break %}{% endif %}
{% endfor %}
{{ strftime_now('%Y') }}|{{ eos_token }}|{{ unk_token is defined }}|{{ tools is none }}
{% if add_generation_prompt %}<go>{% endif %}"""

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>"]
CONVERSATIONS = [
    prompt_messages("What is 12 + 30?"),
    prompt_messages("What is 12 + 30?", BOXED_SYSTEM_PROMPT),
    [{"role": "user", "content": "  Hi <b>&</b> \"é\"\n"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
]


def _tokenizer() -> tokenizers.Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = tokenizers.Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL)
    return tokenizer


def hf_folder(folder, chat_template=None, **tokenizer_config):
    """A tokenizer-only HF folder; chat_template None leaves the key out."""
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer().save(str(folder / "tokenizer.json"))
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


def reference(folder, messages, add_generation_prompt=True) -> str:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("template, tokens", [
    (SMOLLM2, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}),
    (LLAMA3, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    (QWEN2_5, {"bos_token": None, "eos_token": "<|im_end|>"}),
    # AddedToken as tokenizer_config.json saves it.
    (HELPERS, {"bos_token": {"__type": "AddedToken", "content": "<|endoftext|>"},
               "eos_token": "<|im_end|>"}),
], ids=["smollm2", "llama3", "qwen2.5", "helpers"])
def test_hf_folder_renders_as_transformers(tmp_path, template, tokens):
    folder = hf_folder(tmp_path, template, **tokens)
    chat = ChatTemplate.from_checkpoint(folder)
    for messages in CONVERSATIONS:
        assert chat.render(messages) == reference(folder, messages)
    assert chat.render(CONVERSATIONS[3], add_generation_prompt=False) == \
        reference(folder, CONVERSATIONS[3], add_generation_prompt=False)


def test_hardcoded_formats_match_their_templates():
    smollm2 = ChatTemplate(SMOLLM2, "smollm2")
    llama3 = ChatTemplate(LLAMA3, "llama3", {"bos_token": "<|begin_of_text|>"})
    for messages in CONVERSATIONS:
        assert smollm2.render(messages) == format_chatml(messages, default_system=SMOLLM2_SYSTEM)
        assert llama3.render(messages) == format_llama3(messages)


def test_template_file_and_named_list(tmp_path):
    # chat_template.jinja beside the config wins over the config's entry, as in transformers.
    folder = hf_folder(tmp_path / "file", SMOLLM2)
    (folder / "chat_template.jinja").write_text(QWEN2_5)
    assert ChatTemplate.from_checkpoint(folder).source == str(folder / "chat_template.jinja")
    assert ChatTemplate.from_checkpoint(folder).render(CONVERSATIONS[0]) == \
        reference(folder, CONVERSATIONS[0])
    # A list of named templates renders the one named "default".
    folder = hf_folder(tmp_path / "list", [{"name": "tool_use", "template": QWEN2_5},
                                           {"name": "default", "template": SMOLLM2}])
    assert ChatTemplate.from_checkpoint(folder).render(CONVERSATIONS[2]) == \
        reference(folder, CONVERSATIONS[2])
    folder = hf_folder(tmp_path / "nodefault", [{"name": "tool_use", "template": QWEN2_5}])
    with pytest.raises(ModelFileError,
                       match=r"tokenizer_config\.json: .*\['tool_use'\].*'default'"):
        ChatTemplate.from_checkpoint(folder)


def write_gguf(path, chat_template=None):
    """Metadata only: the token list and the template, as convert_hf_to_gguf writes them."""
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_token_list(["<unk>", "<|im_start|>", "<|im_end|>", "a"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_template_and_special_tokens(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "{{ bos_token }}|{{ eos_token }}")
    chat = ChatTemplate.from_checkpoint(path)
    assert chat.render(CONVERSATIONS[0]) == "<|im_start|>|<|im_end|>"


def test_embedded_gguf_is_chatml_with_smollm2_system():
    try:
        path = default_policy_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    chat = ChatTemplate.from_checkpoint(path)
    assert chat.text == SMOLLM2
    assert chat.special_tokens == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    for messages in CONVERSATIONS:
        # SmolLM2's template adds its own system prompt when the conversation has none.
        assert chat.render(messages) == format_chatml(messages, default_system=SMOLLM2_SYSTEM)
    assert chat.render(prompt_messages("Q", BOXED_SYSTEM_PROMPT)).startswith(
        f"<|im_start|>system\n{BOXED_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nQ<|im_end|>")


def test_resolve_named_and_raw(tmp_path):
    folder = hf_folder(tmp_path, LLAMA3, bos_token="<|begin_of_text|>")
    assert resolve_chat_template("", folder) is None
    # A named format is used as named, whatever the checkpoint ships, and needs no checkpoint.
    assert resolve_chat_template("chatml", folder) is format_chatml
    assert resolve_chat_template("llama3", None) is format_llama3
    assert resolve_chat_template("auto", folder)(CONVERSATIONS[1]) == \
        reference(folder, CONVERSATIONS[1])
    with pytest.raises(ValueError,
                       match=r"one of \['auto', 'chatml', 'llama3', ''\], got 'vicuna'"):
        resolve_chat_template("vicuna", folder)
    with pytest.raises(ValueError,
                       match=r"'auto' .* no checkpoint; name one of \['chatml', 'llama3'\]"):
        resolve_chat_template("auto", None)


def test_auto_without_template_names_the_file(tmp_path):
    folder = hf_folder(tmp_path / "hf", eos_token="<|im_end|>")
    with pytest.raises(ModelFileError, match=rf"{folder / 'tokenizer_config.json'}: no "
                       r"'chat_template' key.*one of \['chatml', 'llama3'\], or '' for raw"):
        resolve_chat_template("auto", folder)
    (folder / "tokenizer_config.json").unlink()
    with pytest.raises(ModelFileError, match=r"tokenizer_config\.json: file not found, so the "
                       "checkpoint has no chat template"):
        resolve_chat_template("auto", folder)
    path = write_gguf(tmp_path / "bare.gguf")
    with pytest.raises(ModelFileError, match=rf"{path}: no GGUF metadata key "
                       r"'tokenizer.chat_template'.*\['chatml', 'llama3'\]"):
        resolve_chat_template("auto", path)


def test_template_errors_name_the_file(tmp_path):
    folder = hf_folder(tmp_path / "hf", "{% for m in messages %}\n{{ m.content }")
    with pytest.raises(ModelFileError, match=rf"{folder / 'tokenizer_config.json'}: chat "
                       r"template does not parse \(template line 2\)"):
        ChatTemplate.from_checkpoint(folder)
    path = write_gguf(tmp_path / "bad.gguf", "{% if messages %}")
    with pytest.raises(ModelFileError, match=rf"{path} \(tokenizer.chat_template\): chat "
                       "template does not parse"):
        ChatTemplate.from_checkpoint(path)
    # raise_exception() is how templates reject a conversation; the error says whose template.
    chat = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}", "t.jinja")
    with pytest.raises(ValueError,
                       match="t.jinja: chat template: Conversation roles must alternate"):
        chat.render(CONVERSATIONS[0])
    with pytest.raises(ValueError, match=r"messages\[0\]\.role must be one of"):
        chat.render([{"role": "bot", "content": "x"}])
