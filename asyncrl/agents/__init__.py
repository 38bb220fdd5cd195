"""Agents: the tools a model calls inside its turns (tool_calls, calculator) and the
environments an episode of several turns talks to (environments). Episodes in the engine,
under the per-trajectory staleness bound, are being built on these (issue 48)."""
