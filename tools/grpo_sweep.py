"""GRPO and its family on the sort task (Chapter 11): each variant of ``VARIANTS`` from each seed's
under-trained SFT start, scored on held-out prompts every ``--eval-every`` iterations, and PPO on
the task's reward (Chapter 10's trainer, with its critic and reference) beside them. Chapter 11's
figures and tables read the results file.

    python tools/grpo_sweep.py --seeds 0 1 2 --out book/data/grpo_sweep.json

Each record is one run: its variant, seed and settings, the held-out scores at each evaluation
(``evaluate``: greedy and sampled exact match, and the wall time so far), the training history
averaged over blocks of ``--block`` iterations, as columns (reward, zero-variance groups, entropy,
clip fraction, lengths, seconds per iteration), and the process's peak resident memory. The runs
go ``--jobs`` at a time, one thread each, each in a fresh process (so that the peak memory is the
run's own).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from rlkit.llm.grpo import GRPOConfig, GRPOTrainer
from rlkit.llm.rlhf_ppo import RLHFPPOConfig, RLHFPPOTrainer
from rlkit.llm.sft import sft_starting_point

FOUR_STEPS = dict(minibatch_size=16)  # four AdamW steps per batch of 64: the ratio leaves 1
VARIANTS = {
    # the chapter's settings: partial credit, temperature 0.6, one step per batch
    "grpo": {},
    # RLOO's baseline, unscaled, with GRPO's per-completion normaliser (RLOO itself sums tokens)
    "rloo": dict(baseline="leave_one_out", scale="none"),
    "dr_grpo": dict(scale="none", loss_type="dr_grpo"),
    # the reward and the temperature: how many groups carry a signal
    "exact_t1": dict(reward="exact", temperature=1.0),
    "exact_t1_dynamic": dict(reward="exact", temperature=1.0, dynamic_sampling_rounds=3),
    "exact_t06": dict(reward="exact"),
    "positions_t1": dict(temperature=1.0),
    # several steps per batch, where clipping acts
    "token_4steps": FOUR_STEPS,
    "clip_higher_4steps": dict(FOUR_STEPS, clip_eps_high=0.28),
    "dapo_4steps": dict(
        FOUR_STEPS, clip_eps_high=0.28, loss_type="dapo", dynamic_sampling_rounds=3
    ),
    "gspo_4steps": dict(
        FOUR_STEPS, importance_sampling="sequence", clip_eps=3e-4, clip_eps_high=4e-4
    ),
    # Chapter 10's PPO on the task's exact-match reward, with its critic and reference
    "ppo": dict(trainer="ppo", reward="task", kl_coef=0.05, critic_from="policy"),
}
HISTORY_FIELDS = (
    "reward",
    "score",
    "exact_match_sampled",
    "zero_variance_groups",
    "zero_variance_groups_trained",
    "sampling_rounds",
    "entropy",
    "clip_fraction",
    "completion_length",
    "response_length",
    "truncated",
    "kl",
)


def build(variant: str, seed: int, iterations: int, sft_folder: Path):
    settings = dict(VARIANTS[variant])
    if settings.pop("trainer", "grpo") == "ppo":
        config = RLHFPPOConfig(
            sft_folder=str(sft_folder), seed=seed, num_iterations=iterations, **settings
        )
        return RLHFPPOTrainer(config)
    config = GRPOConfig(
        sft_folder=str(sft_folder), seed=seed, num_iterations=iterations, **settings
    )
    return GRPOTrainer(config)


def blocks(history: list[dict], size: int) -> dict[str, list[float]]:
    """The history's means over consecutive blocks of ``size`` iterations, as columns (one list
    per field, with the block's last ``iteration``); an iteration's ``seconds`` are the sum of
    its phases."""
    columns: dict[str, list[float]] = {"iteration": []}
    for start in range(0, len(history), size):
        block = history[start : start + size]
        columns["iteration"].append(block[-1]["iteration"])
        for field in HISTORY_FIELDS:
            if field in block[0]:
                columns.setdefault(field, []).append(float(np.mean([r[field] for r in block])))
        seconds = [sum(v for k, v in r.items() if k.startswith("seconds_")) for r in block]
        columns.setdefault("seconds", []).append(float(np.mean(seconds)))
    return columns


def run(task: tuple) -> dict:
    """One run, scored before training and every ``eval_every`` iterations."""
    cache, variant, seed, iterations, eval_every, prompts, block = task
    torch.set_num_threads(1)
    sft_folder = sft_starting_point(cache / f"sft-start-{seed}", seed=seed)
    trainer = build(variant, seed, iterations, sft_folder)
    scores = [dict(iteration=0, seconds=0.0, **summary(trainer.evaluate(prompts)))]
    start = time.perf_counter()
    while not trainer.finished:
        trainer.run_update()
        if trainer.updates_done % eval_every == 0 or trainer.finished:
            seconds = time.perf_counter() - start
            evaluation = summary(trainer.evaluate(prompts))
            scores.append(dict(iteration=trainer.updates_done, seconds=seconds, **evaluation))
    record = dict(
        variant=variant,
        seed=seed,
        settings=VARIANTS[variant],
        iterations=iterations,
        scores=scores,
        history=blocks(trainer.history, block),
        peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    print(json.dumps({k: record[k] for k in ("variant", "seed")} | scores[-1]), flush=True)
    return record


def summary(evaluation: dict) -> dict:
    return {
        key: float(evaluation[key])
        for key in ("exact_match", "exact_match_sampled", "kl")
        if key in evaluation
    }


def rounded(value):
    """``value`` with every float to 5 significant digits (a results file a reader can diff)."""
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [rounded(item) for item in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--iterations", type=int, default=GRPOConfig.num_iterations)
    parser.add_argument(
        "--ppo-iterations", type=int, default=240, help="PPO's (about GRPO's wall time)"
    )
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--block", type=int, default=10, help="iterations per history point")
    parser.add_argument("--prompts", type=int, default=500, help="held-out prompts scored")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("_build/rlhf-cache"))
    parser.add_argument("--out", type=Path, default=Path("_build/grpo_sweep.json"))
    args = parser.parse_args()
    cache = args.cache.resolve()
    for seed in args.seeds:  # built once, before the runs that share them
        sft_starting_point(cache / f"sft-start-{seed}", seed=seed)
    tasks = [
        (
            cache,
            variant,
            seed,
            args.ppo_iterations if variant == "ppo" else args.iterations,
            args.eval_every,
            args.prompts,
            args.block,
        )
        for variant, seed in itertools.product(args.variants, args.seeds)
    ]
    context = get_context("spawn")
    with context.Pool(args.jobs, maxtasksperchild=1) as pool:
        records = pool.map(run, tasks, chunksize=1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rounded(records), separators=(",", ":")))
    print(f"wrote {args.out}: {len(tasks)} runs")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
