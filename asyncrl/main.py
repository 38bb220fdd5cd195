"""Asynchronous RL post-training: python -m asyncrl.main --config=experiments/grpo.py

    --config=experiments/grpo.py:tiny,eta=1   variants through get_config's argument
    --config.train.steps=30                    any field; a misspelt one is an error
    --workdir=runs/grpo                        metrics, checkpoints, results.json (default:
                                               runs/<config file's name>[-<its argument>])
    --resume_anyway                            use a workdir another config started (run.json)
    --print_config                             print the resolved config (JSON) and exit

Ctrl-C (or SIGTERM) finishes or abandons the step in flight, checkpoints and exits 0;
rerunning the same command resumes.
"""

from asyncrl.host_devices import split_cpu_host
from asyncrl.host_memory import tune_host_malloc

# Before JAX is imported anywhere: on a CPU, enough devices for one trainer mesh and the
# rollout meshes.
split_cpu_host(8)
# Before JAX allocates: XLA:CPU's buffers are host memory, and glibc's defaults fragment them.
tune_host_malloc()

import signal  # noqa: E402
import threading  # noqa: E402

from absl import app, flags, logging  # noqa: E402

from asyncrl.cli import define_config_flag, quiet_libraries, run_main  # noqa: E402
from asyncrl.errors import local_workdir  # noqa: E402
from asyncrl.run_folder import check_identity, default_workdir, experiment_name  # noqa: E402

_CONFIG = define_config_flag("experiments/grpo.py", "Experiment config file (get_config(arg)).",
                             print_flag=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where metrics, checkpoints and results go (default: runs/<config file's "
    "name>[-<its argument>], e.g. runs/grpo, runs/grpo-tiny, runs/sync).")
_RESUME_ANYWAY = flags.DEFINE_bool(
    "resume_anyway", False, "Resume a workdir whose run.json records another experiment or "
    "other values of the fields a run's state depends on (the differences are recorded).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    quiet_libraries()
    from asyncrl.config import resolve

    # Every field checked once, before JAX loads and before Ray, a trainer group or JAX's
    # backend starts; the run and the group's followers read this spec. (Checking imports
    # the reward plugins: one that started a JAX backend on import would do it before the
    # GPUs are split between this process and Ray, asyncrl/distributed/gpus.py.)
    spec = resolve(_CONFIG.value)
    import jax  # here, not at the top: a bad flag or field is reported without waiting for JAX

    from asyncrl.trainer_actors import form_group

    # A trainer group (distributed.* or JAX_*, or trainer_processes: followers this process
    # starts as Ray actors): joined before anything starts JAX's backend (importing the run
    # may), which then sees every process's devices. One process: nothing to join.
    config_flag = flags.FLAGS["config"].serialize().partition("=")[2]
    workdir = str(local_workdir(_WORKDIR.value or default_workdir(config_flag)))
    experiment = experiment_name(config_flag)
    # On every process, before anything (the trainer group's start included) writes there:
    # another run's folder is refused as it is. Process 0 records this run in it (asyncrl/run).
    check_identity(workdir, spec, experiment, _RESUME_ANYWAY.value)
    group = form_group(spec, workdir)
    from asyncrl.run import run

    logging.info("process %d of %d, devices: %s", jax.process_index(), jax.process_count(),
                 jax.devices())
    stop = threading.Event()

    def request_stop(signum, frame):
        logging.warning("signal %d: finishing the step in flight, then checkpointing", signum)
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    with group:  # then the followers' ends are awaited and their errors surfaced
        run(spec, workdir, stop=stop, experiment=experiment,
            resume_anyway=_RESUME_ANYWAY.value)


if __name__ == "__main__":
    run_main(main)
