"""Planning a run before renting chips: `python -m asyncrl.plan` (planner.py).

  planner       compiles the run's programs for the target chips, the HBM plan, predicted
                step times and the split of the chips (the CLI)
  hbm           what the trainer's state and a step take in device memory; the check a run
                makes against its real devices before it loads weights (asyncrl.run)
  accelerators  the chips' datasheet figures (HBM, bandwidth, peak FLOP/s) by name
  tpu_compile   compiling for a TPU topology on a CPU host (libtpu, no TPU)
  decode_cost   the decode step's bytes as XLA counts them for a TPU
                (`python -m asyncrl.plan.decode_cost`)

Import-light: asyncrl.run imports hbm on every run; the others load JAX or libtpu when used.
"""
