"""Held-out evaluation of a policy: python -m asyncrl.eval --checkpoint=runs/grpo

    --config=experiments/grpo.py:tiny      the config: optional for a run folder, whose
                                           run.json holds the one it was trained with;
                                           given, it wins (a warning names the fields where
                                           it differs); needed for a model file
    --config.eval.heldout_size=50          any field, on either config
    --split=validation                     the task's validation split (the default), or
    --split=test                           its test split: the figure to report, once the
                                           settings are chosen on validation

    --checkpoint=runs/grpo                 a run's workdir: its latest checkpoint
    --checkpoint=runs/grpo/checkpoints/12  one checkpoint step (or a checkpoints folder)
    --checkpoint=path/to/hf_folder         a Hugging Face folder (config.json, safetensors)
    --checkpoint=model.gguf                a GGUF file; 'embedded' for the default policy
    --config.eval.samples=8 --config.eval.pass_k=1,8   sampled pass@k as well as greedy

Prints the figures that training logs (accuracy, pass@k, mean response length, format rate)
and writes them as JSON to --output (default: eval.json in the run's workdir, or the
current directory for a model file), and every greedy response with its grades beside it
(eval_responses.jsonl).
"""

from asyncrl.host_devices import split_cpu_host

# Before JAX is imported anywhere: evaluation needs one device, but a trainer checkpoint is
# restored onto the mesh layout it was saved from, as asyncrl.main splits the host.
split_cpu_host(8)

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from asyncrl.cli import define_config_flag, quiet_libraries, run_main  # noqa: E402
from asyncrl.run_checkpoint import checkpoint_config, load_params  # noqa: E402

_CONFIG = define_config_flag(None, "Experiment config file (get_config(arg)); default: the "
                             "run.json of the run folder --checkpoint names.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A run's workdir or checkpoint, a Hugging Face folder, a .gguf file or "
    "'embedded'.", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Where the JSON figures go.")
_SPLIT = flags.DEFINE_enum("split", "validation", ["validation", "test"],
                           "Which held-out split of the task to evaluate.")


def evaluate_checkpoint(c, checkpoint: str, output: str | None = None,
                        split: str = "validation") -> dict:
    from asyncrl import config as config_lib
    from asyncrl.data.sources import build_task_data
    from asyncrl.eval.accuracy import describe
    from asyncrl.run import evaluator_for

    c = config_lib.validate(c, jax.device_count())
    policy, params, folder = load_params(c, checkpoint)
    out = pathlib.Path(output) if output else folder / "eval.json"
    data = build_task_data(c.task, c.eval.heldout_size, out.parent)
    mesh = Mesh(jax.devices()[:1], ("tp",))
    responses = out.with_name(f"{out.stem}_responses.jsonl")
    evaluator = evaluator_for(c, policy, mesh, data)
    with contextlib.closing(evaluator):
        result = evaluator(params, 0, "eval", split=split, responses_to=responses)
    figures = {"checkpoint": str(checkpoint), **dataclasses.asdict(result)}
    out.write_text(json.dumps(figures, indent=2))
    print(f"{describe(result)}; written to {out}, each response to {responses}")
    return figures


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    quiet_libraries()
    c = checkpoint_config(_CONFIG.value, _CHECKPOINT.value)
    evaluate_checkpoint(c, _CHECKPOINT.value, _OUTPUT.value, _SPLIT.value)


if __name__ == "__main__":
    run_main(main, optional_config="config")
