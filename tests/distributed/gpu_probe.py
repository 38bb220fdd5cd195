"""The actor tests/distributed/test_gpus.py starts with the run's options in an instance's or
a follower's place: it reports what its process was given. Ray's workers import this module,
so it imports nothing heavy."""

import os


class Probe:
    def __init__(self, *args):
        pass

    def seen(self) -> dict:
        import ray

        return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "ray_ids": sorted(ray.get_gpu_ids()),
                "fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
                "noset": os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")}
