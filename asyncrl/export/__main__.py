"""A run's trained policy as a Hugging Face folder:

    python -m asyncrl.export --checkpoint=runs/grpo --out=runs/grpo/hf

    --checkpoint=runs/grpo                 a run folder: its latest checkpoint (or its
                                           checkpoints folder, or one step folder in it)
    --step=12                              that step of the run folder instead
    --out=DIR                              an existing folder that is not empty is refused,
    --overwrite                            unless it holds an earlier export (the files below
                                           and no others) and this: replaced once the new
                                           one is whole
    --config=experiments/grpo.py:tiny      optional: the run folder's run.json holds the
                                           config it was trained with; given, it wins (as
                                           for python -m asyncrl.eval)
    --config.rollout.max_new_tokens=512    any field, on either config (here: the
                                           generation_config.json default)

Writes model.safetensors, config.json, tokenizer.json, tokenizer_config.json and
chat_template.jinja (the template the run's prompts were rendered with) and
generation_config.json (the run's sampling): what transformers' from_pretrained and vLLM
read (asyncrl/export/hf.py says where each comes from).
"""

from asyncrl.host_devices import split_cpu_host

# Before JAX is imported anywhere: a trainer checkpoint is restored onto the mesh layout it
# was saved from, as asyncrl.main splits the host.
split_cpu_host(8)

from absl import app, flags  # noqa: E402

from asyncrl.cli import define_config_flag, quiet_libraries, run_main  # noqa: E402
from asyncrl.run_checkpoint import checkpoint_config  # noqa: E402

_CONFIG = define_config_flag(None, "Experiment config file (get_config(arg)); default: the "
                             "run.json of the run folder --checkpoint names.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A run folder, its checkpoints folder or one step folder in it.",
    required=True)
_OUT = flags.DEFINE_string("out", None, "The Hugging Face folder to write.", required=True)
_STEP = flags.DEFINE_integer("step", None, "The checkpoint step to export (default: the "
                             "latest).", lower_bound=0)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace --out when it holds an earlier "
                               "export (its files and no others).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    quiet_libraries()
    from asyncrl.export.hf import export_run, require_trainer_checkpoint

    require_trainer_checkpoint(_CHECKPOINT.value)  # a model: refused before its config is sought
    c = checkpoint_config(_CONFIG.value, _CHECKPOINT.value)
    export_run(c, _CHECKPOINT.value, _OUT.value, _STEP.value, _OVERWRITE.value)


if __name__ == "__main__":
    run_main(main, optional_config="config")
