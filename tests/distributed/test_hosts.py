"""Many hosts for real: two hosts emulated in network namespaces (launch/emulated_hosts.py), a
Ray cluster on them started, used and stopped by launch/gpu_vms.sh (--via=netns), the job's
driver and the Ray head on host 0, a Ray worker on host 1; runs of the tiny job across them.

One cluster per module (its start costs ~10-25 s). Needs root and iproute2 (CI runs as root):
without them the tests fail, naming what is missing; they are never skipped.
"""

import importlib.util
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from asyncrl.metrics import read_metrics
from tests.distributed.test_group_watch import (assert_process_0_named_the_stopped_follower,
                                                group_process_argv,
                                                stop_the_follower_once_the_group_works)
from tests.test_system import assert_every_entry_accounted_once

# One worker runs the whole module (pyproject's --dist=loadgroup): split across two, each
# would start its own cluster.
pytestmark = pytest.mark.xdist_group("emulated_hosts")

ROOT = pathlib.Path(__file__).resolve().parents[2]
if "emulated_hosts" not in sys.modules:  # launch/ is scripts, not a package
    _spec = importlib.util.spec_from_file_location("emulated_hosts", ROOT / "launch" / "emulated_hosts.py")
    sys.modules["emulated_hosts"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["emulated_hosts"])
emulated_hosts = sys.modules["emulated_hosts"]

TINY = ("--config=experiments/grpo.py:tiny", "--")
# The fewest steps that show each behaviour; no evaluation (it costs a compile per run).
SMALL = ("--config.eval.heldout_size=0", "--config.distributed.start_timeout_s=240")


def gpu_vms(hosts, phase: str, *args: str, background: bool = False, timeout: float = 600):
    """launch/gpu_vms.sh PHASE on the emulated hosts: host 0 the head, host 1 the worker,
    one CPU device per host standing for its GPU."""
    command = ["bash", str(ROOT / "launch" / "gpu_vms.sh"), phase, "--via=netns", "--platform=cpu",
               f"--head={hosts.host('h0').address}", f"--workers={hosts.host('h1').address}",
               "--gpus=1", *args]
    env = {**os.environ, "ASYNCRL_HOSTS_ROOT": hosts.root}
    if background:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def hosts_up(n: int, needed_by: str):
    """`n` emulated hosts owned by this process; without root or iproute2 the test fails
    naming what is missing (never skipped)."""
    try:
        emulated_hosts.require_root_and_ip()
    except RuntimeError as error:
        pytest.fail(f"{needed_by} needs root and iproute2: {error}")
    return emulated_hosts.EmulatedHosts.up(n, owner_pid=os.getpid())


@pytest.fixture(scope="module")
def hosts():
    # The suite's compilation cache (tests/conftest.py) for every process on the hosts, whose
    # environment is made fresh: one filesystem, so they share its programs. Machine
    # configuration, as a VM image's /etc/environment would set it; no behaviour under test
    # depends on it.
    cluster = hosts_up(2, "tests/distributed/test_hosts.py")
    try:
        cluster.env.update({k: v for k, v in os.environ.items()
                            if k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))})
        # The stuck-engine test's hook (tests/distributed/stall_hook): inert until its marker
        # file appears. The driver passes PYTHONPATH on to the instance actors.
        cluster.env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(ROOT / "tests" / "distributed" / "stall_hook"),
                        os.environ.get("PYTHONPATH", "")] if p)
        cluster.env["ASYNCRL_TEST_STALL_MARKER"] = os.path.join(cluster.root, "stall-decode")
        cluster.save()
        started = gpu_vms(cluster, "start")
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]
        yield cluster
    finally:
        try:
            gpu_vms(cluster, "stop", timeout=120)
        finally:
            cluster.down()


class BackgroundJob:
    """`gpu_vms.sh run ARGS` in the background, its output read line by line as it comes;
    killed on leaving the `with` block if it still runs."""

    def __init__(self, hosts, *args: str):
        self.process = gpu_vms(hosts, "run", *args, background=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(
            target=lambda: self.lines.extend(iter(self.process.stdout.readline, "")), daemon=True)
        self._reader.start()

    def __enter__(self) -> "BackgroundJob":
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def wait_for(self, what: str, seen, timeout_s: float = 400) -> None:
        """Until `seen()` while the job runs; fails naming `what` and the output's tail."""
        deadline = time.monotonic() + timeout_s
        while not seen() and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert seen(), f"no {what}: " + "".join(self.lines)[-4000:]

    def finish(self, timeout_s: float) -> str:
        """Waits for the job to end; its whole output."""
        self.process.wait(timeout=timeout_s)
        self._reader.join(30)
        return "".join(self.lines)


def steps_logged(metrics: pathlib.Path) -> int:
    return len(read_metrics(metrics)) if metrics.exists() else 0


def job_output(done) -> str:
    return (done.stdout or "") + (done.stderr or "")


def results_of(hosts, workdir: str) -> tuple[dict, list[dict]]:
    """results.json and the metrics rows a run wrote in host 0's (host-local) workdir."""
    local = pathlib.Path(hosts.path("h0", workdir))
    return json.loads((local / "results.json").read_text()), read_metrics(local / "metrics.jsonl")


def instances_started(output: str) -> list[tuple[str, str, str]]:
    """(instance, node, jax_transfer server or '') for each instance actor the run started."""
    return re.findall(r"rollout instance (\d+): Ray actor pid \d+ on ([\d.]+)"
                      r"(?:, its jax_transfer server at (\S+))?", output)


# ---------------------------------------------------------------------------- the harness


def test_hosts_reach_each_other_and_nothing_else_and_keep_their_homes_apart(hosts):
    h0, h1 = hosts.host("h0"), hosts.host("h1")
    listen = ("import socket; s = socket.socket(); s.bind(('%s', 7001)); s.listen(); "
              "c, a = s.accept(); print(a[0], c.recv(5).decode())" % h0.address)
    server = hosts.popen("h0", ["python3", "-c", listen], stdout=subprocess.PIPE, text=True)
    try:
        connect = ("import socket, time\nfor _ in range(100):\n    try:\n"
                   "        socket.create_connection(('%s', 7001), 2).send(b'hello'); break\n"
                   "    except OSError: time.sleep(0.05)\n" % h0.address)
        hosts.run("h1", ["python3", "-c", connect], check=True, timeout=30)
        out, _ = server.communicate(timeout=30)
    finally:
        server.kill()
    assert out.split() == [h1.address, "hello"]
    # No route leaves the subnet: the machine's own addresses are unreachable from a host.
    outside = hosts.shell("h1", "ip route; ip -o addr show", capture_output=True, text=True,
                          check=True).stdout
    assert "default" not in outside and "eth0" in outside
    probe = hosts.run("h1", ["python3", "-c", "import socket; socket.create_connection(('192.0.2.2', 22), 2)"],
                      capture_output=True, text=True, timeout=30)
    assert "Network is unreachable" in probe.stderr
    # The machine's name resolves to each host's own address, as on cloud VMs.
    for host in (h0, h1):
        resolved = hosts.run(host.name, ["python3", "-c", "import socket; "
                                         "print(socket.gethostbyname(socket.gethostname()))"],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert resolved == host.address
    # One HOME path, host-local contents; TMPDIR (Ray's temp dir) differs by path.
    hosts.shell("h1", "echo one > ~/only-on-h1", check=True)
    seen = hosts.shell("h0", "cat ~/only-on-h1 2>&1; echo $TMPDIR", capture_output=True,
                       text=True).stdout
    assert "No such file" in seen and h0.tmp in seen
    assert pathlib.Path(hosts.path("h1", f"{hosts.home}/only-on-h1")).read_text() == "one\n"
    # Each host runs its own Ray node (gpu_vms.sh start), with token authentication on.
    for host in (h0, h1):
        assert any(hosts_pid_runs(hosts, host.name, "raylet")), f"no raylet on {host.name}"
        token = pathlib.Path(hosts.path(host.name, f"{hosts.home}/.ray/auth_token"))
        assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) == 64


def hosts_pid_runs(hosts, name: str, word: str) -> list[int]:
    """Processes of a host whose command line contains `word`."""
    found = []
    for pid in emulated_hosts._pids(hosts.host(name).namespace):
        try:
            if word in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(pid)
        except OSError:
            continue
    return found


def test_down_removes_every_namespace_link_and_process_even_after_a_failure(tmp_path):
    # A cluster of its own (not the module's), torn down by the context manager as a test's
    # failure unwinds.
    with pytest.raises(RuntimeError, match="the test failed"):
        with emulated_hosts.EmulatedHosts.up(1, owner_pid=os.getpid()) as extra:
            sleeper = extra.popen("h0", ["sh", "-c", "sleep 600 & sleep 600"])
            names = (extra.bridge, extra.host("h0").namespace, extra.root)
            assert os.path.exists(f"/etc/netns/{names[1]}/hosts")  # its name resolution
            deadline = time.monotonic() + 30
            while len(pids := emulated_hosts._pids(names[1])) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError("the test failed")
    sleeper.wait(timeout=30)
    bridge, namespace, root = names
    assert len(pids) >= 2 and all(gone(pid) for pid in pids), pids
    assert namespace not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                           text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f" {bridge}:" not in links and f" {bridge[:-2]}v0@" not in links
    assert not os.path.exists(root) and not os.path.exists(f"/etc/netns/{namespace}")


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie its parent has yet to reap."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# ---------------------------------------------------------------------------- runs across hosts


def test_the_launch_script_runs_the_tiny_job_with_its_instance_on_the_other_host(hosts):
    workdir = f"{hosts.home}/object-store"  # host 0's own disk
    done = gpu_vms(hosts, "run", f"--workdir={workdir}", *TINY, "--config.train.steps=2", *SMALL)
    output = job_output(done)
    assert done.returncode == 0, output[-4000:]
    started = instances_started(output)
    assert started and all(node == hosts.host("h1").address for _, node, _ in started), output[-3000:]
    results, rows = results_of(hosts, workdir)
    assert results["steps"] == 2 and [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["failed_instances"] == 0
    assert_every_entry_accounted_once(rows, results["protocol"])


@pytest.fixture(scope="module")
def interrupted(hosts):
    """A run with weights by jax_transfer, its driver sent SIGTERM after its first step, then
    the same command again: (the first run's output, the second's, the workdir, steps)."""
    workdir, steps = f"{hosts.home}/sigterm", 10
    args = (f"--workdir={workdir}", *TINY, f"--config.train.steps={steps}", *SMALL,
            "--config.distributed.transport=jax_transfer")
    metrics = pathlib.Path(hosts.path("h0", workdir)) / "metrics.jsonl"
    with BackgroundJob(hosts, *args) as first:
        first.wait_for("step 1", lambda: steps_logged(metrics) >= 1)
        driver = [pid for pid in hosts_pid_runs(hosts, "h0", "asyncrl.main")
                  if pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3]
                  == [b"-m", b"asyncrl.main"]]
        assert len(driver) == 1, f"driver processes on host 0: {driver}"
        os.kill(driver[0], signal.SIGTERM)  # what a preempted VM's driver gets
        first_output = first.finish(timeout_s=300)
    assert first.process.returncode == 0, first_output[-4000:]
    stopped_at = len(read_metrics(metrics))
    second = gpu_vms(hosts, "run", *args)
    return first_output, stopped_at, second, workdir, steps


def test_weights_cross_hosts_by_jax_transfer_each_side_on_its_own_address(hosts, interrupted):
    first, _, second, workdir, steps = interrupted
    # Before the fix the actor bound the driver's address: "Cannot assign requested address".
    assert second.returncode == 0, job_output(second)[-4000:]
    h1 = hosts.host("h1").address
    for output in (first, job_output(second)):
        assert "Cannot assign requested address" not in output
        started = instances_started(output)
        assert started and all(node == h1 and server.startswith(f"{h1}:")
                               for _, node, server in started), output[-3000:]
    results, rows = results_of(hosts, workdir)
    # Every version trained reached the instance (its only weights): lags within η = 2.
    assert results["steps"] == steps and rows[-1]["failed_instances"] == 0
    assert max(lag for r in rows for lag in r["staleness"]) <= 2


def test_sigterm_to_the_driver_checkpoints_and_the_same_command_resumes(hosts, interrupted):
    first, stopped_at, second, workdir, steps = interrupted
    assert "finishing the step in flight, then checkpointing" in first
    assert 1 <= stopped_at < steps, "the run finished before it could be interrupted"
    assert second.returncode == 0, job_output(second)[-4000:]
    assert "resumed from" in job_output(second)
    results, rows = results_of(hosts, workdir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert_every_entry_accounted_once(rows, results["protocol"])


def test_a_host_killed_mid_run_is_waited_for_and_its_instance_rejoins_when_it_returns(hosts):
    # kill -9 of every process of host 1 (its raylet, its instance actor) after step 2: the
    # instance's work goes back to the coordinator, a fresh actor waits for a node that can
    # hold it, and `gpu_vms.sh join` brings host 1 back: the run finishes on it.
    workdir, steps = f"{hosts.home}/host-loss", 6
    metrics = pathlib.Path(hosts.path("h0", workdir)) / "metrics.jsonl"
    with BackgroundJob(hosts, f"--workdir={workdir}", *TINY, f"--config.train.steps={steps}",
                       *SMALL, "--config.distributed.max_instance_restarts=1") as run:
        run.wait_for("step 2", lambda: steps_logged(metrics) >= 2)
        killed = hosts.kill("h1")
        run.wait_for("restart", lambda: any("starting a fresh actor in place" in l for l in run.lines))
        joined = gpu_vms(hosts, "join")
        assert joined.returncode == 0, job_output(joined)[-3000:]
        output = run.finish(timeout_s=400)
    assert run.process.returncode == 0, output[-4000:]
    assert len(killed) >= 2  # the raylet and the instance's worker at least
    started = instances_started(output)
    assert len(started) == 2 and {node for _, node, _ in started} == {hosts.host("h1").address}
    assert "rollout instance 0 rejoined: a fresh actor" in output
    results, rows = results_of(hosts, workdir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    last = rows[-1]
    assert last["failed_instances"] == 1 and last["rejoined_instances"] == 1
    assert last["instance0_restarts"] == 1 and last["instance0_finished"] > 0
    # What it held when its host died went back to the coordinator (the run is rollout-bound
    # here: the instance always holds work; two runs: 32 of 32 slots each time).
    assert last["rerouted_after_failure"] >= 1
    assert max(lag for r in rows for lag in r["staleness"]) <= 2
    assert_every_entry_accounted_once(rows, results["protocol"])


def test_an_engine_stuck_on_the_other_host_is_failed_by_the_watchdog_and_replaced(hosts):
    # After step 2 the instance's engine on host 1 enters a decode step that never returns
    # (tests/distributed/stall_hook), while its actor goes on answering polls: the driver's
    # watchdog fails it after rollout.stall_timeout_s, naming why, its work goes back to the
    # coordinator, a fresh actor takes its place on host 1, and the run finishes.
    workdir, steps = f"{hosts.home}/stuck-engine", 6
    metrics = pathlib.Path(hosts.path("h0", workdir)) / "metrics.jsonl"
    marker = pathlib.Path(hosts.env["ASYNCRL_TEST_STALL_MARKER"])
    try:
        with BackgroundJob(hosts, f"--workdir={workdir}", *TINY, f"--config.train.steps={steps}",
                           *SMALL, "--config.distributed.max_instance_restarts=1",
                           "--config.rollout.stall_timeout_s=10") as run:
            run.wait_for("step 2", lambda: steps_logged(metrics) >= 2)
            marker.touch()
            run.wait_for("the watchdog's verdict", lambda: any("made no progress" in line
                                                               for line in run.lines))
            output = run.finish(timeout_s=400)
        assert not marker.exists()  # a decode step took it: the engine did get stuck
    finally:
        marker.unlink(missing_ok=True)  # never left to stall a later test's engine
    assert run.process.returncode == 0, output[-4000:]
    verdict = next(line for line in output.splitlines() if "made no progress" in line)
    stalled = re.search(r"made no progress for (\d+) s: its engine is stuck in one prefill or "
                        r"decode step", verdict)
    assert stalled and int(stalled[1]) >= 10, verdict
    started = instances_started(output)
    assert len(started) == 2 and {node for _, node, _ in started} == {hosts.host("h1").address}
    results, rows = results_of(hosts, workdir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    last = rows[-1]
    assert last["failed_instances"] == 1 and last["rejoined_instances"] == 1
    assert last["rerouted_after_failure"] >= 1
    assert max(lag for r in rows for lag in r["staleness"]) <= 2
    assert_every_entry_accounted_once(rows, results["protocol"])


def test_a_trainer_group_over_two_hosts_with_host_local_workdirs_is_refused_naming_the_need(hosts):
    workdir = f"{hosts.home}/group"  # the same path on both hosts, different disks
    done = gpu_vms(hosts, "run", f"--workdir={workdir}", *TINY, "--config.train.steps=2", *SMALL,
                   "--config.distributed.trainer_processes=2", timeout=300)
    output = job_output(done)
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1, output[-4000:]
    assert f"the workdir {workdir} is not shared" in errors[0]
    assert f"on {hosts.host('h1').address}" in errors[0]  # the follower, on the other host
    assert "same shared storage" in errors[0]
    assert "Traceback" not in output
    assert not list(pathlib.Path(hosts.path("h0", workdir)).glob(".trainer-group-*"))


def test_a_follower_stopped_on_the_other_host_ends_process_0_with_the_named_error(hosts):
    # A two-process trainer group, process 0 and the jax.distributed coordinator on host 0,
    # the follower on host 1 (each in its own namespace, on its own address): the follower is
    # SIGSTOPped once the group works, and process 0 must end naming it, not wait forever.
    free = hosts.run("h0", [sys.executable, "-c", "import socket; s = socket.socket(); "
                            "s.bind(('', 0)); print(s.getsockname()[1])"],
                     capture_output=True, text=True, check=True)
    address = f"{hosts.host('h0').address}:{free.stdout.strip()}"
    env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    lead, follower = (hosts.popen(name, group_process_argv(address, i), env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                      for i, name in enumerate(("h0", "h1")))
    output, took = stop_the_follower_once_the_group_works(lead, follower)
    assert_process_0_named_the_stopped_follower(lead, output, took)
