"""The simulator against the real system on this machine.

benchmarks/e2e.py measures StaleFlow and synchronous RL on the tiny model with long-tailed
responses (frozen policy, so both see the same lengths). The simulator, given the costs the
synchronous run measured (asyncrl.sim.calibrate) and the run's length histogram, must
predict StaleFlow's speed-up over synchronous RL within 25%: the scheduling it simulates is
the scheduling that happens.
"""

import importlib.util
import json
import pathlib

import pytest

from asyncrl.sim import calibrate
from asyncrl.sim.run import simulate

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 30
ATTEMPTS = 3


def _e2e():
    spec = importlib.util.spec_from_file_location("e2e_benchmark", ROOT / "benchmarks" / "e2e.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ratios(e2e, tmp_path):
    config = {name: e2e.configure(name, "longtail", STEPS, frozen=True)
              for name in ("staleflow", "sync")}
    measured = {name: e2e.measure(c, tmp_path / name)["tokens_per_s"] for name, c in config.items()}
    calibration = calibrate.from_barrier_run(tmp_path / "sync", config["sync"].rollout.num_slots)
    simulated = {name: simulate(calibrate.simulator_config(c, calibration, tmp_path / "sim", STEPS))
                 .throughput_tok_s for name, c in config.items()}
    return (simulated["staleflow"] / simulated["sync"], measured["staleflow"] / measured["sync"],
            f"simulated {simulated}, measured {measured}")


@pytest.mark.owns_host
def test_simulated_speedup_over_sync_is_within_25_percent_of_the_measured_one(tmp_path):
    # The two schedules are measured one after the other on a shared host: a neighbour that
    # loads only one of them moves the measured ratio, so a miss is measured again, up to
    # three times. How large the real speed-up is depends on the host (1.88 on a quiet one,
    # 0.95-1.00 on a slower one where the simulator, calibrated there, predicted 1.16-1.18):
    # the test asks that the prediction follows it, and a simulator that predicts a fixed
    # speed-up misses on one host or the other. Whether StaleFlow is faster is the
    # benchmark's to measure (benchmarks/e2e.py), not a test's.
    e2e, misses = _e2e(), []
    for attempt in range(ATTEMPTS):
        sim_ratio, real_ratio, figures = _ratios(e2e, tmp_path / f"attempt{attempt}")
        if abs(sim_ratio / real_ratio - 1.0) <= 0.25:
            # The simulator models no shared cores, so it predicts an overlap gain on any host;
            # a prediction of none would mean its scheduling lost StaleFlow's advantage.
            assert sim_ratio > 1.0, figures
            return
        misses.append(f"simulated staleflow/sync {sim_ratio:.2f} vs measured {real_ratio:.2f}: "
                      f"{figures}")
    pytest.fail("; ".join(misses))


def _write_rows(run_dir: pathlib.Path, staleness: list[int]) -> None:
    run_dir.mkdir()
    row = {"staleness": staleness, "response_lengths": [3, 5, 5, 8], "prompt_length": 6.0,
           "decode_step_s_mean": 0.002, "prefill_s_per_token": 1e-4, "push_s_mean": 0.001,
           "trainer_step_s_mean": 0.1}
    (run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")


def test_calibration_reads_a_barrier_run_and_refuses_an_overlapping_one(tmp_path):
    _write_rows(tmp_path / "sync", [0, 0])
    calibration = calibrate.from_barrier_run(tmp_path / "sync", num_slots=4)
    assert calibration.profile["step_latency"]["c"] == 0.002
    assert calibration.profile["trainer"]["step_overhead_s"] == 0.1
    assert calibration.lengths == {"cap": 8, "bins": [[3, 4, 1], [5, 6, 2], [8, 8, 1]]}
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
