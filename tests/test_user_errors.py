"""A new user's mistakes end `python -m asyncrl.main` with one line naming the culprit and a
non-zero exit, never a traceback; a bug still shows its traceback.

Each case runs the real entry point in a subprocess. The flag cases fail before JAX is
imported (well under a second); the others import it (5-10 s each); the damaged checkpoint
first needs a 2-step run of the tiny config to damage (~30 s on 2 CPU cores, once).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import tokenizers

from asyncrl.cli import EXIT_USER_ERROR, exit_on_user_error
from asyncrl.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--config=experiments/grpo.py:tiny", "--config.eval.heldout_size=8"]
GOOD_ROW = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}
HF_CONFIG = {  # a small Llama, as transformers writes it
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 3,
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 128,
    "tie_word_embeddings": False, "torch_dtype": "float32",
}


def run_asyncrl_main(*args: str) -> subprocess.CompletedProcess:
    # The timeout guards against a hang, not speed: a loaded CI machine may take minutes.
    return subprocess.run([sys.executable, "-m", "asyncrl.main", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def trained_workdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trained")
    run = run_asyncrl_main(*TINY, "--config.train.steps=2", f"--workdir={workdir}")
    assert run.returncode == 0, run.stderr[-3000:]
    return workdir


def misspelt_field(tmp_path, request):
    return ["--config.train.stepz=3"], ["--config.train.stepz", "did you mean 'steps'"]


def negative_eta(tmp_path, request):
    return ["--config.staleness.eta=-1"], ["config.staleness.eta = -1", "≥ 0"]


def empty_batch(tmp_path, request):
    return ["--config.train.batch_size=0"], ["config.train.batch_size = 0", "≥ 1"]


def garbage_gguf(tmp_path, request):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(os.urandom(4096))
    return [f"--config.model.checkpoint={path}"], [str(path), "not a readable GGUF file"]


def hf_folder_without_weights(tmp_path, request):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    vocab = {"a": 0, "b": 1, "<unk>": 2}
    tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>")).save(
        str(folder / "tokenizer.json"))
    return [f"--config.model.checkpoint={folder}"], [str(folder), "model.safetensors"]


def malformed_row(tmp_path, request):
    train, heldout = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text(json.dumps(GOOD_ROW) + "\n" + json.dumps({"question": "What is 3 + 3?"}) + "\n")
    heldout.write_text(json.dumps(GOOD_ROW) + "\n")
    return (["--config.task.dataset=gsm8k", f"--config.task.train_path={train}",
             f"--config.task.test_path={heldout}", "--config.eval.heldout_size=1"],
            [f"{train}: line 2", "missing field 'answer'"])


def misnamed_prompt_field(tmp_path, request):
    # A GSM8K file read as generic prompts with the default field names.
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(GOOD_ROW) + "\n")
    return (["--config.task.dataset=prompts", f"--config.task.train_path={path}",
             f"--config.task.test_path={path}"],
            [f"{path}: line 1", "missing field 'prompt' (fields: question, answer)",
             "config.task.prompt_field"])


def missing_data_file(tmp_path, request):
    heldout = tmp_path / "test.jsonl"
    heldout.write_text(json.dumps(GOOD_ROW) + "\n")
    return (["--config.task.dataset=gsm8k", "--config.task.train_path=/nowhere.jsonl",
             f"--config.task.test_path={heldout}", "--config.eval.heldout_size=1"],
            ["config.task.train_path = '/nowhere.jsonl'"])


def flipped_checkpoint_byte(tmp_path, request):
    workdir = tmp_path / "run"
    shutil.copytree(request.getfixturevalue("trained_workdir"), workdir)
    step = workdir / "checkpoints" / "2"
    data = max((p for p in (step / "state").rglob("d/*") if p.is_file()),
               key=lambda p: p.stat().st_size)
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0x01
    data.write_bytes(bytes(content))
    return ["--config.train.steps=4", f"--workdir={workdir}"], [f"checkpoint {step}"]


def bucket_workdir(tmp_path, request):
    # Written through the local filesystem, it would become a folder named "gs:".
    return ["--workdir=gs://bucket/run"], ["--workdir=gs://bucket/run is a URL", "gcsfuse"]


@pytest.mark.parametrize("case", [
    misspelt_field, negative_eta, empty_batch, garbage_gguf, hf_folder_without_weights,
    malformed_row, misnamed_prompt_field, missing_data_file, flipped_checkpoint_byte,
    bucket_workdir,
], ids=lambda case: case.__name__)
def test_user_error_is_one_line_naming_the_culprit(case, tmp_path, request):
    args, culprits = case(tmp_path, request)
    if not any(arg.startswith("--workdir") for arg in args):
        args.append(f"--workdir={tmp_path / 'run'}")
    run = run_asyncrl_main(*TINY, *args)
    assert run.returncode == EXIT_USER_ERROR, run.stderr[-3000:]
    error_lines = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, run.stderr[-3000:]
    for culprit in culprits:
        assert culprit in error_lines[0]
    assert "Traceback" not in run.stderr + run.stdout


@pytest.mark.parametrize("args, culprits", [
    (["--config.train.stepz=3"], ["--config.train.stepz", "did you mean 'steps'"]),
    (["--config=experiments/nope.py"], ["no such config file 'experiments/nope.py'"]),
    (["--config=experiments/grpo.py:tinyy"], ["config argument 'tinyy' is unknown"]),
    (["--workdirr=x"], ["'workdirr'"]),
    (["--config.schedule=barrier"], ["--config.schedule has moved: use --config.coordinator.admission"]),
], ids=["default-config-misspelt-field", "missing-config-file", "unknown-config-argument",
        "unknown-flag", "moved-field"])
def test_flag_mistakes_are_named_before_anything_is_imported(args, culprits):
    run = run_asyncrl_main(*args)
    assert run.returncode == EXIT_USER_ERROR, run.stderr[-3000:]
    assert run.stderr.startswith("error: ") and run.stderr.count("\n") == 1, run.stderr
    for culprit in culprits:
        assert culprit in run.stderr
    assert "Traceback" not in run.stdout


@pytest.mark.parametrize("source, culprits", [
    ("def get_config(:\n", ["line 1: SyntaxError"]),
    ("CONFIG = {}\n", ["defines no get_config()"]),
    ("def get_config(arg=None):\n    return {}['lr']\n", ["line 2: KeyError: 'lr'"]),
], ids=["syntax-error", "no-get-config", "get-config-raises"])
def test_a_config_file_that_does_not_load_is_one_error_line(source, culprits, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(source)
    run = run_asyncrl_main(f"--config={path}")
    assert run.returncode == EXIT_USER_ERROR, run.stderr[-3000:]
    assert run.stderr.startswith(f"error: --config={path}: ") and run.stderr.count("\n") == 1, \
        run.stderr
    for culprit in culprits:
        assert culprit in run.stderr
    assert "Traceback" not in run.stdout


def test_a_bug_keeps_its_traceback():
    def buggy():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        exit_on_user_error(buggy)


def test_a_user_error_exits_2_with_its_message(capsys):
    def refuse():
        raise UserError("config.x = 1 is not allowed")

    with pytest.raises(SystemExit) as exit_:
        exit_on_user_error(refuse)
    assert exit_.value.code == EXIT_USER_ERROR
    assert capsys.readouterr().err == "error: config.x = 1 is not allowed\n"


def test_absl_entry_point_bug_prints_its_traceback():
    script = ("from asyncrl.cli import run_main\n"
              "def main(argv):\n    raise RuntimeError('a bug')\n"
              "run_main(main)\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert run.returncode == 1
    assert "Traceback" in run.stderr and "RuntimeError: a bug" in run.stderr


def test_a_bucket_workdir_given_to_run_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # The notebook path: `run` itself refuses it. pathlib would have made it a local folder
    # "gs:" beside the caller, the checkpoints in it.
    from asyncrl.run import run
    from experiments.grpo import get_config

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"--workdir=gs://bucket/run is a URL"):
        run(get_config("tiny"), "gs://bucket/run")
    assert list(tmp_path.iterdir()) == []
