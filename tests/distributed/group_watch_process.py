"""One process of a two-process trainer group, for tests/distributed/test_group_watch.py and,
one process per emulated host, tests/distributed/test_hosts.py:

    python -m tests.distributed.group_watch_process [HOST:]PORT PROCESS_ID HEARTBEAT_TIMEOUT_S

The real `initialize` (jax.distributed, its coordinator on HOST, 127.0.0.1 if left out; the
heartbeats) and the real TrainerGroup, both processes in the same loop of weight gathers
(process 0 prints each), with a stand-in trainer: a mesh of one CPU device per process and
host arrays for weights. No model, no compile beyond the gather's.
"""

import itertools
import os
import sys
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")


def main(address: str, process_id: int, heartbeat_timeout_s: float) -> None:
    from asyncrl.distributed.trainer_group import GroupSettings, initialize

    if ":" not in address:
        address = f"127.0.0.1:{address}"
    initialize(GroupSettings(address, 2, process_id, heartbeat_timeout_s))
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from asyncrl.distributed.trainer_ops import TrainerGroup

    trainer = types.SimpleNamespace(mesh=Mesh(np.asarray(jax.devices()), ("fsdp",)),
                                    policy_params=lambda params: params)
    checkpointer = types.SimpleNamespace(close=lambda: None)
    state = types.SimpleNamespace(params={"w": np.arange(4, dtype=np.float32)})
    group = TrainerGroup(trainer, checkpointer)
    for i in itertools.count():
        group.host_params(state, 0)
        if process_id == 0:
            print(f"gathered {i}", flush=True)
            time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
