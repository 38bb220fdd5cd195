"""The benchmarks still run and print the JSON line the README quotes.

Speed is judged by the benchmarks themselves, not here: these runs are scaled down (a tiny
model, few entries) and only check that each benchmark finishes, measures what it says and
ends with its documented keys, so an API change cannot leave a benchmark broken unnoticed.
"""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

from asyncrl.metrics import read_metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _last_json(script: str, *args: str) -> dict:
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)  # a hang guard only
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_engine_benchmark():
    result = _last_json("engine.py", "--hidden_dim=64", "--num_layers=1", "--vocab_size=256",
                        "--num_slots=4", "--requests=12", "--max_new_tokens=24",
                        "--median_len=6", "--prompt_buckets", "8", "--naive_steps=2",
                        "--repeats=1", "--page_size=4", "--paged_slots=8",
                        "--paged_requests=16", "--group_size=2", "--decode_steps=2",
                        "--skip_tpu")  # the TPU byte count: tests/test_tpu_compile.py
    assert result.keys() == {"slot_tok_s", "static_tok_s", "naive_tok_s", "slot_vs_static",
                             "contiguous_tok_s", "paged_tok_s", "paged_vs_contiguous_concurrency",
                             "paged_vs_contiguous_tok_s", "multistep_vs_single",
                             "multistep_behind_vs_single", "behind_vs_blocking",
                             "group_prefill_saving", "preemptions"}
    assert min(v for k, v in result.items() if k != "preemptions") > 0
    assert result["slot_vs_static"] == round(result["slot_tok_s"] / result["static_tok_s"], 2)
    assert result["paged_vs_contiguous_tok_s"] == round(
        result["paged_tok_s"] / result["contiguous_tok_s"], 2)


def test_protocol_benchmark():
    result = _last_json("protocol.py", "--entries=2000", "--batch_size=16", "--instances=10")
    assert {"entries_per_s", "ops_per_s", "vs_goal"} <= result.keys()
    assert result["ops_per_s"] > result["entries_per_s"] > 0


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="its steps compile for a TPU topology: libtpu (requirements-test.txt)")
def test_long_context_benchmark():
    result = _last_json("long_context.py", "--model=tiny", "--caps", "64", "--cpu_groups=2",
                        "--cpu_cap=64", "--repeats=1")
    assert {"padding_fraction", "padding_fraction_before", "hbm_per_chip_gib", "refused",
            "flops_per_useful_token_vs_6n", "compile_s", "cpu_tok_s",
            "cpu_packed_vs_padded"} <= result.keys()
    assert result["hbm_per_chip_gib"]["64"].keys() == {"before", "after"}
    assert min(result["hbm_per_chip_gib"]["64"].values()) > 0
    # Packed rows compute less padding than a trajectory per row, and only what they hold.
    assert 0 <= result["padding_fraction"] < result["padding_fraction_before"] < 1
    over = result["padding_over_draws"]["64"]
    assert 0 <= over["low"] <= over["mean"] <= over["high"] < 1 and over["rows_seen"]
    assert result["cpu_rows"]["packed"][0] < result["cpu_rows"]["padded"][0]
    assert result["cpu_packed_vs_padded"] == round(
        result["cpu_tok_s"]["packed"] / result["cpu_tok_s"]["padded_dense"], 2)


def test_sim_paper_benchmark(tmp_path):
    result = _last_json("sim_paper.py", f"--out={tmp_path}", "--regime=latency", "--quick",
                        "--seeds=2", "--workers=1", "--set=num_instances=4", "--set=batch_size=8")
    assert result["staleflow_vs"].keys() == {"verl", "areal", "roll", "slime", "sync", "one_step"}
    assert result["staleflow_vs_spread"].keys() == result["staleflow_vs"].keys()
    assert {"staleflow_vs_matched_max", "staleflow_vs_matched_mean", "mean_vs_strict",
            "mean_staleness", "frontier", "frontier_min_ratio", "window"} <= result.keys()
    assert result["regime"] == "latency" and result["seeds"] == 2
    assert result["window"]["2"] == [6, 24]  # 2 + 8 cycles of η + 1
    assert result["max_staleness"]["staleflow"] <= 2  # the benchmark's η
    assert 0 < result["coordinator_s_per_step"] < result["modelled_step_s"]


def test_learning_benchmark(tmp_path):
    # One seed of each variant on the tiny config, 4 steps: the JSON the README quotes.
    result = _last_json("learning.py", "--scale=tiny", "--seeds=0", "--steps=4", "--eval-every=2",
                        "--override=--config.eval.heldout_size=8", f"--workdir={tmp_path}",
                        f"--plot={tmp_path / 'learning.png'}")
    assert {"time_to_target_s", "speedup_median", "final_accuracy", "target",
            "median_time_to_target_s", "goal_met"} <= result.keys()
    assert result["final_accuracy"].keys() == {"staleflow", "sync", "control"}
    assert result["accuracy_label"] == "train-set"  # the tiny task is too small to hold out
    assert (tmp_path / "learning.png").stat().st_size > 0
    # Asked again in the same workdir, the finished runs are reused, not redone or lost.
    written = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*_0/results.json")}
    assert len(written) == 3
    assert not list(tmp_path.glob("*_0/checkpoints"))  # finished runs keep their figures only
    again = _last_json("learning.py", "--scale=tiny", "--seeds=0", "--steps=4", "--eval-every=2",
                       "--override=--config.eval.heldout_size=8", f"--workdir={tmp_path}")
    assert again["final_accuracy"] == result["final_accuracy"]
    assert again["time_to_target_s"] == result["time_to_target_s"]
    assert {p: p.stat().st_mtime_ns for p in written} == written
    for variant in ("staleflow", "sync", "control"):
        evals = json.loads((tmp_path / f"{variant}_0" / "results.json").read_text())["evals"]
        assert [e["step"] for e in evals] == [2]  # version 4 is the final evaluation
        # A metrics row is timed when its step's weights existed, on the evaluations' clock
        # (not when it was written, a step later): the reward and accuracy curves line up.
        rows = read_metrics(tmp_path / f"{variant}_0" / "metrics.jsonl")
        walls = {r["step"]: r["wall_s"] for r in rows}
        assert [walls[e["step"]] for e in evals] == [e["trained_s"] for e in evals]
        # So is the final point: when step 4's weights existed, not when the run ended.
        assert result["training_s"][variant] == [round(walls[4], 1)]
    # The harder setting in the same workdir: staleflow at another η beside the first runs,
    # sync's (η = 0 either way) reused.
    harder = _last_json("learning.py", "--scale=tiny", "--seeds=0", "--steps=4", "--eval-every=2",
                        "--override=--config.eval.heldout_size=8", f"--workdir={tmp_path}",
                        "--eta=1", "--variants=sync,staleflow")
    assert harder["eta"] == 1 and harder["final_accuracy"]["sync"] == result["final_accuracy"]["sync"]
    assert {p: p.stat().st_mtime_ns for p in written} == written
    run = tmp_path / "staleflow_eta1_0"
    assert "--config=experiments/grpo.py:tiny,eta=1" in json.loads(
        (run / "benchmark_run.json").read_text())["command"]
    assert max(row["staleness_max"] for row in read_metrics(run / "metrics.jsonl")) <= 1


def test_device_check_runs_scaled_down_on_the_cpu(tmp_path):
    # On a CPU: the tiny config colocated on one device, peaks measured rather than looked up.
    result = _last_json("device_check.py", "--quick", "--steps=2", f"--workdir={tmp_path}",
                        # Its 540 s default budget cut the run short on a loaded CI machine.
                        "--budget_s=1500")
    assert result.keys() == {"device", "peaks", "decode", "train", "push", "run", "wall_s"}
    assert result["device"]["platform"] == "cpu" and result["device"]["scale"] == "tiny"
    assert result["peaks"]["source"].startswith("measured on this CPU")
    decode = result["decode"][0]
    assert decode["tok_s"] > 0 and decode["roofline_tok_s"] > 0 and decode["of_roofline"] > 0
    assert 0 < result["train"]["mfu"] and result["train"]["tflops"] > 0
    assert result["push"]["pull_is_reference"] is True and result["push"]["push_vs_copy"] > 0
    run = result["run"]
    assert run["steps"] == 2 and 0 <= run["accuracy_after"] <= 1 and run["max_staleness"] <= 2
    assert run["eval_label"] == "train-set"  # tiny has too few problems to hold any out


def _learning_module():
    spec = importlib.util.spec_from_file_location("learning_benchmark",
                                                  ROOT / "benchmarks" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_learning_benchmark_ranks_a_run_that_never_reached_the_target_last():
    learning = _learning_module()
    # The default's η = 2 runs: each schedule missed the target on one seed of three.
    assert learning.median_time_to([428.6, 429.3, None]) == 429.3
    assert learning.median_time_to([659.3, None, 457.9]) == 659.3
    assert learning.median_time_to([None, 300.0, None]) is None  # most runs never got there
    assert learning.median_time_to([None, 300.0]) is None  # the middle pair holds a miss
    finals = {"staleflow": [0.625, 0.555, 0.45], "sync": [0.605, 0.51, 0.7]}
    assert not learning.goal_met(1.536, finals)  # sooner, but 5 points under at the end
    assert learning.goal_met(1.536, {**finals, "staleflow": [0.59, 0.6, 0.45]})
    assert not learning.goal_met(1.4, {**finals, "staleflow": [0.7, 0.7, 0.7]})
    assert not learning.goal_met(None, finals)


def test_learning_benchmark_times_nothing_to_a_target_no_higher_than_the_start():
    learning = _learning_module()
    runs = {"sync": [{"curve": [(0.0, 0.0), (20.0, 0.0)]}],
            "staleflow": [{"curve": [(0.0, 0.1), (20.0, 0.4)]}]}
    assert not learning.target_above_start(runs, 0.0 - 0.05)  # sync ended at 0: target < 0
    assert not learning.target_above_start(runs, 0.1)  # staleflow started there
    assert learning.target_above_start(runs, 0.15)


def _reward_audit():
    spec = importlib.util.spec_from_file_location("reward_audit", ROOT / "benchmarks" / "reward_audit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reward_audit_task_splits_share_no_problem_and_load_as_math_files(tmp_path):
    from asyncrl.data.math_data import load_math

    paths = _reward_audit().write_task(tmp_path, train=300, heldout=40, seed=3)
    loaded = {name: load_math(path) for name, path in paths.items()}
    questions = {name: {p.question for p in data} for name, data in loaded.items()}
    assert [len(questions[n]) for n in ("train", "validation", "test")] == [300, 40, 40]
    assert not questions["train"] & questions["test"]
    assert not questions["train"] & questions["validation"]
    assert not questions["validation"] & questions["test"]
    for problem in loaded["test"]:  # the gold is the expression's value
        assert int(problem.answer) == eval(problem.question.removeprefix("What is ").rstrip("?"))


def test_reward_audit_recounts_strictly_and_shows_what_the_lenient_grader_would_report(tmp_path):
    audit = _reward_audit()
    rows = [  # (response, gold, what the run's grader said)
        (r"so \boxed{48}", "48", True),
        (r"\boxed{-10}", "-10", True),
        (r"\boxed{29 + 55 - 36}", "48", False),
        ("The problem is 29 + 55 - 36. I do not know.", "48", False),
        (r"\boxed{47}", "48", False),
    ]
    path = tmp_path / "after.jsonl"
    path.write_text("".join(json.dumps(
        {"response": r, "answer": a, "correct": c, "grader": "math_verify", "formatted": True,
         "cut": False, "length": 10}) + "\n" for r, a, c in rows))
    figures = audit.recount(path)
    assert figures["reported"] == figures["strict_recount"] == 0.4
    assert figures["within_5_points"] and figures["difference_points"] == 0.0
    # math-verify's extraction pays the restated problem.
    assert figures["lenient_would_report"] == 0.6
    assert not audit.strict_correct(r"\boxed{48", "48") and audit.strict_correct(r"\boxed{ 48 }", "48")


def test_reward_audit_benchmark(tmp_path):
    # One step of the real recipe on SmolLM2, 8 held-out problems: the JSON and the recount.
    result = _last_json("reward_audit.py", f"--workdir={tmp_path}", "--config.train.steps=1",
                        "--config.train.warmup_steps=0",
                        "--config.train.batch_size=2", "--config.eval.heldout_size=8",
                        "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0",
                        "--config.rollout.max_new_tokens=16", "--config.eval.max_new_tokens=16")
    assert result["problems"] == 8 and result["grader"] == "math_verify"
    assert result["trained_on"] == "math_verify" and result["before"]["problems"] == 8
    assert abs(result["reported"] - result["strict_recount"]) <= 0.05
    assert {"lenient_would_report", "format_rate", "cut_rate", "reward_hacking"} <= set(result)


def test_lag_benchmark_pairs_its_variants():
    # Three steps of the tiny config, one seed: the JSON, and the pairing itself. Every
    # variant samples step 0 with the initial weights, lag1 and lag2 sample steps 0-1 with
    # them, lag2 and the uncorrected control steps 0-2: the same prompts and keys must give
    # the same rewards there, and lag 0 (weights of steps 1, 2) must not.
    result = _last_json("lag.py", "--steps=3", "--seeds=0")
    assert {"steps", "seeds", "window", "mean_reward", "mean_reward_all_steps", "median",
            "rewards", "lag1_vs_lag0", "lag2_vs_lag0", "uncorrected_vs_lag0"} <= set(result)
    assert result["steps"] == 3 and result["seeds"] == [0] and result["window"] == [1, 3]
    rewards = {v: runs[0] for v, runs in result["rewards"].items()}
    assert set(rewards) == {"lag0", "lag1", "lag2", "uncorrected"}
    assert all(len(r) == 3 and all(0 <= x <= 1 for x in r) for r in rewards.values())
    assert len({r[0] for r in rewards.values()}) == 1, rewards
    assert rewards["lag1"][:2] == rewards["lag2"][:2], rewards
    assert rewards["lag2"] == rewards["uncorrected"], rewards
    assert rewards["lag0"][1:] != rewards["lag2"][1:], rewards


def test_transport_benchmark_measures_weights_served_where_they_live_against_the_gather():
    result = _last_json("transport.py", "--transports=device_put", "--mib=4", "--repeats=1",
                        "--shards=1,2", "--shard_rows=256")
    shards = result["shards"]
    assert set(shards["receivers"]) == {"1", "2"}
    for row in shards["receivers"].values():
        assert row["shards_vs_gather"] > 0
        for path in ("shards", "gather"):
            assert min(row[path].values()) > 0
    # Three receivers down the relay tree (fanout 2): the trainer served each bucket twice.
    assert shards["uploads_per_version"] == 2
    assert shards["bytes"] * 2 == shards["model_bytes"]  # float32 master, bfloat16 sent
    assert min(shards["trainer_blocked_s_per_push"].values()) > 0
