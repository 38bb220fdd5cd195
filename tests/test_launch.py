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
        setup = [l for l in lines if l.startswith(f"ssh me@{node} 'cd asyncrl && python3 -m venv")]
        assert setup and 'pip install -U "jax[cuda12]==0.10.2" "ray==2.60.0"' in setup[0]
    assert ("ssh me@10.0.0.2 'cd asyncrl && . .venv/bin/activate && RAY_AUTH_MODE=token ray start "
            "--head --node-ip-address=10.0.0.2 --port=6379 --num-gpus=0 --disable-usage-stats "
            "--include-dashboard=false'") in lines
    assert ("ssh me@10.0.0.4 'cd asyncrl && . .venv/bin/activate && RAY_AUTH_MODE=token ray start "
            "--address=10.0.0.2:6379 --node-ip-address=10.0.0.4 --num-gpus=8 --disable-usage-stats'") in lines
    job = [l for l in lines if "asyncrl.main" in l]
    assert len(job) == 1 and "--config.distributed.ray_address=auto" in job[0]
    assert "--config.mesh.trainer_devices=8 --config.mesh.rollout_instances=16" in job[0]


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
