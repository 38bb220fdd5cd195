"""`config.distributed`: the backend (one process, or Ray), the trainer group, the weight
transport and the Ray resources and timeouts; checked before Ray or a trainer group starts,
which happens before JAX (and so the rest of the run's checks) can run."""

from __future__ import annotations

from asyncrl.distributed import BACKENDS, TPU_HOST_CHIP_BOUNDS, TRANSPORTS
from asyncrl.sections import Section, fail, int_at_least, positive, registered, section


@section
class DistributedSection(Section):
    name = "distributed"
    backend: str
    transport: str
    transfer_host: str
    ray_address: str
    ray_num_cpus: int
    ray_object_store_mb: int
    instance_cpus: float
    instance_gpus: float
    instance_resource: str
    instance_platform: str
    instances_per_host: int
    trainer_cpus: float
    trainer_gpus: float
    trainer_resource: str
    trainer_processes: int
    num_processes: int
    process_id: int
    coordinator_address: str
    max_instance_restarts: int
    poll_wait_s: float
    heartbeat_timeout_s: float
    start_timeout_s: float
    pull_timeout_s: float
    stop_timeout_s: float

    def check(self) -> None:
        if self.backend not in BACKENDS:
            fail("distributed.backend", self.backend, f"one of {', '.join(BACKENDS)}")
        if self.transport != "auto":
            registered("distributed.transport", self.transport, TRANSPORTS)
            if self.backend not in TRANSPORTS.get(self.transport)["backends"]:
                serving = [n for n in TRANSPORTS.names()
                           if self.backend in TRANSPORTS.get(n)["backends"]]
                fail("distributed.transport", self.transport,
                     f"backend {self.backend!r} moves weights with 'auto' or {', '.join(serving)}")
        for field in ("ray_num_cpus", "ray_object_store_mb", "num_processes",
                      "max_instance_restarts"):
            int_at_least(f"distributed.{field}", getattr(self, field), 0)
        int_at_least("distributed.trainer_processes", self.trainer_processes, 1)
        self._check_trainer_group()
        for field in ("instance_cpus", "instance_gpus", "trainer_cpus", "trainer_gpus"):
            if getattr(self, field) < 0:
                fail(f"distributed.{field}", getattr(self, field), "expected a number ≥ 0 (Ray "
                     "resources)")
        for field in ("poll_wait_s", "heartbeat_timeout_s", "start_timeout_s", "pull_timeout_s",
                      "stop_timeout_s"):
            positive(f"distributed.{field}", getattr(self, field))
        if not self.heartbeat_timeout_s > self.poll_wait_s:
            fail("distributed.heartbeat_timeout_s", self.heartbeat_timeout_s,
                 f"must exceed distributed.poll_wait_s ({self.poll_wait_s}): an idle actor "
                 "answers only that often")
        if not self.ray_address:
            fail("distributed.ray_address", self.ray_address,
                 "'local' (a loopback-only head in this process), 'auto' or 'host:port'")
        if self.instance_platform not in ("", "cpu", "cuda", "gpu", "tpu", "rocm"):
            fail("distributed.instance_platform", self.instance_platform,
                 "'' (as the node has it) or a JAX platform: cpu, cuda, gpu, rocm, tpu")
        if self.instance_platform == "tpu" and self.ray_address == "local":
            fail("distributed.instance_platform", self.instance_platform,
                 "not 'tpu' with distributed.ray_address = 'local': each TPU instance owns its "
                 "host's first chips, and here the trainer and every instance share one host "
                 "(one TPU VM: the local backend; a slice: launch/tpu_vms.sh or tpu_slice.sh)")
        int_at_least("distributed.instances_per_host", self.instances_per_host, 1)
        if self.instances_per_host > 1 and not (self.instance_platform == "tpu"
                                                and self.instance_resource):
            fail("distributed.instances_per_host", self.instances_per_host,
                 "1 unless distributed.instance_platform = 'tpu' and an instance_resource "
                 "names the hosts: several instances share a TPU host by owning a block of "
                 "its chips each (on GPUs Ray hands each instance its own)")
        if self.coordinator_address not in ("", "auto") and ":" not in self.coordinator_address:
            fail("distributed.coordinator_address", self.coordinator_address,
                 "'' (from JAX_COORDINATOR_ADDRESS), 'host:port' of process 0, or 'auto' (a TPU "
                 "slice: JAX reads the group from the VM's metadata)")
        if self.process_id < -1 or (self.num_processes and self.process_id >= self.num_processes):
            fail("distributed.process_id", self.process_id,
                 f"-1 (from JAX_PROCESS_ID) or an int in [0, distributed.num_processes = "
                 f"{self.num_processes})")

    def _check_trainer_group(self) -> None:
        if self.trainer_processes <= 1:
            return
        if self.backend != "ray":
            fail("distributed.trainer_processes", self.trainer_processes,
                 f"1 with distributed.backend={self.backend!r}: the other trainer processes are "
                 "Ray actors (backend='ray'); without Ray start every process yourself "
                 "(distributed.num_processes, process_id, coordinator_address)")
        for field, unset in (("num_processes", 0), ("process_id", -1),
                             ("coordinator_address", "")):
            if getattr(self, field) != unset:
                fail("distributed.trainer_processes", self.trainer_processes,
                     f"1 when distributed.{field} is set ({getattr(self, field)!r}): "
                     "trainer_processes > 1 has the driver spawn its group as Ray actors, "
                     f"distributed.{field} is for a group whose every process runs the command")

    def check_instance_chips(self, devices_per_instance: int) -> None:
        """A TPU instance is a process owning a block of its host's chips
        (config.mesh.devices_per_instance), one of instances_per_host blocks."""
        if self.instance_platform != "tpu":
            return
        if devices_per_instance not in TPU_HOST_CHIP_BOUNDS:
            *most, last = TPU_HOST_CHIP_BOUNDS
            fail("mesh.devices_per_instance", devices_per_instance,
                 f"{', '.join(map(str, most))} or {last} with distributed.instance_platform = "
                 "'tpu': each instance is a TPU process owning that many of its host's chips")
        most = max(TPU_HOST_CHIP_BOUNDS)
        if devices_per_instance * self.instances_per_host > most:
            fail("distributed.instances_per_host", self.instances_per_host,
                 f"at most {most // devices_per_instance} instances of "
                 f"{devices_per_instance} chip(s) (mesh.devices_per_instance) on a TPU host "
                 f"of at most {most} chips")
