"""asyncrl.train."""
