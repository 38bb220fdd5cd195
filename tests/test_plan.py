"""The planner: accelerator names, the real-shape configs, and plans compiled for a TPU v5e
topology on this CPU (libtpu, no TPU): one placement that fits, one that cannot."""

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
def test_the_tiny_config_fits_one_v5e_chip_each_side():
    done = _plan("--config=experiments/grpo.py:tiny", "--trainer=v5e-1", "--rollout=v5e-1")
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    assert plan["fits"] is True
    for side in ("trainer", "rollout"):
        part = plan[side]
        assert 0 < part["hbm_bytes_per_device"] <= part["hbm_capacity_bytes"]
    assert min(plan["trainer"][k] for k in ("params_bytes", "optimizer_bytes",
                                            "activation_bytes")) > 0
    assert plan["rollout"]["kv_pages"] > 0 and plan["rollout"]["max_concurrent_sequences"] > 0
    assert min(plan["predicted"].values()) > 0
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
    from asyncrl.plan.planner import Part, check_host_fits

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
