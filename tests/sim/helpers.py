"""Small run configs for the simulator tests, built from the real `run_config()`."""

from asyncrl.sim.config import run_config, system_config, systems


def tiny(system="staleflow", *, instances=2, eta=1, batch=4, group=4, slots=0,
         response=None, steps=(1, 3), seed=0):
    """System `system` (a label of `systems()`) on a small cluster and workload."""
    c = run_config()
    c.batch_size = batch
    c.group_size = group
    c.num_slots = slots
    c.warmup_steps, c.measure_steps = steps
    c.response_lengths = response or {
        "name": "lognormal", "median": 200.0, "sigma": 0.8, "cap": 1500}
    c.prompt_lengths = {"name": "constant", "value": 32}
    # A tiny run ends in minutes of virtual time; one that has not after a day deadlocked.
    c.max_sim_time_s = 86_400.0
    return system_config(c, systems(), system, num_instances=instances, eta=eta, seed=seed)
