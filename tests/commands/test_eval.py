"""python -m asyncrl.eval on a run folder reads the config the run recorded (run.json):
--config is optional, --config.<field> overrides still apply with the config flag's types
and errors, and a folder that records no config is one error line."""

import json

from asyncrl.run_checkpoint import checkpoint_config
from tests.commands.conftest import STEPS, command, one_error_line
from tests.test_system import tiny


def test_a_run_folder_is_evaluated_under_its_own_config(tiny_run, tmp_path):
    _, workdir, results = tiny_run
    # No --config: the default experiment's SmolLM2 shapes would not restore the tiny model.
    out = tmp_path / "step.json"
    done = command("asyncrl.eval", f"--checkpoint={workdir / 'checkpoints' / str(STEPS)}",
                   f"--output={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"restored step {STEPS}" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["num_problems"] == results["after"]["num_problems"] == 10
    assert figures["accuracy"] == results["after"]["accuracy"]

    out = tmp_path / "fewer.json"
    done = command("asyncrl.eval", f"--checkpoint={workdir}", "--config.eval.heldout_size", "4",
                   f"--output={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text())["num_problems"] == 4  # the override, read as an int


def test_an_override_of_the_stored_config_is_checked_as_the_config_flag_checks(tiny_run):
    _, workdir, _ = tiny_run
    misspelt = one_error_line(command("asyncrl.eval", f"--checkpoint={workdir}",
                                      "--config.eval.heldout_sise=4"))
    assert misspelt.startswith("error: --config.eval.heldout_sise: config.eval has no field "
                               "'heldout_sise'; did you mean 'heldout_size'?")
    mistyped = one_error_line(command("asyncrl.eval", f"--checkpoint={workdir}",
                                      "--config.eval.heldout_size=many"))
    assert "--config.eval.heldout_size=many: invalid literal for int()" in mistyped


def test_an_override_of_a_field_stored_as_none_asks_for_a_config_file(tiny_run):
    _, workdir, _ = tiny_run
    field = "coordinator.admission_params.verl.staleness_threshold"
    stored = checkpoint_config(None, str(workdir))
    assert stored.coordinator.admission_params.verl.staleness_threshold is None  # so no type
    for module, *args in (("asyncrl.eval",), ("asyncrl.export", "--out=unwritten")):
        done = command(module, f"--checkpoint={workdir}", f"--config.{field}=0.5", *args)
        assert "restored step" not in done.stdout
        assert one_error_line(done) == (
            f"error: --config.{field}: the stored config holds None there, so its type is "
            f"unknown and the value cannot be read; pass --config=<a config file that sets it> "
            f"instead")


def test_a_folder_that_records_no_config_asks_for_one(tmp_path):
    (tmp_path / "old" / "checkpoints").mkdir(parents=True)
    message = one_error_line(command("asyncrl.eval", f"--checkpoint={tmp_path / 'old'}"))
    assert message == (f"error: --checkpoint={tmp_path / 'old'}: {tmp_path / 'old'} records no "
                       f"config (no run.json: a run folder from before asyncrl recorded one, or "
                       f"not a run folder); pass --config=<the config file it was trained with>, "
                       f"e.g. --config=experiments/grpo.py:tiny")
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["checkpoints"]
    message = one_error_line(command("asyncrl.eval", "--checkpoint=embedded"))
    assert "--checkpoint=embedded is a model, not a run folder" in message


def test_a_given_config_wins_and_the_fields_it_changes_are_named(tiny_run, capsys):
    c, workdir, _ = tiny_run
    stored = checkpoint_config(None, str(workdir / "checkpoints"))
    assert stored.to_dict() == c.to_dict()
    assert not capsys.readouterr().err
    given = tiny(seed=7, train__learning_rate=0.5)
    assert checkpoint_config(given, str(workdir)) is given
    warning = capsys.readouterr().err
    assert warning.startswith(f"warning: --config differs from {workdir / 'run.json'}")
    assert "config.seed (7 here, 0 there); config.train.learning_rate (0.5 here, 0.01 there)" \
        in warning
