"""launch/: every script parses, every dry run prints complete command lines and runs nothing,
and the one-machine script runs the tiny job for real on a loopback-only Ray head."""

import json
import pathlib
import shlex
import subprocess
import sys

from asyncrl.metrics import read_metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "launch").glob("*.sh"))
PROGRAMS = {"cd", "python3", sys.executable, "unshare", "rsync", "ssh", "scp", "sh", "gcloud", "git"}


def dry_run(script: str, *args: str) -> list[str]:
    result = subprocess.run(["bash", str(ROOT / "launch" / script), "--dry-run", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    for line in lines:  # each one a whole command: balanced quotes, a known program first
        assert shlex.split(line)[0] in PROGRAMS, line
    return lines


def dry_run_notes(script: str, *args: str) -> str:
    """What a dry run says on stderr (where the log is, how to follow and stop the job)."""
    result = subprocess.run(["bash", str(ROOT / "launch" / script), "--dry-run", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_every_script_parses():
    assert {p.name for p in SCRIPTS} == {"lib.sh", "one_machine.sh", "gpu_vms.sh", "tpu_vms.sh",
                                         "tpu_slice.sh"}
    for script in SCRIPTS:
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_one_machine_dry_run():
    assert dry_run("one_machine.sh", "--config=experiments/grpo.py:tiny", "--workdir=/tmp/w",
                   "--", "--config.train.steps=4") == [
        f"cd {ROOT}",
        "python3 -m asyncrl.main --config=experiments/grpo.py:tiny --workdir=/tmp/w "
        "--config.distributed.backend=ray --config.distributed.ray_address=local "
        "--config.distributed.ray_num_cpus=0 --config.distributed.ray_object_store_mb=1024 "
        "--config.distributed.transfer_host=127.0.0.1 --config.mesh.rollout_instances=2 "
        "--config.train.steps=4"]
    netns = dry_run("one_machine.sh", "--netns", "--workdir=/tmp/w")[1]
    assert shlex.split(netns)[:5] == ["unshare", "--net", "--", "sh", "-c"]
    assert shlex.split(netns)[5].startswith("ip link set lo up && exec python3 -m asyncrl.main ")


def test_gpu_vms_dry_run_carries_one_token_to_every_node():
    lines = dry_run("gpu_vms.sh", "all", "--head=10.0.0.2", "--workers=10.0.0.3 10.0.0.4",
                    "--gpus=8", "--user=me", "--workdir=runs/gpu")
    token = ROOT / "launch" / ".ray_auth_token"
    assert not token.exists(), "a dry run made the token"
    for node in ("10.0.0.2", "10.0.0.3", "10.0.0.4"):
        assert f"scp {token} me@{node}:.ray/auth_token" in lines
        assert f"ssh me@{node} 'cd asyncrl && . .venv/bin/activate && ray stop'" in lines
        setup = [l for l in lines if l.startswith(f"ssh me@{node} 'cd asyncrl && export PATH=")]
        assert setup and 'pip install -U "jax[cuda12]==0.10.2" "ray==2.60.0"' in setup[0]
    assert ("ssh me@10.0.0.2 'cd asyncrl && . .venv/bin/activate && RAY_AUTH_MODE=token ray start "
            "--head --node-ip-address=10.0.0.2 --port=6379 --num-gpus=0 --disable-usage-stats "
            "--include-dashboard=false'") in lines
    assert ("ssh me@10.0.0.4 'cd asyncrl && . .venv/bin/activate && RAY_AUTH_MODE=token ray start "
            "--address=10.0.0.2:6379 --node-ip-address=10.0.0.4 --num-gpus=8 --disable-usage-stats'") in lines
    job = [l for l in lines if "asyncrl.main" in l]
    assert len(job) == 1 and "--config.distributed.ray_address=auto" in job[0]
    assert "--config.mesh.trainer_devices=8 --config.mesh.rollout_instances=16" in job[0]
    # A worker back from a preemption: the token and Ray on it alone, as `start` does it.
    join = dry_run("gpu_vms.sh", "join", "--head=10.0.0.2", "--workers=10.0.0.4", "--gpus=8",
                   "--user=me")
    assert join == ["ssh me@10.0.0.4 'mkdir -p ~/.ray && chmod 700 ~/.ray'",
                    f"scp {token} me@10.0.0.4:.ray/auth_token",
                    "ssh me@10.0.0.4 'chmod 600 ~/.ray/auth_token'",
                    "ssh me@10.0.0.4 'cd asyncrl && . .venv/bin/activate && RAY_AUTH_MODE=token "
                    "ray start --address=10.0.0.2:6379 --node-ip-address=10.0.0.4 --num-gpus=8 "
                    "--disable-usage-stats'"]
    assert all(line in lines for line in join)


def test_tpu_vms_dry_run_creates_sets_up_starts_runs_and_tears_down():
    lines = dry_run("tpu_vms.sh", "all", "--name=rl", "--zone=us-central2-b", "--type=v4-32",
                    "--hosts=4", "--chips=4", "--project=p")
    tpu = "gcloud compute tpus tpu-vm"
    where = "--zone=us-central2-b --project=p"
    assert lines[0] == f"{tpu} create rl {where} --accelerator-type=v4-32 --version=tpu-ubuntu2204-base"
    assert f"{tpu} scp /tmp/asyncrl.tgz rl:asyncrl.tgz {where} --worker=all" in lines
    assert any(l.startswith(f"{tpu} ssh rl {where} --worker=all '--command=mkdir -p asyncrl && tar")
               and '"jax[tpu]==0.10.2"' in l for l in lines)
    joins = [l for l in lines if "ray start --address=$(python -m asyncrl.distributed.cluster "
             "--tpu-worker-0):6379" in l]
    assert [next(a for a in shlex.split(l) if a.startswith("--worker=")) for l in joins] == \
        ["--worker=1", "--worker=2", "--worker=3"]
    job = [l for l in lines if "asyncrl.main" in l]
    assert len(job) == 1 and "--worker=0" in job[0]
    assert "--config.distributed.instance_resource=asyncrl_rollout" in job[0]
    assert "--config.mesh.rollout_instances=3 --config.mesh.devices_per_instance=4" in job[0]
    # Worker 0's trainer is alone on its host, as each instance is (tests/distributed/test_tpu_hosts.py).
    assert ("isolation=$(python -m asyncrl.distributed.cluster --tpu-isolation=4) && env $isolation "
            "RAY_AUTH_MODE=token python -m asyncrl.main") in job[0]
    assert lines[-1] == f"{tpu} delete rl {where} --quiet"



def test_tpu_vms_dry_run_with_a_slice_per_role_forms_the_trainer_group_on_its_own_slice():
    lines = dry_run("tpu_vms.sh", "all", "--name=rl-rollout", "--type=v4-32", "--hosts=4",
                    "--chips=4", "--trainer-slice=rl-train", "--trainer-type=v4-16",
                    "--trainer-hosts=2", "--zone=z")
    tpu = "gcloud compute tpus tpu-vm"
    assert lines[:2] == [f"{tpu} create rl-train --zone=z --accelerator-type=v4-16 --version=tpu-ubuntu2204-base",
                         f"{tpu} create rl-rollout --zone=z --accelerator-type=v4-32 --version=tpu-ubuntu2204-base"]
    for slice in ("rl-train", "rl-rollout"):  # both set up, given the token, stopped, deleted
        assert f"{tpu} scp /tmp/asyncrl.tgz {slice}:asyncrl.tgz --zone=z --worker=all" in lines
        assert any(l.startswith(f"{tpu} scp ") and f"{slice}:ray_auth_token" in l for l in lines)
        assert f"{tpu} delete {slice} --zone=z --quiet" in lines
    head, = [l for l in lines if "ray start --head" in l]
    assert head.startswith(f"{tpu} ssh rl-train --zone=z --worker=0 ")
    # The trainer slice's other host carries the trainer resource; the rollout slice's hosts,
    # all of them, join the head at the address `describe` gives.
    follower, = [l for l in lines if '"asyncrl_trainer": 1' in l]
    assert follower.startswith(f"{tpu} ssh rl-train --zone=z --worker=1 ")
    describe = f"{tpu} describe rl-train --zone=z '--format=value(networkEndpoints[0].ipAddress)'"
    rollout_join, = [l for l in lines if l.startswith(f"{tpu} ssh rl-rollout") and "ray start" in l]
    assert lines.index(describe) == lines.index(rollout_join) - 1
    assert "--worker=all" in rollout_join and "--address=HEAD_IP:6379" in rollout_join
    job, = [l for l in lines if "asyncrl.main" in l]
    assert job.startswith(f"{tpu} ssh rl-train --zone=z --worker=0 ")
    assert ("--config.distributed.trainer_processes=2 --config.distributed.trainer_resource="
            "asyncrl_trainer --config.mesh.trainer_devices=4 --config.mesh.rollout_instances=4 "
            "--config.mesh.devices_per_instance=4") in job
    assert "--tpu-isolation" not in job  # the trainer slice is one slice: its hosts one group

def test_tpu_slice_dry_runs_run_the_same_command_on_every_worker():
    check, = dry_run("tpu_slice.sh", "check", "--zone=z")
    assert check == ("gcloud compute tpus tpu-vm ssh asyncrl --zone=z --worker=all '--command=cd "
                     "asyncrl && . .venv/bin/activate && python -m asyncrl.distributed.trainer_group "
                     "--steps=3 --coordinator_address=auto '")
    run, = dry_run("tpu_slice.sh", "run", "--zone=z", "--chips=8", "--instances=4")
    assert "--worker=all" in run and "--config.mesh.trainer_devices=4 --config.mesh.rollout_instances=4" in run
    assert "coordinator_address" not in run  # one host: no trainer group
    group, = dry_run("tpu_slice.sh", "run", "--zone=z", "--hosts=4", "--chips=4", "--instances=2")
    assert "--worker=all" in group and "--config.mesh.trainer_devices=2 " in group
    assert "--config.distributed.coordinator_address=auto" in group


def test_the_one_machine_script_runs_the_tiny_job(tmp_path):
    steps = 3
    result = subprocess.run(
        ["bash", str(ROOT / "launch/one_machine.sh"), f"--python={sys.executable}",
         "--config=experiments/grpo.py:tiny", f"--workdir={tmp_path}", "--cpus=2",
         "--object-store-mb=256", "--", f"--config.train.steps={steps}",
         "--config.eval.heldout_size=8"],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train-set accuracy:" in result.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert results["steps"] == steps and rows[-1]["failed_instances"] == 0
    assert all(0 <= lag <= 2 for r in rows for lag in r["staleness"])
    entries = [e for r in rows for e in r["entries"]]
    assert len(entries) == len(set(entries)) == steps * 8
    protocol = results["protocol"]
    accounted = set(entries) | set(protocol["unconsumed"]) | set(protocol["aborted"])
    assert accounted == set(range(protocol["next_entry_id"]))


def test_dry_runs_start_the_job_detached_with_its_log_in_the_workdir_and_wait_for_it():
    gpu = ("gpu_vms.sh", "all", "--head=10.0.0.2", "--workers=10.0.0.3", "--user=me",
           "--workdir=runs/gpu")
    lines = dry_run(*gpu)
    job, = [l for l in lines if "asyncrl.main" in l]
    remote = shlex.split(job)[2]
    assert "setsid nohup bash -c " in remote and "> runs/gpu/job.log 2>&1 < /dev/null &" in remote
    assert "echo $! > runs/gpu/job.pid" in remote and "> runs/gpu/job.rc" in remote
    follow = lines[lines.index(job) + 1]  # `all` follows the log before it stops Ray
    assert "tail -n +1 --pid=$(cat runs/gpu/job.pid) -f runs/gpu/job.log" in follow
    assert lines[lines.index(job) + 2] == "ssh me@10.0.0.2 'cd asyncrl && . .venv/bin/activate && ray stop'"
    notes = dry_run_notes(*gpu)
    assert "log ~/asyncrl/runs/gpu/job.log" in notes and "kill -TERM -- -" in notes
    assert dry_run("gpu_vms.sh", "wait", *gpu[2:]) == [follow]
    fg, = [l for l in dry_run("gpu_vms.sh", "run", "--foreground", *gpu[2:]) if "asyncrl.main" in l]
    assert "setsid" not in fg and "RAY_AUTH_MODE=token python -m asyncrl.main" in fg
    # emulated hosts: the job in the foreground, its output the script's (tests/distributed)
    netns = dry_run("gpu_vms.sh", "run", "--via=netns", "--head=10.213.77.1", "--workers=10.213.77.2")
    assert len(netns) == 1 and "setsid" not in netns[0]
    # TPU VMs: on worker 0
    tpu = dry_run("tpu_vms.sh", "all", "--name=rl", "--zone=z", "--type=v4-32", "--hosts=4",
                  "--workdir=runs/tpu")
    job, = [l for l in tpu if "asyncrl.main" in l]
    assert "--worker=0" in job and "setsid nohup" in job and "> runs/tpu/job.log 2>&1" in job
    assert "-f runs/tpu/job.log" in tpu[tpu.index(job) + 1]
    # A bucket URL is refused before anything runs (asyncrl would refuse it too, after setup)
    for script, where in (("tpu_vms.sh", ["all", "--name=rl", "--zone=z", "--hosts=4"]),
                          ("tpu_slice.sh", ["run", "--zone=z"]),
                          ("gpu_vms.sh", ["all", "--head=h", "--workers=w"])):
        refused = subprocess.run(["bash", str(ROOT / "launch" / script), "--dry-run", *where,
                                  "--workdir=gs://b/run"], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and refused.stdout == "", (script, refused.stdout)
        assert refused.stderr.startswith("error: --workdir=gs://b/run is a URL"), refused.stderr
    # one slice, every worker: one log per host
    run = dry_run("tpu_slice.sh", "run", "--zone=z", "--workdir=runs/t", "--wait")
    assert len(run) == 2 and "> runs/t/job-$(hostname).log 2>&1" in shlex.split(run[0])[-1]
    assert "--worker=all" in run[1] and "-f runs/t/job-$(hostname).log" in run[1]


def test_setup_provides_python_3_11_and_names_the_version_when_it_cannot():
    gpu = dry_run("gpu_vms.sh", "setup", "--head=h", "--workers=w")
    tpu = dry_run("tpu_vms.sh", "setup", "--zone=z", "--hosts=2")
    installs = [l for l in gpu + tpu if "pip install -r requirements.txt" in l]
    assert len(installs) == 3
    for line in installs:
        assert "python3 -m venv" not in line
        assert "uv python install 3.11 && rm -rf .venv && uv venv --seed --python 3.11 .venv" in line
        assert "error: setup needs Python >= 3.11" in line
        assert line.index("uv venv") < line.index(". .venv/bin/activate")


def fake_tools(tmp_path, fail_on: str):
    """A PATH whose ssh, scp, rsync, gcloud and git log their arguments and succeed, except
    a command line containing `fail_on`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "calls"
    for tool in ("ssh", "scp", "rsync", "gcloud", "git"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho \"{tool} $*\" >> {log}\n"
                                    f"case \"$*\" in *\"{fail_on}\"*) exit 1 ;; esac\n")
        (bin_dir / tool).chmod(0o755)
    import os
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def test_all_tears_down_when_a_phase_fails(tmp_path):
    """Not a dry run: the tools are fakes that log their arguments; the job's start fails."""
    env, log = fake_tools(tmp_path, "asyncrl.main")
    result = subprocess.run(
        ["bash", str(ROOT / "launch/tpu_vms.sh"), "all", "--name=rl", "--zone=z", "--type=v4-8",
         "--hosts=2", f"--token-file={tmp_path / 'token'}"],
        env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "error: a phase failed (exit status 1): tearing down: stop Ray and delete the slices (rl)" in result.stderr
    calls = log.read_text().splitlines()
    failed = next(i for i, c in enumerate(calls) if "asyncrl.main" in c)
    assert [c for c in calls[failed + 1:]] == [
        "gcloud compute tpus tpu-vm ssh rl --zone=z --worker=all --command=cd asyncrl && . .venv/bin/activate && ray stop",
        "gcloud compute tpus tpu-vm delete rl --zone=z --quiet"]
    # a phase after setup fails on GPU VMs: Ray stopped on every node
    env, log = fake_tools(tmp_path / "gpu", "ray start --head")
    result = subprocess.run(
        ["bash", str(ROOT / "launch/gpu_vms.sh"), "all", "--head=h", "--workers=w", "--user=me",
         f"--token-file={tmp_path / 'token'}"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "tearing down: stop Ray on every node" in result.stderr
    assert log.read_text().splitlines()[-2:] == [
        "ssh me@h cd asyncrl && . .venv/bin/activate && ray stop",
        "ssh me@w cd asyncrl && . .venv/bin/activate && ray stop"]
