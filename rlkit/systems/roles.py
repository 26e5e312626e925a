"""The worker roles of Chapter 10's RLHF-PPO and Chapter 11's GRPO dataflows (Chapter 13): what
each node of the dataflow computes, with no word about where it runs.

Every role is a plain object with a few methods: the ``actor`` samples completions and updates the
policy, the ``reference`` gives the frozen start's log-probabilities, the ``reward`` scores the
completions (the task's verifiable reward, or RLHF's reward model), the ``critic`` (RLHF-PPO) gives
the values of the response tokens and takes the value steps; the ``rollout`` worker generates apart
from the actor (GRPO's asynchronous training). A host (``LocalHost`` here,
``rlkit.systems.ray_controller``'s Ray actors, or one rank of ``rlkit.systems.spmd``) builds the
roles it is given and runs their methods; the driver (``rlkit.systems.dataflow``) holds the dataflow
and calls them. Each role is built from the run's config alone (a ``GRPOConfig`` or an
``RLHFPPOConfig``), so that a host in another process builds the same object from the same settings,
and the same random streams make it compute the same numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass

import torch

from rlkit.llm.generation import ResponseBatch, generate
from rlkit.llm.grpo import GRPOConfig, GRPOTrainer, Rollout, task_rewards
from rlkit.llm.models import load_causal_lm
from rlkit.llm.rlhf_ppo import Minibatch, RLHFPPOConfig, RLHFPPOTrainer, response_values
from rlkit.llm.tasks import make_task
from rlkit.llm.trainer import frozen, uses_bf16
from rlkit.training import require

__all__ = [
    "PPO_ROLES",
    "ROLES",
    "ActorRole",
    "CriticRole",
    "Generated",
    "LocalHost",
    "PPOActorRole",
    "PPORewardRole",
    "ReferenceRole",
    "RewardRole",
    "RolloutRole",
    "roles_of",
]


@dataclass
class Generated:
    """The actor's completions of one batch of prompts."""

    batch: ResponseBatch
    texts: list[str]
    sampler_logprobs: torch.Tensor | None  # [B, T]: a separate sampler's, where one is kept
    weights_version: int | None = None  # a separate generator's: the actor updates its weights had


class ActorRole:
    """The policy: it samples completions (the rollout) and takes the policy's steps (the actor
    update). It is Chapter 11's trainer without the reference and the data, which live
    elsewhere."""

    def __init__(self, config: GRPOConfig):
        self.trainer = GRPOTrainer(config, keep_reference=False)

    def generate(self, prompts: list[str]) -> Generated:
        """One completion per prompt (a group repeats its prompt), from this iteration's
        sampler."""
        trainer = self.trainer
        if trainer.sampler is not None:
            trainer.sampler.sync(trainer.model)
        batch, sampler_logprobs = trainer.generate_completions(prompts)
        return Generated(batch, batch.texts(trainer.tokenizer), sampler_logprobs)

    def update(self, rollout: Rollout) -> dict[str, float]:
        """``num_epochs`` passes of ``grpo_loss`` steps over the scored rollout."""
        stats = self.trainer._policy_epochs(rollout)
        self.trainer.updates_done += 1
        return stats

    def reference_logprobs(self, batch: ResponseBatch) -> torch.Tensor:
        """With LoRA the reference is this policy with its adapters disabled: only the actor's
        host can compute it."""
        with torch.no_grad(), self.trainer.autocast():
            return self.trainer.reference_logprobs(batch)

    def reference_logprobs_of(self, generated: Generated) -> torch.Tensor:
        return self.reference_logprobs(generated.batch)

    def old_logprobs(self, batch: ResponseBatch) -> ResponseBatch:
        """The batch with the trainer's log-probabilities as the ratio's old ones (a generator that
        is not the trainer sampled it, and the loss takes more than one step on it)."""
        with torch.no_grad(), self.trainer.autocast():
            logprobs = batch.logprobs_under(self.trainer.model)
        return dataclasses.replace(batch, logprobs=logprobs)

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights, for a generator in another process."""
        return self.trainer.model.state_dict()

    def evaluate(self, num_prompts: int | None = None, seed: int = 0) -> dict:
        return self.trainer.evaluate(num_prompts, seed)

    def state_dict(self) -> dict:
        return self.trainer.state_dict()


class RolloutRole:
    """A generator apart from the trainer (asynchronous training): a copy of the policy whose
    weights the driver sets after the actor's steps. It is built as the actor is, so that it
    samples from the random stream the actor would have sampled from."""

    def __init__(self, config: GRPOConfig):
        self.trainer = GRPOTrainer(config, keep_reference=False)
        self.trainer.optimizer = None  # it never steps
        self.version = 0  # how many of the actor's updates its weights include

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self.trainer.model.load_state_dict(weights)
        self.version = version

    def generate(self, prompts: list[str], with_logprobs: bool = True) -> Generated:
        """One completion per prompt with this copy's weights, and (``with_logprobs``) their
        log-probabilities under it, the sampler's: one more forward pass."""
        trainer, config = self.trainer, self.trainer.config
        with torch.no_grad(), trainer.autocast():
            batch = generate(
                trainer.model,
                trainer.tokenizer,
                prompts,
                config.max_new_tokens,
                config.temperature,
                decoder=config.decoder,
                with_logprobs=with_logprobs,
            )
        sampler_logprobs = batch.logprobs if with_logprobs else None
        return Generated(batch, batch.texts(trainer.tokenizer), sampler_logprobs, self.version)


class ReferenceRole:
    """The frozen start: the log-probabilities of the sampled tokens for the KL term."""

    def __init__(self, config: GRPOConfig):
        require(
            config.lora_rank is None,
            "lora_rank",
            "None for a reference worker of its own (with LoRA the reference is the actor's "
            "disabled adapters: the actor answers for it)",
            config.lora_rank,
        )
        self.model = frozen(load_causal_lm(config.sft_folder, dtype=torch.float32))
        self.model.to(config.device)
        self.bf16 = uses_bf16(config)

    def logprobs_of(self, generated: Generated) -> torch.Tensor:
        """``logprobs`` of the generated batch (chained on a generation still running)."""
        return self.logprobs(generated.batch)

    def logprobs(self, batch: ResponseBatch) -> torch.Tensor:
        """Under the trainer's autocast (bf16 on a capable GPU), as the single process computes
        them."""
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
        )
        with torch.no_grad(), autocast:
            return batch.logprobs_under(self.model)


class RewardRole:
    """The task's verifiable reward (and DAPO's over-long penalty when it is on)."""

    def __init__(self, config: GRPOConfig):
        self.config = config
        self.task = make_task(config.task, num_digits=config.num_digits)

    def rewards(self, prompts: list[str], generated: Generated) -> torch.Tensor:
        return task_rewards(self.task, self.config, prompts, generated.texts, generated.batch)


class PPOActorRole(ActorRole):
    """RLHF-PPO's policy (Chapter 10): it samples the responses and takes PPO's policy steps
    (eq-ppo-clip); the critic, the reference and the reward model are other roles."""

    def __init__(self, config: RLHFPPOConfig):
        self.trainer = RLHFPPOTrainer(config, keep=())

    def generate(self, prompts: list[str]) -> Generated:
        """One response per prompt, as the single process samples it (its separate sampler, where
        the config injects one, included)."""
        trainer = self.trainer
        with trainer.autocast():
            batch, sampler_logprobs = trainer._generate(prompts)
        return Generated(batch, batch.texts(trainer.tokenizer), sampler_logprobs)

    def update(self, rollout: Minibatch) -> dict[str, float]:
        """The actor's half of ``ppo_epochs`` passes: its steps on the shuffled minibatches."""
        stats = self.trainer._ppo_epochs(rollout, steps=("actor",))
        self.trainer.updates_done += 1
        return stats

    def state_dict(self) -> dict:
        """The policy and its optimizer (the trainer's whole state names models it does not
        hold)."""
        return {
            "model": self.trainer.model.state_dict(),
            "optimizer": self.trainer.optimizer.state_dict(),
        }


def without_policy(trainer: RLHFPPOTrainer) -> RLHFPPOTrainer:
    """A trainer that keeps another model and never runs the policy: its actor (loaded to start a
    critic from, and to build the trainer around) is let go."""
    trainer.model = trainer.optimizer = trainer.sampler = None
    return trainer


class CriticRole:
    """RLHF-PPO's value model: ``V(s_t)`` for every response token, and PPO's value steps
    (eq-ppo-value-clip) on the same shuffled minibatches as the actor's (the two never read each
    other's weights)."""

    def __init__(self, config: RLHFPPOConfig):
        self.trainer = without_policy(RLHFPPOTrainer(config, keep=("critic",)))

    def values(self, generated: Generated) -> torch.Tensor:
        batch, trainer = generated.batch, self.trainer
        with torch.no_grad(), trainer.autocast():
            return response_values(
                trainer.critic, batch.prompts, batch.response_ids, batch.response_mask
            )

    def update(self, rollout: Minibatch) -> dict[str, float]:
        stats = self.trainer._ppo_epochs(rollout, steps=("critic",))
        self.trainer.updates_done += 1
        return stats

    def state_dict(self) -> dict:
        """The critic and its optimizer."""
        trainer = self.trainer
        return {
            "critic": trainer.critic.state_dict(),
            "critic_optimizer": trainer.critic_optimizer.state_dict(),
        }


class PPORewardRole:
    """RLHF-PPO's score of each response: the reward model's (or the task's exact match), less the
    missing-EOS penalty where the config sets one."""

    def __init__(self, config: RLHFPPOConfig):
        self.trainer = without_policy(RLHFPPOTrainer(config, keep=("reward_model",)))

    def rewards(self, prompts: list[str], generated: Generated) -> torch.Tensor:
        return self.trainer._scores(prompts, generated.texts, generated.batch)


ROLES = {
    "actor": ActorRole,
    "rollout": RolloutRole,
    "reference": ReferenceRole,
    "reward": RewardRole,
}
PPO_ROLES = {
    "actor": PPOActorRole,
    "critic": CriticRole,
    "reference": ReferenceRole,
    "reward": PPORewardRole,
}


def roles_of(config) -> dict[str, type]:
    """The role classes of ``config``'s algorithm: RLHF-PPO's or GRPO's."""
    return PPO_ROLES if isinstance(config, RLHFPPOConfig) else ROLES


@dataclass
class Submitted:
    """A call that ``LocalHost.submit`` ran at once: its result and the seconds it computed."""

    result: object
    seconds: float


class LocalHost:
    """Hosts roles in this process: the single process of Chapter 11, and what each Ray actor and
    each SPMD rank runs inside. ``call`` returns a method's result with the seconds it computed,
    so that a driver can tell computing from dispatching."""

    def __init__(self, config: GRPOConfig | RLHFPPOConfig, role_names: list[str]):
        classes = roles_of(config)
        for name in role_names:
            require(name in classes, "role", f"one of {tuple(classes)}", name)
        # the actor and the rollout last: their trainers seed the random streams they sample with,
        # and loading another role's model may draw from them
        order = sorted(role_names, key=lambda name: name in ("actor", "rollout"))
        self.roles = {name: classes[name](config) for name in order}

    def call(self, role: str, method: str, *args):
        start = time.perf_counter()
        result = getattr(self.roles[role], method)(*args)
        return result, time.perf_counter() - start

    def call_on_results(self, role: str, method: str, results_at: tuple[int, ...], *args):
        """``call``, where the arguments at ``results_at`` are other calls' ``(result, seconds)``
        (a Ray worker receives a submitted call's result that way) and only the result is
        passed on."""
        args = [arg[0] if i in results_at else arg for i, arg in enumerate(args)]
        return self.call(role, method, *args)

    def submit(self, role: str, method: str, *args) -> Submitted:
        """``call`` for a driver that overlaps calls: in one process it runs at once. An argument
        may be another submitted call: its result is passed."""
        args = [arg.result if isinstance(arg, Submitted) else arg for arg in args]
        return Submitted(*self.call(role, method, *args))

    def wait(self, submitted: Submitted) -> tuple[object, float]:
        return submitted.result, submitted.seconds

    def pid(self) -> int:
        return os.getpid()
