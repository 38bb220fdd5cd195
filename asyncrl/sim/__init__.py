"""A discrete-event simulator of asynchronous RL post-training at cluster scale.

It answers "what happens on 128 (or 1,024) 8-GPU instances" on a laptop: the coordinator core
the live system runs (`asyncrl.coordinator.core.Core`, built by the same builder from the same
`coordinator` section) takes every decision, and modelled instances, trainer and transfers
carry them out with durations from a profile instead of engines:

  cluster.py    the driver: applies the core's commands to the modelled cluster and reports
                what happened back, once per virtual time point; the trainer
  instance.py   a rollout instance: continuous batching, decode advanced in closed-form chunks
                under the step-latency model until the next event (no per-token events)
  build.py      the run shape a sim config gives the one core builder (`coordinator.build`)
  config.py     the run config, and the grid's systems as labelled variants of the admissions
                (sync, one_step, slime = barrier; areal, roll = token_bucket; verl; staleflow)
  prompts.py    the simulated task: each prompt's lengths and rewards, the same for every system
  server.py     the TrajectoryServer, keeping each trajectory's current state only
  events.py     the virtual clock and event heap (no sleeping, no threads)
  workload.py   response / prompt lengths from named distributions
  profile.py    every cost, from a JSON profile (profiles/, each citing its source)
  run.py        one run, the grid, and its CSV / Markdown / plots

    python -m asyncrl.sim --config=experiments/sim/paper.py --workdir=/tmp/sim
"""
