"""A3C's throughput with 1 and 2 workers on CartPole-v1 (the preset otherwise), alternately, several
rounds.

Each run's throughput is read from its own history: environment steps per wall-clock second between
the first episode that ends after 20% of the run and the last one, so the processes' start-up
(importing torch in a fresh interpreter) is not counted. On a machine with 2 cores the limit is
2.0x.

    python bench/a3c_scaling.py              # 3 rounds of 40k steps per run
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlkit.a3c import A3CConfig, train  # noqa: E402


def steady_throughput(result) -> float:
    steps, times = result.column("step"), result.column("time")
    window = steps >= 0.2 * result.config.total_steps
    steps, times = steps[window], times[window]
    return float((steps[-1] - steps[0]) / (times[-1] - times[0]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40_000)
    args = parser.parse_args()
    rates: dict[int, list[float]] = {1: [], 2: []}
    for round_index in range(args.rounds):
        for workers in (1, 2):
            result = train(
                A3CConfig.for_env(
                    "CartPole-v1",
                    seed=round_index,
                    total_steps=args.steps,
                    num_workers=workers,
                    timeout=600,
                )
            )
            rates[workers].append(steady_throughput(result))
            print(
                f"round {round_index}: {workers} worker(s) {rates[workers][-1]:8.0f} env steps/s",
                flush=True,
            )
    ratios = [two / one for one, two in zip(rates[1], rates[2])]
    print(
        f"median: 1 worker {statistics.median(rates[1]):.0f}, 2 workers "
        f"{statistics.median(rates[2]):.0f} env steps/s; per-round ratios "
        f"{np.round(ratios, 2).tolist()}"
    )
    print(f"result: a3c_scaling_2_workers = {statistics.median(ratios):.2f} (goal: >= 1.7)")


if __name__ == "__main__":
    main()
