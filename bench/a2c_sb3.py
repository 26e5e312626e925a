"""rlkit's A2C against Stable-Baselines3's A2C on CartPole-v1, with the same settings, in one
process.

rl-baselines3-zoo's CartPole-v1 A2C: 8 envs, n_steps 5, RMSprop (lr 7e-4, alpha 0.99, eps 1e-5),
gamma 0.99, gae_lambda 1, ent_coef 0, vf_coef 0.5, max_grad_norm 0.5, separate 64-64 tanh actor and
critic, orthogonal init. One torch thread for both. Each round trains, alternately, SB3, rlkit on
Gymnasium's SyncVectorEnv (the same CartPole code SB3 steps) and rlkit with its preset (the batched
CartPole), timing training only; the medians of env steps per second are compared.

    python bench/a2c_sb3.py                   # 3 rounds of 50k steps each
    python bench/a2c_sb3.py --steps 500000    # full runs, also evaluated greedily (100 episodes)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlkit import a2c  # noqa: E402
from rlkit.training import greedy_returns  # noqa: E402


def run_sb3(steps: int, seed: int, evaluate: bool) -> tuple[float, float | None]:
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    model = A2C(
        "MlpPolicy",
        make_vec_env("CartPole-v1", n_envs=8, seed=seed),
        n_steps=5,
        learning_rate=7e-4,
        gamma=0.99,
        gae_lambda=1.0,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        rms_prop_eps=1e-5,
        use_rms_prop=True,
        normalize_advantage=False,
        seed=seed,
        device="cpu",
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    rate = steps / (time.perf_counter() - start)
    score = None
    if evaluate:
        act = lambda obs: torch.as_tensor(model.predict(obs.numpy(), deterministic=True)[0])  # noqa: E731
        score = float(greedy_returns("CartPole-v1", act, 100).mean())
    return rate, score


def run_rlkit(steps: int, seed: int, batched: bool, evaluate: bool) -> tuple[float, float | None]:
    config = a2c.A2CConfig.for_env("CartPole-v1", seed=seed, total_steps=steps, batched_env=batched)
    start = time.perf_counter()
    result = a2c.train(config)
    rate = result.history[-1]["step"] / (time.perf_counter() - start)
    return rate, (a2c.evaluate(result) if evaluate else None)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    evaluate = args.steps >= 500_000
    runners = {
        "sb3": lambda seed: run_sb3(args.steps, seed, evaluate),
        "rlkit (gymnasium SyncVectorEnv)": lambda seed: run_rlkit(
            args.steps, seed, False, evaluate
        ),
        "rlkit (preset: batched CartPole)": lambda seed: run_rlkit(
            args.steps, seed, True, evaluate
        ),
    }
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for round_index in range(args.rounds):
        for name, runner in runners.items():
            rate, score = runner(round_index)
            rates[name].append(rate)
            scored = "" if score is None else f", greedy return {score:.1f}"
            print(f"round {round_index}: {name:<34} {rate:8.0f} env steps/s{scored}", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, median in medians.items():
        print(f"median {name:<34} {median:8.0f} env steps/s   ({median / medians['sb3']:.2f}x SB3)")
    same_envs = medians["rlkit (gymnasium SyncVectorEnv)"] / medians["sb3"]
    print(f"result: a2c_speedup_vs_sb3_same_envs = {same_envs:.2f} (goal: >= 3)")
    print(
        "result: a2c_speedup_vs_sb3 = "
        f"{medians['rlkit (preset: batched CartPole)'] / medians['sb3']:.2f} (goal: >= 3)"
    )


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
