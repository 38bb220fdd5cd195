"""Planning a run before renting chips: `python -m asyncrl.plan` (planner.py).

  planner       the CLI: compiles the run's programs for the target chips, prints the HBM
                plan, the predicted times and the recommended split
  parts         each side's memory plan and compiled costs, and the checks that a part fits
  predict       times from the compiled costs: the efficiency assumptions, bands and the
                measurements that calibrate them
  recommend     the cluster simulator over splits of the chips (two kinds of chip: both
                assignments) and over η
  hbm           what the trainer's state and a step take in device memory; the check a run
                makes against its real devices before it loads weights (asyncrl.run)
  accelerators  the chips' datasheet figures (HBM, bandwidth, peak FLOP/s) by name
  tpu_compile   compiling for a TPU topology on a CPU host (libtpu, no TPU), XLA's analyses
  hlo_cost      a compiled program's cost with every loop run its trip count
  kernel_cost   a Pallas kernel's bytes and FLOPs from its block plan (XLA counts none)
  decode_cost   the decode step's bytes against the least it could read
                (`python -m asyncrl.plan.decode_cost`)

Import-light: asyncrl.run imports hbm on every run; the others load JAX or libtpu when used.
"""
