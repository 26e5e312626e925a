"""GRPO with LoRA on a real pretrained model, on a CPU: SmolLM2-135M-Instruct (its packaged copy,
``rlkit.llm.packaged``) answering one-digit sums asked in words (``addition_question``), scored on
the 50 held-out prompts before and after training. The book's section "On a real model" reads the
results file.

    python tools/real_model_grpo.py --seeds 0 1 2 --out book/data/real_model_grpo.json

The same run from the command line (one seed):

    rlkit train grpo --model HuggingFaceTB/SmolLM2-135M-Instruct --seed 0 --out runs/smollm2-grpo \
        --set task=addition_question --set num_digits=1 --set reward=exact --set lora_rank=16 \
        --set lora_alpha=32 --set learning_rate=2e-4 --set num_iterations=8 \
        --set prompts_per_iteration=4 --set max_new_tokens=16 --set temperature=0.7 \
        --set micro_batch_size=8

Each record: the seed, the settings, the held-out scores before and after (per prompt: greedy and
sampled exact match and the completions), the history, and the seconds of training alone (the
evaluations excluded). Seeds run one after another, each with both threads of a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from rlkit.checkpoint import write_atomically
from rlkit.llm.grpo import GRPOConfig, GRPOTrainer
from rlkit.llm.packaged import SMOLLM2

SETTINGS = dict(
    sft_folder=SMOLLM2,
    task="addition_question",
    num_digits=1,
    reward="exact",
    lora_rank=16,
    lora_alpha=32,
    learning_rate=2e-4,
    num_iterations=8,
    prompts_per_iteration=4,
    group_size=8,
    max_new_tokens=16,
    temperature=0.7,
    micro_batch_size=8,
)


def run(seed: int) -> dict:
    trainer = GRPOTrainer(GRPOConfig(**SETTINGS, seed=seed))
    before = trainer.evaluate(per_prompt=True)
    start = time.perf_counter()
    for _ in range(trainer.num_updates):
        trainer.run_update()
    seconds = time.perf_counter() - start
    after = trainer.evaluate(per_prompt=True)
    return dict(
        seed=seed,
        settings=SETTINGS,
        before=before,
        after=after,
        history=trainer.history,
        train_seconds=seconds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    records = json.loads(args.out.read_text()) if args.out.exists() else []
    for seed in args.seeds:
        records = [record for record in records if record["seed"] != seed] + [run(seed)]
        records.sort(key=lambda record: record["seed"])
        text = (json.dumps(records, indent=1) + "\n").encode()
        # after each seed, and atomically: a crash loses at most the seed it was training
        write_atomically(args.out, lambda file, text=text: file.write(text))
        last = records[[r["seed"] for r in records].index(seed)]
        print(
            f"seed {seed}: greedy exact match "
            f"{sum(last['before']['exact_match']) / 50:.2f} -> "
            f"{sum(last['after']['exact_match']) / 50:.2f}, sampled "
            f"{sum(last['before']['exact_match_sampled']) / 50:.2f} -> "
            f"{sum(last['after']['exact_match_sampled']) / 50:.2f}, "
            f"{last['train_seconds']:.0f} s of training",
            flush=True,
        )


if __name__ == "__main__":
    main()
