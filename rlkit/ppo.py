"""Proximal policy optimization (PPO; Schulman et al., 2017; Chapter 7).

PPO collects a rollout with the current policy ``pi_old`` and then takes several epochs of minibatch
gradient steps on it. The probability ratio ``rho_t = pi(a_t|s_t) / pi_old(a_t|s_t)`` weighs each
advantage, and clipping it keeps the new policy near the one that collected the data:

    L^CLIP = 1/|o| sum_t min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t)             (eq-ppo-clip)

(``rlkit.losses.clipped_policy_loss`` returns its negative). The critic regresses on GAE's
lambda-returns (eq-gae), optionally with its change clipped as well (eq-ppo-value-clip), and one
loss trains both:

    L = -L^CLIP + vf_coef * L^V - ent_coef * 1/|o| sum_t H(pi(.|s_t))                  (eq-ppo-loss)

The implementation details for classic control (Huang et al., 2022), each visible below: vectorised
rollouts that carry the last observation across updates (``RolloutCollector``), orthogonal
initialisation (``ActorCritic``), Adam with eps 1e-5, linear learning-rate annealing, GAE, shuffled
minibatches over several epochs, per-minibatch advantage normalisation, the clipped surrogate,
optional value clipping, the entropy bonus, global gradient-norm clipping, and approx-KL, clip
fraction and explained variance in the history. Truncation bootstraps and termination does not
(``RolloutCollector``). Continuous actions come from a Gaussian with a state-independent log-std,
drawn unbounded and clipped to the action bounds only for the environment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import torch

from rlkit.actor_critic import (
    ActorCriticTrainer,
    advantages_and_returns,
    clip_grad_norm,
    validate_actor_critic,
)
from rlkit.losses import (
    approx_kl,
    clip_fraction,
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    masked_whiten,
)
from rlkit.nets import ActorCritic, FlatAdam
from rlkit.presets import AlgorithmConfig
from rlkit.rollouts import BATCHED_ENVS, Rollout
from rlkit.training import (
    SCHEDULES,
    TrainResult,
    fit,
    greedy_mean_return,
    is_count,
    is_finite_number,
    is_number,
    require,
    scheduled,
    set_learning_rate,
)


@dataclass
class PPOConfig(AlgorithmConfig):
    """PPO's hyperparameters, each with its default (CleanRL's ``ppo.py``: 4 minibatches of
    4 x 128, value clipping at 0.2, entropy 0.01).

    ``PPOConfig.for_env(env_id, **overrides)`` applies the tested preset of ``env_id``
    (``rlkit/presets.py``): for CartPole-v1 and Pendulum-v1, rl-baselines3-zoo's."""

    algorithm: ClassVar[str] = "ppo"

    env_id: str = "CartPole-v1"
    seed: int = 0
    # environment steps, all copies together (rounded down to whole rollouts)
    total_steps: int = 500_000
    num_envs: int = 4  # copies stepped in lockstep
    num_steps: int = 128  # steps per copy per rollout
    # transitions per gradient step; must divide num_envs * num_steps
    minibatch_size: int = 128
    num_epochs: int = 4  # passes over each rollout
    learning_rate: float = 2.5e-4
    lr_schedule: str = "linear"  # "linear" (anneal to 0 over training) or "constant"
    gamma: float = 0.99
    lam: float = 0.95  # GAE's lambda
    # the ratio is clipped to [1 - clip_eps, 1 + clip_eps] (eq-ppo-clip; math.inf: never)
    clip_eps: float = 0.2
    clip_schedule: str = "constant"  # "constant", or "linear" to 0 (rl-baselines3-zoo's CartPole)
    # clip the critic's change per rollout (eq-ppo-value-clip); None: plain MSE
    value_clip_eps: float | None = 0.2
    normalize_advantages: bool = True  # whiten the advantages of each minibatch
    ent_coef: float = 0.01  # weight of the entropy bonus
    # weight of the value loss, which is 0.5 * squared error (CleanRL's scale)
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5  # clip the global gradient norm (math.inf: never)
    # stop after an epoch that leaves approx-KL on the rollout above it (None: never)
    target_kl: float | None = None
    optimizer_eps: float = 1e-5  # Adam's eps (1e-5, not PyTorch's 1e-8)
    # of both the policy and the value network (no shared layers)
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    # continuous actions only: the Gaussian's starting log-std (None: 0)
    initial_log_std: float | None = None
    # step the copies with rlkit's batched env (CartPole-v1) instead of SyncVectorEnv
    batched_env: bool = False
    device: str = "cpu"
    progress: bool = False

    @property
    def batch_size(self) -> int:
        """Transitions per rollout."""
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        """Whole rollouts within ``total_steps`` (CleanRL's count): training never exceeds the step
        budget."""
        return self.total_steps // self.batch_size

    def _validate(self) -> None:
        validate_actor_critic(self)
        for name in ("num_envs", "minibatch_size", "num_epochs"):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            self.total_steps >= self.batch_size,
            "total_steps",
            f">= num_envs * num_steps = {self.batch_size} (one rollout)",
            self.total_steps,
        )
        require(
            self.minibatch_size <= self.batch_size and self.batch_size % self.minibatch_size == 0,
            "minibatch_size",
            f"a divisor of num_envs * num_steps = {self.batch_size}",
            self.minibatch_size,
        )
        require(
            is_clip_range(self.clip_eps),
            "clip_eps",
            "a number > 0 (math.inf: never clip)",
            self.clip_eps,
        )
        require(
            self.clip_schedule in SCHEDULES,
            "clip_schedule",
            f"one of {SCHEDULES}",
            self.clip_schedule,
        )
        require(
            self.value_clip_eps is None or is_clip_range(self.value_clip_eps),
            "value_clip_eps",
            "None or a number > 0 (math.inf: never clip)",
            self.value_clip_eps,
        )
        require(
            self.target_kl is None or (is_number(self.target_kl) and self.target_kl > 0),
            "target_kl",
            "None or a number > 0",
            self.target_kl,
        )
        require(
            isinstance(self.normalize_advantages, bool),
            "normalize_advantages",
            "True or False",
            self.normalize_advantages,
        )
        require(
            not self.normalize_advantages or self.minibatch_size >= 2,
            "normalize_advantages",
            "False when minibatch_size < 2 (whitening needs two advantages)",
            self.normalize_advantages,
        )
        require(
            self.initial_log_std is None
            or (is_finite_number(self.initial_log_std) and -20 <= self.initial_log_std <= 2),
            "initial_log_std",
            "None or a number in [-20, 2] (a standard deviation from 2e-9 to 7.4)",
            self.initial_log_std,
        )
        require(
            isinstance(self.batched_env, bool), "batched_env", "True or False", self.batched_env
        )
        require(
            not self.batched_env or self.env_id in BATCHED_ENVS,
            "batched_env",
            f"False for {self.env_id!r} (batched versions exist of {sorted(BATCHED_ENVS)})",
            self.batched_env,
        )


def is_clip_range(value) -> bool:
    """A clip range: a number > 0 that float32 holds, or math.inf (never clip)."""
    return (
        is_number(value)
        and value > 0
        and (value == math.inf or value <= torch.finfo(torch.float32).max)
    )


def make_agent(config: PPOConfig, envs: gym.vector.VectorEnv) -> ActorCritic:
    """A categorical actor-critic for Discrete actions, a Gaussian one for Box actions (flat Box
    observations)."""
    observations, actions = envs.single_observation_space, envs.single_action_space
    require(
        isinstance(observations, gym.spaces.Box) and len(observations.shape) == 1,
        "env_id",
        "an environment with flat Box observations",
        f"{config.env_id} with {observations}",
    )
    continuous = isinstance(actions, gym.spaces.Box)
    require(
        continuous
        and len(actions.shape) == 1
        or isinstance(actions, gym.spaces.Discrete)
        and actions.start == 0,
        "env_id",
        "an environment with Discrete (from 0) or flat Box actions",
        f"{config.env_id} with {actions}",
    )
    require(
        continuous or config.initial_log_std is None,
        "initial_log_std",
        f"None for {config.env_id}, whose actions are discrete (it sets a Gaussian's spread)",
        config.initial_log_std,
    )
    log_std = 0.0 if config.initial_log_std is None else config.initial_log_std
    return ActorCritic.for_spaces(
        observations, actions, config.hidden_sizes, config.activation, log_std
    ).to(config.device)


@dataclass
class Batch:
    """A rollout flattened to ``[num_envs * num_steps]`` transitions, with GAE's advantages and
    returns."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor  # log pi_old(a|s)
    values: torch.Tensor  # V_old(s)
    advantages: torch.Tensor
    returns: torch.Tensor

    @classmethod
    def from_rollout(
        cls, rollout: Rollout, advantages: torch.Tensor, returns: torch.Tensor
    ) -> Batch:
        return cls(
            rollout.obs.flatten(0, 1),
            rollout.actions.flatten(0, 1),
            rollout.logprobs.flatten(),
            rollout.values.flatten(),
            advantages.flatten(),
            returns.flatten(),
        )

    def __len__(self) -> int:
        return self.logprobs.shape[0]

    def take(self, indices: torch.Tensor) -> Batch:
        return Batch(*(getattr(self, name)[indices] for name in self.__dataclass_fields__))


def minibatches(batch: Batch, minibatch_size: int, generator: torch.Generator):
    """A fresh random permutation of the batch, cut into minibatches (the whole batch when it is
    one)."""
    # one minibatch per epoch: its order changes no mean, so skip the gather
    if minibatch_size == len(batch):
        yield batch
        return
    permutation = torch.randperm(len(batch), generator=generator).to(batch.obs.device)
    for start in range(0, len(batch), minibatch_size):
        yield batch.take(permutation[start : start + minibatch_size])


def ppo_loss(
    agent: ActorCritic, minibatch: Batch, config: PPOConfig, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """eq-ppo-loss on one minibatch; the loss and its parts ``[policy loss, value loss, entropy]``
    (detached)."""
    logprobs, entropies, values = agent.log_prob_entropy_and_value(minibatch.obs, minibatch.actions)
    advantages = minibatch.advantages
    if config.normalize_advantages:
        advantages = masked_whiten(advantages)
    policy_loss = clipped_policy_loss(logprobs, minibatch.logprobs, advantages, clip_eps)
    value_loss = clipped_value_loss(
        values, minibatch.values, minibatch.returns, config.value_clip_eps
    )
    entropy_bonus = entropies.mean()
    loss = policy_loss + config.vf_coef * value_loss
    if config.ent_coef:  # with ent_coef = 0 the backward pass skips the entropy's graph
        loss = loss - config.ent_coef * entropy_bonus
    return loss, torch.stack([policy_loss, value_loss, entropy_bonus]).detach()


LOSS_PARTS = ("policy_loss", "value_loss", "entropy")


def update(
    agent: ActorCritic,
    optimizer: torch.optim.Optimizer | FlatAdam,
    rollout: Rollout,
    config: PPOConfig,
    clip_eps: float,
    generator: torch.Generator,
) -> dict[str, float]:
    """``num_epochs`` passes of minibatch gradient steps on one rollout; the metrics of the update.

    The losses and the gradient norm are averaged over the steps; approx-KL and the clip fraction
    compare the policy after the update with ``pi_old`` on the whole rollout (SB3 averages them over
    the minibatches, before each step). With ``target_kl``, the same measurement after each epoch
    can end the update early.
    """
    advantages, returns = advantages_and_returns(rollout, config.gamma, config.lam)
    batch = Batch.from_rollout(rollout, advantages, returns)
    parts, grad_norms = [], []
    for epoch in range(1, config.num_epochs + 1):
        for minibatch in minibatches(batch, config.minibatch_size, generator):
            loss, loss_parts = ppo_loss(agent, minibatch, config, clip_eps)
            optimizer.zero_grad()
            loss.backward()
            grad_norms.append(clip_grad_norm(agent.parameters(), config.max_grad_norm))
            optimizer.step()
            parts.append(loss_parts)
        if (
            config.target_kl is not None
            and policy_change(agent, batch, clip_eps)[0] > config.target_kl
        ):
            break  # the policy moved too far from pi_old: stop reusing this rollout
    kl, clipped = policy_change(agent, batch, clip_eps)
    metrics = dict(zip(LOSS_PARTS, torch.stack(parts).mean(dim=0).tolist()))
    metrics.update(
        grad_norm=sum(grad_norms) / len(grad_norms),
        approx_kl=kl,
        clip_fraction=clipped,
        epochs=epoch,
        explained_variance=explained_variance(rollout.values, returns).item(),
    )
    if agent.continuous:
        metrics["action_std"] = agent.log_std.detach().exp().mean().item()
    return metrics


def policy_change(agent: ActorCritic, batch: Batch, clip_eps: float) -> tuple[float, float]:
    """``(approx-KL(pi_old || pi), clip fraction)`` of the current policy on ``batch``'s samples."""
    with torch.no_grad():
        logprobs = agent.log_prob_entropy_and_value(batch.obs, batch.actions)[0]
        return approx_kl(logprobs, batch.logprobs).item(), clip_fraction(
            logprobs, batch.logprobs, clip_eps
        ).item()


class PPOTrainer(ActorCriticTrainer):
    """PPO's training, one rollout and its epochs of minibatch steps per update (``train`` runs it
    to the end)."""

    algorithm = "ppo"

    def __init__(self, config: PPOConfig):
        super().__init__(
            config,
            make_agent,
            lambda params, config: FlatAdam(
                params, lr=config.learning_rate, eps=config.optimizer_eps
            ),
        )
        self.generator = torch.Generator().manual_seed(config.seed)  # minibatch shuffles

    def _update(self) -> dict[str, float]:
        config, progress = self.config, self.updates_done / self.config.num_updates
        learning_rate = scheduled(config.learning_rate, config.lr_schedule, progress)
        clip_eps = scheduled(config.clip_eps, config.clip_schedule, progress)
        set_learning_rate(self.optimizer, learning_rate)
        rollout = self.collector.collect()
        row = {
            "step": self.collector.env_steps,
            "learning_rate": learning_rate,
            "clip_eps": clip_eps,
            **update(self.agent, self.optimizer, rollout, config, clip_eps, self.generator),
        }
        if rollout.episode_returns:
            row["episode_return"] = sum(rollout.episode_returns) / len(rollout.episode_returns)
        return row

    def _state(self) -> dict:
        return {**super()._state(), "shuffle_rng": self.generator.get_state()}

    def _load_state(self, state: dict) -> None:
        super()._load_state(state)
        self.generator.set_state(state["shuffle_rng"])


def train(config: PPOConfig) -> TrainResult:
    """Train PPO on ``config.env_id``; one history row per rollout. ``result.agent`` is the
    ``ActorCritic``."""
    return fit(PPOTrainer(config), config.progress)


def greedy_actions(agent: ActorCritic, action_space: gym.Space):
    """``obs -> actions`` of the greedy policy: the most probable action, or the Gaussian's mean
    clipped to the bounds."""
    if not agent.continuous:
        return agent.greedy
    device = next(agent.parameters()).device
    low, high = (
        torch.as_tensor(bound, dtype=torch.float32, device=device)
        for bound in (action_space.low, action_space.high)
    )
    return lambda obs: torch.clamp(agent.greedy(obs), low, high)


def evaluate(result: TrainResult, episodes: int = 100, seed: int = 10_000) -> float:
    """Mean undiscounted return of the greedy policy over ``episodes`` episodes."""
    agent, device = result.agent, result.config.device
    env = gym.make(result.config.env_id)
    act = greedy_actions(agent, env.action_space)
    env.close()
    return greedy_mean_return(result, lambda obs: act(obs.to(device)).cpu(), episodes, seed)
