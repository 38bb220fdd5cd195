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


# ------------------------------------------------------------------ launching a plan

PLANS = ROOT / "launch" / "plans"  # written by the planner (launch/plans/README.md says how)


def plan_variant(tmp_path, name: str, **changes) -> str:
    """A copy of a recorded plan with `changes` ('rollout.accelerator': 'v6e-2', ...)."""
    plan = json.loads((PLANS / name).read_text())
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        plan[section][key] = value
    path = tmp_path / name
    path.write_text(json.dumps(plan))
    return str(path)


def refused(script: str, *args: str) -> str:
    result = subprocess.run(["bash", str(ROOT / "launch" / script), "--dry-run", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr
    return errors[0]


def test_a_7b_plan_for_v5p_and_v6e_builds_both_slices_with_their_images_and_instances():
    plan = json.loads((PLANS / "qwen2.5-7b_v5p-16_v6e-8.json").read_text())
    trainer, rollout = plan["trainer"], plan["rollout"]
    lines = dry_run("tpu_vms.sh", "all", f"--plan={PLANS / 'qwen2.5-7b_v5p-16_v6e-8.json'}",
                    "--name=rl", "--zone=us-east5-b")
    tpu = "gcloud compute tpus tpu-vm"
    # Each slice its own accelerator type and its generation's runtime image.
    assert lines[:2] == [
        f"{tpu} create rl-train --zone=us-east5-b --accelerator-type={trainer['accelerator']} "
        f"--version=v2-alpha-tpuv5",
        f"{tpu} create rl --zone=us-east5-b --accelerator-type={rollout['accelerator']} "
        f"--version=v2-alpha-tpuv6e"]
    assert trainer["accelerator"] == "v5p-16" and rollout["accelerator"].startswith("v6e-")
    per_host = rollout["instances_per_host"]
    assert per_host == rollout["chips_per_host"] // rollout["devices_per_instance"]
    # Every rollout host offers a unit per instance and one per chip block.
    join, = [l for l in lines if l.startswith(f"{tpu} ssh rl ") and "ray start" in l]
    command = next(a for a in shlex.split(join) if a.startswith("--command="))
    offered, = [a for a in shlex.split(command.removeprefix("--command="))
                if a.startswith("--resources=")]
    assert json.loads(offered.removeprefix("--resources=")) == {
        "asyncrl_rollout": per_host, **{f"asyncrl_rollout_{b}": 1 for b in range(per_host)}}
    job, = [l for l in lines if "asyncrl.main" in l]
    assert job.startswith(f"{tpu} ssh rl-train --zone=us-east5-b --worker=0 ")
    assert f"--config={plan['config']} " in job
    assert (f"--config.distributed.trainer_processes={trainer['hosts']} "
            f"--config.distributed.trainer_resource=asyncrl_trainer ") in job
    assert (per_host > 1) == (f"--config.distributed.instances_per_host={per_host} " in job)
    assert (f"--config.mesh.trainer_devices={trainer['chips_per_host']} "
            f"--config.mesh.rollout_instances={rollout['instances']} "
            f"--config.mesh.devices_per_instance={rollout['devices_per_instance']} ") in job
    eta = plan["planned"]["recommended"]["eta"]
    assert f"--config.staleness.eta={eta} --config.checkpoint.keep=1" in job


def test_a_7b_plan_for_two_8xh100_vms_sets_the_memory_fraction_the_plan_needs():
    path = PLANS / "qwen2.5-7b_8xH100_8xH100.json"
    plan = json.loads(path.read_text())
    lines = dry_run("gpu_vms.sh", "all", f"--plan={path}", "--head=10.0.0.2",
                    "--workers=10.0.0.3", "--user=me", "--foreground")
    job, = [l for l in lines if "asyncrl.main" in l]
    fraction = plan["memory_fraction"]
    need = max(plan[s]["hbm_bytes_per_device"] / plan[s]["hbm_capacity_bytes"]
               for s in ("trainer", "rollout"))
    assert need < fraction <= 0.95 and fraction > 0.75  # JAX's default leaves a 7B plan short
    assert f"'cd asyncrl && . .venv/bin/activate && XLA_PYTHON_CLIENT_MEM_FRACTION={fraction} " \
        "RAY_AUTH_MODE=token python -m asyncrl.main" in job
    assert ("--config.mesh.trainer_devices=8 --config.mesh.rollout_instances=8 "
            "--config.mesh.devices_per_instance=1 ") in job
    assert "ray start --address=10.0.0.2:6379 --node-ip-address=10.0.0.3 --num-gpus=8" in \
        "\n".join(lines)
    # The plan names one rollout machine.
    assert refused("gpu_vms.sh", "all", f"--plan={path}", "--head=10.0.0.2",
                   "--workers=10.0.0.3 10.0.0.4") == (
        f"error: --workers: {path} plans 1 rollout machine(s) of 8 GPUs (8xH100), got 2")


def test_a_plan_no_script_can_build_is_one_error_line(tmp_path):
    tpu = "qwen2.5-7b_v5p-16_v6e-8.json"
    where = ("all", "--name=rl", "--zone=z")
    bad = plan_variant(tmp_path, tpu, **{"rollout.accelerator": "v6e-2", "rollout.chips": 2,
                                         "rollout.chips_per_host": 2})
    assert refused("tpu_vms.sh", f"--plan={bad}", *where) == (
        f"error: {bad}: rollout.accelerator: v6e-2 is not a slice or machine one can rent (TPU "
        f"v5e / v6e: 1, 4, 8, 16... chips; v4 / v5p: 4, 8, 16...; GPUs: up to 8, or whole "
        f"machines of 8)")
    odd = plan_variant(tmp_path, tpu, **{"rollout.devices_per_instance": 3})
    assert "rollout.devices_per_instance: 3 chips per instance does not divide" in \
        refused("tpu_vms.sh", f"--plan={odd}", *where)
    assert refused("tpu_vms.sh", f"--plan={PLANS / tpu}", "--type=v4-8", *where) == (
        f"error: --type: set by --plan={PLANS / tpu} (plan again to change them)")
    gpu = PLANS / "qwen2.5-7b_8xH100_8xH100.json"
    assert refused("tpu_vms.sh", f"--plan={gpu}", *where) == (
        f"error: {gpu}: trainer.accelerator: 8xH100 is not a TPU: launch it with "
        f"launch/gpu_vms.sh")
    missing = tmp_path / "nope.json"
    assert refused("tpu_vms.sh", f"--plan={missing}", *where) == (
        f"error: {missing}: cannot read the plan (No such file or directory)")
    (tmp_path / "other.json").write_text('{"fits": true}')
    assert refused("gpu_vms.sh", f"--plan={tmp_path / 'other.json'}", "all", "--head=h",
                   "--workers=w") == (
        f"error: {tmp_path / 'other.json'}: format is None, expected 'asyncrl-plan/1' (write "
        f"it with python -m asyncrl.plan ... --out=)")
    hungry = plan_variant(tmp_path, "qwen2.5-7b_8xH100_8xH100.json",
                          **{"trainer.hbm_bytes_per_device": 79e9})
    assert "the plan needs 99% of each GPU's memory" in refused(
        "gpu_vms.sh", f"--plan={hungry}", "all", "--head=h", "--workers=w")
