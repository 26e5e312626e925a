"""Two ``torchrun`` ranks against the single process, seed by seed: Chapter 11's GRPO (8 prompts x 8
completions, 4 prompts per rank) for ``--iterations`` from one under-trained SFT start, each run's
held-out greedy exact match on ``--prompts`` prompts. ``tests/systems/test_spmd_learning.py`` holds
seeds 0 to 2 to it; this prints any seeds' numbers (the closing notes report seeds 3 to 7).

    python tools/spmd_spread.py --seeds 3 4 5 6 7
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from rlkit.llm.grpo import GRPOConfig, GRPOTrainer
from rlkit.llm.sft import sft_starting_point
from rlkit.systems.spmd import launch
from rlkit.training import fit


def exact_match(config: GRPOConfig, prompts: int, weights: dict | None = None) -> float:
    trainer = GRPOTrainer(config)
    if weights is not None:
        trainer.model.load_state_dict(weights)
    return trainer.evaluate(prompts)["exact_match"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--prompts", type=int, default=200, help="held-out prompts")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "spmd_spread")
    args = parser.parse_args()
    sft = str(sft_starting_point(args.cache / "sft-start-0", seed=0))
    print(f"start: {exact_match(GRPOConfig(sft_folder=sft), args.prompts):.3f}")
    for seed in args.seeds:
        config = GRPOConfig(sft_folder=sft, seed=seed, num_iterations=args.iterations)
        trainer = GRPOTrainer(config)
        fit(trainer)
        single = trainer.evaluate(args.prompts)["exact_match"]
        out = Path(tempfile.mkdtemp(prefix=f"spmd_spread_{seed}_"))
        launch(config, out, nproc=2)
        ranks = exact_match(config, args.prompts, torch.load(out / "state.pt")["model"])
        print(f"seed {seed}: single process {single:.3f}, two ranks {ranks:.3f}", flush=True)


if __name__ == "__main__":
    main()
