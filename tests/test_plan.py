"""The planner: accelerator names, the real-shape configs, plans compiled for a TPU v5e
topology on this CPU (libtpu, no TPU): one placement that fits, one that cannot; compiled
costs with every loop counted, the paged kernel's cost from its block plan, predicted times
with their bands and calibration, and the split of two kinds of chip."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from asyncrl.plan import accelerators
from asyncrl.config import validate
from asyncrl.model import ModelConfig, abstract_params

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="compiling for a TPU topology needs libtpu "
                                         "(requirements-test.txt)")


@pytest.mark.parametrize("name, chips, topology", [
    ("v5e-1", 1, "v5e:1x1"), ("v5litepod-8", 8, "v5e:2x4"), ("v5e-16", 16, "v5e:4x4"),
    ("v5p-8", 4, "v5p:2x2x1"), ("v5p-16", 8, "v5p:2x2x2"), ("v5p-32", 16, "v5p:2x2x4"),
    ("v6e-8", 8, "v6e:2x4"), ("v4-16", 8, "v4:2x2x2"),
])
def test_tpu_accelerator_types_name_their_chips(name, chips, topology):
    accelerator = accelerators.parse(name)
    assert (accelerator.kind, accelerator.chips, accelerator.topology) == ("tpu", chips, topology)


def test_gpu_counts_and_bad_names():
    h100 = accelerators.parse("8xH100")
    assert (h100.kind, h100.chips, h100.chip.hbm_bytes) == ("gpu", 8, 80e9)
    for bad, message in [("v5p-3", "2 per chip"), ("v5e-6", "powers of two"),
                         ("8xB300", "NxTYPE"), ("tpu", "Cloud TPU accelerator type")]:
        with pytest.raises(ValueError, match=message):
            accelerators.parse(bad)


@pytest.mark.parametrize("preset, billions", [
    ("qwen2_5_1_5b", 1.54), ("qwen2_5_7b", 7.62), ("llama3_1_8b", 8.03), ("qwen3_8b", 8.19)])
def test_real_model_presets_have_the_published_parameter_counts(preset, billions):
    import jax
    params = abstract_params(getattr(ModelConfig, preset)())[1]
    count = sum(np.prod(x.shape) for x in jax.tree.leaves(params)) / 1e9
    assert count == pytest.approx(billions, rel=0.01)


@pytest.mark.parametrize("variant, preset", [
    ("qwen2.5-1.5b", "qwen2_5_1_5b"), ("qwen2.5-7b", "qwen2_5_7b"),
    ("llama-3.1-8b", "llama3_1_8b"), ("qwen3-8b", "qwen3_8b")])
def test_gsm8k_real_shape_variants(variant, preset):
    from experiments import gsm8k
    c = gsm8k.get_config(f"{variant},eta=1")
    assert c.model.preset == preset and c.model.checkpoint == f"models/{variant}"
    assert c.rollout.page_size == 16 and c.train.remat == "full" and c.staleness.eta == 1
    assert c.model.param_dtype == "bfloat16"
    validate(c, device_count=8, local_files=False)


def _plan(*args):
    return subprocess.run([sys.executable, "-m", "asyncrl.plan", *args], capture_output=True,
                          text=True, timeout=600)


@needs_libtpu
def test_the_tiny_config_fits_one_v5e_chip_each_side(tmp_path):
    out = tmp_path / "plan.json"
    done = _plan("--config=experiments/grpo.py:tiny", "--trainer=v5e-1", "--rollout=v5e-1",
                 "--config.train.steps=7", f"--out={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    # The plan file: the recommended split, its config and settings, which the TPU launch
    # script builds (tests/test_launch.py: recorded 7B plans).
    written = json.loads(out.read_text())
    assert written["planned"] == plan and written["config"] == "experiments/grpo.py:tiny"
    assert written["overrides"] == {"train.steps": 7, "staleness.eta": plan["recommended"]["eta"],
                                    "checkpoint.keep": 1}
    assert (written["trainer"]["accelerator"], written["rollout"]["accelerator"]) == (
        plan["recommended"]["trainer"], plan["recommended"]["rollout"])
    assert written["rollout"]["runtime_version"] == "v2-alpha-tpuv5-lite"
    launched = subprocess.run(["bash", "launch/tpu_vms.sh", "--dry-run", "all", f"--plan={out}",
                               "--name=rl", "--zone=z"], capture_output=True, text=True,
                              timeout=60)
    assert launched.returncode == 0, launched.stderr
    job, = [line for line in launched.stdout.splitlines() if "asyncrl.main" in line]
    assert "--config=experiments/grpo.py:tiny " in job and "--config.train.steps=7 " in job
    assert plan["fits"] is True
    for side in ("trainer", "rollout"):
        part = plan[side]
        assert 0 < part["hbm_bytes_per_device"] <= part["hbm_capacity_bytes"]
    assert min(plan["trainer"][k] for k in ("params_bytes", "optimizer_bytes",
                                            "activation_bytes")) > 0
    assert plan["rollout"]["kv_pages"] > 0 and plan["rollout"]["max_concurrent_sequences"] > 0
    assert set(plan["predicted"]) == {"train_step_s", "decode_step_s", "prefill_per_token_s",
                                      "weight_sync_s"}
    for time in plan["predicted"].values():  # no TPU measured: every time is a stated band
        assert 0 < time["low"] <= time["value"] <= time["high"] and time["calibrated"] is False
    printed = [line for line in done.stdout.splitlines()
               if line.startswith(("  train step ", "  decode step ", "  prefill ",
                                   "  weight sync "))]
    assert len(printed) == 4 and all("] uncalibrated" in line for line in printed)
    recommended = plan["recommended"]
    assert recommended["trainer_chips"] + recommended["rollout_chips"] == 2
    assert recommended["eta"] >= 1 and recommended["predicted_staleflow_vs_sync"] > 0


@needs_libtpu
def test_a_1_5b_model_on_one_v5e_chip_ends_with_one_error_line_naming_the_part():
    done = _plan("--config=experiments/gsm8k.py:qwen2.5-1.5b", "--trainer=v5e-1",
                 "--rollout=v5e-1")
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert "trainer does not fit" in errors[0] and "TPU v5e" in errors[0]
    assert "parameters and optimizer state" in errors[0] and "trainer chips" in errors[0]


def test_a_bad_accelerator_is_one_error_line():
    done = _plan("--config=experiments/grpo.py:tiny", "--trainer=v5p-3", "--rollout=v5e-1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: 'v5p-3': v5p accelerator")


class _Accelerator:
    """A device as asyncrl.main sees it, with the memory limit a GPU or TPU reports."""

    platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"

    def __init__(self, limit):
        self.limit = limit

    def memory_stats(self):
        return {"bytes_limit": self.limit}


def test_main_refuses_a_trainer_its_devices_cannot_hold_before_loading_weights():
    from asyncrl.plan.hbm import DoesNotFit, check_devices_hold_the_state
    from experiments import gsm8k

    c = gsm8k.get_config("qwen2.5-7b")
    one_gpu = [_Accelerator(80e9)]
    # 7.6B parameters: 30 GB of float32 master weights, 61 GB of Adam moments, 15 GB copy.
    with pytest.raises(DoesNotFit, match=r"trainer does not fit: .* 106\.\d GB per NVIDIA H100 "
                                         r".*use at least 2 trainer devices"):
        check_devices_hold_the_state(c, one_gpu, [one_gpu])
    eight = [_Accelerator(80e9) for _ in range(8)]
    check_devices_hold_the_state(c, eight, [[_Accelerator(80e9)]])  # fits: returns
    c.rollout.num_pages = 200_000  # 3.2M positions of 56 KiB
    with pytest.raises(DoesNotFit, match=r"rollout instance does not fit: .* KV cache"):
        check_devices_hold_the_state(c, eight, [[_Accelerator(80e9)]])


def test_a_cpu_run_is_planned_as_one_host_figure_of_counted_parts():
    done = _plan("--config=experiments/grpo.py:tiny", "--trainer=cpu", "--rollout=cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    host, trainer = plan["host"], plan["trainer"]
    parts = {k: v for k, v in host.items() if k not in ("host_bytes", "host_capacity_bytes")}
    assert set(parts) == {"runtime_bytes", "trainer_bytes", "weight_versions_bytes",
                          "instances_bytes", "evaluation_bytes"}
    assert min(parts.values()) > 0 and host["host_bytes"] == pytest.approx(sum(parts.values()))
    assert host["host_bytes"] <= host["host_capacity_bytes"]
    # float32: the weights rollout reads are the master's bytes; two versions are resident.
    assert parts["weight_versions_bytes"] == pytest.approx(2 * trainer["params_bytes"])
    assert parts["trainer_bytes"] >= (trainer["params_bytes"] + trainer["optimizer_bytes"]
                                      + trainer["activation_bytes"])
    assert "host" in done.stdout and "no times or split predicted" in done.stdout


def test_a_host_that_cannot_hold_the_run_names_its_largest_part():
    from asyncrl.plan.hbm import DoesNotFit
    from asyncrl.plan.parts import Part, check_host_fits

    cpu = accelerators.parse("cpu")
    assert cpu.kind == "cpu" and cpu.chip.hbm_bytes > 0
    pieces = {"runtime_bytes": 1e9, "trainer_bytes": 2 * cpu.chip.hbm_bytes,
              "weight_versions_bytes": 1e9, "instances_bytes": 1e9, "evaluation_bytes": 1e9}
    with pytest.raises(DoesNotFit, match=r"does not fit this host: .* largest part is trainer "
                                         r".*train.num_microbatches"):
        check_host_fits(Part(cpu, sum(pieces.values()), pieces))
    done = _plan("--config=experiments/grpo.py:tiny", "--trainer=cpu", "--rollout=v5e-1")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "--trainer=cpu --rollout=cpu" in last


def _train_step_cost(layers: int, unrolled: bool) -> dict:
    """The tiny model's train step (2 micro-batches) compiled for this host's CPU: XLA's
    figures and the loop-counted ones (asyncrl/plan/tpu_compile.py `analysis`)."""
    import contextlib

    import jax
    import jax.numpy as jnp

    from asyncrl.model.transformer import unrolled_layers
    from asyncrl.plan.tpu_compile import analysis, compile_for
    from asyncrl.train.trainer import (TrainBatch, TrainConfig, Trainer, trainer_mesh,
                                       unrolled_microbatches)

    devices = jax.devices("cpu")[:1]
    trainer = Trainer.create(TrainConfig(num_microbatches=2, remat="full"),
                             ModelConfig.tiny(num_layers=layers), trainer_mesh(devices), 4)
    rows, length = 8, 32
    batch = TrainBatch(*(jax.ShapeDtypeStruct((rows, length), dtype) for dtype in
                         (jnp.int32, jnp.int32, jnp.float32, jnp.float32, jnp.int32)),
                       jax.ShapeDtypeStruct((rows,), jnp.float32),
                       jax.ShapeDtypeStruct((rows,), jnp.int32),
                       jax.ShapeDtypeStruct((), jnp.int32), group_size=4)
    with contextlib.ExitStack() as stack:
        if unrolled:
            stack.enter_context(unrolled_layers())
            stack.enter_context(unrolled_microbatches())
        return analysis(compile_for(trainer.step, (trainer.abstract_state(), batch), devices,
                                    (0,)))


def test_compiled_costs_count_every_layer_and_micro_batch():
    rolled = {layers: _train_step_cost(layers, unrolled=False) for layers in (1, 2, 4)}
    unrolled = _train_step_cost(2, unrolled=True)
    # XLA counts a loop's body once: its own figure hardly moves with depth.
    assert rolled[4]["xla_flops"] < 1.05 * rolled[2]["xla_flops"]
    # The loops counted, the scanned program computes what the unrolled one does by XLA's
    # own count (no loop left for it to undercount); on that loop-free program the count is
    # XLA's own.
    assert rolled[2]["flops"] == pytest.approx(unrolled["xla_flops"], rel=0.02)
    assert unrolled["flops"] == pytest.approx(unrolled["xla_flops"], rel=0.02)
    assert unrolled["bytes_accessed"] == pytest.approx(unrolled["xla_bytes_accessed"], rel=0.03)
    # Bytes: the scanned program also slices each layer's weights out of the stack and
    # updates the stacked gradients in every iteration, which the unrolled one does not.
    assert unrolled["xla_bytes_accessed"] <= rolled[2]["bytes_accessed"] \
        <= 1.2 * unrolled["xla_bytes_accessed"]
    # Each layer adds the same work, in both micro-batches: two more layers, twice one.
    assert rolled[4]["flops"] - rolled[2]["flops"] == pytest.approx(
        2 * (rolled[2]["flops"] - rolled[1]["flops"]), rel=0.01)


def test_the_paged_decode_kernel_copies_each_rows_live_pages_once():
    from asyncrl.model import paged_tpu
    from asyncrl.plan.kernel_cost import paged_decode_attention, paged_decode_kernel

    shape = dict(num_q_heads=4, num_kv_heads=2, head_dim=128, page_size=16, pages_per_seq=64,
                 itemsize=2)
    page = 16 * 2 * 2 * 128 * 2  # positions x (K and V of 2 kv heads) x head_dim x bf16
    cost = paged_decode_kernel([1, 20, 600, 0], **shape)
    # 1, 2 and 38 pages; an empty slot copies none.
    assert cost.kv_bytes == (1 + 2 + 38) * page
    queries = 2 * 4 * (4 * 128 * 2)  # every row's [4, 128] query in, its output out
    scalars = 4 * (3 * 4 + 4 * 64 + 1)  # order, lengths, first blocks, table, layer
    assert cost.bytes_accessed == cost.kv_bytes + queries + scalars
    # Blocks of 32 pages (512 positions): 1 + 1 + 2; per kv head 2 matmuls of
    # 2 x 2 query heads x 512 positions x 128.
    assert paged_tpu.pages_per_block(16, 64) == 32
    assert cost.flops == 4 * 2 * 2 * 2 * 2 * 512 * 128
    # As the model calls it, a short row reads its page, not the row's table.
    model = ModelConfig.tiny(head_dim=128, num_layers=3, param_dtype="bfloat16")
    short, full = (paged_decode_attention(model, [n] * 4, page_size=16, pages_per_row=64)
                   for n in (1, 1024))
    assert full.kv_bytes == 64 * short.kv_bytes == 3 * 4 * 64 * 16 * 2 * 2 * 128 * 2


def test_the_gpu_paged_decode_loads_live_pages_in_compute_blocks(monkeypatch):
    from asyncrl.model import paged_gpu
    from asyncrl.plan.kernel_cost import gpu_paged_decode_kernel

    shape = dict(num_q_heads=4, num_kv_heads=2, head_dim=128, page_size=16, pages_per_seq=64,
                 itemsize=2)
    # Compute blocks of 4 pages (64 positions); 64 columns in 16 partitions of 4.
    assert paged_gpu.block_shape(16, 64) == (4, 16, 64)
    cost = gpu_paged_decode_kernel([1, 20, 600, 0], **shape)
    # 1, 2 and 38 live pages: one block, one block, 9 full partitions and 2 of the tenth,
    # each rounded up to its block; keys and values of both kv heads.
    head_page = 16 * 128 * 2
    assert cost.kv_bytes == (4 + 4 + 40) * 2 * 2 * head_page
    # Query heads padded to a block of 16 per kv head.
    assert cost.flops == (1 + 1 + 10) * 2 * 2 * 2 * 16 * 64 * 128
    # A partition wider than the table's live columns is never loaded: a short row costs
    # its block, not the table.
    monkeypatch.setattr(paged_gpu, "MAX_SPLITS", 1)
    assert gpu_paged_decode_kernel([20], **shape).kv_bytes == 4 * 2 * 2 * head_page


def test_a_paged_gpu_plan_counts_the_gpu_kernel_from_its_plan():
    done = _plan("--config=experiments/grpo.py:tiny", "--config.rollout.page_size=4",
                 "--trainer=1xH100", "--rollout=1xH100")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "plus the paged attention kernel" in done.stdout


def test_splash_attention_visits_the_causal_tiles_of_its_block_plan():
    from asyncrl.plan.kernel_cost import splash_attention

    # 600 tokens pad to 640 = 5 tiles of 128 (640 is no multiple of 256 or 512): 15 of the
    # 25 tile pairs lie on or below the diagonal.
    one = splash_attention(rows=1, length=600, num_q_heads=1, num_kv_heads=1, head_dim=64,
                           itemsize=2, backward=False)
    assert one.flops == 15 * 4 * 128 * 128 * 64
    tile = 128 * 64 * 2
    assert one.bytes_accessed == 15 * 2 * tile + 5 * 2 * tile
    # Rows and query heads multiply; full remat runs the forward twice; the backward is
    # 14 t^2 H a pair.
    trained = splash_attention(rows=3, length=600, num_q_heads=4, num_kv_heads=2, head_dim=64,
                               itemsize=2, forward_passes=2)
    assert trained.flops == 3 * 4 * (2 * one.flops + 15 * 14 * 128 * 128 * 64)
    # 1,024 tokens: tiles of 512, 2 x 3 / 2 = 3 pairs.
    assert splash_attention(rows=1, length=1024, num_q_heads=1, num_kv_heads=1, head_dim=64,
                            itemsize=2, backward=False).flops == 3 * 4 * 512 * 512 * 64


def test_a_measurement_backs_only_its_own_chip_and_regime():
    from asyncrl.plan.predict import backing_measurement

    default = ModelConfig.smollm2_135m()  # float32, as measured on the H200
    h200, h100 = accelerators.parse("1xH200"), accelerators.parse("1xH100")
    assert backing_measurement("decode", h200, default, paged=False, work=0.6e9,
                               chips=1) is not None
    assert backing_measurement("train", h200, default, paged=False, work=3.4e12,
                               chips=1) is not None
    for program, accelerator, model, paged, work, chips in [
            ("decode", h100, default, False, 0.6e9, 1),  # another chip
            ("decode", h200, default.replace(param_dtype="bfloat16"), False, 0.6e9, 1),
            ("decode", h200, default, True, 0.6e9, 1),  # the paged engine was not measured
            ("decode", h200, default, False, 15e9, 1),  # a 7B step's weights: another regime
            ("train", h200, default, False, 5e15, 1),
            ("train", h200, default, False, 3.4e12, 2)]:  # FSDP's collectives: not measured
        assert backing_measurement(program, accelerator, model, paged=paged,
                                   work=work, chips=chips) is None


@pytest.mark.parametrize("gpu", ["1xH200", "1xH100"])
def test_gpu_plans_are_calibrated_only_on_the_measured_chip(gpu):
    done = _plan("--config=experiments/grpo.py", f"--trainer={gpu}", f"--rollout={gpu}")
    assert done.returncode == 0, done.stderr[-2000:]
    predicted = json.loads(done.stdout.strip().splitlines()[-1])["predicted"]
    for time in predicted.values():
        assert 0 < time["low"] <= time["value"] <= time["high"]
    measured = gpu == "1xH200"  # the default config's decode is what was measured there
    assert predicted["decode_step_s"]["calibrated"] is measured
    # The measured train step attended densely; the default's 'auto' runs the GPU flash
    # kernel there: another program, not calibrated by it.
    assert not predicted["train_step_s"]["calibrated"]
    assert not predicted["prefill_per_token_s"]["calibrated"]
    assert not predicted["weight_sync_s"]["calibrated"]
    if measured:  # the decode step measured there (2.95 ms at 16 slots) is in its band
        assert predicted["decode_step_s"]["low"] <= 2.95e-3 <= predicted["decode_step_s"]["high"]


@needs_libtpu
def test_two_kinds_of_chip_are_split_by_the_simulator():
    done = _plan("--config=experiments/grpo.py:tiny", "--trainer=v5e-4", "--rollout=v6e-4")
    assert done.returncode == 0, done.stderr[-2000:]
    recommended = json.loads(done.stdout.strip().splitlines()[-1])["recommended"]
    # Both assignments were simulated, on shares of each pool.
    rows = [line for line in done.stdout.splitlines() if " eta " in line and " + " in line]
    assert any(line.split()[0].startswith("v5e") for line in rows)
    assert any(line.split()[0].startswith("v6e") for line in rows)
    assert any(line.split()[0] in ("v5e-1", "v5e-2") for line in rows)
    picked = (recommended["trainer"], recommended["rollout"])
    assert {p.split("-")[0] for p in picked} == {"v5e", "v6e"}
    assert f"picked {picked[0]} + {picked[1]}" in done.stdout


# ------------------------------------------------------- long rows: packed steps and slices


@pytest.mark.parametrize("variant, folder, new_tokens", [
    ("qwen2.5-7b-16k", "qwen2.5-7b", 16384), ("qwen3-8b-32k", "qwen3-8b", 32768)])
def test_long_response_presets_pack_rows_that_hold_the_longest_trajectory(variant, folder,
                                                                          new_tokens):
    from asyncrl.config import resolve
    from experiments import gsm8k

    spec = resolve(gsm8k.get_config(variant), local_files=False)
    assert spec.model.checkpoint == f"models/{folder}"  # the same weights as the short preset
    assert spec.rollout.max_new_tokens == spec.eval.max_new_tokens == new_tokens
    assert spec.train.tokens_per_row == spec.rollout.max_len == 512 + new_tokens
    assert spec.rollout.max_len % spec.rollout.page_size == 0
    # The pool holds the longest sequence (the config checks that) and several of the length
    # model's mean one.
    from asyncrl.plan.parts import trajectory_lengths
    pool = spec.rollout.num_pages * spec.rollout.page_size
    assert pool >= max(spec.rollout.max_len, 8 * trajectory_lengths(spec).mean())
    assert (spec.train.attention, spec.train.remat) == ("auto", "full")
    validate(gsm8k.get_config(variant), device_count=16, local_files=False)


def _spec(overrides: dict, config: str = "qwen2.5-7b-16k"):
    from asyncrl.config import with_overrides
    from experiments import grpo, gsm8k

    base = grpo.get_config("tiny") if config == "tiny" else gsm8k.get_config(config)
    return validate(with_overrides(base, overrides), device_count=64, local_files=False)


def test_the_planned_step_has_the_rows_the_trainer_packs():
    """The planner compiles the step for the batch the run's packer makes of one step's
    trajectories under the length model, its row count bucketed for the chips."""
    from asyncrl.plan.parts import step_layout, trajectory_lengths
    from asyncrl.servers.trajectory import TrajectoryRecord
    from asyncrl.train.trainer import TrainBatch

    spec = _spec({"mesh.trainer_devices": 8})
    lengths = trajectory_lengths(spec)
    assert len(lengths) == 32 * 8 and lengths.max() <= spec.rollout.max_len
    # Responses about 16,384 / 8 with a long tail, prompts about 256.
    assert 1_500 < np.median(lengths) < 3_500 and lengths.max() > 4 * np.median(lengths)
    group = spec.rollout.group_size
    records = [TrajectoryRecord(trajectory_id=i, prompt=np.zeros(1, np.int32), max_new_tokens=n,
                                tokens=[3] * (int(n) - 1), logprobs=[0.0] * (int(n) - 1),
                                versions=[0] * (int(n) - 1), entry_id=i // group,
                                prompt_id=i // group, reward=0.0)
               for i, n in enumerate(lengths)]
    groups = [records[i:i + group] for i in range(0, len(records), group)]
    for chips in (8, 16):
        layout = step_layout(spec, chips, spec.train.num_microbatches)
        batch = TrainBatch.from_groups(groups, [0] * len(groups), 0, spec.rollout.max_len,
                                       group, spec.train.tokens_per_row, chips)
        assert batch.tokens.shape == (layout.rows, layout.width)
        assert layout.padding_fraction == pytest.approx(1 - lengths.sum() / batch.tokens.size)
    padded = step_layout(_spec({"mesh.trainer_devices": 8, "train.tokens_per_row": 0}), 8, 8)
    assert (padded.rows, padded.width, padded.packed) == (256, 16896, False)
    assert padded.padding_fraction > 0.75 > layout.padding_fraction


def test_micro_batches_are_tried_up_to_one_row_per_chip():
    from asyncrl.plan.parts import microbatch_counts, step_layout

    # Unpacked: 256 rows over 8 chips, 32 each; the config's 8, then 16, then 32.
    unpacked = _spec({"mesh.trainer_devices": 8}, "qwen2.5-7b")
    assert microbatch_counts(unpacked, 8) == [8, 16, 32]
    # 24 rows a chip: 8 divides them, 16 does not; the next is one row each.
    odd = _spec({"mesh.trainer_devices": 8, "train.batch_size": 24}, "qwen2.5-7b")
    assert microbatch_counts(odd, 8) == [8, 24]
    # Packed: one row per chip at once, as many micro-batches as the batch's rows; nothing
    # more to try.
    packed = _spec({"mesh.trainer_devices": 8})
    assert microbatch_counts(packed, 8) == [1]
    layout = step_layout(packed, 8, 1)
    assert layout.rows_per_chip(8) == 1 and layout.num_microbatches == layout.rows // 8


def test_loops_are_counted_through_multi_line_attributes_and_by_their_step():
    """What the TPU compiler prints for a packed splash step over FSDP: a Pallas call's
    kernel metadata over several lines (one starting with '}}': the loop body goes on after
    it), and a windowed einsum's loop unrolled by two, its induction variable stepping by 2
    to its limit. Each matmul counts once a trip, and there are limit / 2 trips."""
    from asyncrl.plan.hlo_cost import Program

    text = """HloModule m

%cond (c: (s32[], f32[8,8])) -> pred[] {
  %c = (s32[], f32[8,8]) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (b: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %b = (s32[], f32[8,8]) parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %x = f32[8,8] get-tuple-element(%b), index=1
  %k = f32[8,8] custom-call(%x), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 512}"
}}, metadata={op_name="pallas_call"}
  %d = f32[8,8] dot(%k, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %two = s32[] constant(2)
  %j = s32[] add(%i, %two)
  ROOT %t = (s32[], f32[8,8]) tuple(%j, %d)
}

ENTRY %main (a: f32[8,8]) -> f32[8,8] {
  %a = f32[8,8] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,8]) tuple(%zero, %a)
  %w = (s32[], f32[8,8]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[8,8] get-tuple-element(%w), index=1
}
"""
    program = Program(text)
    assert [i.opcode for i in program.computations["body"]][-3:] == ["constant", "add", "tuple"]
    assert program.loops() == [("w", 4)]
    dot = 2 * 8 * 8 * 8
    assert 4 * dot <= program.cost().flops < 4 * dot + 16  # and the loop's few scalar adds


def _long_rows(max_len: int, **overrides):
    """The tiny config's run with rows of `max_len` tokens: 2 entries x 4 responses."""
    return _spec({"train.batch_size": 2, "rollout.group_size": 4, "rollout.num_slots": 4,
                  "rollout.prompt_bucket": 16, "rollout.max_new_tokens": max_len - 16,
                  "eval.max_new_tokens": 4, "train.num_microbatches": 1, **overrides}, "tiny")


@needs_libtpu
def test_the_planner_takes_more_micro_batches_when_the_configs_do_not_fit():
    from asyncrl.plan.parts import check_fits, trainer_part

    # Dense scores of 8,192-token rows: eight rows at once ask a v5e chip for more than its
    # 16 GiB; the TPU compiler refuses, and four at once fit.
    spec = _long_rows(8192, **{"train.attention": "dense"})
    part, info = trainer_part(spec, ModelConfig.tiny(max_seq_len=8192),
                              accelerators.parse("v5e-1"))
    (remat, first, asked, refused), *_ = info["tried"]
    assert (remat, first, refused) == ("full", 1, True) and asked > part.capacity
    assert part.layout.num_microbatches > 1 and not info["refused"]
    assert [m for _, m, _, _ in info["tried"]] == [1, 2, 4, 8][:len(info["tried"])]
    assert part.hbm_bytes_per_device <= part.capacity
    check_fits(part, None, spec)  # fits: returns


def test_remat_is_tried_from_the_configs_down_to_full():
    from asyncrl.plan.parts import remat_choices

    assert remat_choices(_long_rows(64, **{"train.remat": "none"})) == ["none", "dots", "full"]
    assert remat_choices(_long_rows(64, **{"train.remat": "full"})) == ["full"]
    from asyncrl.model.remat import REMAT_POLICIES

    REMAT_POLICIES.add("mine", lambda: None)  # a plugin's: not ranked, tried before 'full'
    try:
        assert remat_choices(_long_rows(64, **{"train.remat": "mine"})) == ["mine", "full"]
    finally:
        REMAT_POLICIES.remove("mine")


@needs_libtpu
def test_the_planner_keeps_less_per_layer_when_no_micro_batch_count_fits(capsys):
    """No remat: twelve layers' [T, T] scores of 8,192-token rows exceed a v5e chip at one
    row at once too; 'dots' (the scores recomputed) fits, and the plan says to set it."""
    from asyncrl.plan.parts import trainer_part
    from asyncrl.plan.planner import _print_microbatches

    spec = _long_rows(8192, **{"train.attention": "dense", "train.remat": "none",
                               "train.batch_size": 1, "rollout.group_size": 2})
    part, info = trainer_part(spec, ModelConfig.tiny(max_seq_len=8192, num_layers=12),
                              accelerators.parse("v5e-1"))
    assert [(remat, m) for remat, m, _, _ in info["tried"]] == [("none", 1), ("none", 2),
                                                                ("dots", 1)]
    assert all(refused for _, _, _, refused in info["tried"][:2])
    assert part.layout.remat == "dots" and part.hbm_bytes_per_device <= part.capacity
    _print_microbatches(spec, part, info["tried"])
    assert "the plan is train.remat = 'dots' (set it)" in capsys.readouterr().out


@needs_libtpu
def test_a_row_one_chip_cannot_hold_names_the_smallest_slice_that_holds_it():
    from asyncrl.plan.hbm import DoesNotFit
    from asyncrl.plan.parts import check_fits, trainer_part

    # 1.1B parameters, packed rows of 2,048 tokens: on one v5e chip the float32 master, Adam
    # and the gradient leave no room for a row; FSDP over two chips halves them.
    spec = _long_rows(2048, **{"train.tokens_per_row": 2048})
    model = ModelConfig.tiny(hidden_dim=2048, mlp_dim=8192, num_layers=16, num_heads=16,
                             num_kv_heads=4, head_dim=128, max_seq_len=2048,
                             param_dtype="bfloat16")
    one, info = trainer_part(spec, model, accelerators.parse("v5e-1"))
    # Packed rows: one row per chip at once is the only layout, and 'full' the least remat.
    assert [t[:1] for t in info["tried"]] == [("full",)] and one.layout.rows_per_chip(1) == 1
    tried = {}

    def holds(bigger):
        part = tried[bigger.name] = trainer_part(spec, model, bigger)[0]
        return part.hbm_bytes_per_device <= part.capacity

    # Compiled, not scaled: the refused compile's figures on one chip (what the compiler
    # asked for, 12 GB beside the state) would have named v5e-8.
    with pytest.raises(DoesNotFit, match=r"packed rows, one per chip at once .* compiled "
                                         r"there, the smallest trainer slice that holds it is "
                                         r"v5e-2 \(2 chips\)$"):
        check_fits(one, None, spec, holds)
    assert list(tried) == ["v5e-2"]
    check_fits(tried["v5e-2"], None, spec)  # and it does
