"""Held-out evaluation of a policy: python -m asyncrl.eval --config=… --checkpoint=…

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

import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from asyncrl.cli import define_config_flag, run_main  # noqa: E402

_CONFIG = define_config_flag("experiments/grpo.py", "Experiment config file (get_config(arg)).")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A run's workdir or checkpoint, a Hugging Face folder, a .gguf file or "
    "'embedded'.", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Where the JSON figures go.")
_SPLIT = flags.DEFINE_enum("split", "validation", ["validation", "test"],
                           "Which held-out split of the task to evaluate.")


def _trainer_checkpoint(path: pathlib.Path) -> pathlib.Path | None:
    """The Orbax checkpoint root or step folder that `path` names, if it names one."""
    if (path / "checkpoints").is_dir():
        return path / "checkpoints"
    if path.is_dir() and not (path / "config.json").exists():
        return path  # a checkpoints root or one step: the restore says which, or what is wrong
    return None


def load_params(c, checkpoint: str):
    """(policy, params, default output folder) for `checkpoint`; the config's model section
    describes the architecture a trainer checkpoint was saved from."""
    from asyncrl.policy import load_policy
    from asyncrl.run import train_config
    from asyncrl.train.checkpoint import CheckpointError, restore_params
    from asyncrl.train.trainer import Trainer, trainer_mesh

    path = pathlib.Path(checkpoint)
    if checkpoint != "embedded" and not path.exists():
        raise CheckpointError(f"checkpoint {path}: does not exist")
    root = None if checkpoint == "embedded" else _trainer_checkpoint(path)
    if root is None:  # a model file or folder: it is the policy
        c.model.checkpoint = checkpoint
        policy = load_policy(c.model)
        return policy, policy.params, pathlib.Path.cwd() if checkpoint == "embedded" else path.parent
    policy = load_policy(c.model)  # the architecture the trainer checkpoint was saved from
    trainer = Trainer.create(train_config(c), policy.config,
                             trainer_mesh(jax.devices()[:c.mesh.trainer_devices]), c.rollout.group_size)
    params, step = restore_params(trainer, root)
    print(f"restored step {step} from {root}")
    return policy, params, root.parent if root.name == "checkpoints" else path


def evaluate_checkpoint(c, checkpoint: str, output: str | None = None,
                        split: str = "validation") -> dict:
    from asyncrl import config as config_lib
    from asyncrl.data.sources import build_task_data
    from asyncrl.eval.accuracy import Evaluator, describe
    from asyncrl.model import graphdef_for
    from asyncrl.policy import encode

    config_lib.validate(c, jax.device_count())
    policy, params, folder = load_params(c, checkpoint)
    out = pathlib.Path(output) if output else folder / "eval.json"
    data = build_task_data(c.task, c.eval.heldout_size, out.parent)
    mesh = Mesh(jax.devices()[:1], ("tp",))
    evaluator = Evaluator(c, graphdef_for(policy.config), policy.config, mesh, data,
                          lambda problem: encode(c, policy, problem).tokens, policy.decode)
    responses = out.with_name(f"{out.stem}_responses.jsonl")
    result = evaluator(params, 0, "eval", split=split, responses_to=responses)
    figures = {"checkpoint": str(checkpoint), **dataclasses.asdict(result)}
    out.write_text(json.dumps(figures, indent=2))
    print(f"{describe(result)}; written to {out}, each response to {responses}")
    return figures


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    evaluate_checkpoint(_CONFIG.value, _CHECKPOINT.value, _OUTPUT.value, _SPLIT.value)


if __name__ == "__main__":
    run_main(main)
