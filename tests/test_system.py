"""End to end: the real engine, trainer, servers, coordinator and reward pool on the tiny config.

Each run post-trains a random tiny model on this CPU with 2 rollout instances and a trainer on
disjoint devices; runs take ~30-60 s, most of it compiling.
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from asyncrl.run import run
from asyncrl.run.learning_signal import NoLearningSignal
from asyncrl.config import ConfigError, resolve, validate, with_overrides
from asyncrl.metrics import read_metrics
from asyncrl.rewards.registry import exact_answer
from asyncrl.train.checkpoint import CheckpointError
from experiments.grpo import get_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASYNC_STEPS = 100


def tiny(**changes):
    """The tiny config with fields changed: tiny(train__steps=4) sets train.steps."""
    return with_overrides(get_config("tiny"), {k.replace("__", "."): v for k, v in changes.items()})


def consumed_entries(rows):
    return [e for r in rows for e in r["entries"]]


def assert_every_entry_accounted_once(rows, protocol):
    """Consumed once, still buffered, or aborted: no entry repeated, none lost."""
    entries = consumed_entries(rows)
    assert len(entries) == len(set(entries)), "an entry was consumed twice"
    accounted = set(entries) | set(protocol["unconsumed"]) | set(protocol["aborted"])
    assert accounted == set(range(protocol["next_entry_id"])), "an entry was lost"


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    # Long-tailed work for 2 instances: migration and mid-trajectory weight swaps must happen.
    workdir = tmp_path_factory.mktemp("eta2")
    # The tiny config's 100 steps: the strict grader asks for the digit and a stop, which the
    # partial-credit reward teaches by step 60-100 (mean reward rose 0.34-0.58 on seeds 0-2).
    return run_async(workdir)


def run_async(workdir):
    # `max`: the protocol at η = 2 in full. On a CPU `auto` holds one buffer (lag 1), which
    # would leave the bound's top untested.
    results = run(tiny(train__steps=ASYNC_STEPS, staleness__lead="max"), workdir)
    return results, read_metrics(workdir / "metrics.jsonl"), workdir


def test_every_consumed_entry_respects_the_bound(async_run):
    _, rows, _ = async_run
    lags = [lag for r in rows for lag in r["staleness"]]
    assert lags and all(0 <= lag <= 2 for lag in lags)
    assert max(lags) == 2  # the run really was asynchronous
    entries = consumed_entries(rows)
    assert len(entries) == len(set(entries)) == ASYNC_STEPS * 8


def test_partial_rollouts_and_migrations_happen(async_run):
    _, rows, _ = async_run
    assert sum(r["partial_rollouts"] for r in rows) > 0
    assert rows[-1]["migrated"] > 0


def reward_rise(rows):
    rewards = [r["reward_mean"] for r in rows]
    return np.mean(rewards[-8:]) - np.mean(rewards[:8])


def test_reward_rises_and_accuracy_improves(async_run, tmp_path):
    results, rows, _ = async_run
    if reward_rise(rows) <= 0.1 or results["after"]["accuracy"] <= results["before"]["accuracy"]:
        # How the instances and the trainer interleave depends on the host's load, and with it
        # the staleness each step learns from (one loaded CI run of the earlier 40-step config
        # rose by 0.09). A run that does not learn misses twice; a loaded one is run once more.
        results, rows, _ = run_async(tmp_path)
    assert reward_rise(rows) > 0.1, [r["reward_mean"] for r in rows]
    assert results["after"]["accuracy"] > results["before"]["accuracy"]


def test_accuracy_is_graded_strictly_and_every_final_response_is_kept(async_run):
    results, rows, workdir = async_run
    # Trained on answer_first's partial credit, graded by exact_answer: "3333" is no answer.
    for label in ("before", "after"):
        figures = results[label]
        assert figures["grader"] == "exact_answer"
        kept = [json.loads(line) for line in
                (workdir / "responses" / f"{label}.jsonl").read_text().splitlines()]
        assert len(kept) == figures["num_problems"] == 10
        assert np.mean([k["correct"] for k in kept]) == pytest.approx(figures["accuracy"])
        assert np.mean([k["cut"] for k in kept]) == pytest.approx(figures["cut_rate"])
        assert np.mean([k["formatted"] for k in kept]) == pytest.approx(figures["format_rate"])
        # Each kept record carries its own grade: regraded from the kept text alone, it agrees
        # (the grader's rules, "00" and "0=0" state 0, are tests/rewards/'s to check).
        for k in kept:
            assert k["correct"] == (exact_answer(k["response"], k["answer"]) == 1.0), k
    assert all(0.0 <= r["format_rate"] <= 1.0 and 0.0 <= r["cut_rate"] <= 1.0 for r in rows)
    # A full reward always came with a stated answer, so that sign never shows. The other (the
    # reward rising while the format rate falls) can: answer_first pays partial credit, and
    # which batches this run trains on depends on its timing (a loaded host made it so at
    # step 65). Whatever the run did, the metrics and results.json must tell it alike.
    assert all(r["rewarded_unformatted"] == 0.0 for r in rows)
    flagged = [r["reward_hacking_suspected"] for r in rows]
    turned_on = [r["step"] for i, r in enumerate(rows) if flagged[i] and not (i and flagged[i - 1])]
    events = results.get("reward_hacking", [])
    assert [e["step"] for e in events] == turned_on
    assert all(e["why"].startswith("the batch reward rose by") for e in events)


def test_a_reward_paying_unstated_answers_is_flagged_as_possible_reward_hacking(tmp_path, caplog):
    # A user's plugin reward that pays for the answer anywhere in the response, as
    # math-verify's extraction did: the run says so in its metrics, results and console.
    c = tiny(train__steps=12, eval__heldout_size=8, task__reward="test_answer_anywhere",
             rewards__plugins=("tests.rewards._gameable",), eval__format_reward="integer_format")
    with caplog.at_level("WARNING", logger="asyncrl.run"):
        results = run(c, tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    flagged = [r["step"] for r in rows if r["reward_hacking_suspected"]]
    assert flagged, [(r["reward_mean"], r["format_rate"], r["rewarded_unformatted"]) for r in rows]
    assert results["reward_hacking"][0]["step"] == flagged[0]
    assert "rewarded without an answer in the asked-for format" in results["reward_hacking"][0]["why"]
    assert f"step {flagged[0]}: possible reward hacking" in caplog.text


def no_signal_config(**changes):
    # The case: a grader reading boxed answers under a prompt that asks for none.
    return tiny(task__reward="test_boxed_only", rewards__plugins=("tests.rewards._unanswerable",),
                eval__format_reward="format", eval__heldout_size=4, **changes)


def test_a_run_whose_first_batches_carry_no_signal_says_so_and_why(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="asyncrl.run"):
        results = run(no_signal_config(train__steps=4), tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["no_signal_groups"], r["groups"], r["format_rate"]) for r in rows] == [(8, 8, 0.0)] * 4
    why = results["no_learning_signal"]["why"]
    assert results["no_learning_signal"]["step"] == 3
    assert why.startswith("steps 1-3: every one of 24 groups scored all its 16 responses alike "
                          "(reward 0), so no batch carries a learning signal: no response put "
                          "its answer where task.reward = 'test_boxed_only' reads it (format "
                          "rate 0)"), why
    assert caplog.text.count("so no batch carries a learning signal") == 1
    assert results["steps"] == 4  # a warning: the run goes on


def test_stop_without_signal_ends_the_run_with_the_reason(tmp_path):
    with pytest.raises(NoLearningSignal, match=r"format rate 0.*train.stop_without_signal is True"):
        run(no_signal_config(train__steps=6, train__stop_without_signal=True), tmp_path)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_dynamic_sampling_dropping_every_group_is_named_not_waited_on(tmp_path):
    # Dynamic sampling drops each group without signal before a batch sees it: no batch
    # would ever form, and the run would wait out train.batch_timeout_s in silence.
    c = no_signal_config(train__steps=4, train__stop_without_signal=True,
                         coordinator__dynamic_sampling=True)
    with pytest.raises(NoLearningSignal, match=r"coordinator.dynamic_sampling dropped \d+ groups "
                                               r"whose 16 responses all scored alike before batch 1"):
        run(c, tmp_path)


def test_eta_zero_reproduces_the_synchronous_barrier_baseline(tmp_path):
    runs = {}
    for schedule in ("staleflow", "barrier"):
        c = tiny(staleness__eta=0, train__steps=4, coordinator__admission=schedule,
                 eval__heldout_size=8)
        run(c, tmp_path / schedule)
        runs[schedule] = read_metrics(tmp_path / schedule / "metrics.jsonl")
    digests = {s: [r["batch_digest"] for r in rows] for s, rows in runs.items()}
    assert digests["staleflow"] == digests["barrier"]  # the same tokens, step by step
    for a, b in zip(runs["staleflow"], runs["barrier"]):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6)


def _fail_instance_1_at_dispatch(count: int):
    def break_instance_1(built):
        engine = built.instances[1].engine
        real_generate, calls = engine.generate, []

        def generate(*args, **kwargs):
            calls.append(1)
            if len(calls) == count:
                raise RuntimeError("injected device fault")
            return real_generate(*args, **kwargs)

        engine.generate = generate

    return break_instance_1


def test_without_partial_rollout_every_trajectory_comes_from_one_version(tmp_path):
    # 12-token responses from the untrained model: with partial rollout on, this run swaps
    # weights under running trajectories (22-40 per step from step 3, measured). An instance
    # fails mid-run (its trajectories re-routed) and the run resumes from a checkpoint holding
    # trajectories in flight: neither may continue a trajectory on other weights.
    settings = dict(coordinator__partial_rollout=False, rollout__max_new_tokens=12,
                    checkpoint__every_steps=1, eval__heldout_size=8)

    def slow_then_fail_instance_1(built):
        # Decoding slower than training (0.3 s a dispatch, ~4 s a batch): the rollouts never
        # catch up, so whatever the machine's load the last checkpoint holds work in flight.
        # Without it a quick machine finished every allowed trajectory before the run's end.
        for instance in built.instances:
            real_generate = instance.engine.generate

            def generate(*args, real_generate=real_generate, **kwargs):
                time.sleep(0.3)
                return real_generate(*args, **kwargs)

            instance.engine.generate = generate
        _fail_instance_1_at_dispatch(15)(built)

    run(tiny(train__steps=3, **settings), tmp_path, on_built=slow_then_fail_instance_1)
    meta = json.loads((tmp_path / "checkpoints" / "3" / "meta" / "metadata").read_text())
    in_flight = [t for t in meta["trajectories"]["trajectories"]
                 if t["state"] in ("pending", "routed", "running", "interrupted")]
    assert in_flight, "the checkpoint held no trajectory in flight: the resume tests nothing"
    results = run(tiny(train__steps=6, **settings), tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert results["steps"] == 6 and [r["step"] for r in rows] == list(range(1, 7))
    assert rows[2]["failed_instances"] == 1 and rows[2]["rerouted_after_failure"] > 0
    assert [r["partial_rollouts"] for r in rows] == [0] * 6
    assert max(lag for r in rows for lag in r["staleness"]) > 0  # still asynchronous


def test_a_paged_cache_too_small_for_every_slot_preempts_and_keeps_the_bound(tmp_path):
    # 48 pages of 4 for 32 slots of 28 positions (7 pages each): the instances admit by
    # pages, hand sequences back when they outgrow the pool, and the coordinator resumes them.
    steps = 6
    run(tiny(train__steps=steps, rollout__page_size=4, rollout__num_pages=48,
             rollout__decode_steps_per_dispatch=2, rollout__max_new_tokens=12,
             eval__heldout_size=8), tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == steps
    assert all(0 <= lag <= 2 for r in rows for lag in r["staleness"])
    entries = consumed_entries(rows)
    assert len(entries) == len(set(entries)) == steps * 8
    assert rows[-1]["kv_preemptions"] > 0, "the pool never ran short: the test tests nothing"


def test_a_failing_instance_has_its_work_rerouted(tmp_path, caplog):
    results = run(tiny(train__steps=6, eval__heldout_size=8), tmp_path,
                  on_built=_fail_instance_1_at_dispatch(15))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert results["steps"] == 6
    assert rows[-1]["failed_instances"] == 1
    assert "rollout instance 1 failed" in caplog.text and "injected device fault" in caplog.text


def test_a_full_disk_stops_the_run_with_its_sizes_and_a_rerun_resumes(tmp_path, monkeypatch):
    # The disk fills between the checkpoints of steps 1 and 2 (a run at η = 4 once lost its
    # last checkpoint and results that way, to a traceback from Orbax's writer thread).
    c = tiny(train__steps=3, checkpoint__every_steps=1, eval__heldout_size=8)
    real_usage, calls = shutil.disk_usage, []

    def filling(path):
        calls.append(path)
        usage = real_usage(path)
        return usage if len(calls) == 1 else usage._replace(free=1 << 20)

    monkeypatch.setattr(shutil, "disk_usage", filling)
    with pytest.raises(CheckpointError, match=r"checkpoint of step 2: needs about .* which has "
                                              r"1.0 MiB free.*resumes from step 1"):
        run(c, tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]
    monkeypatch.undo()
    results = run(c, tmp_path)  # room again: the same call carries on from step 1
    assert results["steps"] == 3
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_interrupt_then_rerun_loses_and_repeats_nothing(tmp_path):
    command = [sys.executable, "-m", "asyncrl.main", "--config=experiments/grpo.py:tiny",
               "--config.train.steps=16", "--config.eval.heldout_size=8", f"--workdir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and first.poll() is None:
        if metrics.exists() and len(read_metrics(metrics)) >= 5:
            break
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output[-3000:]
    stopped_at = len(read_metrics(metrics))
    assert stopped_at < 16, "the run finished before it could be interrupted"
    assert (f"its checkpoint is {tmp_path}/checkpoints/{stopped_at}: rerun the same command "
            f"to resume") in output, output[-3000:]

    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr
    rows = read_metrics(metrics)
    assert [r["step"] for r in rows] == list(range(1, 17))
    walls = [r["wall_s"] for r in rows]
    assert walls == sorted(walls), "the resumed run's clock restarted instead of going on"
    assert json.loads((tmp_path / "results.json").read_text())["wall_s"] > walls[stopped_at - 1]
    assert_every_entry_accounted_once(
        rows, json.loads((tmp_path / "results.json").read_text())["protocol"])


def test_a_stop_before_the_first_step_says_no_checkpoint_was_written(tmp_path, caplog):
    stop = threading.Event()
    stop.set()  # Ctrl-C while the run was still building
    results = run(tiny(train__steps=4), tmp_path, stop=stop)
    assert "after" not in results
    assert not [p for p in (tmp_path / "checkpoints").glob("*") if p.name.isdigit()]
    assert ("stopped on request at step 0 of 4; no checkpoint was written (none before the "
            "first step): a rerun starts from the beginning") in caplog.text


def test_colocated_on_one_device_keeps_the_bound_and_the_accounting(tmp_path):
    # The trainer and both instances on one device (what one GPU runs): the protocol cannot
    # tell, so the bound and the accounting hold as in the disjoint runs above.
    command = [sys.executable, "-m", "asyncrl.main", "--config=experiments/grpo.py:tiny",
               "--config.mesh.colocate=True", "--config.train.steps=4",
               "--config.eval.heldout_size=8", f"--workdir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # On a CPU the trainer and the instances share the cores: `auto` (the default) holds
    # one buffer, and the run says so.
    assert "share this host's CPU cores, so new rollouts start one batch ahead" in done.stderr
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    lags = [lag for r in rows for lag in r["staleness"]]
    assert lags and all(0 <= lag <= 2 for lag in lags)  # the tiny config's η
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["placement"] == "colocated: trainer [0], instance0 [0], instance1 [0]"
    assert results["steps"] == 4
    assert len(consumed_entries(rows)) == 4 * 8
    assert_every_entry_accounted_once(rows, results["protocol"])


@pytest.mark.parametrize("changes, message", [
    ({"staleness__eta": -1}, r"config.staleness.eta = -1 is not allowed: expected an int ≥ 0"),
    ({"mesh__rollout_instances": 9}, r"needs 10 devices, this host has 8"),
    ({"train__num_microbatches": 3}, r"config.train.num_microbatches = 3 is not allowed: the batch of 8 entries × 16"),
    ({"coordinator__routing": "fastest"}, r"config.coordinator.routing = 'fastest' is not allowed: registered: least_loaded, round_robin, throughput_optimal, version_first"),
    ({"train__remat": "some"}, r"config.train.remat = 'some' is not allowed: registered: dots, full, none"),
    ({"model__checkpoint": "/nowhere/model"}, r"config.model.checkpoint = '/nowhere/model'"),
    ({"train__warmup_steps": 150}, r"config.train.warmup_steps = 150 is not allowed: at most train.steps \(100\)"),
    ({"train__warmup_steps": 100, "train__lr_schedule": "cosine"}, r"config.train.warmup_steps = 100 is not allowed: below train.steps \(100\) with train.lr_schedule = 'cosine'"),
    ({"task__reward": "math_verify"}, r"config.task.instruction = '' is not allowed: task.reward = 'math_verify' reads the final answer only from \\boxed\{\}"),
    ({"eval__format_reward": "format"}, r"config.eval.format_reward = 'format' is not allowed: 'auto' or 'integer_format'"),
    ({"task__dataset": "gsm8k"}, r"config.task.train_path = '' is not allowed: the path of a local gsm8k file"),
    ({"task__chat_template": "vicuna"}, r"config.task.chat_template = 'vicuna' is not allowed: one of 'auto'"),
    ({"task__system_prompt": "Be brief."}, r"config.task.system_prompt = 'Be brief.' is not allowed: a system prompt needs a chat template"),
    ({"eval__samples": 2, "eval__pass_k": (1, 4)}, r"config.eval.pass_k = \(1, 4\) is not allowed: each k an int in \[1, eval.samples = 2\]"),
    ({"distributed__max_instance_restarts": -1}, r"config.distributed.max_instance_restarts = -1 is not allowed: expected an int ≥ 0"),
    ({"train__eps_low": 1.0}, r"config.train.eps_low = 1.0 is not allowed: expected a number in \[0, 1\)"),
    ({"train__eps_high": -0.1}, r"config.train.eps_high = -0.1 is not allowed: expected a number ≥ 0"),
    ({"train__tis_cap": -1.0}, r"config.train.tis_cap = -1.0 is not allowed: expected a number ≥ 0 \(0 turns the cap off\)"),
    ({"rollout__page_size": 3}, r"config.rollout.page_size = 3 is not allowed: 0 \(contiguous\) or a divisor of rollout.prompt_bucket \+ rollout.max_new_tokens = 20"),
    ({"rollout__page_size": 4, "rollout__num_pages": 2}, r"config.rollout.num_pages = 2 is not allowed: at least one sequence of 20 positions: 5 pages of 4"),
    ({"rollout__preemption": "oldest"}, r"config.rollout.preemption = 'oldest' is not allowed: one of \('newest', 'longest'\)"),
])
def test_bad_config_values_fail_up_front_naming_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(tiny(**changes), device_count=8)


def test_the_clip_settings_reach_the_loss():
    assert resolve(tiny()).train_config().loss.eps == (0.2, 0.28)  # 0: the policy loss's own
    loss = resolve(tiny(train__eps_high=0.4, train__tis_cap=0.0)).train_config().loss
    assert loss.eps == (0.2, 0.4) and loss.tis_cap is None
    with pytest.raises(ConfigError, match=r"config.train: unknown policy loss 'ppo'; registered: "
                       r"dapo, decoupled_ppo, grpo, gspo, uncorrected"):
        resolve(tiny(train__policy_loss="ppo")).train_config()
    with pytest.raises(ConfigError, match=r"config.train: policy loss 'grpo' clips symmetrically"):
        resolve(tiny(train__policy_loss="grpo", train__eps_high=0.3)).train_config()


def test_a_misnamed_loss_fails_before_the_run_loads_data_or_model(tmp_path, monkeypatch):
    def loading(*args, **kwargs):
        raise AssertionError("loaded before the config was checked")

    monkeypatch.setattr("asyncrl.run.build_task_data", loading)
    monkeypatch.setattr("asyncrl.run.load_policy", loading)
    with pytest.raises(ConfigError, match=r"config.train: unknown policy loss 'ppo'"):
        run(tiny(train__policy_loss="ppo"), tmp_path)


def test_too_few_devices_names_mesh_and_how_to_run_colocated():
    with pytest.raises(ConfigError, match=r"config.mesh = '1 \+ 2 × 1' is not allowed: needs 3 "
                       r"devices, this host has 1 \(.*--config.mesh.colocate=True runs the "
                       r"trainer and all 2 instances on the first mesh.trainer_devices \(1\)"):
        validate(tiny(), device_count=1)
    validate(tiny(mesh__colocate=True), device_count=1)


@pytest.mark.parametrize("changes, message", [
    ({"mesh__devices_per_instance": 2}, r"config.mesh.devices_per_instance = 2 is not allowed: "
     r"colocated, each instance runs on devices of the trainer's mesh: at most "
     r"mesh.trainer_devices \(1\)"),
    ({"mesh__trainer_devices": 16}, r"config.mesh = 'colocated on 16 trainer devices' is not "
     r"allowed: needs 16 devices, this host has 8"),
    ({"distributed__backend": "ray"}, r"config.mesh.colocate = True is not allowed: False with "
     r"distributed.backend='ray': each instance actor owns its devices"),
])
def test_bad_colocated_mesh_fails_up_front_naming_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(tiny(mesh__colocate=True, **changes), device_count=8)


def test_a_moved_field_names_its_new_place():
    with pytest.raises(ConfigError, match="config.schedule has moved: set config.coordinator.admission"):
        tiny(schedule="barrier")


def test_late_binding_and_psrl_routing_keep_every_entry_within_eta(tmp_path):
    # PSRL's tools in the live system: V_traj bound late, each response routed on its own,
    # version-first routing with the KV-fit check (the engine reports slots × cache length),
    # KV-aware sync. The core checks the bound at every consume; so does this test.
    latency = ROOT / "asyncrl" / "profiles" / "cpu_tiny.json"
    steps = 8
    run(tiny(train__steps=steps, coordinator__binding="late", coordinator__dispatch="per_response",
             coordinator__routing="version_first", coordinator__latency_model=str(latency),
             coordinator__sync="kv_aware"), tmp_path)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    lags = [lag for r in rows for lag in r["staleness"]]
    assert lags and all(0 <= lag <= 2 for lag in lags)
    entries = consumed_entries(rows)
    assert len(entries) == len(set(entries)) == steps * 8
