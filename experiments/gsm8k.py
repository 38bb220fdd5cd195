"""GSM8K post-training of a Hugging Face chat model (Qwen2.5 / Qwen3 / Llama 3 / SmolLM2) from
local files, on a GPU or TPU VM. Nothing is downloaded: bring the data and the model.

1. The data: GSM8K's two files, one problem per row with `question` and `answer` (the
   worked solution ending in `#### 72`), as JSONL (a copy of openai/grade-school-math) or as
   the parquet files of Hugging Face's openai/gsm8k, used as they are:

       data/gsm8k/train.jsonl   data/gsm8k/test.jsonl
       …:train=data/gsm8k/main/train-00000-of-00001.parquet,test=data/gsm8k/main/test-00000-of-00001.parquet

   MATH / DAPO-style files work the same way with `dataset=math` (JSONL or parquet rows with
   `problem` and `answer` or a `solution` ending in \\boxed{...}; HuggingFaceH4/MATH-500's
   parquet as it is), with the reward `math_verify`. Any other layout is read with
   `dataset=prompts` and its field names: `--config.task.prompt_field=question
   --config.task.answer_field=solution --config.task.answer_format=boxed` (answer formats:
   'plain', 'gsm8k', 'boxed').

2. The model: a Hugging Face folder with config.json, model.safetensors (or shards and their
   index) and tokenizer.json / tokenizer_config.json, e.g. Qwen/Qwen2.5-0.5B-Instruct or
   Qwen/Qwen3-0.6B saved with `huggingface-cli download … --local-dir models/qwen2.5-0.5b`.
   Its own chat template (tokenizer_config.json) renders the prompts, with a system prompt
   asking for the final answer in \\boxed{}.

3. Install JAX for the accelerator (BUILD.md: `pip install -U "jax[cuda12]==0.10.2"` or
   `"jax[tpu]==0.10.2"`), then run:

       python -m asyncrl.main --config=experiments/gsm8k.py:train=data/gsm8k/train.jsonl,test=data/gsm8k/test.jsonl,model=models/qwen2.5-0.5b --workdir=runs/gsm8k

   The devices are split into one trainer mesh and rollout instances, disjoint: by default
   4 + 4 × 1 for an 8-GPU box. On a TPU v4-8 (4 chips):
   `…,trainer_devices=2,instances=2`; on 2 GPUs: `…,trainer_devices=1,instances=1`.

4. Every `eval.every_steps` steps the validation figures (greedy accuracy, pass@1 and pass@8
   from 8 samples per problem, mean response length, the rate of \\boxed{} answers) go to
   metrics.jsonl and TensorBoard in the workdir; the test file is evaluated before the first
   step and after the last (the validation split is a tenth of the train file's questions,
   carved out by construction). Ctrl-C checkpoints; the same command resumes.
   Any checkpoint (or the exported folder, or another model) is evaluated alone with:

       python -m asyncrl.eval --config=experiments/gsm8k.py:train=…,test=…,model=… --checkpoint=runs/gsm8k --split=test

5. Long responses (reasoning RL's 16k-32k caps): `qwen2.5-7b-16k` and `qwen3-8b-32k` are
   qwen2.5-7b / qwen3-8b (their model folders) with 16,384 / 32,768 new tokens, packed rows
   of prompt_bucket + max_new_tokens tokens (train.tokens_per_row: a row holds the longest
   trajectory, shorter ones share rows), train.attention 'auto' (splash on TPU, Pallas flash
   on GPU: no [T, T] scores), full remat, one packed row per chip per micro-batch (as many
   micro-batches as the batch's rows), 16-token pages, 48 / 8 slots (what
   the pages hold at the length model's mean, in whole groups) and 16 decode steps a
   dispatch. Their plans (2026-12-07, docs/results.md; python -m asyncrl.plan
   --config=experiments/gsm8k.py:qwen2.5-7b-16k --trainer=v5p-16 --rollout=v6e-8; the same
   for qwen3-8b-32k), each decided by compiling the packed step for the v5p chips here:
     qwen2.5-7b-16k  fits: the train step 37.8 GB per v5p chip of 102 (56 packed rows of
                     16,896 tokens, 5% padding, 7 micro-batches of one row per chip), an
                     instance 28.5 GB per v6e chip of 34.4 (12,288 pages, 48 slots);
                     predicted step 55 s [38-164], uncalibrated; the swap (train on v6e-8)
                     does not fit (36.5 GB per chip).
     qwen3-8b-32k    fits: the train step 51.0 GB per v5p chip (56 rows of 33,280 tokens,
                     7% padding), an instance 33.2 GB per v6e chip (4,096 pages, 8 slots);
                     predicted step 128 s [90-386], uncalibrated; the swap does not fit (a
                     row's activations and temporaries alone are 31 GB of a v6e's 34.4).
   The row counts are of one batch drawn from the planner's length model (responses
   lognormal about max_new_tokens / 8, sigma 1); a run's vary among a few bucketed values.
"""

from asyncrl.config_args import parse_arg
from asyncrl.model.chat import BOXED_SYSTEM_PROMPT
from experiments import grpo

# Real model shapes (their public config.json, as ModelConfig presets), sized for long
# responses on TPU slices and GPU VMs: `experiments/gsm8k.py:qwen2.5-7b,model=…`. Plan the
# chips first: python -m asyncrl.plan --config=experiments/gsm8k.py:qwen2.5-7b --trainer=v5p-16
# --rollout=v6e-8. `pages` is each instance's KV pool: 16-position pages, sized to leave an
# instance's chip room for the weights (bf16) and the decode step's temporaries.
VARIANTS = {
    "qwen2.5-1.5b": dict(preset="qwen2_5_1_5b", pages=16384),  # 28 KiB of KV per token
    "qwen2.5-7b": dict(preset="qwen2_5_7b", pages=8192),  # 56 KiB
    "llama-3.1-8b": dict(preset="llama3_1_8b", pages=4096),  # 128 KiB
    "qwen3-8b": dict(preset="qwen3_8b", pages=4096),  # 144 KiB
    # Long responses, the regime of reasoning RL (module docstring, "Long responses"): the
    # same weights as qwen2.5-7b / qwen3-8b, their folders.
    "qwen2.5-7b-16k": dict(preset="qwen2_5_7b", pages=12288, new_tokens=16384, slots=48,
                           folder="qwen2.5-7b"),
    "qwen3-8b-32k": dict(preset="qwen3_8b", pages=4096, new_tokens=32768, slots=8,
                         folder="qwen3-8b"),
}


def get_config(arg: str | None = None):
    words = [w for w in (arg or "").split(",") if w]
    variants = [w for w in words if w in VARIANTS]
    arg = parse_arg(",".join(w for w in words if w not in VARIANTS),
                    train="data/gsm8k/train.jsonl", test="data/gsm8k/test.jsonl",
                    model="", dataset="gsm8k", eta=2, trainer_devices=4, instances=4)
    c = grpo.get_config(f"eta={arg.eta}")
    c.model.checkpoint = arg.model or (
        f"models/{VARIANTS[variants[0]].get('folder', variants[0])}" if variants
        else "models/qwen2.5-0.5b")
    # The forward and backward passes and the weights rollout gets; the trainer keeps float32
    # master weights and Adam moments (asyncrl/train/trainer.py).
    c.model.param_dtype = "bfloat16"

    c.task.dataset = arg.dataset
    c.task.train_path = arg.train
    c.task.test_path = arg.test
    c.task.reward = "gsm8k" if arg.dataset == "gsm8k" else "math_verify"
    c.task.chat_template = "auto"
    c.task.system_prompt = BOXED_SYSTEM_PROMPT
    c.task.instruction = ""  # the system prompt asks for working, then a boxed answer

    c.rollout.group_size = 8
    c.rollout.num_slots = 128
    c.rollout.max_new_tokens = 1024
    c.rollout.prompt_bucket = 512

    c.train.batch_size = 32
    c.train.steps = 200
    c.train.learning_rate = 1e-6
    c.train.warmup_steps = 10
    c.train.num_microbatches = 8
    c.train.aggregation = "seq-mean-token-mean"

    c.coordinator.dynamic_sampling = True  # groups whose rewards all agree teach nothing

    c.mesh.trainer_devices = arg.trainer_devices
    c.mesh.rollout_instances = arg.instances
    c.mesh.devices_per_instance = 1

    c.checkpoint.every_steps = 20
    c.eval.heldout_size = 500
    c.eval.max_new_tokens = 1024
    c.eval.every_steps = 20
    c.eval.samples = 8
    c.eval.pass_k = (1, 8)
    if len(variants) > 1:
        from asyncrl.config_args import ConfigError
        raise ConfigError(f"config argument: one model variant at most, got {variants}")
    for name in variants:
        _real_shape(c, **{k: v for k, v in VARIANTS[name].items() if k != "folder"})
    return c


def _real_shape(c, preset: str, pages: int, new_tokens: int = 2048, slots: int = 128) -> None:
    """A 1.5-8B model: the shape named (the checkpoint folder's config.json wins when it is
    there), paged KV for `new_tokens`-token responses, the trainer sharded (FSDP over its
    chips) with full remat and 8 micro-batches. Past 2,048 new tokens (the long presets),
    packed rows that hold the longest trajectory, one per chip per micro-batch, and longer
    decode dispatches."""
    c.model.preset = preset
    c.rollout.max_new_tokens = new_tokens
    c.rollout.page_size = 16
    c.rollout.num_pages = pages
    c.rollout.decode_steps_per_dispatch = 8
    c.train.remat = "full"
    c.eval.max_new_tokens = new_tokens
    if new_tokens > 2048:
        # Responses of up to new_tokens run for minutes: a dispatch of 16 decode steps
        # halves the host's share of each, and the slots are about what the KV pages hold
        # at the length model's mean trajectory (asyncrl.plan prints it: 55 at 16k, 9 at
        # 32k), in whole groups, so preemption handles the tail, not the typical row.
        c.rollout.decode_steps_per_dispatch = 16
        c.rollout.num_slots = slots
        # A row holds the longest trajectory; the rest are packed beside each other
        # (asyncrl/train/packing.py), and with attention 'auto' (grpo.py's) the step never
        # holds a row's T x T scores. A micro-batch is one such row per trainer chip, as
        # many as the batch's rows need (the count is the packer's, not the config's).
        c.train.tokens_per_row = c.rollout.prompt_bucket + new_tokens
        c.train.num_microbatches = 1
