"""The coordinator core a simulated run's config describes: the live system's core, built by
the same builder (`asyncrl.coordinator.build.build_core`) from the same `coordinator` schema;
only the run's shape is read from the sim config and its profile.
"""

from __future__ import annotations

from asyncrl.coordinator.build import RunShape, build_core
from asyncrl.coordinator.core import Core
from asyncrl.coordinator.records import PromptSource
from asyncrl.sim.config import coordinator_section
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.sim.profile import Profile


def batch_size(c) -> int:
    """B in entries: fixed, or (batch_size = 0) groups_per_instance × instances."""
    return c.batch_size or max(1, round(c.groups_per_instance * c.num_instances))


def num_slots(c, profile: Profile) -> int:
    return c.num_slots or profile.num_slots


def sim_shape(c, profile: Profile, max_new_tokens: int) -> RunShape:
    """The shape of the simulated run `c`: the profile gives the slots (where `num_slots` is
    0) and the step latency; `max_new_tokens` is the response lengths' cap."""
    return RunShape(eta=c.eta, lead=c.lead, batch_size=batch_size(c),
                    num_instances=c.num_instances, num_slots=num_slots(c, profile),
                    group_size=c.group_size, max_new_tokens=max_new_tokens,
                    latency=profile.latency, shared_cores=c.shared_cores)


def core_from_sim_config(c, profile: Profile, server: TrajectoryServer, prompts: PromptSource,
                         max_new_tokens: int) -> Core:
    return build_core(coordinator_section(c), sim_shape(c, profile, max_new_tokens), server,
                      prompts)
