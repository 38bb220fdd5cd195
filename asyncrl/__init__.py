"""asyncrl: asynchronous RL post-training of language models with a per-trajectory staleness bound."""

__version__ = "0.1.0"
