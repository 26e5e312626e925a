"""Chapter 13's measurements: one GRPO iteration's time by phase in the single process, on Ray
(split and colocated) and under torchrun; asynchronous rollouts against synchronous ones; two
ranks against one (weak and strong scaling). Everything runs in this one script, side by side,
and prints ratios.

The run is Chapter 11's (a tiny character-level policy on the sort task: 8 prompts x 8
completions of up to 8 tokens), from an untrained policy saved to a folder that every worker
loads. Each variant's first iteration is left out (processes starting, first calls); the rest
are timed by the wall clock of each iteration. On a machine with 2 cores:

- Ray's overhead per iteration: (Ray's seconds per iteration) / (the single process's) - 1;
- asynchronous rollouts (staleness 1: generation of the next batch overlaps this batch's
  training): samples per second against the actor sampling itself (goal: at least 1.4x; the
  ceiling is near 2x when generation and training take similar time), and against the same
  workers run synchronously (staleness 0);
- weak scaling: two ranks at the same prompts per rank against one rank (goal: at least 1.6x);
  strong scaling: two ranks sharing one rank's global batch;
- A2C with its rollouts on Ray workers (RLlib's layout): environment steps per second with two
  workers against one, and against A2C in one process (16 CartPole copies x 32 steps an update).

    python bench/systems.py                 # 3 rounds of 8 timed iterations each
    python bench/systems.py --rounds 1 --iterations 4
    python bench/systems.py --learning      # also: held-out accuracy after async vs sync training
    python bench/systems.py --out book/data/systems_bench.json   # Chapter 13's figures read it

``--out`` writes every round's seconds per iteration by phase of each variant, its ratios and
A2C's steps per second, with the settings and the machine's core count.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlkit.llm.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from rlkit.llm.models import build_causal_lm, tiny_config  # noqa: E402
from rlkit.llm.tokenizer import build_char_tokenizer  # noqa: E402
from rlkit.systems.ray_controller import ray_dataflow, start_ray, stop_ray  # noqa: E402
from rlkit.systems.spmd import launch  # noqa: E402

PHASES = ("generate", "score", "reference", "advantages", "policy")


def policy_folder(folder: Path) -> str:
    tokenizer = build_char_tokenizer()
    build_causal_lm(tiny_config(tokenizer), seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def per_iteration(history: list[dict], names) -> dict[str, float]:
    """Mean seconds per iteration of each ``seconds_<name>``, the first iteration left out."""
    rows = history[1:]
    return {
        name: statistics.fmean(row.get(f"seconds_{name}", 0.0) for row in rows) for name in names
    }


def single_process(config: GRPOConfig) -> dict[str, float]:
    torch.set_num_threads(1)  # as each Ray worker and each rank has
    trainer = GRPOTrainer(config)
    trainer.run_update()
    walls = []
    for _ in range(config.num_iterations - 1):
        start = time.perf_counter()
        trainer.run_update()
        walls.append(time.perf_counter() - start)
    times = per_iteration(trainer.history, PHASES)
    times["iteration"] = statistics.fmean(walls)  # the wall clock, as the dataflow's rows
    return times


def on_ray(config: GRPOConfig, placement, staleness=None) -> dict[str, float]:
    # the throughput runs skip the sampler's log-probs (the mismatch measure): as the actor does
    flow = ray_dataflow(config, placement, staleness=staleness, measure_mismatch=False)
    try:
        history = flow.run()
    finally:
        flow.close()
    return per_iteration(history, PHASES + ("generate_wait", "weights", "dispatch", "iteration"))


def under_torchrun(config: GRPOConfig, nproc: int, folder: Path) -> dict[str, float]:
    history = launch(config, folder, nproc=nproc)["history"]
    return per_iteration(history, PHASES + ("communication", "iteration"))


def a2c_env_steps_per_second(num_workers: int | None, updates: int) -> float:
    """A2C on CartPole-v1 (Gymnasium's envs, 16 copies x 32 steps an update): environment steps
    per second after the first update, in one process (None) or with Ray rollout workers."""
    from rlkit.a2c import A2CConfig, A2CTrainer
    from rlkit.systems.a2c_ray import RayA2CTrainer

    config = A2CConfig(num_envs=16, num_steps=32, total_steps=16 * 32 * (updates + 1))
    trainer = A2CTrainer(config) if num_workers is None else RayA2CTrainer(config, num_workers)
    try:
        trainer.run_update()
        start = time.perf_counter()
        for _ in range(updates):
            trainer.run_update()
        return config.batch_size * updates / (time.perf_counter() - start)
    finally:
        trainer.close()


def throughput(config: GRPOConfig, times: dict[str, float]) -> float:
    """Completions trained on per second."""
    return config.batch_size / times["iteration"]


def learning(config: GRPOConfig, seed: int) -> dict[str, float]:
    """Held-out greedy exact match after the same number of samples, synchronous and async."""
    from rlkit.llm.sft import sft_starting_point

    folder = sft_starting_point(Path(tempfile.gettempdir()) / f"rlkit-sft-start-{seed}", seed)
    config = dataclasses.replace(
        config, sft_folder=str(folder), seed=seed, num_iterations=150, reward="positions"
    )
    scores = {}
    for name, staleness in (("sync", 0), ("async", 1)):
        flow = ray_dataflow(config, "split", staleness=staleness)
        try:
            flow.run()
            scores[name] = flow.evaluate(200)["exact_match"]
        finally:
            flow.close()
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=8, help="timed, after one warm-up")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per iteration (x 8)")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="the completions' limit")
    parser.add_argument("--learning", action="store_true")
    parser.add_argument("--out", type=Path, help="a JSON file for the rounds' measurements")
    args = parser.parse_args()
    if args.rounds < 1 or args.iterations < 1:
        parser.error("--rounds and --iterations must be >= 1")
    work = Path(tempfile.mkdtemp(prefix="rlkit-bench-systems-"))
    config = GRPOConfig(
        sft_folder=policy_folder(work / "policy"),
        num_iterations=args.iterations + 1,
        prompts_per_iteration=args.prompts,
        group_size=8,
        max_new_tokens=args.max_new_tokens,
        beta=0.04,
    )
    doubled = dataclasses.replace(config, prompts_per_iteration=2 * args.prompts)
    ratios: dict[str, list[float]] = {}
    rounds = []
    start_ray(num_cpus=4)  # logical CPUs: one per worker process of the async run
    try:
        for round_index in range(args.rounds):
            results = {
                "single process": single_process(config),
                "Ray, split": on_ray(config, "split"),
                "Ray, colocated": on_ray(config, "colocated"),
                "Ray, split, sync rollout worker": on_ray(config, "split", staleness=0),
                "Ray, split, async (staleness 1)": on_ray(config, "split", staleness=1),
                "torchrun, 1 rank": under_torchrun(config, 1, work / f"r{round_index}-1"),
                "torchrun, 2 ranks, same global batch": under_torchrun(
                    config, 2, work / f"r{round_index}-2s"
                ),
                "torchrun, 2 ranks, same batch per rank": under_torchrun(
                    doubled, 2, work / f"r{round_index}-2w"
                ),
            }
            print(f"round {round_index}: seconds per iteration by phase")
            for name, times in results.items():
                phases = ", ".join(f"{k} {v:.3f}" for k, v in times.items() if v > 0)
                print(f"  {name}: {phases}", flush=True)
            single = results["single process"]["iteration"]
            found = {
                "ray_overhead_per_iteration": results["Ray, split"]["iteration"] / single - 1,
                "ray_colocated_overhead_per_iteration": (
                    results["Ray, colocated"]["iteration"] / single - 1
                ),
                "async_speedup": results["Ray, split, sync rollout worker"]["iteration"]
                / results["Ray, split, async (staleness 1)"]["iteration"],
                "async_speedup_vs_actor_sampling": results["Ray, split"]["iteration"]
                / results["Ray, split, async (staleness 1)"]["iteration"],
                "weak_scaling_2_ranks": throughput(
                    doubled, results["torchrun, 2 ranks, same batch per rank"]
                )
                / throughput(config, results["torchrun, 1 rank"]),
                "strong_scaling_2_ranks": results["torchrun, 1 rank"]["iteration"]
                / results["torchrun, 2 ranks, same global batch"]["iteration"],
            }
            a2c = {workers: a2c_env_steps_per_second(workers, 30) for workers in (None, 1, 2)}
            print(
                f"  A2C on CartPole, env steps/s: one process {a2c[None]:,.0f}, one Ray rollout "
                f"worker {a2c[1]:,.0f}, two {a2c[2]:,.0f}",
                flush=True,
            )
            found["a2c_ray_scaling_2_workers"] = a2c[2] / a2c[1]
            found["a2c_ray_2_workers_vs_one_process"] = a2c[2] / a2c[None]
            for name, value in found.items():
                ratios.setdefault(name, []).append(value)
            a2c_named = {"one process": a2c[None], "1 worker": a2c[1], "2 workers": a2c[2]}
            rounds.append(dict(phases=results, ratios=found, a2c_env_steps_per_second=a2c_named))
            print(f"round {round_index}: " + ", ".join(f"{k} {v:.2f}" for k, v in found.items()))
    finally:
        stop_ray()
    goals = {
        "async_speedup_vs_actor_sampling": " (goal: >= 1.4)",
        "weak_scaling_2_ranks": " (goal: >= 1.6)",
    }
    for name, values in ratios.items():
        print(f"result: {name} = {statistics.median(values):.2f}{goals.get(name, '')}")
    if args.out is not None:
        settings = dict(vars(args), out=str(args.out), batch=config.batch_size)
        record = dict(settings=settings, cpu_count=os.cpu_count(), rounds=rounds)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1, default=str))
        print(f"wrote {args.out}")
    if args.learning:
        for seed in range(args.rounds):
            print(f"seed {seed}: held-out greedy exact match {json.dumps(learning(config, seed))}")
        stop_ray()


if __name__ == "__main__":
    main()
