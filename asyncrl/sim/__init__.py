"""asyncrl.sim."""
