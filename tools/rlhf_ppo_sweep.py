"""Reward over-optimisation, measured the way Gao et al. (2023) did: PPO against Chapter 9's learned
reward (the proxy) at several KL coefficients, and for each run the proxy score, the labeller's
noiseless rule (the gold score) and the task's exact match (the truth) on held-out prompts, before
and after, with the KL to the reference.

    python tools/rlhf_ppo_sweep.py --seeds 0 1 2 --kl-coefs 0.05 0.3 1.0 --iterations 100 \
        --out _build/rlhf_ppo_sweep.json

Each seed's SFT starting point (``sft_starting_point``) and reward model are built once under
``--cache`` and reused. A first version for Chapter 10 (issue 19): its settings are not tuned yet.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from rlkit.llm.generation import generate
from rlkit.llm.reward_model import RewardModelConfig, score, train_reward_model
from rlkit.llm.rlhf_ppo import RLHFPPOConfig, RLHFPPOTrainer
from rlkit.llm.sft import sft_starting_point
from rlkit.llm.tasks import PreferenceOracle


def reward_model_folder(cache: Path, seed: int, sft_folder: Path) -> Path:
    """Chapter 9's reward model for ``seed``, trained from the SFT model once and saved."""
    folder = cache / f"reward-model-{seed}"
    if not (folder / "config.json").exists():
        result = train_reward_model(RewardModelConfig(sft_model_path=str(sft_folder), seed=seed))
        result.model.save_pretrained(folder)
        result.tokenizer.save_pretrained(folder)
    return folder


def held_out_scores(trainer: RLHFPPOTrainer, oracle: PreferenceOracle, count: int) -> dict:
    """Greedy responses to ``count`` held-out prompts: exact match, gold score, proxy score."""
    prompts = [example.prompt for example in trainer.data.heldout[:count]]
    texts = generate(
        trainer.model, trainer.tokenizer, prompts, trainer.config.max_new_tokens, greedy=True
    ).texts(trainer.tokenizer)
    proxy = score(trainer.reward_model, trainer.reward_tokenizer, prompts, texts)
    return {
        "exact_match": sum(map(trainer.task.reward, prompts, texts)) / count,
        "gold": sum(map(oracle.score, prompts, texts)) / count,
        "proxy": float(proxy.mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--kl-coefs", type=float, nargs="+", default=[0.05, 0.3, 1.0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--heldout", type=int, default=200, help="held-out prompts scored")
    parser.add_argument("--cache", type=Path, default=Path("_build/rlhf-cache"))
    parser.add_argument("--out", type=Path, default=Path("_build/rlhf_ppo_sweep.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    oracle, results = PreferenceOracle(), []
    for seed in args.seeds:
        sft_folder = sft_starting_point(args.cache / f"sft-{seed}", seed=seed)
        rm_folder = reward_model_folder(args.cache, seed, sft_folder)
        for kl_coef in args.kl_coefs:
            config = RLHFPPOConfig(
                sft_folder=str(sft_folder),
                reward_model_folder=str(rm_folder),
                seed=seed,
                kl_coef=kl_coef,
                num_iterations=args.iterations,
                learning_rate=1e-4,
                minibatch_size=16,
            )
            trainer = RLHFPPOTrainer(config)
            before, start = held_out_scores(trainer, oracle, args.heldout), time.perf_counter()
            while not trainer.finished:
                trainer.run_update()
            seconds = time.perf_counter() - start
            after = held_out_scores(trainer, oracle, args.heldout)
            kl = trainer.history[-1]["kl"]
            row = dict(
                seed=seed,
                kl_coef=kl_coef,
                before=before,
                after=after,
                kl=kl,
                sqrt_kl=max(kl, 0.0) ** 0.5,
                seconds=seconds,
            )
            results.append(row)
            print(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
