"""asyncrl.parallel."""
