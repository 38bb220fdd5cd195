"""asyncrl.train: GRPO-family losses (losses.py), the sharded train step (trainer.py), its
settings from the run's spec (section.py, settings.py) and checkpoints (checkpoint.py).

Nothing is imported here, so the `train` and `checkpoint` sections can be checked without
loading JAX.
"""
