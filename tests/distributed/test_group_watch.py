"""The trainer group's watchdog (asyncrl/distributed/group_watch.py): on a fake clock, a
follower whose heartbeat stops is failed after the deadline, naming itself, the setting and
what process 0 waits in; a pause of the watch itself judges no one; TrainerGroup names each
collective. Then for real: two processes joined by jax.distributed on 127.0.0.1, the follower
SIGSTOPped while process 0 waits for it in a collective: process 0 exits (status 75) with the
named error instead of waiting forever."""

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import types

import numpy as np

from asyncrl.distributed import group_watch
from asyncrl.distributed.group_watch import EXIT_STATUS, Watch

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def watch_of(beats: dict, clock: Clock, deadline_s: float = 10.0):
    failures = []
    watch = Watch([1, 2], 3, deadline_s, lambda: dict(beats), clock=clock, fail=failures.append)
    return watch, failures


def test_a_follower_whose_heartbeat_stops_fails_after_the_deadline_naming_what_waits():
    clock, beats = Clock(), {1: "0", 2: "0"}
    watch, failures = watch_of(beats, clock)
    for _ in range(30):  # both beat: 30 s of looks, nobody fails
        clock.t += 1
        beats[1], beats[2] = str(int(beats[1]) + 1), str(int(beats[2]) + 1)
        assert watch.poll() is None
    with watch.doing("the train step 7"):
        for _ in range(10):  # process 2 stops; 10 s is the deadline, not past it
            clock.t += 1
            beats[1] = str(int(beats[1]) + 1)
            assert watch.poll() is None
        clock.t += 0.5
        message = watch.poll()
    assert failures == [message]
    assert message.startswith("trainer group: process 2 of 3 sent no heartbeat for 10.5 s "
                              "(distributed.heartbeat_timeout_s = 10): it is stopped (SIGSTOP)")
    assert "process 0 waits for it in the train step 7, a collective that cannot time out" in message
    assert f"exits now (status {EXIT_STATUS}) without a checkpoint" in message
    clock.t += 100
    assert watch.poll() is None and failures == [message]  # once


def test_between_collectives_the_error_names_the_last_one_and_a_follower_that_never_beat():
    clock, beats = Clock(), {1: "0"}
    watch, failures = watch_of(beats, clock)
    with watch.doing("the weight gather after the train step 3"):
        pass
    for _ in range(11):
        clock.t += 1
        beats[1] = str(int(beats[1]) + 1)
        watch.poll()
    assert len(failures) == 1
    assert "process 2 of 3 sent not one heartbeat for 11.0 s" in failures[0]
    assert ("the last operation of the group process 0 began: the weight gather after the train "
            "step 3; the next would wait for it") in failures[0]


def test_a_pause_of_the_watch_itself_judges_no_one():
    clock, beats = Clock(), {1: "5", 2: "5"}
    watch, failures = watch_of(beats, clock)
    clock.t += 60  # process 0 (or its host) stalled: its watch saw nothing for 60 s
    assert watch.poll() is None
    for _ in range(10):
        clock.t += 1
        assert watch.poll() is None  # the 10 s count from the pause's end
    clock.t += 1
    assert watch.poll() is not None and "sent no heartbeat for 11.0 s" in failures[0]


def test_the_trainer_group_names_each_collective_to_the_watch(monkeypatch):
    from asyncrl.distributed import trainer_ops
    from asyncrl.distributed.trainer_group import synthetic_batch
    from asyncrl.model import ModelConfig

    watch, _ = watch_of({}, Clock())
    seen = []
    monkeypatch.setattr(group_watch, "_running", [watch])
    monkeypatch.setattr(trainer_ops, "announce", lambda op, header, mesh: seen.append(watch._doing))
    monkeypatch.setattr(trainer_ops, "share", lambda tree, mesh: tree)
    monkeypatch.setattr(trainer_ops, "gather_to_lead", lambda tree, mesh: tree)
    trainer = types.SimpleNamespace(mesh=None, put_batch=lambda b: b,
                                    step=lambda state, batch: (state, {}),
                                    policy_params=lambda params: params)
    group = trainer_ops.TrainerGroup(trainer, types.SimpleNamespace(close=lambda: None))
    group.processes = 2
    state = types.SimpleNamespace(params={"w": np.zeros(2)})
    group.host_params(state, 0)
    batch = group.next_batch(lambda: synthetic_batch(6, ModelConfig.tiny()))  # trains step 7
    group.step(state, batch)
    group.host_params(state, 0)
    assert group.next_batch(lambda: None) is None
    group.stop()
    assert seen == ["the weight gather before the first train step",
                    "the next batch before the first train step", "the train step 7",
                    "the weight gather after the train step 7",
                    "the next batch after the train step 7", "the stop after the train step 7"]
    assert watch._doing is None and group_watch._running == []  # stop ends the watch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# 5 s against a beat every 0.5 s (a thread's key-value write); a test takes ~15 s.
DEADLINE_S = 5


def group_process_argv(address: str, process_id: int) -> list[str]:
    return [sys.executable, "-m", "tests.distributed.group_watch_process", address,
            str(process_id), str(DEADLINE_S)]


def stop_the_follower_once_the_group_works(lead, follower) -> tuple[str, float]:
    """SIGSTOPs the follower after process 0's third gather; process 0's output, and how long
    it took to end after the stop. Both processes are killed on the way out."""
    try:
        lines = []
        while not any(line.startswith("gathered 2") for line in lines):  # the group works
            line = lead.stdout.readline()
            assert line, "process 0 ended before its third gather:\n" + "".join(lines)[-3000:]
            lines.append(line)
        os.kill(follower.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        output = lead.communicate(timeout=120)[0]  # a hang fails here
        return output, time.monotonic() - stopped
    finally:
        for p in (lead, follower):
            p.kill()
            p.wait()


def assert_process_0_named_the_stopped_follower(lead, output: str, took: float) -> None:
    assert lead.returncode == EXIT_STATUS, output[-3000:]
    error = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(error) == 1, output[-3000:]
    silent = re.match(r"error: trainer group: process 1 of 2 sent no heartbeat for (\d+\.\d) s "
                      rf"\(distributed.heartbeat_timeout_s = {DEADLINE_S}\)", error[0])
    assert silent and float(silent[1]) >= DEADLINE_S, error[0]  # rounded to 0.1 s
    assert "process 0 waits for it in the weight gather before the first train step" in error[0]
    # Silent since its last beat, which came up to a beat's interval before the SIGSTOP.
    assert took < 60, f"noticed after {took:.1f} s"


def test_a_stopped_follower_ends_process_0_with_the_named_error_not_a_hang():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    lead, follower = (subprocess.Popen(group_process_argv(str(port), i), cwd=ROOT, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                      for i in range(2))
    output, took = stop_the_follower_once_the_group_works(lead, follower)
    assert_process_0_named_the_stopped_follower(lead, output, took)
