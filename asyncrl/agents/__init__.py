"""Agents: tools a model calls inside its turns (issue 48; episodes of several turns are
being built on these)."""
