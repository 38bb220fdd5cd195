"""asyncrl.rewards."""
