"""Measured and published step-latency profiles (JSON), read by the live coordinator's
`LatencyModel` (throughput_optimal and version_first routing) and by the simulator.
README.md in this folder says where each file's numbers come from."""

import os

PROFILE_DIR = os.path.dirname(os.path.abspath(__file__))
