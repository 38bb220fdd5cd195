"""Checkpoints: an interrupted run equals an uninterrupted one; bad checkpoints are refused;
the trained policy exports to a folder that transformers loads with the same logits."""

import json
import shutil

import jax
import numpy as np
import pytest

from asyncrl.model import ModelConfig, apply
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import StalenessManager
from asyncrl.train.checkpoint import (
    Checkpointer, CheckpointError, ResumeData, export_policy, restore_or_init,
)
from asyncrl.train.trainer import Trainer
from tests.train.helpers import CONFIG, MODEL, G, ToySource, make_batch, train_steps

K, M = 2, 2  # steps before and after the interruption


@pytest.fixture(scope="module")
def runs(trainer, tmp_path_factory):
    """The same K+M steps twice: straight through, and stopped after K then resumed."""
    root = tmp_path_factory.mktemp("runs")
    seen = {"straight": [], "first": [], "resumed": []}
    # As in main: every host <-> device copy of the loop, saves and restores must be explicit.
    with jax.transfer_guard("disallow"):
        return _runs(trainer, root, seen)


def _runs(trainer, root, seen):
    straight = train_steps(trainer, ToySource(), root / "straight", K + M, 100, seen["straight"])
    source = ToySource()
    train_steps(trainer, source, root / "split", K, K, seen["first"])
    saved = source.resume_data()  # what the source held when checkpoint K was taken
    resumed_source = ToySource()
    resumed = train_steps(trainer, resumed_source, root / "split", K + M, K, seen["resumed"])
    return dict(root=root, straight=straight, resumed=resumed, seen=seen, saved=saved,
                resumed_source=resumed_source)


def test_resumed_run_equals_uninterrupted_run(runs):
    assert runs["seen"] == {"straight": [1, 2, 3, 4], "first": [1, 2], "resumed": [3, 4]}
    straight, resumed = (jax.device_get(runs[k]) for k in ("straight", "resumed"))
    assert int(straight.step) == int(resumed.step) == K + M
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_staleness_and_trajectories_survive_entry_for_entry(trainer, runs):
    ckpt = Checkpointer(runs["root"] / "split" / "checkpoints", trainer)
    _, restored = ckpt.restore(K)
    ckpt.close()
    saved = runs["saved"]
    assert saved.coordinator["entries"] and saved.trajectories["meta"], "nothing to compare"
    assert restored.coordinator == saved.coordinator
    rebuilt = StalenessManager.from_state_dict(restored.coordinator)
    assert rebuilt.state_dict()["entries"] == saved.coordinator["entries"]
    assert rebuilt.version == K and rebuilt.in_flight() == StalenessManager.from_state_dict(saved.coordinator).in_flight()
    assert restored.trajectories == saved.trajectories and restored.data_state == saved.data_state
    assert restored.trajectory_arrays.keys() == saved.trajectory_arrays.keys()
    for name, array in saved.trajectory_arrays.items():
        np.testing.assert_array_equal(restored.trajectory_arrays[name], array)
        assert restored.trajectory_arrays[name].dtype == array.dtype


def test_keeps_the_last_n(trainer, tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", trainer, keep=2)
    state = trainer.init_state()
    for step in (1, 2, 3):
        ckpt.save(state.replace(step=jax.device_put(np.int32(step), state.step.sharding)), ResumeData())
    ckpt.close()
    assert sorted(int(p.name) for p in (tmp_path / "ck").iterdir()) == [2, 3]


def test_workdir_checkpoint_takes_precedence(trainer, runs):
    ckpt, state, resume, source = restore_or_init(trainer, runs["root"] / "split", resume_from=runs["root"] / "nope")
    ckpt.close()
    assert int(state.step) == K + M and str(K + M) in source and resume is not None


def test_mismatched_model_is_refused_naming_the_array(runs):
    other = Trainer.create(CONFIG, ModelConfig.tiny(hidden_dim=32), runs["straight"].params["embed"].get_value().sharding.mesh, G)
    path = runs["root"] / "straight" / "checkpoints"
    with pytest.raises(CheckpointError) as err:
        restore_or_init(other, runs["root"] / "fresh", resume_from=path)
    message = str(err.value)
    assert str(path / str(K + M)) in message
    assert "params.blocks.attn.q: expected (2, 32, 4, 16), checkpoint has (2, 64, 4, 16)" in message


@pytest.fixture
def damaged(runs, tmp_path):
    """A fresh copy of a good checkpoint, for each test to break its own way."""
    shutil.copytree(runs["root"] / "straight" / "checkpoints", tmp_path / "ck")
    return tmp_path / "ck", tmp_path / "ck" / str(K + M)


def _flip_fingerprint(step_dir):
    meta_file = step_dir / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["fingerprints"]["params.blocks.mlp.up"] ^= 1  # as if one bit of that array changed
    meta_file.write_text(json.dumps(meta))


def _garble(step_dir):
    for chunk in (step_dir / "state" / "d").iterdir():
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2] ^= 0xFF
        chunk.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, fault",
    [
        (lambda d: shutil.rmtree(d / "meta"), "missing item 'meta'"),
        (lambda d: shutil.rmtree(d / "trajectories"), "missing item 'trajectories'"),
        (lambda d: (d / "meta" / "metadata").write_text("{truncated"), "unreadable metadata"),
        (_garble, "unreadable"),  # the b-tree holds metadata too: either message
        (_flip_fingerprint, "params.blocks.mlp.up does not match its saved fingerprint"),
    ],
    ids=["no-meta", "no-trajectories", "bad-json", "garbled-chunks", "bit-flip"],
)
def test_damaged_checkpoint_is_refused_naming_it(trainer, damaged, damage, fault, tmp_path):
    root, step_dir = damaged
    damage(step_dir)
    with pytest.raises(CheckpointError) as err:
        restore_or_init(trainer, tmp_path / "run", resume_from=step_dir)
    assert str(step_dir) in str(err.value) and fault in str(err.value)


def test_damaged_workdir_checkpoint_never_falls_back_to_scratch(trainer, damaged, tmp_path):
    root, step_dir = damaged
    shutil.rmtree(step_dir / "meta")
    workdir = tmp_path / "run"
    shutil.move(root, workdir / "checkpoints")
    with pytest.raises(CheckpointError, match="missing item 'meta'"):
        restore_or_init(trainer, workdir)


def test_unfinished_save_is_named(trainer, damaged, tmp_path):
    root, step_dir = damaged
    for other in root.iterdir():
        if other != step_dir:
            shutil.rmtree(other)
    step_dir.rename(root / f"{K + M}.orbax-checkpoint-tmp-1234")
    with pytest.raises(CheckpointError, match=rf"{root}: no finished checkpoint \(unfinished saves: 4.orbax"):
        restore_or_init(trainer, tmp_path / "run", resume_from=root)


def _trajectory_server() -> TrajectoryServer:
    """One group in flight: a member interrupted part-way, one finished and scored."""
    server = TrajectoryServer()
    partial, done = server.add_group(7, prompt_id=3, prompt=[1, 5, 9], group_size=2,
                                     max_new_tokens=8, v_traj=2)
    for t, finish in ((partial, None), (done, "stop")):
        server.route(t, instance=1)
        server.try_start(t)
        server.report(t, [11, 12, 13][: 2 + (t == done)], [-0.5, -1 / 3, -2.0][: 2 + (t == done)],
                      [-0.4, -0.3, -1.9][: 2 + (t == done)], [2, 3, 3][: 2 + (t == done)], finish)
    server.set_reward(done, 1.0)
    return server


@pytest.mark.parametrize("server", [TrajectoryServer(), _trajectory_server()], ids=["empty", "partial"])
def test_trajectory_server_round_trips(trainer, tmp_path, server):
    json_state, arrays = server.state_dict()
    ckpt = Checkpointer(tmp_path / "ck", trainer)
    ckpt.save(trainer.init_state(), ResumeData(trajectories=json_state, trajectory_arrays=arrays))
    ckpt.wait()
    _, resume = ckpt.restore()
    ckpt.close()
    again_json, again_arrays = TrajectoryServer.from_state_dict(
        resume.trajectories, resume.trajectory_arrays
    ).state_dict()
    assert again_json == json_state
    assert again_arrays.keys() == arrays.keys()
    for name, array in arrays.items():  # float64 log-probs come back bit for bit
        assert again_arrays[name].dtype == array.dtype
        np.testing.assert_array_equal(again_arrays[name], array)


def test_resume_data_is_checked_before_saving(trainer, tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", trainer)
    state = trainer.init_state()
    with pytest.raises(ValueError, match="dtype <U1"):
        ckpt.save(state, ResumeData(trajectory_arrays={"ids": np.array(["a"])}))
    with pytest.raises(TypeError):
        ckpt.save(state, ResumeData(data_state={"x": object()}))
    with pytest.raises(ValueError, match="ResumeData.data_state does not survive JSON"):
        ckpt.save(state, ResumeData(data_state={"cursor": (3, 4)}))
    ckpt.close()


def test_a_save_the_disk_cannot_hold_is_refused_before_writing(trainer, tmp_path, monkeypatch):
    ckpt = Checkpointer(tmp_path / "ck", trainer)
    state = trainer.init_state()
    ckpt.save(state, ResumeData())
    ckpt.wait()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10 << 20))
    later = state.replace(step=jax.device_put(np.int32(5), state.step.sharding))
    with pytest.raises(CheckpointError, match=(
            rf"checkpoint of step 5: needs about [\d.]+ MiB under {tmp_path / 'ck'}, which has "
            r"10.0 MiB free.*resumes from step 0, the latest complete checkpoint")):
        ckpt.save(later, ResumeData())
    ckpt.close()
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["0"]  # nothing half-written


def test_a_save_that_fails_while_writing_names_the_disk_and_the_resume_point(trainer, tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", trainer)
    ckpt.save(trainer.init_state(), ResumeData())
    ckpt.wait()
    written = ckpt._manager.wait_until_finished

    def disk_full():  # what Orbax raises when tensorstore meets ENOSPC (Orbax 0.12)
        written()
        raise ValueError('RESOURCE_EXHAUSTED: Error writing "params.embed/0.0" in OCDBT '
                         'database: Failed to write 1494188 bytes to file 4: No space left '
                         "on device [os_error_code='28']")

    ckpt._manager.wait_until_finished = disk_full
    with pytest.raises(CheckpointError, match=(
            r"save under .*ck failed \(the disk is full\): ValueError: RESOURCE_EXHAUSTED.*"
            r"resumes from step 0")):
        ckpt.close()


def test_exported_policy_loads_in_transformers_with_same_logits(trainer, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    state = trainer.init_state()
    for seed in range(2):  # trained weights, not the init: the export must carry the update
        state, _ = trainer.step(state, trainer.put_batch(make_batch(seed, version=seed)))
    folder = export_policy(tmp_path / "hf", trainer, state)

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokens = make_batch(7).tokens[:2]
    with torch.no_grad():
        want = model(torch.from_numpy(tokens).long()).logits.numpy()
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    got, _ = jax.jit(apply, static_argnums=0)(trainer.graphdef, jax.device_get(state.params), tokens, positions)
    assert want.shape == (2, tokens.shape[1], MODEL.vocab_size)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
