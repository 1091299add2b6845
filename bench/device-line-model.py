#!/usr/bin/env python3
"""Scenario 17's shared device alone, as a model: what a pool held to its GPU share costs its
light neighbours when nothing but the device's line is in the way (no sidecar, no client, no
scheduler, no timer ticks).

    bench/device-line-model.py [SECONDS] [SEEDS]

The device runs one batch at a time, in the order the simulators asked for it (`tei-sim
--shared-device`'s ticket line); a simulator with work asks once, with what it holds then, and
asks again when that batch is done. A batch takes 2 ms + 50 us a token, 16 tokens a call, at most
8 calls (scenario 17's `shared_gpu`). Light pools B, C and D send Poisson calls at 42 a second each
(0.2x a pool's share); pool A always has work and asks with `A_BATCH` calls (its sidecar's 2 in
flight) while its credit of device time is not below zero: the credit grows at its share (25 % of
each second), shrinks while A's batch holds the device, and holds at most a burst (50 ms), as
`multiplexer/src/admission/device_time.rs` keeps it under `--gpu-share`.

Prints each light call's latency (arrival to its batch's end) p50 and p99 without A and beside it,
and their ratio, per seed: for the sidecar's share as it is, and for three ways it could be
otherwise (A's batches of one call; A's credit paced a batch at a time, a burst of 4 ms; a share of
15 %). A diagnostic, not a benchmark: it judges nothing and measures nothing;
it says how much of scenario 17's light p99 ratio the device's line alone accounts for.
"""
import random
import sys

FIXED, PER_TOKEN, TOKENS, MAX_BATCH = 0.002, 0.00005, 16, 8
LIGHT_RATE, LIGHTS = 42.0, ("B", "C", "D")


def batch_time(calls):
    return FIXED + PER_TOKEN * TOKENS * calls


def light_latencies(seconds, seed, share=None, a_batch=2, burst=0.050):
    """Each light call's latency, in seconds; A at `share` of the device (None: A idle)."""
    rnd = random.Random(seed)
    arrivals = []
    for pool in LIGHTS:
        t = 0.0
        while True:
            t += rnd.expovariate(LIGHT_RATE)
            if t >= seconds:
                break
            arrivals.append((t, pool))
    arrivals.sort()
    held = {pool: [] for pool in LIGHTS}  # calls a light simulator holds, not yet in line
    in_line = {pool: False for pool in LIGHTS + ("A",)}
    line = []  # (pool, arrival times of its calls), in the order asked
    credit, now, next_arrival, latencies = burst, 0.0, 0, []

    def earn(until, a_running):
        nonlocal credit
        if share is not None:
            spent = until - now if a_running else 0.0
            credit = min(burst, credit + (until - now) * share - spent)

    def arrive(at):
        nonlocal next_arrival
        _, pool = arrivals[next_arrival]
        next_arrival += 1
        held[pool].append(at)
        if not in_line[pool]:
            line.append((pool, held[pool][:MAX_BATCH]))
            del held[pool][:MAX_BATCH]
            in_line[pool] = True

    while next_arrival < len(arrivals) or line:
        if share is not None and not in_line["A"] and credit >= 0.0:
            line.append(("A", []))
            in_line["A"] = True
        if not line:
            # Idle: until the next call, or A's credit is back.
            wake = [arrivals[next_arrival][0]]
            if share is not None and credit < 0.0:
                wake.append(now - credit / share + 1e-9)
            at = min(wake)
            earn(at, False)
            now = at
            if now >= arrivals[next_arrival][0]:
                arrive(now)
            continue
        pool, calls = line.pop(0)
        end = now + batch_time(a_batch if pool == "A" else len(calls))
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] < end:
            at = arrivals[next_arrival][0]
            earn(at, pool == "A")
            now = at
            arrive(at)
        earn(end, pool == "A")
        now = end
        in_line[pool] = False
        latencies.extend(end - arrived for arrived in calls)
        if pool != "A" and held[pool]:
            line.append((pool, held[pool][:MAX_BATCH]))
            del held[pool][:MAX_BATCH]
            in_line[pool] = True
        if next_arrival >= len(arrivals) and all(p == "A" for p, _ in line):
            break
    return sorted(latencies)


def pct(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))] * 1000.0


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    variants = [
        ("A at a 25 % share", {"share": 0.25}),
        ("A's batches of one call", {"share": 0.25, "a_batch": 1}),
        ("A's credit a 4 ms burst", {"share": 0.25, "burst": 0.004}),
        ("A at a 15 % share", {"share": 0.15}),
    ]
    for seed in range(seeds):
        alone = light_latencies(seconds, seed)
        print(f"seed {seed}: light p50 / p99 without A {pct(alone, 0.5):.2f} / {pct(alone, 0.99):.2f} ms")
        for name, options in variants:
            beside = light_latencies(seconds, seed, **options)
            print(
                f"  {name}: {pct(beside, 0.5):.2f} / {pct(beside, 0.99):.2f} ms, "
                f"p99 ratio {pct(beside, 0.99) / pct(alone, 0.99):.2f}"
            )


if __name__ == "__main__":
    main()
