"""The single controller (Chapter 13): one driver holds Chapter 11's GRPO dataflow and calls the
roles wherever they run.

An iteration is the dataflow of eq-grpo-advantage and eq-grpo-objective as calls: the driver
draws the prompts, the ``actor`` generates, the ``reward`` scores, the ``reference`` gives its
log-probabilities (``beta > 0``), the driver computes the group advantages, and the ``actor``
updates. ``hosts`` maps each role to the host that runs it: ``LocalHost`` objects in this process,
or ``rlkit.systems.ray_controller``'s Ray actors. Each host reports the seconds a call computed;
the rest of the call's wall time (serialising, sending, waiting to be scheduled) is counted as
``dispatch``, the single controller's own cost.
"""

from __future__ import annotations

import time
from typing import Protocol

from rlkit.llm.grpo import GRPOConfig, Sampled, rollout_from, sampling_stats
from rlkit.llm.models import load_tokenizer
from rlkit.llm.tasks import TaskData, make_task
from rlkit.training import require

__all__ = ["PHASES", "GRPODataflow", "Host"]

PHASES = ("generate", "score", "reference", "advantages", "policy", "dispatch")


class Host(Protocol):
    def call(self, role: str, method: str, *args) -> tuple[object, float]: ...


def require_dataflow_settings(config: GRPOConfig) -> None:
    """The settings the distributed dataflow runs: one round of sampling per iteration, and the
    roles built from a saved model."""
    require(
        config.dynamic_sampling_rounds == 0,
        "dynamic_sampling_rounds",
        "0 in the distributed dataflow (extra sampling rounds are the single-process trainer's)",
        config.dynamic_sampling_rounds,
    )
    require(
        config.sft_folder is not None,
        "sft_folder",
        "a saved model's folder or hub name (each worker loads the policy from it)",
        None,
    )


class GRPODataflow:
    """Chapter 11's GRPO iteration, driven from one process: the single controller."""

    def __init__(
        self, config: GRPOConfig, hosts: dict[str, Host], rank: int = 0, world_size: int = 1
    ):
        """``rank`` of ``world_size`` (the SPMD ranks of ``rlkit.systems.spmd``): every rank
        draws the ``world_size`` ranks' prompts from the run's one stream and keeps its share."""
        require_dataflow_settings(config)
        needed = {"actor", "reward"} | ({"reference"} if self.separate_reference(config) else set())
        require(
            needed <= set(hosts),
            "hosts",
            f"a host for each of the roles {sorted(needed)}",
            sorted(hosts),
        )
        self.config, self.hosts = config, hosts
        self.task = make_task(config.task, num_digits=config.num_digits)
        self.data = TaskData(self.task, seed=config.seed)
        self.eos_token_id = load_tokenizer(config.sft_folder).eos_token_id
        self.rank, self.world_size = rank, world_size
        self.history: list[dict[str, float]] = []
        self.keep_rollouts, self.rollouts = False, []  # each iteration's, for tests

    @staticmethod
    def separate_reference(config: GRPOConfig) -> bool:
        """A reference worker of its own: with a KL term and without LoRA (with LoRA, the actor's
        disabled adapters are the reference)."""
        return config.beta > 0 and config.lora_rank is None

    def _call(self, seconds: dict[str, float], phase: str, role: str, method: str, *args):
        start = time.perf_counter()
        result, computed = self.hosts[role].call(role, method, *args)
        seconds[phase] += computed
        seconds["dispatch"] += time.perf_counter() - start - computed
        return result

    def run_iteration(self) -> dict[str, float]:
        """One iteration; its history row (the single-process trainer's, and the dispatch time)."""
        config, seconds = self.config, dict.fromkeys(PHASES, 0.0)
        share = config.prompts_per_iteration
        drawn = self.data.train_batch(share * self.world_size)
        prompts = [e.prompt for e in drawn[self.rank * share : (self.rank + 1) * share]]
        repeated = [prompt for prompt in prompts for _ in range(config.group_size)]
        generated = self._call(seconds, "generate", "actor", "generate", repeated)
        rewards = self._call(seconds, "score", "reward", "rewards", repeated, generated)
        ref_logprobs = None
        if config.beta > 0:
            role, method = (
                ("reference", "logprobs")
                if self.separate_reference(config)
                else ("actor", "reference_logprobs")
            )
            ref_logprobs = self._call(seconds, "reference", role, method, generated.batch)
        start = time.perf_counter()
        batch, sampler = generated.batch, generated.sampler_logprobs
        sampled = Sampled(batch, repeated, generated.texts, rewards, ref_logprobs, sampler)
        stats = sampling_stats(sampled, self.task, self.eos_token_id, config.group_size)
        rollout = rollout_from(batch, rewards, ref_logprobs, sampler, config, self.eos_token_id)
        stats["zero_variance_groups_trained"] = float(
            (rollout.advantages.view(-1, config.group_size) == 0).all(dim=1).float().mean()
        )
        seconds["advantages"] += time.perf_counter() - start
        if self.keep_rollouts:
            self.rollouts.append(rollout)
        stats |= self._call(seconds, "policy", "actor", "update", rollout)
        row = {
            "iteration": len(self.history) + 1,
            **stats,
            **{f"seconds_{phase}": value for phase, value in seconds.items()},
        }
        self.history.append(row)
        return row

    def run(self, num_iterations: int | None = None) -> list[dict[str, float]]:
        """``num_iterations`` iterations (None: the config's); the history."""
        for _ in range(self.config.num_iterations if num_iterations is None else num_iterations):
            self.run_iteration()
        return self.history

    def evaluate(self, num_prompts: int | None = None, seed: int = 0) -> dict:
        """The actor's held-out scores (``GRPOTrainer.evaluate``, computed where the actor is)."""
        return self.hosts["actor"].call("actor", "evaluate", num_prompts, seed)[0]
