"""Export: a run's trained policy as a Hugging Face folder (`hf.export_run`) and the command
`python -m asyncrl.export --checkpoint=runs/grpo --out=runs/grpo/hf` (__main__.py).

Import-light: the command splits this host's CPU into devices before JAX starts, so the
package imports nothing.
"""
