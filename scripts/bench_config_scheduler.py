"""The scheduler across configs: what one decision costs (config_scheduler.allocate).

Prints one JSON object: microseconds per allocate() call for a number of configs with a full
history each (the last `--evaluations` decided generations), median of `--repeats` timed
rounds; the gate calls it every `scheduler.interval_s` and on each promotion, so this is the
scheduler's whole CPU cost on a node.

    python scripts/bench_config_scheduler.py --configs 2 4 16 --evaluations 64
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from app.config.configs import SchedulerConfig
from app.coordination.pipeline.config_scheduler import ConfigHistory, Evaluation, allocate


def histories(n: int, evaluations: int, rng: random.Random) -> list[ConfigHistory]:
    out = []
    for i in range(n):
        elo, cpu, evs = 0.0, 0.0, []
        for _ in range(evaluations):
            cpu += rng.uniform(0.05, 0.5)
            elo += rng.gauss(20.0, 40.0)
            evs.append(Evaluation(cpu, elo))
        out.append(ConfigHistory(f"c{i}", rng.uniform(0.5, 2.0), tuple(evs), rng.uniform(0.0, 3.0)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", type=int, nargs="+", default=[2, 4, 16])
    p.add_argument("--evaluations", type=int, default=64)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    rng = random.Random(0)
    cfg = SchedulerConfig()
    result: dict[str, object] = {"evaluations": args.evaluations, "calls": args.calls, "us_per_decision": {}}
    for n in args.configs:
        hs = histories(n, args.evaluations, rng)
        rounds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(args.calls):
                allocate(hs, cfg)
            rounds.append((time.perf_counter() - start) / args.calls * 1e6)
        result["us_per_decision"][str(n)] = round(statistics.median(rounds), 2)  # type: ignore[index]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
