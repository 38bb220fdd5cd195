"""asyncrl.model."""
