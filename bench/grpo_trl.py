"""rlkit's GRPO trainer against TRL's GRPOTrainer, on the same tiny model, task and settings

Both start from ``sft_starting_point(seed)`` and train on the sort task with the same partial-credit
reward (``SortTask.position_reward``) and Chapter 11's settings: 8 prompts x 8 completions per
step, at most 8 new tokens, temperature 0.6, loss type "grpo", clip 0.2, no KL term (no reference
model), rewards scaled by the group's std, step size 3e-4 decaying by a cosine to 10%, one
optimizer step per batch. TRL runs in one process on the CPU with bf16 off, gradient checkpointing
off and dropout off (the tiny models have none), on the same prompts (the first ``steps x 8`` of
the seed's training stream; TRL's sampler shuffles them).

The rounds alternate which trainer goes first. Times are of the training loops only (each trainer
built first), one torch thread; generation is timed around each trainer's own sampling call
(rlkit's ``generate`` phase, TRL's ``_generate_single_turn``), and "the rest" is everything else
in a step. Both are then scored greedy on the seed's 500 held-out prompts. The ratio is rlkit's
seconds per step over TRL's, median over the rounds.

    python bench/grpo_trl.py                 # 3 rounds: seeds 0, 1, 2 (about 4 minutes)
    python bench/grpo_trl.py --rounds 1      # seed 0
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
from rlkit.llm.evaluation import held_out_scores  # noqa: E402
from rlkit.llm.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from rlkit.llm.models import load_causal_lm  # noqa: E402
from rlkit.llm.sft import sft_starting_point  # noqa: E402
from rlkit.llm.tasks import SortTask, TaskData  # noqa: E402

PROMPTS, GROUP = 8, 8
SETTINGS = dict(max_new_tokens=8, temperature=0.6, learning_rate=3e-4, clip_eps=0.2)


def greedy_exact_match(model, tokenizer, seed: int) -> float:
    task = SortTask()
    prompts = [example.prompt for example in TaskData(task, seed=seed).heldout]
    with torch.no_grad():
        scores = held_out_scores(model, tokenizer, task, prompts, SETTINGS["max_new_tokens"])
    return scores["exact_match"]


def rlkit_run(sft: Path, seed: int, steps: int) -> dict[str, float]:
    config = GRPOConfig(
        sft_folder=str(sft),
        seed=seed,
        num_iterations=steps,
        prompts_per_iteration=PROMPTS,
        group_size=GROUP,
        **SETTINGS,
    )
    trainer = GRPOTrainer(config)
    start = time.perf_counter()
    while not trainer.finished:
        trainer.run_update()
    seconds = time.perf_counter() - start
    generation = sum(row["seconds_generate"] for row in trainer.history)
    return {
        "step": seconds / steps,
        "generation": generation / steps,
        "exact_match": greedy_exact_match(trainer.model, trainer.tokenizer, seed),
    }


def trl_run(sft: Path, seed: int, steps: int) -> dict[str, float]:
    import trl
    from datasets import Dataset

    task = SortTask()
    tokenizer = AutoTokenizer.from_pretrained(sft)
    prompts = [example.prompt for example in TaskData(task, seed=seed).train_batch(steps * PROMPTS)]

    def positions(prompts, completions, **_):
        return [task.position_reward(p, c) for p, c in zip(prompts, completions)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = trl.GRPOConfig(
            output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
            report_to="none",
            seed=seed,
            max_steps=steps,
            per_device_train_batch_size=PROMPTS * GROUP,  # TRL counts completions
            num_generations=GROUP,
            gradient_accumulation_steps=1,
            num_iterations=1,
            max_completion_length=SETTINGS["max_new_tokens"],
            temperature=SETTINGS["temperature"],
            learning_rate=SETTINGS["learning_rate"],
            lr_scheduler_type="cosine_with_min_lr",
            lr_scheduler_kwargs={"min_lr_rate": 0.1},
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            epsilon=SETTINGS["clip_eps"],
            beta=0.0,
            loss_type="grpo",
            scale_rewards="group",
            bf16=False,
            gradient_checkpointing=False,
            disable_dropout=True,
            logging_steps=10**6,
            save_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
        )
        trainer = trl.GRPOTrainer(
            model=load_causal_lm(str(sft), dtype=torch.float32),
            reward_funcs=positions,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
        )
    generation = [0.0]
    sample = trainer._generate_single_turn

    def timed_sample(*arguments, **keywords):
        start = time.perf_counter()
        try:
            return sample(*arguments, **keywords)
        finally:
            generation[0] += time.perf_counter() - start

    trainer._generate_single_turn = timed_sample
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    seconds = time.perf_counter() - start
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {
        "step": seconds / steps,
        "generation": generation[0] / steps,
        "exact_match": greedy_exact_match(model.eval(), tokenizer, seed),
    }


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
        ours, theirs = runs["rlkit"], runs["trl"]
        ratios.append(ours["step"] / theirs["step"])
        start = greedy_exact_match(
            load_causal_lm(str(sft), dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(sft),
            seed,
        )
        print(
            f"seed {seed} ({' first, '.join(order)} second): rlkit {ours['step']:.3f} s per step "
            f"(generation {ours['generation']:.3f}, the rest "
            f"{ours['step'] - ours['generation']:.3f}), TRL {theirs['step']:.3f} (generation "
            f"{theirs['generation']:.3f}, the rest {theirs['step'] - theirs['generation']:.3f}): "
            f"{ours['step'] / theirs['step']:.2f}x; greedy exact match {start:.3f} -> rlkit "
            f"{ours['exact_match']:.3f}, TRL {theirs['exact_match']:.3f} after {args.steps} steps"
        )
    print(
        f"result: grpo_time_vs_trl = {statistics.median(ratios):.3f} (goal: <= 0.5, seconds per "
        "step)"
    )


if __name__ == "__main__":
    main()
