"""asyncrl.tools."""
