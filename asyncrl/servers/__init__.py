"""asyncrl.servers."""
