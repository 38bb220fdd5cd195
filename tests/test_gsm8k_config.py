"""experiments/gsm8k.py, the documented path for real data and a Hugging Face chat model: a
tiny Qwen2 folder (its own chat template) post-trains on GSM8K-format files for two steps,
scaled down to this CPU, and a missing file is named before anything is built."""

import json

import pytest

from asyncrl import policy as policy_lib
from asyncrl.run import run
from asyncrl.config import ConfigError, resolve, validate
from asyncrl.metrics import read_metrics
from asyncrl.model import BOXED_SYSTEM_PROMPT
from experiments.gsm8k import get_config
from tests.model.checkpoints import build_hf_model, build_tokenizer, save_hf
from tests.model.test_chat_template import QWEN2_5

pytest.importorskip("transformers")

PROBLEMS = [("Tom has 3 apples and buys 4 more. How many?", "3 + 4 = 7\n#### 7"),
            ("Ann had 9 pens and lost 2. How many now?", "9 - 2 = 7\n#### 7"),
            ("A box holds 5 eggs. How many in 2 boxes?", "2 * 5 = 10\n#### 10"),
            ("Sam reads 1,000 pages in 4 days. Pages per day?", "1000 / 4 = 250\n#### 250")]
# Training asks other questions (a test question the train file holds would be dropped), and
# enough of them that the validation split, a tenth carved out by construction, holds four.
TRAIN_PROBLEMS = [(f"Tom has {a} apples and buys {b} more. How many?",
                   f"{a} + {b} = {a + b}\n#### {a + b}") for a in range(10, 20) for b in range(10, 20)]


def gsm8k_file(path, rows):
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gsm8k")
    model = root / "qwen2"
    save_hf(build_hf_model("qwen2", 320, max_positions=512), build_tokenizer(), model)
    (model / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": QWEN2_5, "eos_token": "<|im_end|>", "bos_token": None}))
    return (gsm8k_file(root / "train.jsonl", TRAIN_PROBLEMS),
            gsm8k_file(root / "test.jsonl", PROBLEMS),
            model)


def scaled_down(train, test, model):
    c = get_config(f"train={train},test={test},model={model},trainer_devices=1,instances=2")
    c.model.param_dtype = "float32"
    c.rollout.group_size, c.rollout.num_slots = 4, 8
    c.rollout.max_new_tokens, c.rollout.prompt_bucket = 8, 256
    c.train.batch_size, c.train.steps, c.train.num_microbatches = 2, 2, 1
    c.train.warmup_steps = 0
    c.coordinator.dynamic_sampling = False  # a random model's rewards are all 0
    c.eval.heldout_size, c.eval.max_new_tokens, c.eval.every_steps = 4, 8, 1
    c.eval.samples, c.eval.pass_k = 2, (1, 2)
    c.checkpoint.every_steps = 0
    return c


def test_the_gsm8k_config_runs_on_a_hugging_face_folder(files, tmp_path):
    c = scaled_down(*files)
    validate(c, 8)
    results = run(c, tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    evaluated = [r for r in rows if "eval_version" in r]
    assert [r["eval_version"] for r in evaluated] == [1]
    assert {"eval_pass@1", "eval_pass@2", "eval_format_rate"} <= set(evaluated[0])
    assert results["after"]["num_problems"] == results["test"]["after"]["num_problems"] == 4
    assert (results["after"]["eval_label"], results["test"]["after"]["eval_label"]) == (
        "validation", "test")


def test_prompts_use_the_checkpoints_template_and_the_boxed_system_prompt(files, tmp_path):
    c = scaled_down(*files)
    policy = policy_lib.load_policy(c.model)
    from asyncrl.data.sources import build_task_data

    problem = build_task_data(c.task, 4, tmp_path).test[0]
    spec = resolve(c)
    text = policy.tokenizer.decode(list(policy_lib.encode(policy, problem, spec.task,
                                                          spec.rollout.prompt_bucket).tokens),
                                   skip_special_tokens=False)
    assert text.startswith(f"<|im_start|>system\n{BOXED_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n")
    assert text.endswith(f"{problem.question}<|im_end|>\n<|im_start|>assistant\n")
    assert problem.answer == "7"  # the number after ####


def test_a_missing_data_file_is_named(files, tmp_path):
    train, _, model = files
    c = scaled_down(train, tmp_path / "test.jsonl", model)
    with pytest.raises(ConfigError, match=r"config.task.test_path = .*test.jsonl"):
        validate(c, 8)


def test_the_long_response_presets_resolve_for_planning():
    """qwen2.5-7b-16k and qwen3-8b-32k (the module docstring's long responses) resolve
    without their weights here, as asyncrl.plan reads them, on the short presets' folders."""
    for variant, folder, new_tokens in (("qwen2.5-7b-16k", "qwen2.5-7b", 16384),
                                        ("qwen3-8b-32k", "qwen3-8b", 32768)):
        spec = resolve(get_config(variant), local_files=False)
        assert spec.model.checkpoint == f"models/{folder}"
        assert spec.rollout.max_new_tokens == new_tokens
        assert spec.train.tokens_per_row == spec.rollout.prompt_bucket + new_tokens
        with pytest.raises(ConfigError, match=rf"config.model.checkpoint = 'models/{folder}'"):
            resolve(get_config(variant))  # the weights are not here: named before loading
