"""Two ``torchrun`` ranks learn as the single process does: after their first iteration their
sampling streams are not the single process's (rank 1 samples from a stream of its own), so the
runs part, and what is left to check is that data parallelism learns as well as one process,
within the spread of the single process's seeds. Chapter 11's settings (8 prompts x 8
completions, 4 prompts per rank) for 150 iterations from one under-trained SFT start."""

import pytest
import torch

from rlkit.llm.grpo import GRPOConfig, GRPOTrainer
from rlkit.llm.sft import sft_starting_point
from rlkit.systems.spmd import launch
from rlkit.training import fit

pytestmark = [pytest.mark.learning, pytest.mark.alone]

SEEDS = (0, 1, 2)
ITERATIONS = 150
HELD_OUT = 200  # prompts
# how far outside the single process's seeds a run on two ranks may land: about one and a half
# times the seeds' standard deviation of held-out exact match at 150 iterations (about 0.03)
MARGIN = 0.05


def held_out_exact_match(config: GRPOConfig, weights: dict | None = None) -> float:
    trainer = GRPOTrainer(config)
    if weights is not None:
        trainer.model.load_state_dict(weights)
    return trainer.evaluate(HELD_OUT)["exact_match"]


def test_two_ranks_learn_within_the_spread_of_the_single_process_s_seeds(run_cache, tmp_path):
    sft = str(sft_starting_point(run_cache.folder / "sft-start-0", seed=0))
    start = held_out_exact_match(GRPOConfig(sft_folder=sft))
    single, ranks = [], []
    for seed in SEEDS:
        config = GRPOConfig(sft_folder=sft, seed=seed, num_iterations=ITERATIONS)
        trainer = GRPOTrainer(config)
        fit(trainer)
        single.append(trainer.evaluate(HELD_OUT)["exact_match"])
        launch(config, tmp_path / f"seed{seed}", nproc=2)
        weights = torch.load(tmp_path / f"seed{seed}" / "state.pt")["model"]
        ranks.append(held_out_exact_match(config, weights))
    # seeds 0-2 measured: single 0.86, 0.85, 0.795; two ranks 0.85, 0.89, 0.805 (start 0.435)
    low, high = min(single) - MARGIN, max(single) + MARGIN
    assert all(low <= value <= high for value in ranks), (single, ranks)
    assert min(ranks) > start + 0.25, (start, ranks)  # both learned: the spread is not noise
