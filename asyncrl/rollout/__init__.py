"""asyncrl.rollout."""
