"""The single controller (Chapter 13): one driver holds the dataflow of Chapter 11's GRPO or
Chapter 10's RLHF-PPO and calls the roles wherever they run.

A GRPO iteration is the dataflow of eq-grpo-advantage and eq-grpo-objective as calls: the driver
draws the prompts, the ``actor`` generates, the ``reward`` scores, the ``reference`` gives its
log-probabilities (``beta > 0``), the driver computes the group advantages, and the ``actor``
updates. An RLHF-PPO iteration adds the ``critic``: its values of the response tokens feed the
driver's token-level GAE over the KL-shaped rewards (eq-rlhf-reward, eq-token-gae), and it takes its
value steps beside the actor's policy steps. ``hosts`` maps each role to the host that runs it:
``LocalHost`` objects in this process, or ``rlkit.systems.ray_controller``'s Ray actors. Each host
reports the seconds a call computed; the rest of the call's wall time (serialising, sending, waiting
to be scheduled) is counted as ``dispatch``, the single controller's own cost.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Protocol

from rlkit.llm.grpo import GRPOConfig, Sampled, rollout_from, sampling_stats
from rlkit.llm.models import load_tokenizer
from rlkit.llm.rlhf_ppo import (
    AdaptiveKLController,
    Minibatch,
    RLHFPPOConfig,
    ppo_advantages,
    rollout_stats,
    shaped_rewards,
)
from rlkit.llm.tasks import TaskData, make_task
from rlkit.llm.trainer import OneProcess
from rlkit.training import is_count, require

__all__ = [
    "PHASES",
    "PPO_PHASES",
    "AsyncGRPODataflow",
    "Dataflow",
    "GRPODataflow",
    "Host",
    "PPODataflow",
    "dataflow_for",
    "roles_needed",
]

# "generate_wait": how long the driver waited for an overlapped generation and the scores started
# on it (asynchronous rollouts);
# "weights": asking for the actor's weights to go to a generator apart from it
PHASES = (
    "generate",
    "generate_wait",
    "score",
    "reference",
    "advantages",
    "policy",
    "weights",
    "dispatch",
)
# RLHF-PPO's: "values", the critic's of the response tokens; "critic", its value steps (beside
# the actor's, "policy")
PPO_PHASES = (
    "generate",
    "score",
    "reference",
    "values",
    "advantages",
    "policy",
    "critic",
    "dispatch",
)


class Host(Protocol):
    """Where roles run: ``call`` waits for a method's result and the seconds it computed;
    ``submit`` starts one and ``wait`` collects it (a driver that overlaps calls)."""

    def call(self, role: str, method: str, *args) -> tuple[object, float]: ...

    def submit(self, role: str, method: str, *args) -> object: ...

    def wait(self, submitted: object) -> tuple[object, float]: ...


def require_dataflow_settings(config: GRPOConfig | RLHFPPOConfig) -> None:
    """The settings the distributed dataflow runs: the roles built from saved models, and (GRPO)
    one round of sampling per iteration."""
    require(
        config.sft_folder is not None,
        "sft_folder",
        "a saved model's folder or hub name (each worker loads the policy from it)",
        None,
    )
    if isinstance(config, RLHFPPOConfig):
        require(
            config.reward != "model" or config.reward_model_folder is not None,
            "reward_model_folder",
            "a saved reward model's folder (the reward worker loads it)",
            None,
        )
        return
    require(
        config.dynamic_sampling_rounds == 0,
        "dynamic_sampling_rounds",
        "0 in the distributed dataflow (extra sampling rounds are the single-process trainer's)",
        config.dynamic_sampling_rounds,
    )


def separate_reference(config: GRPOConfig | RLHFPPOConfig) -> bool:
    """A reference worker of its own: without LoRA (with LoRA, the actor's disabled adapters are
    the reference) and, in GRPO, with a KL term (RLHF-PPO always reads the KL)."""
    with_kl = isinstance(config, RLHFPPOConfig) or config.beta > 0
    return with_kl and config.lora_rank is None


def roles_needed(config: GRPOConfig | RLHFPPOConfig, asynchronous: bool = False) -> list[str]:
    """The roles a run of ``config`` has: the actor and the reward, RLHF-PPO's critic, a
    reference of its own (``separate_reference``), and a rollout worker apart from the actor when
    it is asynchronous."""
    roles = ["actor", "reward"]
    if isinstance(config, RLHFPPOConfig):
        roles.append("critic")
    if separate_reference(config):
        roles.append("reference")
    if asynchronous:
        roles.append("rollout")
    return roles


class Dataflow:
    """What a single controller holds whatever the algorithm: the hosts of the roles, the run's
    prompt stream, the history, and calls timed as computing and dispatch. (A run is not
    checkpointed: the driver's prompt stream and the workers' random streams are not saved.)"""

    phases: tuple[str, ...] = PHASES

    def __init__(
        self,
        config,
        hosts: dict[str, Host],
        rank: int = 0,
        world_size: int = 1,
        ranks: OneProcess | None = None,
    ):
        """``rank`` of ``world_size`` (the SPMD ranks of ``rlkit.systems.spmd``): every rank
        draws the ``world_size`` ranks' prompts from the run's one stream and keeps its share;
        ``ranks`` combines what the algorithm computes over the whole batch."""
        require_dataflow_settings(config)
        needed = set(roles_needed(config, asynchronous=isinstance(self, AsyncGRPODataflow)))
        require(
            needed <= set(hosts),
            "hosts",
            f"a host for each of the roles {sorted(needed)}",
            sorted(hosts),
        )
        self.config, self.hosts = config, hosts
        self.task = make_task(getattr(config, "task", "sort"), num_digits=config.num_digits)
        self.data = TaskData(self.task, seed=config.seed)
        self.data.shard(rank, world_size)
        self.eos_token_id = load_tokenizer(config.sft_folder).eos_token_id
        self.rank, self.world_size = rank, world_size
        self.ranks = OneProcess() if ranks is None else ranks
        self.history: list[dict[str, float]] = []
        self.keep_rollouts, self.rollouts = False, []  # the first iteration's, for tests

    def _call(self, seconds: dict[str, float], phase: str, role: str, method: str, *args):
        start = time.perf_counter()
        result, computed = self.hosts[role].call(role, method, *args)
        seconds[phase] += computed
        seconds["dispatch"] += time.perf_counter() - start - computed
        return result

    def _reference_call(self) -> tuple[str, str]:
        """The role and method that give the reference's log-probabilities of a ``Generated``:
        the reference worker's, or with LoRA the actor's (its adapters disabled)."""
        if separate_reference(self.config):
            return "reference", "logprobs_of"
        return "actor", "reference_logprobs_of"

    def _draw_share(self, share: int) -> list[str]:
        """This rank's ``share`` of the next ``share * world_size`` prompts of the run's stream."""
        return [example.prompt for example in self.data.train_batch(share)]

    def _keep_first(self, rollout) -> None:
        if self.keep_rollouts:
            self.rollouts.append(rollout)
            self.keep_rollouts = False  # the first is what the SPMD test compares

    def run_iteration(self) -> dict[str, float]:
        raise NotImplementedError

    def run(self, num_iterations: int | None = None) -> list[dict[str, float]]:
        """``num_iterations`` iterations (None: the config's); the history."""
        for _ in range(self.config.num_iterations if num_iterations is None else num_iterations):
            self.run_iteration()
        return self.history

    def close(self) -> None:
        """Stops the hosts that are processes of their own (Ray actors); local ones have nothing
        to stop."""
        for host in {id(host): host for host in self.hosts.values()}.values():
            if hasattr(host, "kill"):
                host.kill()

    def evaluate(self, num_prompts: int | None = None, seed: int = 0) -> dict:
        """The actor's held-out scores (its trainer's ``evaluate``, computed where the actor is;
        scores that need a model the actor's worker does not hold, such as RLHF's proxy reward,
        are left out)."""
        return self.hosts["actor"].call("actor", "evaluate", num_prompts, seed)[0]


class GRPODataflow(Dataflow):
    """Chapter 11's GRPO iteration, driven from one process: the single controller."""

    def run_iteration(self) -> dict[str, float]:
        """One iteration, the phases of eq-sync-iteration-time in order; its history row (the
        single-process trainer's, and the seconds of each phase, dispatch included)."""
        config, seconds = self.config, dict.fromkeys(PHASES, 0.0)
        iteration_start = time.perf_counter()
        repeated, generated = self._next_generation(seconds)
        rewards, ref_logprobs = self._score(seconds, repeated, generated)
        start = time.perf_counter()
        batch, sampler = generated.batch, generated.sampler_logprobs
        sampled = Sampled(batch, repeated, generated.texts, rewards, ref_logprobs, sampler)
        stats = sampling_stats(sampled, self.task, self.eos_token_id, config.group_size)
        rollout = rollout_from(batch, rewards, ref_logprobs, sampler, config, self.eos_token_id)
        stats["zero_variance_groups_trained"] = float(
            (rollout.advantages.view(-1, config.group_size) == 0).all(dim=1).float().mean()
        )
        seconds["advantages"] += time.perf_counter() - start
        self._keep_first(rollout)
        stats |= self._call(seconds, "policy", "actor", "update", rollout)
        self._after_update(seconds)
        row = {
            "iteration": len(self.history) + 1,
            **stats,
            **{f"seconds_{phase}": value for phase, value in seconds.items()},
            "seconds_iteration": time.perf_counter() - iteration_start,  # wall clock
        }
        self.history.append(row)
        return row

    def _draw_prompts(self) -> list[str]:
        """This rank's share of the next global batch of prompts, each ``group_size`` times."""
        prompts = self._draw_share(self.config.prompts_per_iteration)
        return [prompt for prompt in prompts for _ in range(self.config.group_size)]

    def _next_generation(self, seconds: dict[str, float]):
        """The next prompts and the actor's completions of them."""
        repeated = self._draw_prompts()
        return repeated, self._call(seconds, "generate", "actor", "generate", repeated)

    def _score(self, seconds: dict[str, float], repeated: list[str], generated):
        """The completions' rewards and (``beta > 0``) the reference's log-probabilities."""
        rewards = self._call(seconds, "score", "reward", "rewards", repeated, generated)
        ref_logprobs = None
        if self.config.beta > 0:
            role, method = self._reference_call()
            ref_logprobs = self._call(seconds, "reference", role, method, generated)
        return rewards, ref_logprobs

    def _after_update(self, seconds: dict[str, float]) -> None:
        """Nothing: the actor that steps is the one that samples."""


class PPODataflow(Dataflow):
    """Chapter 10's RLHF-PPO iteration, driven from one process: the four models of
    ``RLHFPPOTrainer`` as roles (actor, critic, reference, reward), the KL-shaped rewards, the
    advantages and the adaptive KL coefficient in the driver."""

    phases = PPO_PHASES

    def __init__(self, config: RLHFPPOConfig, hosts: dict[str, Host], **ranks):
        super().__init__(config, hosts, **ranks)
        self.kl_coef = config.kl_coef
        self.kl_controller = None
        if config.target_kl is not None:
            self.kl_controller = AdaptiveKLController(
                config.kl_coef, config.target_kl, config.kl_horizon
            )

    def run_iteration(self) -> dict[str, float]:
        """One iteration, the single process's phases in its order; the critic's value steps run
        beside the actor's policy steps (eq-sync-iteration-time with the two updates overlapped
        where they are placed apart)."""
        config, seconds = self.config, dict.fromkeys(self.phases, 0.0)
        iteration_start = time.perf_counter()
        prompts = self._draw_share(config.batch_size)
        generated = self._call(seconds, "generate", "actor", "generate", prompts)
        scores = self._call(seconds, "score", "reward", "rewards", prompts, generated)
        role, method = self._reference_call()
        ref_logprobs = self._call(seconds, "reference", role, method, generated)
        values = self._call(seconds, "values", "critic", "values", generated)
        start = time.perf_counter()
        batch, mask = generated.batch, generated.batch.response_mask
        rewards = shaped_rewards(batch, ref_logprobs, scores, self.kl_coef, config)
        advantages, returns = ppo_advantages(rewards, values, mask, config, self.ranks.whiten)
        rollout = Minibatch.of(batch, advantages, returns, values, generated.sampler_logprobs)
        seconds["advantages"] += time.perf_counter() - start
        self._keep_first(rollout)
        row = {
            "iteration": len(self.history) + 1,
            **rollout_stats(self.task, prompts, generated.texts, scores, batch, ref_logprobs),
            "kl_coef": self.kl_coef,
            **self._updates(seconds, rollout),
            **{f"seconds_{phase}": value for phase, value in seconds.items()},
            "seconds_iteration": time.perf_counter() - iteration_start,  # wall clock
        }
        self.history.append(row)
        if self.kl_controller is not None:
            kl, responses = self.ranks.mean(row["kl"]), config.batch_size * self.world_size
            self.kl_coef = self.kl_controller.update(kl, responses)
        return row

    def _updates(self, seconds: dict[str, float], rollout: Minibatch) -> dict[str, float]:
        """The actor's and the critic's steps on the rollout, both started before either is
        waited for; the pair's wall time beyond the longer of the two is dispatch."""
        start = time.perf_counter()
        policy = self.hosts["actor"].submit("actor", "update", rollout)
        critic = self.hosts["critic"].submit("critic", "update", rollout)
        (actor_stats, seconds["policy"]), (critic_stats, seconds["critic"]) = (
            self.hosts["actor"].wait(policy),
            self.hosts["critic"].wait(critic),
        )
        wall = time.perf_counter() - start
        seconds["dispatch"] += max(0.0, wall - max(seconds["policy"], seconds["critic"]))
        return actor_stats | critic_stats


def dataflow_for(config: GRPOConfig | RLHFPPOConfig, hosts: dict[str, Host], **ranks) -> Dataflow:
    """The synchronous single controller of ``config``'s algorithm (``ranks``: ``Dataflow``'s
    ``rank``, ``world_size`` and ``ranks``, for an SPMD rank)."""
    if isinstance(config, RLHFPPOConfig):
        return PPODataflow(config, hosts, **ranks)
    return GRPODataflow(config, hosts, **ranks)


def require_async_settings(config: GRPOConfig, staleness: int, measure_mismatch: bool) -> None:
    """The settings asynchronous rollouts take (checked before any worker starts)."""
    require_dataflow_settings(config)
    require(is_count(staleness, minimum=0), "staleness", "an integer >= 0", staleness)
    require(
        config.sampler_lag == 0,
        "sampler_lag",
        "0 with asynchronous rollouts (their lag is the staleness)",
        config.sampler_lag,
    )
    require(
        config.sampler_dtype == "float32",
        "sampler_dtype",
        "'float32' with asynchronous rollouts (the rollout worker holds the actor's weights)",
        config.sampler_dtype,
    )
    require(
        measure_mismatch or config.sampler_correction is None,
        "measure_mismatch",
        f"True when sampler_correction is set ({config.sampler_correction!r} reads the "
        "sampler's log-probabilities)",
        measure_mismatch,
    )


class AsyncGRPODataflow(GRPODataflow):
    """Asynchronous rollouts: a ``rollout`` worker generates the next batches while the actor
    trains on this one, ``staleness`` batches ahead at most.

    At the start of iteration ``k`` the driver asks for every generation up to batch ``k +
    staleness`` not yet asked for (one, after the first iteration); the rollout worker runs its
    calls in order, so batch ``k + staleness`` is generated with the weights after update ``k -
    1``: batch ``j`` comes from the policy ``staleness`` updates before the one that trains on it
    (the start's in the first iterations), the single-process trainer's ``sampler_lag``, which it
    equals. With ``staleness=0`` it is the synchronous run. The reward's and the reference
    worker's calls on a batch are started with its generation and take its completions when they
    are ready (on Ray, from the object store, not through the driver), so they too overlap
    training; place them apart from the actor, or they wait in its queue. The actor's weights go
    to the rollout worker after every update; with more than one step per batch the actor
    recomputes the ratio's old log-probabilities itself.

    ``measure_mismatch``: the rollout worker also returns the sampler's log-probabilities (one
    more forward pass), which the history's ``sampler_kl`` and a ``sampler_correction`` read;
    off (False) only without a correction.
    """

    def __init__(
        self,
        config: GRPOConfig,
        hosts: dict[str, Host],
        staleness: int = 1,
        measure_mismatch: bool = True,
    ):
        require_async_settings(config, staleness, measure_mismatch)
        super().__init__(config, hosts)
        self.staleness, self.measure_mismatch = staleness, measure_mismatch
        # (prompts, generation, rewards, reference): the calls submitted for each batch ahead
        self.in_flight: collections.deque = collections.deque()
        self.generations_asked = 0

    def _next_generation(self, seconds: dict[str, float]):
        """The batch to train on, generated while earlier batches trained (eq-async-iteration-time):
        first every generation up to ``staleness`` batches ahead is asked for."""
        generator = self.hosts["rollout"]
        ahead = min(len(self.history) + 1 + self.staleness, self.config.num_iterations)
        while self.generations_asked < ahead:
            repeated = self._draw_prompts()
            submitted = generator.submit("rollout", "generate", repeated, self.measure_mismatch)
            self.in_flight.append((repeated, submitted, *self._submit_scores(repeated, submitted)))
            self.generations_asked += 1
        require(
            len(self.in_flight) > 0,
            "num_iterations",
            f"more iterations than the run's {self.config.num_iterations}",
            len(self.history) + 1,
        )
        repeated, submitted, *self.scores_in_flight = self.in_flight.popleft()
        start = time.perf_counter()
        generated, computed = generator.wait(submitted)
        seconds["generate"] += computed
        seconds["generate_wait"] += time.perf_counter() - start
        if not self.config.one_step_per_batch:
            batch = self._call(seconds, "policy", "actor", "old_logprobs", generated.batch)
            generated = dataclasses.replace(generated, batch=batch)
        # how many of the actor's updates the generator's weights were behind: at most staleness
        self.last_staleness = len(self.history) - generated.weights_version
        if self.last_staleness > self.staleness:  # a set_weights call was lost
            raise RuntimeError(
                f"the rollout worker's weights were {self.last_staleness} updates behind, more "
                f"than the staleness bound {self.staleness}: sending it the weights failed"
            )
        return repeated, generated

    def run_iteration(self) -> dict[str, float]:
        """One iteration; its row adds ``staleness``, the updates the batch's weights lacked."""
        row = super().run_iteration()
        row["staleness"] = float(self.last_staleness)
        return row

    def _submit_scores(self, repeated: list[str], generation) -> tuple:
        """The reward's call and the reference worker's, started on a generation still running:
        each worker takes the completions when they are ready, with no trip through the driver.
        (With LoRA the actor computes the reference: it is asked later, after it is free.)"""
        rewards = self.hosts["reward"].submit("reward", "rewards", repeated, generation)
        reference = None
        if separate_reference(self.config):
            reference = self.hosts["reference"].submit("reference", "logprobs_of", generation)
        return rewards, reference

    def _score(self, seconds: dict[str, float], repeated: list[str], generated):
        rewards_call, reference_call = self.scores_in_flight
        start = time.perf_counter()
        rewards, computed = self.hosts["reward"].wait(rewards_call)
        seconds["score"] += computed
        ref_logprobs = None
        if reference_call is not None:
            ref_logprobs, computed = self.hosts["reference"].wait(reference_call)
            seconds["reference"] += computed
        seconds["generate_wait"] += time.perf_counter() - start
        if self.config.beta > 0 and reference_call is None:  # LoRA: the actor's, now
            role, method = self._reference_call()
            ref_logprobs = self._call(seconds, "reference", role, method, generated)
        return rewards, ref_logprobs

    def _after_update(self, seconds: dict[str, float]) -> None:
        """The actor's new weights to the rollout worker, behind the generations already asked.
        The driver only asks: the rollout worker takes the weights from the actor's call when they
        are ready (on Ray, through the object store), and the driver goes on to the next batch."""
        version = len(self.history) + 1
        if version >= self.config.num_iterations:
            return  # every generation has been asked for: no batch would use these weights
        start = time.perf_counter()
        weights = self.hosts["actor"].submit("actor", "weights")
        self.hosts["rollout"].submit("rollout", "set_weights", weights, version)
        seconds["weights"] += time.perf_counter() - start
