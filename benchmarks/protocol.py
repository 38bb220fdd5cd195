"""Throughput of the staleness protocol on one core: reserve + occupy + consume per second.

A central coordinator serves every rollout instance, so the protocol must never be the
bottleneck: at 1,000 instances finishing a group every few seconds it sees a few hundred
entries per second; the goal is ≥ 100k entries/s.

    python benchmarks/protocol.py [--entries=200000] [--eta=2] [--batch_size=512]

The last line is JSON: {"entries_per_s": …, "ops_per_s": …, "vs_goal": …}.
"""

import argparse
import json
import random
import time

from asyncrl.cli import exit_on_user_error, int_at_least
from asyncrl.staleness import BufferStatus, StalenessManager

GOAL_ENTRIES_PER_S = 100_000


def run(entries: int, eta: int, batch_size: int, instances: int, seed: int) -> float:
    """Simulates instances at mixed versions completing entries out of order; returns seconds."""
    rng = random.Random(seed)
    # Random choices are drawn up front so the timed loop measures the protocol, not the RNG.
    draws = 4 * entries
    picks = [rng.randrange(instances) for _ in range(draws)]
    completions = [rng.random() for _ in range(draws)]
    sm = StalenessManager(eta=eta, batch_size=batch_size)
    instance_versions = [0] * instances
    in_flight: list[int] = []
    next_id = 0
    consumed = 0
    step = 0
    start = time.perf_counter()
    while consumed < entries:
        i = picks[step % draws]
        step += 1
        dispatched = sm.can_reserve(instance_versions[i])
        if dispatched:
            sm.reserve(next_id, instance_versions[i])
            in_flight.append(next_id)
            next_id += 1
        else:
            instance_versions[i] = sm.version
        # Keep about a batch in flight; when no slot is left, only completions free one.
        if in_flight and (len(in_flight) > batch_size or not dispatched):
            # Complete a random in-flight entry: response lengths make the order random.
            j = int(completions[step % draws] * len(in_flight))
            in_flight[j], in_flight[-1] = in_flight[-1], in_flight[j]
            sm.occupy(in_flight.pop())
        if sm.status(sm.version) is BufferStatus.READY:
            consumed += len(sm.consume())
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int_at_least(1), default=200_000)
    parser.add_argument("--eta", type=int_at_least(0), default=2)
    parser.add_argument("--batch_size", type=int_at_least(1), default=512)
    parser.add_argument("--instances", type=int_at_least(1), default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    seconds = run(args.entries, args.eta, args.batch_size, args.instances, args.seed)
    entries_per_s = args.entries / seconds
    # reserve, occupy and the entry's share of consume are three protocol operations.
    print(f"{args.entries} entries, eta={args.eta}, B={args.batch_size}, "
          f"{args.instances} instances: {seconds:.2f} s")
    print(json.dumps({
        "entries_per_s": round(entries_per_s),
        "ops_per_s": round(3 * entries_per_s),
        "vs_goal": round(entries_per_s / GOAL_ENTRIES_PER_S, 2),
    }))


if __name__ == "__main__":
    exit_on_user_error(main)
