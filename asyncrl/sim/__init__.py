"""A discrete-event simulator of asynchronous RL post-training at cluster scale.

It answers "what happens on 128 (or 1,024) 8-GPU instances" on a laptop, by driving the real
`asyncrl.staleness.StalenessManager` and the coordinator's policy objects with modelled
durations instead of engines:

  events.py     the virtual clock and event heap (no sleeping, no threads)
  instance.py   a rollout instance: continuous batching, decode advanced in closed-form chunks
                under the step-latency model until the next event (no per-token events)
  engine.py     groups, routing, the trainer, weight pushes, pulls and broadcasts
  schedules/    sync, one_step, verl, areal, roll, slime, staleflow: one module each,
                documented from the public description of the system it models
  workload.py   response / prompt lengths from named distributions
  profile.py    every cost, from a JSON profile (profiles/, each citing its source)
  run.py        one run, the grid, and its CSV / Markdown / plots

    python -m asyncrl.sim --config=experiments/sim/paper.py --workdir=/tmp/sim
"""
