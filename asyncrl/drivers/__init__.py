"""Drivers of the coordinator core: they apply its commands to real (threaded) instances."""
