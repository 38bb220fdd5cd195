"""python -m asyncrl.export: a run's checkpoint as a Hugging Face folder that transformers
loads with the same logits (float32, within 1e-4) and whose tokenizer renders the chat
template the run's prompts were rendered with, whatever the policy's source (an HF folder, a
GGUF file, the tiny preset's character tokenizer). vLLM itself is not run here: the folder is
checked by list for every file it reads."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from asyncrl.config import resolve, with_overrides
from asyncrl.data.arithmetic import Problem
from asyncrl.errors import UserError
from asyncrl.export.hf import export_run
from asyncrl.model import apply, graphdef_for, resolve_chat_template
from asyncrl.model.chat import CHAT_FORMATS, NAMED_TEMPLATES, ChatTemplate
from asyncrl.policy import load_policy
from asyncrl.run_checkpoint import checkpoint_config, load_params
from asyncrl.run_folder import claim
from asyncrl.train.checkpoint import Checkpointer, CheckpointError, ResumeData
from asyncrl.train.trainer import Trainer, trainer_mesh
from experiments.grpo import get_config
from tests.commands.conftest import STEPS, command, one_error_line
from tests.test_system import ROOT
from tests.model import checkpoints
from tests.model.test_chat_template import CONVERSATIONS, SMOLLM2, reference

TOLERANCE = 1e-4  # max |Δlogit| in float32
# What vLLM reads from a model folder: the architecture, the weights, the tokenizer with its
# special tokens and chat template, the generation defaults.
VLLM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json")
SAVED_STEP = 3


def assert_vllm_reads_it(out, c, config):
    assert {*VLLM_FILES} <= {p.name for p in out.iterdir()}
    # Readable by whoever can read the rest (a server may run as another user).
    assert (out / "model.safetensors").stat().st_mode == (out / "config.json").stat().st_mode
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["architectures"] == ["LlamaForCausalLM"]
    assert hf_config["model_type"] == "llama"
    generation = json.loads((out / "generation_config.json").read_text())
    eos = list(config.eos_token_ids)
    assert generation["bos_token_id"] == config.bos_token_id
    assert generation["eos_token_id"] == (eos[0] if len(eos) == 1 else eos)
    assert isinstance(generation["pad_token_id"], int)
    assert generation["max_new_tokens"] == c.rollout.max_new_tokens
    assert (generation["temperature"], generation["top_p"], generation["top_k"]) == (
        c.rollout.temperature, c.rollout.top_p, c.rollout.top_k)


def assert_same_logits(out, config, params, tokens, other=None):
    """transformers on the folder computes asyncrl's logits for `params`; `other`: logits of
    the weights the run started from, which the folder must not hold."""
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    want = checkpoints.torch_logits(model, tokens)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    got, _ = jax.jit(apply, static_argnums=0)(graphdef_for(config), params, jnp.asarray(tokens),
                                              positions)
    assert np.abs(np.asarray(got) - want).max() <= TOLERANCE
    if other is not None:
        assert np.abs(other - want).max() > 100 * TOLERANCE


def trained_run(folder, source, chat_template):
    """A run folder as a run leaves it, for a policy loaded from `source`: run.json and a
    trainer checkpoint at SAVED_STEP whose weights moved away from the source's."""
    c = with_overrides(get_config(), {"model.checkpoint": str(source),
                                      "task.chat_template": chat_template})
    claim(folder, c, "experiments/grpo.py")  # first, as a run records it
    policy = load_policy(c.model)
    trainer = Trainer.create(resolve(c).train_config(), policy.config, trainer_mesh(jax.devices()[:1]),
                             c.rollout.group_size)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda p: np.asarray(p) + rng.normal(0, 0.05, p.shape).astype(p.dtype),
                          policy.params)
    state = trainer.init_state(params)
    checkpointer = Checkpointer(folder / "checkpoints", trainer)
    checkpointer.save(state.replace(step=jax.device_put(np.int32(SAVED_STEP), state.step.sharding)),
                      ResumeData())
    checkpointer.close()
    return c, policy, params


@pytest.fixture(scope="module")
def source_model(tmp_path_factory):
    tokenizer = checkpoints.build_tokenizer()
    model = checkpoints.build_hf_model("llama", tokenizer.get_vocab_size())
    ids = tokenizer.encode("What is the capital of France? Paris, 0123.").ids
    tokens = np.array([ids[:12], ids[:12][::-1]], np.int32)
    return tokenizer, model, tokens, checkpoints.torch_logits(model, tokens)


def test_named_templates_render_as_their_formats():
    for name, template in NAMED_TEMPLATES.items():
        chat = ChatTemplate(template, name)
        for messages in CONVERSATIONS:
            assert chat.render(messages) == CHAT_FORMATS[name](messages)
            assert chat.render(messages, add_generation_prompt=False) == \
                CHAT_FORMATS[name](messages, add_generation_prompt=False)


def test_an_hf_policy_exports_with_the_template_the_run_used(source_model, tmp_path):
    tokenizer, model, tokens, source_logits = source_model
    source = checkpoints.save_hf(model, tokenizer, tmp_path / "source")
    # The source's own template adds SmolLM2's system prompt; the run rendered plain ChatML.
    (source / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": SMOLLM2, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}))
    c, policy, params = trained_run(tmp_path / "run", source, "chatml")
    out = tmp_path / "hf"
    done = command("asyncrl.export", f"--checkpoint={tmp_path / 'run'}", f"--out={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"restored step {SAVED_STEP}" in done.stdout
    for name in VLLM_FILES:
        assert f"wrote {out / name} (" in done.stdout
    assert "chat template: 'chatml' (config.task.chat_template)" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(f"exported to {out}: ")

    assert_vllm_reads_it(out, c, policy.config)
    assert_same_logits(out, policy.config, params, tokens, other=source_logits)
    render = resolve_chat_template("chatml", source)  # what the run's prompts were
    exported = transformers.AutoTokenizer.from_pretrained(out)
    assert reference(source, CONVERSATIONS[0]) != render(CONVERSATIONS[0])
    for messages in CONVERSATIONS:
        text = render(messages)
        assert reference(out, messages) == text
        assert exported(text, add_special_tokens=False).input_ids == \
            policy.tokenizer.encode(text, add_special_tokens=False).ids
    assert (out / "chat_template.jinja").read_text() == NAMED_TEMPLATES["chatml"]


def test_a_gguf_policy_exports_its_tokenizer_and_template(source_model, tmp_path):
    tokenizer, model, tokens, source_logits = source_model
    source = checkpoints.write_gguf(model, tokenizer, tmp_path / "policy.gguf", SMOLLM2)
    c, policy, params = trained_run(tmp_path / "run", source, "auto")
    out = export_run(checkpoint_config(None, str(tmp_path / "run")), str(tmp_path / "run"),
                     tmp_path / "hf")
    assert_vllm_reads_it(out, c, policy.config)
    assert_same_logits(out, policy.config, params, tokens, other=source_logits)
    render = resolve_chat_template("auto", source)  # the GGUF's tokenizer.chat_template
    exported = transformers.AutoTokenizer.from_pretrained(out)
    assert (exported.bos_token, exported.eos_token) == ("<|im_start|>", "<|im_end|>")
    for messages in CONVERSATIONS:
        text = render(messages)
        assert reference(out, messages) == text
        assert exported(text, add_special_tokens=False).input_ids == \
            policy.tokenizer.encode(text, add_special_tokens=False).ids


def test_the_tiny_run_exports_its_raw_prompts_tokenizer(tiny_run, tmp_path):
    c, workdir, _ = tiny_run
    stored = checkpoint_config(None, str(workdir))
    out = export_run(stored, str(workdir), tmp_path / "hf")
    policy, params, _ = load_params(stored, str(workdir))
    assert_vllm_reads_it(out, c, policy.config)
    tokens = np.array([policy.tokenizer.encode("12+3=45?", add_special_tokens=False).ids], np.int32)
    assert_same_logits(out, policy.config, jax.device_get(params), tokens)
    # Raw prompts (task.chat_template ''): no template, and the tokenizer gives the tokens
    # the run gave the model, BOS first.
    assert "chat_template" not in json.loads((out / "tokenizer_config.json").read_text())
    assert not (out / "chat_template.jinja").exists()
    exported = transformers.AutoTokenizer.from_pretrained(out)
    for question in ("3=", "7="):
        prompt = policy.encode_prompt(Problem(0, question, question[0], "echo1"), "", "")
        assert exported(question).input_ids == list(prompt)
        assert exported.decode(list(prompt) + [2], skip_special_tokens=True) == \
            policy.decode(list(prompt) + [2]) == question


def test_overwrite_replaces_an_earlier_export_and_nothing_else(tiny_run, tmp_path):
    _, workdir, _ = tiny_run
    stored = checkpoint_config(None, str(workdir))
    out = tmp_path / "hf"
    export_run(stored, str(workdir), out)
    done = command("asyncrl.export", f"--checkpoint={workdir}", f"--out={out}")
    assert one_error_line(done) == (f"error: --out={out} holds an export already; choose another "
                                    f"--out, or pass --overwrite to replace it (once the new "
                                    f"folder is written)")
    assert "restored step" not in done.stdout
    (out / "model.safetensors").write_bytes(b"an older export")
    export_run(stored, str(workdir), out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(VLLM_FILES)
    assert (out / "model.safetensors").read_bytes() != b"an older export"
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no partial folder left behind

    # A folder of exports, or an export with a file of the user's in it: kept, whatever
    # --overwrite says, and refused before anything is restored.
    (out / "notes.txt").write_text("mine")
    done = command("asyncrl.export", f"--checkpoint={workdir}", f"--out={tmp_path}", "--overwrite")
    assert "restored step" not in done.stdout
    assert one_error_line(done) == (
        f"error: --out={tmp_path} holds hf/, which no export writes: --overwrite replaces only "
        f"an earlier export's folder (chat_template.jinja, config.json, generation_config.json, "
        f"model.safetensors, tokenizer.json, tokenizer_config.json; config.json and "
        f"model.safetensors among them); choose another --out")
    with pytest.raises(UserError, match=rf"--out={out} holds notes.txt, which no export writes"):
        export_run(stored, str(workdir), out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == sorted({*VLLM_FILES, "notes.txt"})
    (out / "notes.txt").unlink()
    (out / "model.safetensors").unlink()  # not an export: what the folder holds is unknown
    with pytest.raises(UserError, match=rf"--out={out} holds config.json, generation_config.json, "
                                        rf"tokenizer.json, tokenizer_config.json, but no "
                                        rf"model.safetensors: "):
        export_run(stored, str(workdir), out, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_the_current_folder_and_a_checkpoint_s_parents_are_refused(tiny_run, tmp_path,
                                                                     monkeypatch):
    c, workdir, _ = tiny_run
    done = command("asyncrl.export", f"--checkpoint={workdir}", "--out=.", "--overwrite")
    assert one_error_line(done) == (f"error: --out=. is {ROOT}, the current folder or one "
                                    f"holding it, which writing there would replace; choose a "
                                    f"folder of its own, e.g. --out=hf")
    assert "restored step" not in done.stdout
    monkeypatch.chdir(workdir / "checkpoints")
    with pytest.raises(UserError, match=rf"--out=\.\. is {workdir}, the current folder or one "):
        export_run(c, str(workdir), "..", overwrite=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=rf"--out={workdir.parent} holds the checkpoint "
                                        rf"{workdir}, "):
        export_run(c, str(workdir), workdir.parent, overwrite=True)
    assert (workdir / "checkpoints" / str(STEPS)).is_dir()
    assert not any(tmp_path.iterdir())


def test_refusals_name_what_to_change(tiny_run, tmp_path):
    c, workdir, _ = tiny_run
    (tmp_path / "old" / "checkpoints").mkdir(parents=True)
    message = one_error_line(command("asyncrl.export", f"--checkpoint={tmp_path / 'old'}",
                                     f"--out={tmp_path / 'hf'}"))
    assert f"{tmp_path / 'old'} records no config (no run.json" in message
    assert not (tmp_path / "hf").exists()
    with pytest.raises(UserError, match=rf"--out={workdir} holds the checkpoint {workdir}, "):
        export_run(c, str(workdir), workdir, overwrite=True)
    assert (workdir / "checkpoints" / str(STEPS)).is_dir()
    with pytest.raises(CheckpointError, match=rf"--step=5: .*checkpoints holds no such step "
                                              rf"\(steps: {STEPS}\)"):
        export_run(c, str(workdir), tmp_path / "hf", step=5)
    with pytest.raises(UserError, match=r"--checkpoint=embedded is a model, not a run's "):
        export_run(c, "embedded", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
