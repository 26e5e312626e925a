"""rlkit's DPO trainer against TRL's DPOTrainer, on the same tiny model, pairs and batch

Both start from ``sft_starting_point(seed)``, which is also the reference, and train on the same
preference pairs (the first ``steps x 64`` of the seed's pairs from Chapter 9's oracle, in the same
order: TRL's sampler is not shuffled here) with the same settings: 64 pairs per step, the sigmoid
loss with beta 0.5, step size 1e-4 after 10 warm-up steps decaying by a cosine to 10%, the global
norm clipped to 1, the reference's log-probabilities computed at every step (TRL's default; neither
precomputes). TRL runs in one process on the CPU with bf16 off, gradient checkpointing off and
dropout off (the tiny models have none).

The rounds alternate which trainer goes first. Times are of the training loops only (each trainer
built first, its data tokenized), one torch thread. Both are then scored on the seed's 500
held-out prompts: greedy exact match and the oracle's win rate over the reference (a tie counts
one half). The ratio is rlkit's seconds per step over TRL's, median over the rounds.

    python bench/dpo_trl.py                 # 3 rounds: seeds 0, 1, 2 (about 3 minutes)
    python bench/dpo_trl.py --rounds 1      # seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlkit.llm.dpo import DPOConfig, DPOTrainer  # noqa: E402
from rlkit.llm.models import load_causal_lm  # noqa: E402
from rlkit.llm.sft import sft_starting_point  # noqa: E402

BATCH = 64
SETTINGS = dict(beta=0.5, learning_rate=1e-4, warmup_steps=10)


def rlkit_trainer(sft: Path, seed: int, steps: int) -> DPOTrainer:
    """rlkit's trainer on the seed's first ``steps x BATCH`` pairs, read in order."""
    config = DPOConfig(
        sft_folder=str(sft),
        seed=seed,
        num_train_pairs=steps * BATCH,
        batch_size=BATCH,
        precompute_ref_log_probs=False,
        **SETTINGS,
    )
    trainer = DPOTrainer(config)
    trainer.order_rng.shuffle = lambda order: None  # the pairs in their drawn order, as TRL's
    return trainer


def rlkit_run(sft: Path, seed: int, steps: int) -> tuple[float, dict]:
    trainer = rlkit_trainer(sft, seed, steps)
    start = time.perf_counter()
    while not trainer.finished:
        trainer.run_update()
    seconds = time.perf_counter() - start
    return seconds / steps, scores(trainer, trainer.model)


def trl_run(sft: Path, seed: int, steps: int) -> tuple[float, dict]:
    import trl
    from datasets import Dataset

    ours = rlkit_trainer(sft, seed, steps)  # the same pairs, and the scoring afterwards
    pairs = ours.train_pairs
    data = {
        "prompt": [pair.prompt for pair in pairs],
        "chosen": [pair.chosen for pair in pairs],
        "rejected": [pair.rejected for pair in pairs],
    }
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        args = trl.DPOConfig(
            output_dir=tempfile.mkdtemp(prefix="trl-dpo-"),
            report_to="none",
            seed=seed,
            max_steps=steps,
            per_device_train_batch_size=BATCH,
            gradient_accumulation_steps=1,
            beta=SETTINGS["beta"],
            loss_type=["sigmoid"],
            learning_rate=SETTINGS["learning_rate"],
            lr_scheduler_type="cosine_with_min_lr",
            lr_scheduler_kwargs={"min_lr_rate": 0.1},
            warmup_steps=SETTINGS["warmup_steps"],
            weight_decay=0.0,
            max_grad_norm=1.0,
            precompute_ref_log_probs=False,
            bf16=False,
            gradient_checkpointing=False,
            disable_dropout=True,
            logging_steps=10**6,
            save_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
            dataloader_num_workers=0,
        )
        trainer = trl.DPOTrainer(
            model=load_causal_lm(str(sft), dtype=torch.float32),
            ref_model=load_causal_lm(str(sft), dtype=torch.float32),
            args=args,
            train_dataset=Dataset.from_dict(data),
            processing_class=AutoTokenizer.from_pretrained(sft),
        )
    trainer._get_train_sampler = lambda *arguments: torch.utils.data.SequentialSampler(
        trainer.train_dataset
    )
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    seconds = time.perf_counter() - start
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    return seconds / steps, scores(ours, model)


def scores(trainer: DPOTrainer, model) -> dict:
    """The trained ``model``'s held-out scores, read through an rlkit trainer of the same seed."""
    trainer.model = model
    return trainer.evaluate()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds, seeds 0 to rounds - 1")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per run")
    parser.add_argument("--cache", type=Path, default=Path("_build/rlhf-cache"))
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be >= 1")
    torch.set_num_threads(1)
    ratios = []
    for seed in range(args.rounds):
        sft = sft_starting_point(args.cache / f"sft-start-{seed}", seed=seed)
        runs = {}
        order = ("rlkit", "trl") if seed % 2 == 0 else ("trl", "rlkit")
        for name in order:
            runs[name] = (rlkit_run if name == "rlkit" else trl_run)(sft, seed, args.steps)
        (ours, our_scores), (theirs, their_scores) = runs["rlkit"], runs["trl"]
        ratios.append(ours / theirs)
        print(
            f"seed {seed} ({' first, '.join(order)} second): rlkit {ours:.3f} s per step, TRL "
            f"{theirs:.3f}: {ours / theirs:.2f}x; after {args.steps} steps greedy exact match "
            f"rlkit {our_scores['exact_match']:.3f}, TRL {their_scores['exact_match']:.3f}; win "
            f"rate over the reference rlkit {our_scores['win_rate']:.3f}, TRL "
            f"{their_scores['win_rate']:.3f}"
        )
    print(
        f"result: dpo_time_vs_trl = {statistics.median(ratios):.3f} (goal: <= 0.5, seconds per "
        "step)"
    )


if __name__ == "__main__":
    main()
