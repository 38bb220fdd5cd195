"""python -m asyncrl.plan --config=… --trainer=… --rollout=…: see asyncrl/plan/planner.py."""

from asyncrl.cli import run_main
from asyncrl.plan.planner import main

run_main(main)
