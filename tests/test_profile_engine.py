"""The engine profiler end to end: measure a tiny grid, fit, write a loadable latency model."""

import importlib.util
import json
import pathlib

import pytest
from absl import flags
from absl.testing import flagsaver

from asyncrl.coordinator.latency import LatencyModel

# A script beside the benchmarks, loaded from its file (benchmarks/ is not a package).
_SPEC = importlib.util.spec_from_file_location(
    "profile_engine", pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "profile_engine.py")
profile_engine = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(profile_engine)

RUNNING, LENGTHS = (2, 32), (16, 128)  # kv_tokens 32 .. 4096


@pytest.fixture
def parsed_flags():
    """main() reads absl flags; pytest never parses them, so mark them parsed (defaults) and
    let flagsaver set and restore the ones each test needs."""
    was_parsed = flags.FLAGS.is_parsed()
    if not was_parsed:
        flags.FLAGS.mark_as_parsed()
    yield
    if not was_parsed:
        flags.FLAGS.unparse_flags()


def test_main_writes_a_fitted_model_that_loads(tmp_path, parsed_flags):
    out = tmp_path / "profiles" / "cpu_tiny.json"
    with flagsaver.flagsaver(model="tiny", num_slots=max(RUNNING), max_len=max(LENGTHS),
                             running=[str(r) for r in RUNNING],
                             lengths=[str(s) for s in LENGTHS], prompt_lengths=["4", "16"],
                             steps=6, out=str(out)):
        profile_engine.main(["profile_engine"])

    model = LatencyModel.load(out)
    for running in RUNNING:
        times = [model.step_time(running, running * s) for s in (0, *LENGTHS, 4 * max(LENGTHS))]
        assert all(t > 0 for t in times)
        # A longer cache never predicts a faster step (b ≥ 0); on a noisy shared CPU the tiny
        # engine's cache cost may drown in noise, so it need not be strictly slower.
        assert all(later >= earlier for earlier, later in zip(times, times[1:])), times
    assert model.prefill_time(16) > 0
    # `source` records what was measured, so a profile is never mistaken for a datasheet.
    for fact in ("tiny", "cpu", "num_slots r in [2, 32]", "max_len S in [16, 128]",
                 "leave-one-out"):
        assert fact in model.source
    raw = json.loads(out.read_text())
    assert {"model", "hardware"} <= set(raw)


def test_bad_requests_say_what_was_received():
    with pytest.raises(ValueError, match="exactly one of --model"):
        profile_engine.load_model("tiny", "embedded", seed=0)
    with pytest.raises(ValueError, match="fewer than 4 points"):
        profile_engine.profile("tiny", None, num_slots=2, max_len=32, running=["2"],
                               lengths=["16", "32"], log=lambda _: None)
    with pytest.raises(ValueError, match="max_len=4 leaves"):
        profile_engine.profile("tiny", None, num_slots=2, max_len=8, running=["1", "2"],
                               lengths=["4", "8"], prompt_lengths=["2"], log=lambda _: None)
