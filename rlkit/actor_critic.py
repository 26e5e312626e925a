"""What the actor-critic algorithms share (Chapters 6 and 7): the checks of their common
fields, GAE's advantages and returns over a rollout, gradient-norm clipping, and
the trainer that owns the vector envs, the ``ActorCritic``, its optimizer and the rollout
collector.

``rlkit.a2c`` and ``rlkit.ppo`` are siblings: each imports these and adds its own loss and update.
"""

from __future__ import annotations

import math

import torch

from rlkit.advantages import gae
from rlkit.nets import ACTIVATIONS, ValueView, flatten_parameters
from rlkit.rollouts import Rollout, RolloutCollector, make_vector_env
from rlkit.training import (
    SCHEDULES,
    Trainer,
    TrainResult,
    is_count,
    is_finite_number,
    is_number,
    is_seed,
    require,
    require_device,
    seed_everything,
)

FLOAT32_TINY = torch.finfo(torch.float32).tiny
# The smallest optimizer eps: a gradient g whose square underflows to 0 in float32 (|g| < 2.7e-23)
# moves a weight by |g| / eps: at most 3e-4 times the learning rate with this eps, 2e15 times with
# eps = FLOAT32_TINY.
SMALLEST_OPTIMIZER_EPS = math.sqrt(FLOAT32_TINY)


def validate_actor_critic(config) -> None:
    """The checks A2C, A3C and PPO share: a ValueError naming the first bad field."""
    require(is_seed(config.seed), "seed", "an integer in [0, 2**32)", config.seed)
    for name in ("total_steps", "num_steps"):
        require(is_count(getattr(config, name)), name, "an integer >= 1", getattr(config, name))
    for name in ("learning_rate", "gamma", "lam", "ent_coef", "vf_coef", "optimizer_eps"):
        require(
            is_finite_number(getattr(config, name)), name, "a finite number", getattr(config, name)
        )
    require(
        config.max_grad_norm is None or is_number(config.max_grad_norm),
        "max_grad_norm",
        "a number",
        config.max_grad_norm,
    )
    require_device(config.device)
    require(
        0 < config.learning_rate <= 1,
        "learning_rate",
        "in (0, 1] (the optimizer moves each weight by about this much)",
        config.learning_rate,
    )
    require(
        config.lr_schedule in SCHEDULES, "lr_schedule", f"one of {SCHEDULES}", config.lr_schedule
    )
    require(0 <= config.gamma <= 1, "gamma", "in [0, 1]", config.gamma)
    require(0 <= config.lam <= 1, "lam", "in [0, 1]", config.lam)
    require(config.ent_coef >= 0, "ent_coef", ">= 0", config.ent_coef)
    require(config.vf_coef >= 0, "vf_coef", ">= 0", config.vf_coef)
    require(
        config.max_grad_norm is None or config.max_grad_norm > 0,
        "max_grad_norm",
        "> 0 (math.inf: never clip)",
        config.max_grad_norm,
    )
    require(
        config.optimizer_eps >= SMALLEST_OPTIMIZER_EPS,
        "optimizer_eps",
        f">= {SMALLEST_OPTIMIZER_EPS:.3g} (the square root of float32's smallest normal number: "
        "where a gradient's square underflows to 0, the optimizer divides the gradient by eps "
        "alone)",
        config.optimizer_eps,
    )
    require(
        all(is_count(size) for size in config.hidden_sizes),
        "hidden_sizes",
        "positive layer sizes (integers)",
        config.hidden_sizes,
    )
    require(
        isinstance(config.activation, str) and config.activation in ACTIVATIONS,
        "activation",
        f"one of {sorted(ACTIVATIONS)}",
        config.activation,
    )


def advantages_and_returns(
    rollout: Rollout, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the rollout, bootstrapping from ``V(s_n)`` after the last step (eq-gae;
    eq-n-step-advantage when lam = 1)."""
    return gae(
        rollout.rewards,
        rollout.values,
        gamma,
        lam,
        dones=rollout.dones,
        last_value=rollout.last_value,
    )


def clip_grad_norm(parameters, max_norm: float | None) -> float:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)``: scale the gradients by
    ``min(1, max_norm / (||g|| + 1e-6))`` (never when ``max_norm`` is None); the global norm
    before, as a float.

    When the gradients are views of one flat buffer (``flatten_parameters``), the norm and the
    scaling are two operations on that buffer instead of two per parameter: the actor-critics'
    steps on a small network are fast on a CPU because of it (``tests/test_a2c.py`` compares it with
    PyTorch's).
    """
    parameters = list(parameters)
    buffer = shared_gradient_buffer([p.grad for p in parameters if p.grad is not None])
    if buffer is None:
        limit = math.inf if max_norm is None else max_norm
        return torch.nn.utils.clip_grad_norm_(parameters, limit).item()
    norm = torch.linalg.vector_norm(buffer)
    if max_norm is not None:
        buffer.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm.item()


def shared_gradient_buffer(gradients: list[torch.Tensor]) -> torch.Tensor | None:
    """The one tensor that ``gradients`` are, or are views that exactly fill; None when there is
    none."""
    if len(gradients) == 1 and gradients[0]._base is None:
        return gradients[0]
    buffer = gradients[0]._base if gradients else None
    if buffer is None or any(gradient._base is not buffer for gradient in gradients):
        return None
    return buffer if sum(gradient.numel() for gradient in gradients) == buffer.numel() else None


class ActorCriticTrainer(Trainer):
    """What A2C's and PPO's training share: vector envs, an ``ActorCritic`` whose parameters live in
    one flat buffer, its optimizer (``build_optimizer([flat], config)``) and a ``RolloutCollector``,
    all in the checkpoint; one rollout per update."""

    def __init__(self, config, build_agent, build_optimizer):
        super().__init__(config)
        seed_everything(config.seed)
        self.envs = make_vector_env(config.env_id, config.num_envs, config.batched_env)
        try:
            self.agent = build_agent(config, self.envs)
            self.optimizer = build_optimizer([flatten_parameters(self.agent)], config)
            self.collector = RolloutCollector(
                self.envs, self.agent, config.num_steps, config.gamma, config.seed
            )
        except BaseException:
            self.envs.close()
            raise

    @property
    def num_updates(self) -> int:
        return self.config.num_updates

    def _state(self) -> dict:
        return {
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "collector": self.collector.state_dict(),
        }

    def _load_state(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.collector.load_state_dict(state["collector"])

    def result(self) -> TrainResult:
        return TrainResult(self.config, self.agent, self.history, critic=ValueView(self.agent))

    def close(self) -> None:
        self.envs.close()
