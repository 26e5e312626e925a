"""GRPO and its family on the sort task (Chapter 11): each variant of ``VARIANTS`` from each seed's
under-trained SFT start, scored on held-out prompts every ``--eval-every`` iterations, and PPO on
the task's reward (Chapter 10's trainer, with its critic and reference) beside them. Chapter 11's
figures and tables read the results file. Chapter 12's read DPO's variants, set beside RLHF-PPO
(Chapter 10's trainer with Chapter 9's reward model) and GRPO; Chapter 13's read GRPO with a
sampler that is not the trainer (stale or bf16 weights), with and without truncated importance
sampling.

    python tools/grpo_sweep.py --seeds 0 1 2 --out book/data/grpo_sweep.json
    python tools/grpo_sweep.py --seeds 0 1 2 --variants grpo rlhf_ppo dpo dpo_beta01 ipo cdpo \
        simpo dpo_online dpo_online_beta01 --out book/data/preference_sweep.json
    python tools/grpo_sweep.py --seeds 0 1 2 --variants grpo lag4 lag4_tis lag16 lag16_tis bf16 \
        bf16_tis --out book/data/mismatch_sweep.json

Each record is one run: its variant, seed and settings, the held-out scores at each evaluation
(``evaluate``: greedy and sampled exact match, and the wall time so far, evaluations included),
the training history averaged over blocks of ``--block`` iterations, as columns (reward,
zero-variance groups, entropy, clip fraction, lengths, seconds per iteration; DPO's implicit
rewards), the seconds of training alone, the models the trainer holds while it trains, the
process's peak resident memory, and ``final``: the last evaluation's greedy exact match, the
oracle's mean score and its win rate over the SFT start (a tie one half), per prompt. The runs
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

from rlkit.llm.dpo import DPOConfig, DPOTrainer
from rlkit.llm.evaluation import held_out_scores, heldout_prompts, win_outcomes
from rlkit.llm.grpo import GRPOConfig, GRPOTrainer
from rlkit.llm.models import load_causal_lm
from rlkit.llm.reward_model import rlhf_starting_point
from rlkit.llm.rlhf_ppo import RLHFPPOConfig, RLHFPPOTrainer
from rlkit.llm.sft import sft_starting_point
from rlkit.llm.tasks import PreferenceOracle

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
    # Chapter 13: the rollout/training mismatch, injected (a sampler whose weights lag the policy's
    # by some updates, or are rounded to bf16), and truncated importance sampling against it
    **{f"lag{lag}": dict(sampler_lag=lag) for lag in (4, 16)},
    **{
        f"lag{lag}_tis": dict(sampler_lag=lag, sampler_correction="token_truncate")
        for lag in (4, 16)
    },
    "bf16": dict(sampler_dtype="bfloat16"),
    "bf16_tis": dict(sampler_dtype="bfloat16", sampler_correction="token_truncate"),
    # Chapter 10's PPO on the task's exact-match reward, with its critic and reference
    "ppo": dict(trainer="ppo", reward="task", kl_coef=0.05, critic_from="policy"),
    # Chapter 10's RLHF-PPO as its learning test runs it: Chapter 9's reward model, the critic from
    # it, the reference, kl_coef 0.3
    "rlhf_ppo": dict(trainer="rlhf_ppo", kl_coef=0.3),
    # Chapter 12: DPO on Chapter 9's labelled pairs, its variants, and online DPO
    "dpo": dict(trainer="dpo"),
    "dpo_beta01": dict(trainer="dpo", beta=0.1),
    "ipo": dict(trainer="dpo", loss_type="ipo"),
    "cdpo": dict(trainer="dpo", label_smoothing=0.1),  # the labels' own flip rate
    "simpo": dict(trainer="dpo", loss_type="simpo", beta=2.0),
    "dpo_online": dict(trainer="dpo", pairs="online"),
    "dpo_online_beta01": dict(trainer="dpo", pairs="online", beta=0.1),
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
    "loss",
    "reward_accuracy",
    "reward_margin",
    "reward_chosen",
    "reward_rejected",
    "logp_chosen",
    "logp_rejected",
    "pairs_kept",
    "sampler_kl",
    "sampler_ratio_over_cap",
)


def build(variant: str, seed: int, iterations: int, cache: Path):
    """The variant's trainer from seed ``seed``'s starting point (``iterations``: GRPO's and PPO's;
    DPO's steps are its pairs over its batch)."""
    settings = dict(VARIANTS[variant])
    kind = settings.pop("trainer", "grpo")
    sft_folder = sft_starting_point(cache / f"sft-start-{seed}", seed=seed)
    if kind == "dpo":
        return DPOTrainer(DPOConfig(sft_folder=str(sft_folder), seed=seed, **settings))
    if kind == "rlhf_ppo":
        sft_folder, reward_folder = rlhf_starting_point(cache, seed)
        config = RLHFPPOConfig(
            sft_folder=str(sft_folder),
            reward_model_folder=str(reward_folder),
            seed=seed,
            **settings,
        )
        return RLHFPPOTrainer(config)
    if kind == "ppo":
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
        columns["iteration"].append(block[-1].get("iteration", block[-1].get("step")))
        for field in HISTORY_FIELDS:
            if any(field in row for row in block):  # online DPO may skip a step's loss
                values = [row[field] for row in block if field in row]
                columns.setdefault(field, []).append(float(np.mean(values)))
        seconds = [sum(v for k, v in r.items() if k.startswith("seconds_")) for r in block]
        columns.setdefault("seconds", []).append(float(np.mean(seconds)))
    return columns


def run(task: tuple) -> dict:
    """One run, scored before training and every ``eval_every`` iterations."""
    cache, variant, seed, iterations, eval_every, prompts, block = task
    torch.set_num_threads(1)
    trainer = build(variant, seed, iterations, cache)
    held = models_held(trainer)
    scores = [dict(iteration=0, seconds=0.0, **summary(trainer.evaluate(prompts)))]
    start, training = time.perf_counter(), 0.0
    while not trainer.finished:
        step_start = time.perf_counter()
        trainer.run_update()
        training += time.perf_counter() - step_start
        if trainer.updates_done % eval_every == 0 or trainer.finished:
            seconds = time.perf_counter() - start
            evaluation = summary(trainer.evaluate(prompts))
            scores.append(dict(iteration=trainer.updates_done, seconds=seconds, **evaluation))
    record = dict(
        variant=variant,
        seed=seed,
        settings=VARIANTS[variant],
        iterations=trainer.num_updates,
        scores=scores,
        history=blocks(trainer.history, block),
        training_seconds=training,
        models_held=held,
        final=against_the_start(trainer, cache, seed, prompts),
        peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    print(json.dumps({k: record[k] for k in ("variant", "seed")} | scores[-1]), flush=True)
    return record


def models_held(trainer) -> int:
    """The networks a trainer keeps while it trains: the policy, and its reference, critic and
    reward model where it has them (DPO's reference leaves once its log-probabilities are
    precomputed)."""
    names = ("model", "reference", "critic", "reward_model")
    return sum(getattr(trainer, name, None) is not None for name in names)


def against_the_start(trainer, cache: Path, seed: int, prompts: int) -> dict:
    """Per held-out prompt: the trained policy's greedy exact match, the oracle's score, and the
    oracle's verdict against the SFT start's greedy answer (1 win, 1/2 tie, 0 loss)."""
    folder = sft_starting_point(cache / f"sft-start-{seed}", seed=seed)
    start = load_causal_lm(folder, dtype=torch.float32).eval()
    questions = heldout_prompts(trainer.data, prompts)
    answers = {}
    for name, model in (("trained", trainer.model), ("start", start)):
        with torch.no_grad():
            answers[name] = held_out_scores(
                model,
                trainer.tokenizer,
                trainer.task,
                questions,
                trainer.config.max_new_tokens,
                per_prompt=True,
            )
    oracle, trained = PreferenceOracle(trainer.task), answers["trained"]
    return {
        "exact_match": [float(value) for value in trained["exact_match"]],
        "gold": [oracle.score(p, c) for p, c in zip(questions, trained["completions"])],
        "win": win_outcomes(
            oracle, questions, trained["completions"], answers["start"]["completions"]
        ),
    }


def summary(evaluation: dict) -> dict:
    return {
        key: float(evaluation[key])
        for key in ("exact_match", "exact_match_sampled", "kl", "gold", "win_rate")
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
        if "rlhf_ppo" in args.variants:
            rlhf_starting_point(cache, seed)
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
