"""Advantage actor-critic, synchronous (A2C; Chapter 6).

Mnih et al. (2016) introduced the asynchronous version (A3C, ``rlkit.a3c``); A2C is its synchronous
twin: ``num_envs`` copies step in lockstep for ``num_steps`` steps, and one gradient step follows
from all of them (Wu et al., 2017, OpenAI Baselines). The critic's advantage estimate steers the
policy gradient,

    grad J ~ 1/N sum_{i,t} A_t grad log pi(a_t | s_t),                    (eq-actor-critic-gradient)

with ``A_t`` from ``rlkit.advantages.gae``: ``lam = 1`` gives the n-step return minus the value,
``R_t - V(s_t)`` with ``R_t = r_t + gamma r_{t+1} + ... + gamma^{n-t} V(s_n)``
(eq-n-step-advantage), and ``lam < 1`` the exponentially weighted GAE (eq-gae). One loss trains both
networks:

    L = -1/N sum A_t log pi(a_t|s_t) + vf_coef * 1/N sum (V(s_t) - R_t)^2
        - ent_coef * 1/N sum H(pi(.|s_t))                                              (eq-a2c-loss)

The defaults are Stable-Baselines3's A2C (RMSprop, alpha 0.99, eps 1e-5, lr 7e-4, n_steps 5, vf_coef
0.5, max_grad_norm 0.5), which rl-baselines3-zoo uses for CartPole-v1 with 8 envs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from rlkit.actor_critic import (
    ActorCriticTrainer,
    advantages_and_returns,
    clip_grad_norm,
    validate_actor_critic,
)
from rlkit.losses import explained_variance, masked_whiten, policy_gradient_loss
from rlkit.nets import ActorCritic
from rlkit.presets import AlgorithmConfig
from rlkit.rollouts import Rollout
from rlkit.training import (
    TrainResult,
    fit,
    greedy_mean_return,
    is_count,
    is_number,
    require,
    require_discrete_actions_and_flat_obs,
    scheduled,
    set_learning_rate,
)

OPTIMIZERS = ("rmsprop", "adam")


@dataclass
class A2CConfig(AlgorithmConfig):
    """A2C's hyperparameters, each with its default (rl-baselines3-zoo's CartPole-v1 A2C, which
    is SB3's defaults with 8 envs and no entropy bonus).

    ``A2CConfig.for_env(env_id, **overrides)`` applies the tested preset of ``env_id``
    (``rlkit/presets.py``)."""

    algorithm: ClassVar[str] = "a2c"

    env_id: str = "CartPole-v1"
    seed: int = 0
    total_steps: int = 500_000  # environment steps, all copies together
    num_envs: int = 8  # copies stepped in lockstep
    num_steps: int = 5  # steps per copy per update (the n of the n-step return)
    learning_rate: float = 7e-4
    lr_schedule: str = "constant"  # "constant", or "linear" decay to 0 over training
    gamma: float = 0.99
    lam: float = 1.0  # GAE's lambda; 1.0 gives the n-step return (eq-n-step-advantage)
    ent_coef: float = 0.0  # weight of the entropy bonus
    vf_coef: float = 0.5  # weight of the value loss
    max_grad_norm: float = 0.5  # clip the global gradient norm (math.inf: never)
    optimizer: str = "rmsprop"  # "rmsprop" (as A3C and SB3) or "adam"
    rmsprop_alpha: float = 0.99  # RMSprop's smoothing constant
    optimizer_eps: float = 1e-5
    normalize_advantages: bool = False  # whiten the advantages of each update
    # of both the policy and the value network (no shared layers)
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    # step the copies with rlkit's batched env (CartPole-v1) instead of SyncVectorEnv
    batched_env: bool = False
    device: str = "cpu"
    progress: bool = False

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return math.ceil(self.total_steps / self.batch_size)

    def _validate(self) -> None:
        require(is_count(self.num_envs), "num_envs", "an integer >= 1", self.num_envs)
        require(
            isinstance(self.batched_env, bool), "batched_env", "True or False", self.batched_env
        )
        validate_actor_critic(self)
        require(self.optimizer in OPTIMIZERS, "optimizer", f"one of {OPTIMIZERS}", self.optimizer)
        require(
            is_number(self.rmsprop_alpha) and 0 < self.rmsprop_alpha < 1,
            "rmsprop_alpha",
            "in (0, 1)",
            self.rmsprop_alpha,
        )
        require(
            not self.normalize_advantages or self.batch_size >= 2,
            "normalize_advantages",
            "False when num_envs * num_steps < 2 (whitening needs two advantages)",
            self.normalize_advantages,
        )


def make_optimizer(parameters, config) -> torch.optim.Optimizer:
    """RMSprop (PyTorch's, eps outside the square root, as SB3's default) or Adam, from the
    config."""
    if config.optimizer == "rmsprop":
        return torch.optim.RMSprop(
            parameters,
            lr=config.learning_rate,
            alpha=config.rmsprop_alpha,
            eps=config.optimizer_eps,
        )
    return torch.optim.Adam(parameters, lr=config.learning_rate, eps=config.optimizer_eps)


def a2c_loss(
    logprobs: torch.Tensor,
    entropies: torch.Tensor,
    values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    ent_coef: float,
    vf_coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """eq-a2c-loss: policy-gradient term (advantages held constant), value regression, entropy
    bonus.

    Returns the loss and its three parts (as floats, for logging).
    """
    policy_loss = policy_gradient_loss(logprobs, advantages)
    value_loss = F.mse_loss(values, returns)
    entropy_bonus = entropies.mean()
    loss = policy_loss + vf_coef * value_loss
    if ent_coef:  # with ent_coef = 0 the backward pass skips the entropy's graph
        loss = loss - ent_coef * entropy_bonus
    return loss, {
        "policy_loss": policy_loss.item(),
        "value_loss": value_loss.item(),
        "entropy": entropy_bonus.item(),
    }


def rollout_loss(
    agent: ActorCritic, rollout: Rollout, config
) -> tuple[torch.Tensor, dict[str, float]]:
    """eq-a2c-loss on one rollout, with advantages from GAE; the loss and the logged metrics (A2C
    and A3C)."""
    advantages, returns = advantages_and_returns(rollout, config.gamma, config.lam)
    if config.normalize_advantages:
        advantages = masked_whiten(advantages)
    logprobs, entropies, values = agent.log_prob_entropy_and_value(
        rollout.obs.flatten(0, 1), rollout.actions.flatten(0, 1)
    )
    loss, metrics = a2c_loss(
        logprobs,
        entropies,
        values,
        advantages.flatten(),
        returns.flatten(),
        config.ent_coef,
        config.vf_coef,
    )
    metrics["explained_variance"] = explained_variance(rollout.values, returns).item()
    return loss, metrics


def update(
    agent: ActorCritic,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    config: A2CConfig,
) -> dict[str, float]:
    """One A2C gradient step on one rollout; the logged metrics."""
    loss, metrics = rollout_loss(agent, rollout, config)
    # set_to_none=False: the parameters' gradients are views of the flat buffer's, zeroed in place
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    metrics["grad_norm"] = clip_grad_norm(agent.parameters(), config.max_grad_norm)
    optimizer.step()
    return metrics


def make_agent(config, envs) -> ActorCritic:
    """The categorical actor-critic for ``envs`` (a ValueError naming env_id for anything but
    Discrete actions)."""
    require_discrete_actions_and_flat_obs(
        config.env_id,
        envs.single_action_space,
        envs.single_observation_space,
        "this actor-critic uses a categorical policy",
    )
    return ActorCritic.for_spaces(
        envs.single_observation_space,
        envs.single_action_space,
        config.hidden_sizes,
        config.activation,
    ).to(config.device)


class A2CTrainer(ActorCriticTrainer):
    """A2C's training, one rollout and one gradient step per update (``train`` runs it to the
    end)."""

    algorithm = "a2c"

    def __init__(self, config: A2CConfig):
        super().__init__(config, make_agent, make_optimizer)

    def _update(self) -> dict[str, float]:
        config = self.config
        learning_rate = scheduled(
            config.learning_rate, config.lr_schedule, self.updates_done / config.num_updates
        )
        set_learning_rate(self.optimizer, learning_rate)
        rollout = self.collector.collect()
        row = {
            "step": self.collector.env_steps,
            "learning_rate": learning_rate,
            **update(self.agent, self.optimizer, rollout, config),
        }
        if rollout.episode_returns:
            row["episode_return"] = sum(rollout.episode_returns) / len(rollout.episode_returns)
        return row


def train(config: A2CConfig) -> TrainResult:
    """Train A2C on ``config.env_id``; one history row per update. ``result.agent`` is the
    ``ActorCritic``."""
    return fit(A2CTrainer(config), config.progress)


def evaluate(result: TrainResult, episodes: int = 100, seed: int = 10_000) -> float:
    """Mean undiscounted return of the greedy policy ``argmax_a pi(a|s)`` over ``episodes``
    episodes."""
    agent, device = result.agent, result.config.device
    return greedy_mean_return(result, lambda obs: agent.greedy(obs.to(device)), episodes, seed)
