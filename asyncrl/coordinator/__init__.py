"""asyncrl.coordinator."""
