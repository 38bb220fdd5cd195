"""The simulator against the real system on this machine.

benchmarks/e2e.py runs synchronous RL on the tiny model with long-tailed responses (frozen
policy). The simulator, given the costs that run measured over its second half
(asyncrl.sim.calibrate) and its length histogram, must reproduce that half's throughput:
the scheduling it simulates is the scheduling that happens, at the costs that were paid.
Whether StaleFlow is faster than synchronous RL on a given host is benchmarks/e2e.py's to
measure: on 2 shared cores the real overlap gain depends on what else the host runs, which
the simulator does not model (docs/results.md, "The simulator against the real system").
"""

import importlib.util
import json
import pathlib

import pytest

from asyncrl.metrics import read_metrics
from asyncrl.sim import calibrate
from asyncrl.sim.run import simulate

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 30


def _e2e():
    spec = importlib.util.spec_from_file_location("e2e_benchmark", ROOT / "benchmarks" / "e2e.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A calibration that counts the first steps' compiles predicted a tenth of the throughput,
# one that charges every member of a group its own prompt prefill half; what is left, 21-29%
# under the measured on four runs (2026-12-05), is the simulator taking more decode steps
# per training step than the engine (docs/results.md): a known gap, not yet explained.
TOLERANCE = 0.4


@pytest.mark.owns_host
def test_the_simulator_reproduces_the_run_it_was_calibrated_on(tmp_path):
    # The costs and the throughput share the run's window and whatever load the host had,
    # so a try on a busy host is as good as one on a quiet host: no retries.
    e2e = _e2e()
    sync = e2e.configure("sync", "longtail", STEPS, frozen=True)
    e2e.measure(sync, tmp_path / "sync")
    measured = calibrate.window_tokens_per_s(read_metrics(tmp_path / "sync" / "metrics.jsonl"))
    calibration = calibrate.from_barrier_run(tmp_path / "sync", sync.rollout.num_slots)
    simulated = {name: simulate(calibrate.simulator_config(
        e2e.configure(name, "longtail", STEPS, frozen=True), calibration, tmp_path / "sim", STEPS))
        .throughput_tok_s for name in ("sync", "staleflow")}
    figures = f"simulated {simulated}, measured sync {measured:.0f} tok/s"
    assert abs(simulated["sync"] / measured - 1.0) <= TOLERANCE, figures
    # On these costs, with no cores shared, overlapping rollout and training must pay
    # (1.23-1.60× on the runs above): a StaleFlow no faster than the barrier would mean its
    # scheduling lost its advantage.
    assert simulated["staleflow"] > simulated["sync"], figures


def _write_rows(run_dir: pathlib.Path, staleness: list[int]) -> None:
    """Four steps; the first compiles (its decode steps, prefill and train step are slow), the
    last finishes the run (its train step holds the final push)."""
    run_dir.mkdir()
    rows = []
    for step, (decode_s, steps, prefill_s, tokens, train_s) in enumerate(
            [(1.0, 10, 0.5, 10, 5.0), (1.02, 20, 0.5002, 20, 5.1), (1.04, 30, 0.5004, 30, 5.2),
             (1.06, 40, 0.5006, 40, 6.0)], 1):
        rows.append({"step": step, "staleness": staleness, "response_lengths": [3, 5, 5, 8],
                     "prompt_length": 6.0, "decode_step_s_mean": decode_s / steps,
                     "decode_steps": steps, "prefill_s_per_token": prefill_s / tokens,
                     "prefill_tokens": tokens, "push_s_mean": 0.001,
                     "trainer_step_s_mean": train_s / step, "rollout_tokens": 21,
                     "wall_s": 10.0 * step})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_calibration_reads_a_barrier_run_and_refuses_an_overlapping_one(tmp_path):
    _write_rows(tmp_path / "sync", [0, 0])
    calibration = calibrate.from_barrier_run(tmp_path / "sync", num_slots=4)
    # The second half's own means (steps 2-3), not the first step's compiles or the last's end.
    assert calibration.profile["step_latency"]["c"] == pytest.approx(0.002)
    assert calibration.profile["prefill_s_per_token"] == pytest.approx(2e-5)
    assert calibration.profile["trainer"]["step_overhead_s"] == pytest.approx(0.1)
    assert calibrate.window_tokens_per_s(read_metrics(tmp_path / "sync" / "metrics.jsonl")) == 2.1
    assert calibration.lengths == {"cap": 8, "bins": [[3, 4, 4], [5, 6, 8], [8, 8, 4]]}
    assert calibration.prompt_length == 6.0

    _write_rows(tmp_path / "async", [0, 2])
    with pytest.raises(ValueError, match="not a synchronous run"):
        calibrate.from_barrier_run(tmp_path / "async", num_slots=4)
    with pytest.raises(FileNotFoundError, match="no metrics"):
        calibrate.from_barrier_run(tmp_path / "missing", num_slots=4)


def test_every_admission_maps_and_dynamic_sampling_is_refused(tmp_path):
    from experiments import staleflow as staleflow_experiment
    from experiments.baselines import barrier, sync, token_bucket

    from asyncrl.sim.run import simulate

    _write_rows(tmp_path / "sync", [0])
    calibration = calibrate.from_barrier_run(tmp_path / "sync", num_slots=4)
    sim = calibrate.simulator_config(sync.get_config("tiny"), calibration, tmp_path / "sim", 5)
    assert (sim.coordinator.admission, sim.eta, sim.measure_steps, sim.reprefill_on_resume) == (
        "barrier", 0, 4, False)
    sim = calibrate.simulator_config(token_bucket.get_config("tiny"), calibration, tmp_path / "sim", 5)
    assert (sim.coordinator.admission, sim.coordinator.migration) == ("token_bucket", "none")
    slime_like = calibrate.simulator_config(barrier.get_config("tiny"), calibration,
                                            tmp_path / "sim", 5)
    assert slime_like.coordinator.admission_params.barrier.over_sampling == 1.5
    staleflow = staleflow_experiment.get_config("tiny")
    staleflow.coordinator.redundancy = "batch"
    sim = calibrate.simulator_config(staleflow, calibration, tmp_path / "sim", 5)
    assert (sim.coordinator.admission, sim.coordinator.redundancy, sim.coordinator.routing) == (
        "staleflow", "batch", "throughput_optimal")
    assert sim.coordinator.latency_model == staleflow.coordinator.latency_model
    staleflow.coordinator.partial_rollout = False  # a pull waits for running work, as live
    sim = calibrate.simulator_config(staleflow, calibration, tmp_path / "sim", 5)
    assert sim.coordinator.partial_rollout is False
    assert simulate(sim).throughput_tok_s > 0
    staleflow.coordinator.dynamic_sampling = True
    with pytest.raises(ValueError, match="dynamic_sampling=True"):
        calibrate.simulator_config(staleflow, calibration, tmp_path / "sim", 5)
