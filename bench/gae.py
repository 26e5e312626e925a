"""rlkit's vectorised ``gae`` against the reverse loop over time (DeepSpeed-Chat's form), one
process.

B = 64, T = 1024, float32, one thread, with episode ends present. Both are run alternately, several
rounds, and the median time of each is compared; the outputs are checked to agree first.

    python bench/gae.py            # prints per-round times and the result line
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' oracle lives in tests/
from rlkit.advantages import gae  # noqa: E402
from tests.oracles import deepspeed_chat_gae  # noqa: E402


def make_case(batch: int, length: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, length, generator=gen)
    values = torch.randn(batch, length, generator=gen)
    dones = (torch.rand(batch, length, generator=gen) < 0.02).float()
    last_value = torch.randn(batch, generator=gen)
    return rewards, values, dones, last_value


def time_call(fn, args, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rewards, values, dones, last_value = make_case(args.batch, args.length)
    gamma, lam = 0.99, 0.95

    def ours(*_):
        return gae(rewards, values, gamma, lam, dones=dones, last_value=last_value)

    def loop(*_):
        return deepspeed_chat_gae(rewards, values, gamma, lam, dones=dones, last_value=last_value)

    adv_ours, ret_ours = ours()
    adv_loop, ret_loop = loop()
    torch.testing.assert_close(adv_ours, adv_loop, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ret_ours, ret_loop, rtol=1e-4, atol=1e-4)
    print(
        f"B={args.batch} T={args.length} float32 threads={torch.get_num_threads()}: outputs agree "
        "(1e-4)"
    )

    loop_times, ours_times = [], []
    for round_index in range(args.rounds):
        loop_times.append(time_call(loop, (), args.repeats))
        ours_times.append(time_call(ours, (), args.repeats))
        print(
            f"round {round_index}: loop {loop_times[-1] * 1e3:8.2f} ms   vectorised "
            f"{ours_times[-1] * 1e3:8.2f} ms"
        )
    speedup = statistics.median(loop_times) / statistics.median(ours_times)
    print(f"result: gae_speedup = {speedup:.1f} (goal: >= 10)")


if __name__ == "__main__":
    main()
