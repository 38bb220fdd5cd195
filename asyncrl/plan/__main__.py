"""python -m asyncrl.plan --config=… --trainer=… --rollout=…: see asyncrl/plan/planner.py."""

from absl import flags

from asyncrl.cli import run_main
from asyncrl.plan.planner import main

_OUT = flags.DEFINE_string("out", None, "Also write the recommended split as a plan file the "
                           "launch scripts build (launch/tpu_vms.sh --plan=FILE).")

run_main(lambda argv: main(argv, _OUT.value))
