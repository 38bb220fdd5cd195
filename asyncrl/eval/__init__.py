"""Evaluation: `accuracy` (greedy accuracy, pass@k, format and cut rates on a task's
validation or test split, on engines of its own; the run's background evaluator) and the
standalone `python -m asyncrl.eval --checkpoint=…` (__main__.py).

Import-light: the CLI splits this host's CPU into devices before JAX starts, so it lives in
__main__.py, which nothing imports.
"""
