"""The trainer group as Ray actors: the driver is process 0 of a jax.distributed job and starts
the other processes itself (distributed.trainer_processes > 1, backend='ray').

    with form_group(c, workdir):   # this process joined (as process 0 when there are actors)
        run(c, workdir)            # process 0 leads the trainer's collectives (asyncrl/run/)

Order matters: `jax.distributed.initialize` must run here before JAX's backend starts, and it
blocks until every process has joined. So Ray is connected first (the same `connect` the
rollouts use, which then finds it connected and leaves it to us), the follower actors are
placed and each answers `ready` within distributed.start_timeout_s (a follower Ray cannot
place fails here, naming its resources, rather than as a join timeout), their `follow` calls
are sent, and only then does this process join as process 0.

A follower runs what a process started by hand runs: `initialize` with its id, then `run`,
which in a process > 0 runs the same loop as process 0 on the batches it broadcasts, until
process 0 ends it.
Its relative paths (the workdir, a checkpoint folder) are the driver's: it works in the
driver's directory, which on other hosts must exist there too (a shared filesystem, as the
checkpoints of any trainer group need). That is checked before the group forms: process 0
writes a file in the workdir and every follower must read it back, else the run stops with
one error naming the workdir, the follower and the requirement (`SharedWorkdirError`):
host-local workdirs would each hold some processes' shards of a checkpoint, and a resume
would pick steps no process agrees on (a bucket URL is refused before: asyncrl.errors).

The end: the driver waits for each follower's `follow` (distributed.stop_timeout_s, naming the
actor), then the group leaves jax.distributed together (its shutdown is a barrier over every
process), then the actors are killed. A follower that dies mid-run breaks the lead's next
collective (its connections close): the lead's run fails with TrainerGroupError. One that
fails but lives is logged and killed by a watcher, to the same effect. One that stops (SIGSTOP)
or hangs stops its heartbeat: after distributed.heartbeat_timeout_s the lead exits naming it
(asyncrl/distributed/group_watch.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import sys
import threading

from asyncrl.errors import UserError

log = logging.getLogger(__name__)


class SharedWorkdirError(UserError, RuntimeError):
    """A follower does not see the workdir process 0 writes: it is not one shared folder."""


class TrainerFollower:
    """Trainer-group process `index` (> 0), in a Ray actor. Its environment (device count,
    platform, this asyncrl on the path) is set before the process imports JAX."""

    def __init__(self, index: int, code_version: str = ""):
        self.index = index
        self.code_version = code_version  # the driver's asyncrl fingerprint ('': unchecked)

    def ready(self) -> dict:
        """Where it runs; raises CodeVersionError if it runs other asyncrl than the driver."""
        import ray

        from asyncrl.distributed.code_version import check_code_version

        node = ray.util.get_node_ip_address()
        check_code_version(self.code_version, f"trainer actor {self.index}", node)
        return {"pid": os.getpid(), "node": node}

    def sees(self, path: str, content: str) -> bool:
        """Whether the file process 0 wrote at `path` is here, as it wrote it."""
        try:
            with open(path) as f:
                return f.read() == content
        except OSError:
            return False

    def follow(self, config, workdir: str, group, cwd: str) -> None:
        """Joins the group as process `group.process_id` and follows process 0 until it says
        stop (returns) or fails (raises TrainerGroupError)."""
        if os.path.isdir(cwd):
            os.chdir(cwd)
        from asyncrl.distributed.trainer_group import initialize

        initialize(group)  # before importing the run: that may start JAX's backend
        from asyncrl.run import run

        run(config, workdir)

    def leave(self) -> None:
        """Leaves jax.distributed, at the same time as every other process (a barrier)."""
        import jax

        from asyncrl.distributed import group_watch

        group_watch.stop()  # no heartbeat to a client that is shutting down
        jax.distributed.shutdown()


@dataclasses.dataclass
class Follower:
    index: int
    actor: object
    info: dict
    ref: object = None  # the running `follow` call

    def name(self, n: int) -> str:
        return (f"trainer actor {self.index} (trainer-group process {self.index} of {n}, pid "
                f"{self.info.get('pid')} on {self.info.get('node')})")


class Group:
    """This process's place in the trainer group; a context manager around the run."""

    def __init__(self, n: int = 1, followers: list[Follower] | None = None, cluster=None,
                 stop_timeout_s: float = 30.0):
        self.n, self.followers, self.cluster = n, followers or [], cluster
        self.stop_timeout_s = stop_timeout_s
        self._finishing = threading.Event()
        self._lock = threading.Lock()  # the watcher kills no actor once finish has begun
        self._killed: set[int] = set()
        if self.followers:
            threading.Thread(target=self._watch, name="trainer-actors-watch", daemon=True).start()

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.finish(failed=error is not None)

    def _watch(self) -> None:
        """A follower whose `follow` raised while the run goes on: its error is logged (the
        lead's broken collective only says 'another process') and its actor killed. Alive but
        out of the group, it would leave the lead waiting in a collective that JAX's heartbeat
        cannot end; dead, its connections close and the lead's collective fails at once."""
        import ray

        pending = {f.ref: f for f in self.followers}
        try:
            while pending and not self._finishing.is_set():
                done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in done:
                    follower = pending.pop(ref)
                    try:
                        ray.get(ref)  # returned: process 0 said stop, as it should
                    except Exception as error:  # noqa: BLE001 - reported; the lead fails on it
                        with self._lock:
                            if self._finishing.is_set():
                                return
                            log.error("%s failed during the run: %s; killing it so that the "
                                      "lead's collectives fail rather than wait for it",
                                      follower.name(self.n), _first_line(error))
                            self._killed.add(follower.index)
                            ray.kill(follower.actor)
        except Exception as error:  # noqa: BLE001 - a watcher must not outlive Ray noisily
            if not self._finishing.is_set():
                log.warning("trainer actors: the watcher stopped: %s", _first_line(error))

    def finish(self, failed: bool) -> None:
        """Waits for every follower, leaves the group, frees the actors and (if this process
        started it) Ray. A follower's error is raised unless the lead's own is in flight."""
        if not self.followers:
            return
        import jax
        import ray

        from asyncrl.distributed import group_watch
        from asyncrl.distributed.trainer_ops import TrainerGroupError

        with self._lock:
            self._finishing.set()
        # The run is over (the lead has said stop, or failed): followers that now return, are
        # killed or leave stop beating, and that is no failure.
        group_watch.stop()
        # A killed follower cannot join the shutdown barrier.
        errors, broken = [], bool(self._killed)
        try:
            for follower in self.followers:
                try:
                    ray.get(follower.ref, timeout=self.stop_timeout_s)
                except ray.exceptions.GetTimeoutError:
                    broken = True
                    errors.append(f"{follower.name(self.n)} did not return within "
                                  f"distributed.stop_timeout_s = {self.stop_timeout_s} s; killed")
                except ray.exceptions.RayActorError as error:
                    broken = True
                    errors.append(f"{follower.name(self.n)} died: {_first_line(error)}")
                except Exception as error:  # noqa: BLE001 - its message is passed on
                    errors.append(f"{follower.name(self.n)} failed: {_first_line(error)}")
            if not broken:
                # Every process is alive and out of the run: the shutdown barrier completes.
                leaving = [f.actor.leave.remote() for f in self.followers]
                jax.distributed.shutdown()
                try:
                    ray.get(leaving, timeout=self.stop_timeout_s)
                except Exception as error:  # noqa: BLE001 - the run itself is over
                    log.warning("trainer actors: leaving jax.distributed: %s", _first_line(error))
        finally:
            for follower in self.followers:
                ray.kill(follower.actor)
            self.cluster.close()
        for message in errors:
            log.error("%s", message)
        if errors and not failed:
            raise TrainerGroupError("trainer group: " + "; ".join(errors))


def form_group(c, workdir: str) -> Group:
    """Joins this process to its trainer group before JAX's backend starts: as process 0 of
    distributed.trainer_processes, after starting the other processes as Ray actors; or as
    distributed.* / JAX_* say (one process: nothing to join). `c`: the run's spec
    (asyncrl.config.resolve: checked before Ray starts)."""
    from asyncrl.distributed.gpus import split_machine
    from asyncrl.distributed.trainer_group import initialize

    # Before JAX's backend starts here too: CUDA reads the GPUs this process keeps once.
    split_machine(c.distributed, c.mesh)
    d = c.distributed
    if d.trainer_processes <= 1:
        initialize(d)
        return Group()
    import ray

    from asyncrl.distributed.cluster import connect, reported_addresses
    from asyncrl.distributed.gpus import check_cluster
    from asyncrl.distributed.trainer_group import GroupSettings

    n = d.trainer_processes
    cluster = connect(d)
    followers: list[Follower] = []
    try:
        check_cluster(c.distributed, c.mesh)  # Ray itself would wait for GPUs no node offers without end
        address = coordinator_address(loopback=d.ray_address == "local")
        actor_class = ray.remote(TrainerFollower).options(**follower_options(c))
        from asyncrl.distributed.code_version import CodeVersionError, code_version

        actors = [actor_class.remote(i, code_version()) for i in range(1, n)]
        resources = (f"distributed.trainer_cpus = {d.trainer_cpus}, trainer_gpus = "
                     f"{d.trainer_gpus}, trainer_resource = {d.trainer_resource!r}")
        for i, actor in enumerate(actors, 1):
            try:
                info = ray.get(actor.ready.remote(), timeout=d.start_timeout_s)
            except CodeVersionError as error:  # Ray's wrapper: its cause is the one line
                raise CodeVersionError(str(getattr(error, "cause", error))) from None
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(
                    f"trainer actor {i} (trainer-group process {i} of {n}) was not placed and "
                    f"started within distributed.start_timeout_s = {d.start_timeout_s} s: does "
                    f"the Ray cluster have a node with {resources} free?") from None
            followers.append(Follower(i, actor, info))
        absolute = os.path.abspath(workdir)
        check_shared_workdir(absolute, followers, n, d.start_timeout_s)
        for f in followers:
            f.ref = f.actor.follow.remote(
                c, absolute, GroupSettings(address, n, f.index, d.heartbeat_timeout_s), os.getcwd())
        # The console's line about the group (tests read its addresses).
        print(f"trainer group of {n} processes: coordinator {address}; Ray reports "
              f"{', '.join(reported_addresses())}; "
              + "; ".join(f"process {f.index}: pid {f.info['pid']} on {f.info['node']}"
                          for f in followers), file=sys.stderr, flush=True)
        initialize(GroupSettings(address, n, 0, d.heartbeat_timeout_s),
                   timeout_s=int(d.start_timeout_s))
    except BaseException:
        for f in followers:
            ray.kill(f.actor)
        cluster.close()
        raise
    return Group(n, followers, cluster, d.stop_timeout_s)


def follower_options(c) -> dict:
    """The Ray options of a follower actor (`cluster.actor_options`): this process's platform
    (one jax.distributed job runs on one) and, on a CPU, its device count (JAX's and Orbax's
    multi-process collectives need equal counts)."""
    from asyncrl.distributed.cluster import actor_options
    from asyncrl.host_devices import cpu_device_count

    d = c.distributed
    return actor_options(d.trainer_cpus, d.trainer_gpus, d.trainer_resource,
                         cpu_device_count() or c.mesh.trainer_devices,
                         os.environ.get("JAX_PLATFORMS", ""))


def check_shared_workdir(workdir: str, followers: list[Follower], n: int, timeout_s: float) -> None:
    """Raises SharedWorkdirError unless every follower reads back a file written here in
    `workdir` (see the module docstring)."""
    import ray

    os.makedirs(workdir, exist_ok=True)
    content = secrets.token_hex(16)
    path = os.path.join(workdir, f".trainer-group-{content[:8]}")
    with open(path, "w") as f:
        f.write(content)
    try:
        seen = ray.get([f.actor.sees.remote(path, content) for f in followers], timeout=timeout_s)
    finally:
        os.remove(path)
    for follower, ok in zip(followers, seen):
        if not ok:
            raise SharedWorkdirError(
                f"trainer group: the workdir {workdir} is not shared: {follower.name(n)} does "
                f"not see the file process 0 wrote there. Every process of a trainer group "
                f"saves and restores its shards of one checkpoint in the workdir, so it must be "
                f"the same shared storage (NFS, a mounted bucket) at that path on every host")


def coordinator_address(loopback: bool) -> str:
    """'host:port' for the group's coordinator, in this process: 127.0.0.1 on a loopback-only
    cluster (it then listens there alone), else this node's address as Ray knows it (the one
    the other hosts reach it by). The port is free now; JAX binds it moments later."""
    import ray

    host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host if loopback else "", 0))
        port = s.getsockname()[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _first_line(error: BaseException) -> str:
    # A failed Ray call's error leads with Ray's own header; the follower's exception is its cause.
    error = getattr(error, "cause", None) or error
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"
