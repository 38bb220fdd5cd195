"""The Ray cluster rollout actors run on: joined, or started here on loopback alone.

One machine (`distributed.ray_address = 'local'`): a head inside this process, its GCS,
raylet, object manager and workers listening and advertising on 127.0.0.1 only. Passing
`_node_ip_address='127.0.0.1'` is not enough: Ray resolves a loopback address back to the
host's external one ("remotely reachable"). Ray's single-node mode,
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (read when Ray is imported; meant for laptops), makes it
use loopback and refuse other nodes, which a one-machine run has none of. After the start,
every address Ray reports is checked (`reported_addresses`): one that is not loopback stops
the run.

Token authentication stays on. A local head gets a fresh token, handed to its processes
through the environment (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN), so ~/.ray/auth_token is
neither read nor written. Joining a cluster (`'host:port'`, `'auto'`) uses the token the
launch scripts carried to this node (RAY_AUTH_TOKEN or ~/.ray/auth_token).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Sequence

from asyncrl.distributed import TPU_HOST_CHIP_BOUNDS
from asyncrl.distributed.gpus import VISIBLE, ray_gpus
from asyncrl.distributed.gpus import gpu_environment
from asyncrl.errors import UserError

log = logging.getLogger(__name__)

SINGLE_NODE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


# How long a joined cluster's address may take to accept a connection: Ray itself retries an
# address nothing answers at for minutes, silently.
CONNECT_TIMEOUT_S = 20.0


class ClusterError(UserError, RuntimeError):
    """The Ray cluster could not be started or joined as configured."""


def _keeping_signal_handlers(start):
    """`start()` (a ray.init), with this process's SIGINT and SIGTERM handlers put back after:
    the driver's ray.init installs its own, which ends the process at once (exit -6) instead
    of letting the run checkpoint (asyncrl/main.py's handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return start()
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return start()
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raises ClusterError naming `address` if nothing accepts a connection there in time."""
    if address == "auto" or "://" in address:  # Ray finds those itself / its client protocol
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"distributed.ray_address = {address!r}: expected 'local', 'auto' "
                           f"or the head's 'host:port'")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as error:
        raise ClusterError(f"nothing answers at {address} (distributed.ray_address) within "
                           f"{timeout_s:.0f} s: {error}; start the cluster first (launch/) "
                           f"or correct the address") from None


def loopback_environment(token: str | None = None) -> dict[str, str]:
    """The variables a one-machine head (and every process it starts) runs with."""
    return {SINGLE_NODE: "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": token or secrets.token_hex(32),
            "RAY_USAGE_STATS_ENABLED": "0"}


class Cluster:
    """A connection to Ray; `close` shuts down only what this object started or joined."""

    def __init__(self, owned: bool):
        self.owned = owned

    def close(self) -> None:
        import ray

        if self.owned and ray.is_initialized():
            ray.shutdown()


def start_local(num_cpus: int = 0, object_store_mb: int = 1024,
                gpus: Sequence[str] | None = None) -> Cluster:
    """A loopback-only head in this process (see the module docstring), offering `gpus`
    (CUDA's ids; None: the GPUs Ray finds, as this process sees them)."""
    # Before Ray is imported: it reads these then. A token the caller chose (a test,
    # launch/one_machine.sh) wins over a fresh one.
    os.environ.update(loopback_environment(os.environ.get("RAY_AUTH_TOKEN")))
    imported_before = "ray" in sys.modules
    import ray

    if ray.is_initialized():
        raise ClusterError("a Ray cluster is already connected in this process")
    if imported_before:  # read them again, as Ray's own token set-up does
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    kwargs = {"num_cpus": num_cpus} if num_cpus else {}
    if gpus is not None:
        kwargs["num_gpus"] = len(gpus)
    with _visible_gpus(gpus):
        _keeping_signal_handlers(lambda: ray.init(
            address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
            object_store_memory=object_store_mb * 1024 * 1024, configure_logging=False,
            **kwargs))
    outside = [a for a in reported_addresses() if not is_loopback(a)]
    if outside:
        ray.shutdown()
        raise ClusterError(f"the one-machine Ray head advertises {', '.join(outside)}, not "
                           "127.0.0.1 alone; refusing to run on a reachable address")
    return Cluster(owned=True)


@contextlib.contextmanager
def _visible_gpus(gpus: Sequence[str] | None):
    """CUDA_VISIBLE_DEVICES naming `gpus` while the head starts: its raylet, and every worker
    it spawns, inherit the variable as it is then, and Ray maps an actor's share of the GPUs
    onto those ids. This process's own value (its trainer's GPUs) is put back after."""
    if gpus is None:
        yield
        return
    kept = os.environ.get(VISIBLE)
    os.environ[VISIBLE] = ",".join(gpus)
    try:
        yield
    finally:
        if kept is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = kept


def join(address: str) -> Cluster:
    """A cluster started beforehand (`ray start`, launch/): 'auto' or its 'host:port'."""
    import ray

    if ray.is_initialized():
        return Cluster(owned=False)
    check_reachable(address)
    try:
        _keeping_signal_handlers(lambda: ray.init(address=address, configure_logging=False))
    except (ConnectionError, RuntimeError) as error:
        raise ClusterError(f"could not join the Ray cluster at {address!r} "
                           f"(distributed.ray_address): {error}") from error
    return Cluster(owned=True)


def connect(distributed) -> Cluster:
    """The cluster a config's `distributed` section names; one this process already joined
    (a test's cluster, say) is used as it is, and left running."""
    import ray

    if ray.is_initialized():
        return Cluster(owned=False)
    if distributed.ray_address == "local":
        return start_local(distributed.ray_num_cpus, distributed.ray_object_store_mb, ray_gpus())
    return join(distributed.ray_address)


def reported_addresses() -> list[str]:
    """Every address Ray reports for this cluster: each node's and the GCS's host."""
    import ray

    nodes = [node["NodeManagerAddress"] for node in ray.nodes()]
    return nodes + [ray.get_runtime_context().gcs_address.rsplit(":", 1)[0]]


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return address == "localhost"


def package_root() -> str:
    """The directory holding this asyncrl: actors import the same code as the driver, not
    another checkout the environment may point at."""
    import asyncrl

    return os.path.dirname(os.path.dirname(os.path.abspath(asyncrl.__file__)))


def actor_environment(devices: int, platform: str, gpus: float = 0.0) -> dict[str, str]:
    """Variables of an actor's process, set before it imports JAX: its own device count on a
    CPU, the platform asked for, its GPU memory share for the `gpus` it reserves (none shown
    if none: `gpus.gpu_environment`), and this asyncrl on the path. Never the driver's
    CUDA_VISIBLE_DEVICES: Ray sets each actor's to the GPUs it assigned."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env = {"XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]),
           "PYTHONPATH": os.pathsep.join(p for p in [package_root(), os.environ.get("PYTHONPATH", "")] if p),
           "PYTHONUNBUFFERED": "1"}
    if platform:
        env["JAX_PLATFORMS"] = platform
    env.update(gpu_environment(gpus))
    return env


def actor_options(cpus: float, gpus: float, resource: str, devices: int, platform: str,
                  **more) -> dict:
    """The Ray options of one of the run's actors (an instance, a trainer follower): what it
    reserves (its GPUs become its own: `asyncrl.distributed.gpus`), one unit of `resource` if
    named, and its process's environment (`actor_environment`)."""
    return dict(num_cpus=cpus, num_gpus=gpus, resources={resource: 1} if resource else None,
                # Never Ray's restart: the driver respawns a failed instance behind a fresh
                # stand-in (`asyncrl.distributed.rejoin`), and a failed follower fails its
                # group (JAX cannot take a process back mid-job; the run resumes instead).
                max_restarts=0,
                runtime_env={"env_vars": actor_environment(devices, platform, gpus)}, **more)


# ---------------------------------------------------------------------------- TPU VM slices

# The port an isolated TPU process serves its (single-process) runtime on; block k's process
# on a host of several uses the port k above it.
TPU_ISOLATED_PORT = 8476


def tpu_isolation(chips: int, block: int = 0) -> dict[str, str]:
    """The environment that makes a process on one host of a multi-host TPU slice a slice of
    its own, owning block `block` of the host's chips (chips block·chips .. (block+1)·chips
    - 1). Without it every process's TPU runtime joins the whole slice and blocks until a
    process on every host does, which the Ray layouts (independent instances, a trainer
    apart from them) never do. Processes sharing a host own different blocks (each its own
    chips and runtime port)."""
    if chips not in TPU_HOST_CHIP_BOUNDS:
        *most, last = TPU_HOST_CHIP_BOUNDS
        raise ClusterError(f"a TPU process on its host owns {', '.join(map(str, most))} "
                           f"or {last} chips, not {chips!r}")
    if not 0 <= block < max(TPU_HOST_CHIP_BOUNDS) // chips:
        raise ClusterError(f"chip block {block} of {chips} chip(s) is past a TPU host's "
                           f"{max(TPU_HOST_CHIP_BOUNDS)} chips")
    port = TPU_ISOLATED_PORT + block
    return {"TPU_PROCESS_BOUNDS": "1,1,1",
            "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_HOST_CHIP_BOUNDS[chips],
            "TPU_VISIBLE_CHIPS": ",".join(map(str, range(block * chips, (block + 1) * chips))),
            "TPU_PROCESS_PORT": str(port),
            "TPU_PROCESS_ADDRESSES": f"localhost:{port}", "CLOUD_TPU_TASK_ID": "0"}


TPU_METADATA = ("http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
                "worker-network-endpoints")


def parse_worker_endpoints(text: str) -> list[str]:
    """A TPU VM slice's `worker-network-endpoints` metadata, worker 0 first: hostnames, or
    (the older format) name:id:ip triples, whose ip is taken (as JAX's own TPU detection does)."""
    addresses = []
    for worker in filter(None, text.strip().split(",")):
        parts = worker.split(":")
        if len(parts) not in (1, 3):
            raise ClusterError(f"unsupported worker-network-endpoints entry {worker!r}")
        addresses.append(parts[-1])
    return addresses


def tpu_worker_addresses(timeout_s: float = 10.0) -> list[str]:
    """This slice's workers, from the TPU VM's metadata server (worker 0 first)."""
    import urllib.request

    request = urllib.request.Request(TPU_METADATA, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return parse_worker_endpoints(response.read().decode())


if __name__ == "__main__":
    # launch/tpu_vms.sh: each worker finds the Ray head (worker 0) itself.
    import argparse

    parser = argparse.ArgumentParser(description="Cluster addresses for the launch scripts.")
    parser.add_argument("--tpu-worker-0", action="store_true",
                        help="print the address of this TPU VM slice's worker 0")
    parser.add_argument("--tpu-isolation", type=int, metavar="CHIPS",
                        help="print the variables (NAME=value ...) that make a process owning "
                             "this host's first CHIPS chips a TPU slice of its own")
    args = parser.parse_args()
    if args.tpu_worker_0:
        print(tpu_worker_addresses()[0])
    if args.tpu_isolation is not None:
        try:
            print(" ".join(f"{k}={v}" for k, v in tpu_isolation(args.tpu_isolation).items()))
        except ClusterError as e:
            sys.exit(f"error: --tpu-isolation: {e}")
