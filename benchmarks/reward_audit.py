r"""Does the reported accuracy mean what it says? A run on a MATH-style file, recounted.

  python benchmarks/reward_audit.py --workdir=runs/audit             # write the task, run, recount
  python benchmarks/reward_audit.py --workdir=runs/audit --reward=math_verify_lenient
  python benchmarks/reward_audit.py --workdir=runs/audit --recount   # recount a finished run
  python benchmarks/reward_audit.py ... --config.train.steps=2       # any run flag passes on

The task: two- and three-term sums and differences of two-digit integers ("What is
29 + 55 - 36?"), written as a MATH-style JSONL file ({"problem", "answer"}): 3,000 training
problems and 200 held-out ones, distinct problems drawn from one seeded stream with the
held-out ones drawn first and excluded from training, so training can never draw them
(checked when written). The run is the README's default recipe on that file,
`--config.task.dataset=math --config.task.reward=math_verify` (or --reward), with the prompt
asking for a boxed answer (the format math_verify reads; INSTRUCTION, chosen on a validation
split the run never reads). Training on `math_verify_lenient` (what math_verify was before)
shows the exploit: its reward rises, and the run still reports strict accuracy and flags it.

The recount reads the run's own final greedy responses (<workdir>/responses/after.jsonl)
with a rule that shares no code with the rewards: the content of the last closed
\boxed{...}, without spaces, dollar signs or thousands commas, must be the gold integer
written out. It also scores the same responses with `math_verify_lenient` (math-verify's own
extraction, what `math_verify` was before): the figure a gamed run would have reported.
Last line, JSON: {"reported": a, "strict_recount": b, "difference_points": ..,
"within_5_points": .., "lenient_would_report": c, "format_rate": .., "cut_rate": .., ...}.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncrl.cli import exit_on_user_error  # noqa: E402

# Chosen on the validation split (60 problems, greedy, before training): SmolLM2-135M boxed
# 10% of its answers with the example and none with "Put the final answer in \boxed{}." or
# "Answer with only the number, in the form \boxed{N}."
INSTRUCTION = "Write the final answer as \\boxed{N}, for example \\boxed{12}."
_LAST_CLOSED_BOX = re.compile(r"\\boxed\{([^{}]*)\}")


def draw_problems(count: int, rng: random.Random, exclude: set[str]) -> list[dict[str, str]]:
    """`count` distinct problems not in `exclude`: two or three two-digit terms, + or -."""
    problems: dict[str, str] = {}
    while len(problems) < count:
        terms = [rng.randint(10, 99) for _ in range(rng.choice((2, 3)))]
        text, value = str(terms[0]), terms[0]
        for term in terms[1:]:
            sign = rng.choice("+-")
            text += f" {sign} {term}"
            value += term if sign == "+" else -term
        question = f"What is {text}?"
        if question not in exclude:
            problems[question] = str(value)
    return [{"problem": q, "answer": a} for q, a in problems.items()]


def write_task(folder: pathlib.Path, train: int = 3000, heldout: int = 200,
               seed: int = 0) -> dict[str, pathlib.Path]:
    """Writes test.jsonl (what the run reports), validation.jsonl (where settings may be
    chosen) and train.jsonl: drawn in that order, none repeating a problem of another."""
    rng = random.Random(seed)
    test = draw_problems(heldout, rng, set())
    validation = draw_problems(heldout, rng, {p["problem"] for p in test})
    held = {p["problem"] for p in test + validation}
    training = draw_problems(train, rng, held)
    if held & {p["problem"] for p in training} or len(held) != 2 * heldout:
        raise AssertionError("the splits share a problem")
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.jsonl" for name in ("train", "validation", "test")}
    for name, rows in (("train", training), ("validation", validation), ("test", test)):
        paths[name].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return paths


def strict_correct(response: str, gold: str) -> bool:
    """The last closed box holds the gold integer, written out (no expression, no words)."""
    boxes = _LAST_CLOSED_BOX.findall(response)
    if not boxes:
        return False
    stated = re.sub(r"[\s$,]|\\\$", "", boxes[-1])
    return re.fullmatch(r"-?\d+", stated) is not None and int(stated) == int(gold)


def recount(responses_path: pathlib.Path) -> dict:
    from asyncrl.rewards import REWARDS

    rows = [json.loads(line) for line in responses_path.read_text().splitlines()]
    if not rows:
        raise SystemExit(f"error: {responses_path} holds no responses")
    lenient = REWARDS.get("math_verify_lenient")
    n = len(rows)
    reported = sum(r["correct"] for r in rows) / n
    strict = sum(strict_correct(r["response"], r["answer"]) for r in rows) / n
    return {
        "responses": str(responses_path), "problems": n, "grader": rows[0]["grader"],
        "reported": reported, "strict_recount": strict,
        "difference_points": round(100 * (reported - strict), 2),
        "within_5_points": abs(reported - strict) <= 0.05,
        "lenient_would_report": sum(lenient(response=r["response"], answer=r["answer"])
                                    for r in rows) / n,
        "format_rate": sum(bool(r["formatted"]) for r in rows) / n,
        "cut_rate": sum(r["cut"] for r in rows) / n,
        "mean_length": sum(r["length"] for r in rows) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/reward_audit")
    parser.add_argument("--recount", action="store_true", help="only recount a finished run")
    parser.add_argument("--seed", type=int, default=0, help="the task's and the run's seed")
    parser.add_argument("--reward", default="math_verify", help="the training reward")
    args, flags = parser.parse_known_args()
    if any(not flag.startswith("--config.") for flag in flags):
        parser.error(f"unknown arguments (only --config.* flags pass on to the run): {flags}")
    workdir = pathlib.Path(args.workdir)
    run_dir = workdir / args.reward
    if not args.recount:
        paths = write_task(workdir / "data", seed=args.seed)
        command = [sys.executable, "-m", "asyncrl.main", "--config=experiments/grpo.py",
                   f"--workdir={run_dir}", "--config.task.dataset=math",
                   f"--config.task.train_path={paths['train']}",
                   f"--config.task.test_path={paths['test']}",
                   f"--config.task.reward={args.reward}",
                   f"--config.task.instruction={INSTRUCTION}",
                   f"--config.seed={args.seed}", f"--config.task.seed={args.seed}", *flags]
        print(" ".join(command), file=sys.stderr)
        finished = subprocess.run(command, cwd=ROOT)
        if finished.returncode:  # the run printed why; its status is the benchmark's
            sys.exit(finished.returncode)
    figures = {label: recount(run_dir / "responses" / f"{label}_test.jsonl")
               for label in ("before", "after")}
    results = json.loads((run_dir / "results.json").read_text())
    print(json.dumps({**figures["after"], "trained_on": args.reward,
                      "reward_hacking": results.get("reward_hacking", []),
                      "before": figures["before"]}))


if __name__ == "__main__":
    exit_on_user_error(main)
