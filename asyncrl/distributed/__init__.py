"""asyncrl.distributed."""
