"""asyncrl.data."""
