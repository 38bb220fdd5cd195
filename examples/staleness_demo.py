"""A walk through the staleness protocol on a virtual clock: python examples/staleness_demo.py

Rollout instances generate GRPO groups whose lengths have a long tail, pull new weights as
soon as the trainer publishes them, and the trainer consumes one READY buffer per step. Each
step prints the buffer it trained on and how stale its entries were; the run ends with the
staleness histogram, which never goes past η.
"""

import argparse
import collections
import heapq
import random

from asyncrl.staleness import BufferStatus, StalenessManager


def run(eta: int, batch_size: int, instances: int, steps: int, seed: int) -> collections.Counter:
    rng = random.Random(seed)
    sm = StalenessManager(eta=eta, batch_size=batch_size)
    versions = [0] * instances
    finish_events: list[tuple[float, int, int]] = []  # (time, entry id, instance)
    busy = [False] * instances
    staleness = collections.Counter()
    v_traj_of: dict[int, int] = {}
    clock, next_id, train_until = 0.0, 0, 0.0
    while sm.version < steps:
        for i in range(instances):
            versions[i] = sm.version if train_until <= clock else versions[i]
            if not busy[i] and sm.can_reserve(versions[i]):
                sm.reserve(next_id, versions[i])
                v_traj_of[next_id] = versions[i]
                # Long-tailed generation time: most groups are quick, a few take ten times longer.
                duration = min(rng.lognormvariate(0.0, 1.0), 12.0)
                heapq.heappush(finish_events, (clock + duration, next_id, i))
                busy[i] = True
                next_id += 1
        if sm.status(sm.version) is BufferStatus.READY and train_until <= clock:
            buffer_id = sm.version
            batch = sm.consume()
            lags = [buffer_id - v_traj_of.pop(e) for e in batch]
            staleness.update(lags)
            train_until = clock + 1.0
            print(f"step {buffer_id:3d}  t={clock:7.2f}  trained {len(batch)} entries, "
                  f"staleness mean {sum(lags) / len(lags):.2f} max {max(lags)}")
            continue
        if not finish_events or finish_events[0][0] > train_until > clock:
            clock = train_until  # nothing finishes before the trainer publishes new weights
            continue
        clock, entry_id, instance = heapq.heappop(finish_events)
        sm.occupy(entry_id)
        busy[instance] = False
    return staleness


def main():
    parser = argparse.ArgumentParser(description="Staleness protocol demo on a virtual clock.")
    parser.add_argument("--eta", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--instances", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    histogram = run(args.eta, args.batch_size, args.instances, args.steps, args.seed)
    print(f"staleness histogram (buffer - V_traj, bound eta={args.eta}): {dict(sorted(histogram.items()))}")


if __name__ == "__main__":
    main()
