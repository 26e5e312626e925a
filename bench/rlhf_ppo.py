"""rlkit's RLHF-PPO trainer against TRL's PPO trainer, on the same tiny models, prompts and settings

TRL 1.0's ``trl.experimental.ppo.PPOTrainer`` (the PPO trainer left TRL's main API and is gone by
TRL 1.16) runs with the same four models: the actor from ``sft_starting_point(seed)``, its frozen
copy as the reference, Chapter 9's reward model trained from it (``reward_model_starting_point``),
and a critic initialised from the reward model (TRL's value model is a sequence-classification
model, so it is a copy of the reward model, as ``critic_from="reward_model"`` is in rlkit). Both
train on the same prompts (the first ``iterations x 32`` of the seed's training stream; TRL's data
loader shuffles them) with Chapter 10's settings: 32 responses per iteration, 2 epochs of
minibatches of 16, at most 8 new tokens, temperature 0.7, k1 KL penalty with coefficient 0.1,
clip 0.2, value clip 0.2, gamma 1, lambda 0.95, step size 1e-4, advantages whitened.

What differs is each trainer's own: TRL takes one AdamW step on the sum of the policy and value
losses (``vf_coef`` 0.1) where rlkit takes one step for each model; TRL places the score one token
after the response's last real token and rlkit at it (Chapter 10's pitfalls); TRL samples with
``top_k=0``. Times are of the training loops only (each trainer built first), one torch thread;
the ratio is rlkit's seconds per iteration over TRL's, median over the seeds. Both runs are then
scored on the seed's 500 held-out prompts (``held_out_scores``: gold and exact match of sampled
answers), so that the speed is compared at equal learning.

    python bench/rlhf_ppo.py                 # seeds 0, 1, 2 (about 8 minutes on a fresh cache)
    python bench/rlhf_ppo.py --rounds 1      # seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlkit.llm.evaluation import held_out_scores  # noqa: E402
from rlkit.llm.models import load_causal_lm  # noqa: E402
from rlkit.llm.reward_model import rlhf_starting_point  # noqa: E402
from rlkit.llm.rlhf_ppo import PHASES, RLHFPPOConfig, RLHFPPOTrainer  # noqa: E402
from rlkit.llm.tasks import PreferenceOracle, SortTask, TaskData  # noqa: E402

SETTINGS = dict(batch_size=32, minibatch_size=16, ppo_epochs=2, max_new_tokens=8, temperature=0.7)
SETTINGS.update(kl_coef=0.1, clip_eps=0.2, value_clip_eps=0.2, gamma=1.0, lam=0.95)
SETTINGS.update(learning_rate=1e-4, critic_learning_rate=1e-4)


def scores_of(model, tokenizer, seed: int) -> dict[str, float]:
    task = SortTask()
    prompts = [example.prompt for example in TaskData(task, seed=seed).heldout]
    return held_out_scores(
        model,
        tokenizer,
        task,
        prompts,
        SETTINGS["max_new_tokens"],
        SETTINGS["temperature"],
        oracle=PreferenceOracle(task),
    )


def rlkit_run(sft: Path, reward_model: Path, seed: int, iterations: int) -> tuple[float, dict]:
    config = RLHFPPOConfig(
        sft_folder=str(sft),
        reward_model_folder=str(reward_model),
        seed=seed,
        num_iterations=iterations,
        **SETTINGS,
    )
    trainer = RLHFPPOTrainer(config)
    start = time.perf_counter()
    while not trainer.finished:
        trainer.run_update()
    seconds = (time.perf_counter() - start) / iterations
    phases = {phase: sum(row[f"seconds_{phase}"] for row in trainer.history) for phase in PHASES}
    total = sum(phases.values())
    print(
        "  rlkit's phases: "
        + ", ".join(f"{phase} {100 * value / total:.0f}%" for phase, value in phases.items())
    )
    return seconds, scores_of(trainer.model, trainer.tokenizer, seed)


def trl_run(sft: Path, reward_model: Path, seed: int, iterations: int) -> tuple[float, dict]:
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(sft)
    tokenizer.padding_side = "left"  # TRL generates from left-padded queries
    data = TaskData(SortTask(), seed=seed)
    prompts = [example.prompt for example in data.train_batch(iterations * SETTINGS["batch_size"])]
    encode = lambda texts: Dataset.from_dict({"input_ids": tokenizer(texts)["input_ids"]})  # noqa: E731
    policy = load_causal_lm(str(sft), dtype=torch.float32)
    reward = AutoModelForSequenceClassification.from_pretrained(reward_model, dtype=torch.float32)
    args = PPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-ppo-"),
        report_to="none",
        seed=seed,
        total_episodes=iterations * SETTINGS["batch_size"],
        # TRL's rollout is per_device_train_batch_size x gradient_accumulation_steps responses, cut
        # into num_mini_batches minibatches, each stepped once per epoch (with no accumulation)
        per_device_train_batch_size=SETTINGS["batch_size"],
        gradient_accumulation_steps=1,
        num_mini_batches=SETTINGS["batch_size"] // SETTINGS["minibatch_size"],
        num_ppo_epochs=SETTINGS["ppo_epochs"],
        response_length=SETTINGS["max_new_tokens"],
        temperature=SETTINGS["temperature"],
        kl_coef=SETTINGS["kl_coef"],
        kl_estimator="k1",
        cliprange=SETTINGS["clip_eps"],
        cliprange_value=SETTINGS["value_clip_eps"],
        gamma=SETTINGS["gamma"],
        lam=SETTINGS["lam"],
        learning_rate=SETTINGS["learning_rate"],
        lr_scheduler_type="constant",
        stop_token="eos",
        num_sample_generations=0,
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=policy,
        ref_model=copy.deepcopy(policy),
        reward_model=reward,
        value_model=copy.deepcopy(reward),
        train_dataset=encode(prompts),
        eval_dataset=encode(prompts[:8]),
    )
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    seconds = (time.perf_counter() - start) / iterations
    trained = trainer.accelerator.unwrap_model(trainer.model).policy
    tokenizer.padding_side = "right"
    return seconds, scores_of(trained, tokenizer, seed)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=3, help="seeds 0 to rounds - 1")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--cache", type=Path, default=Path("_build/rlhf-cache"))
    args = parser.parse_args()
    if args.rounds < 1 or args.iterations < 1:
        parser.error("--rounds and --iterations must be >= 1")
    torch.set_num_threads(1)
    ratios, gold = [], {"rlkit": [], "trl": []}
    for seed in range(args.rounds):
        sft, reward_model = rlhf_starting_point(args.cache, seed)
        ours, our_scores = rlkit_run(sft, reward_model, seed, args.iterations)
        theirs, their_scores = trl_run(sft, reward_model, seed, args.iterations)
        ratios.append(ours / theirs)
        gold["rlkit"].append(our_scores["gold_sampled"])
        gold["trl"].append(their_scores["gold_sampled"])
        print(
            f"seed {seed}: {ours:.3f} s per iteration against TRL's {theirs:.3f} "
            f"({ours / theirs:.2f}x); after {args.iterations} iterations, gold (sampled) "
            f"{our_scores['gold_sampled']:.2f} against {their_scores['gold_sampled']:.2f}, exact "
            f"match (greedy) {our_scores['exact_match']:.3f} against "
            f"{their_scores['exact_match']:.3f}"
        )
    for name, values in gold.items():
        print(f"{name}: gold (sampled) over the seeds from {min(values):.2f} to {max(values):.2f}")
    print(
        f"result: rlhf_ppo_time_vs_trl = {statistics.median(ratios):.3f} (goal: <= 0.5, "
        "seconds per iteration)"
    )


if __name__ == "__main__":
    main()
