"""Reward over-optimisation, measured the way Gao et al. (2023) did: PPO against Chapter 9's learned
reward (the proxy) at several KL coefficients, and PPO on the task's verifiable reward beside it.
Every ``--eval-every`` iterations each run is scored on held-out prompts
(``RLHFPPOTrainer.evaluate``): the proxy score, the labeller's noiseless rule (the gold score) and
the task's exact match (the truth), greedy and sampled, with the KL to the reference. Chapter 10's
figure reads the results file.

    python tools/rlhf_ppo_sweep.py --seeds 0 1 2 --kl-coefs 0.01 0.03 0.1 0.3 1.0 \
        --out book/data/rlhf_ppo_sweep.json

Each seed's SFT starting point (``sft_starting_point``) and reward model
(``reward_model_starting_point``) are built once under ``--cache`` and reused; the runs go
``--jobs`` at a time, one thread each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from multiprocessing import get_context
from pathlib import Path

import torch

from rlkit.llm.reward_model import rlhf_starting_point
from rlkit.llm.rlhf_ppo import RLHFPPOConfig, RLHFPPOTrainer


def run(task: tuple) -> list[dict]:
    """One PPO run, scored before training and every ``eval_every`` iterations."""
    cache, seed, reward, kl_coef, iterations, eval_every, prompts = task
    torch.set_num_threads(1)
    sft_folder, rm_folder = rlhf_starting_point(cache, seed)
    config = RLHFPPOConfig(
        sft_folder=str(sft_folder),
        reward_model_folder=str(rm_folder),
        reward=reward,
        critic_from="reward_model" if reward == "model" else "policy",
        seed=seed,
        kl_coef=kl_coef,
        num_iterations=iterations,
    )
    trainer, rows, start = RLHFPPOTrainer(config), [], time.perf_counter()
    setting = dict(seed=seed, reward=reward, kl_coef=kl_coef)
    rows.append(dict(setting, iteration=0, seconds=0.0, **trainer.evaluate(prompts)))
    while not trainer.finished:
        trainer.run_update()
        if trainer.updates_done % eval_every == 0 or trainer.finished:
            seconds = time.perf_counter() - start
            scores = trainer.evaluate(prompts)
            rows.append(dict(setting, iteration=trainer.updates_done, seconds=seconds, **scores))
    print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kl-coefs", type=float, nargs="+", default=[0.01, 0.03, 0.1, 0.3, 1.0])
    parser.add_argument(
        "--task-kl-coef", type=float, default=0.05, help="kl_coef of the task-reward runs"
    )
    parser.add_argument("--iterations", type=int, default=RLHFPPOConfig.num_iterations)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=500, help="held-out prompts scored")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("_build/rlhf-cache"))
    parser.add_argument("--out", type=Path, default=Path("_build/rlhf_ppo_sweep.json"))
    args = parser.parse_args()
    settings = [("model", kl) for kl in args.kl_coefs] + [("task", args.task_kl_coef)]
    # setting by setting, so that the pool's first runs build different seeds' starting points
    # side by side (a seed's later runs wait for its build, under its lock)
    tasks = [
        (args.cache, seed, reward, kl, args.iterations, args.eval_every, args.prompts)
        for (reward, kl), seed in itertools.product(settings, args.seeds)
    ]
    with get_context("spawn").Pool(args.jobs) as pool:
        rows = [row for rows in pool.map(run, tasks, chunksize=1) for row in rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=0))
    print(f"wrote {args.out}: {len(tasks)} runs")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
