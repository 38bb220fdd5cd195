"""Small run configs for the simulator tests, built from the real `run_config()`."""

from asyncrl.sim.config import run_config


def tiny(schedule="staleflow", *, instances=2, eta=1, batch=4, group=4, slots=0,
         response=None, steps=(1, 3), seed=0):
    c = run_config()
    c.schedule = schedule
    c.num_instances = instances
    c.eta = eta
    c.batch_size = batch
    c.group_size = group
    c.num_slots = slots
    c.seed = seed
    c.warmup_steps, c.measure_steps = steps
    c.response_lengths = response or {
        "name": "lognormal", "median": 200.0, "sigma": 0.8, "cap": 1500}
    c.prompt_lengths = {"name": "constant", "value": 32}
    # A tiny run ends in minutes of virtual time; one that has not after a day deadlocked.
    c.max_sim_time_s = 86_400.0
    return c
