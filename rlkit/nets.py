"""Small networks shared by every deep algorithm in the book: MLP torsos, Q, value and policy heads.

Orthogonal initialisation (Saxe et al., 2014), as the PPO implementation details prescribe: hidden
layers with gain sqrt(2), a policy head with gain 0.01 (a near-uniform first policy), value heads with
gain 1. Q-networks keep PyTorch's default initialisation, as DQN implementations (SB3, CleanRL) do: the
DQN presets are tuned for it, and with orthogonal gains the same preset learned far worse in our runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributions import Categorical, Independent, Normal

HIDDEN_GAIN = math.sqrt(2)
POLICY_GAIN = 0.01
VALUE_GAIN = 1.0
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def layer_init(layer: nn.Linear, gain: float = HIDDEN_GAIN, bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with the given gain, constant bias."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden_sizes: Sequence[int], out_dim: int, activation: str = "tanh",
        output_gain: float | None = VALUE_GAIN) -> nn.Sequential:
    """``in_dim -> hidden... -> out_dim`` with the activation between layers and none after the last.

    ``output_gain=None`` keeps PyTorch's default initialisation for every layer.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if in_dim < 1 or out_dim < 1 or any(size < 1 for size in hidden_sizes):
        raise ValueError(f"layer sizes must be >= 1, got in_dim={in_dim}, hidden_sizes={list(hidden_sizes)}, out_dim={out_dim}")
    layers: list[nn.Module] = []
    init = (lambda layer, gain=HIDDEN_GAIN: layer) if output_gain is None else layer_init
    for size in hidden_sizes:
        layers += [init(nn.Linear(in_dim, size)), ACTIVATIONS[activation]()]
        in_dim = size
    layers.append(init(nn.Linear(in_dim, out_dim), output_gain))
    return nn.Sequential(*layers)


class QNetwork(nn.Module):
    """``Q(s, .)``: one output per discrete action (PyTorch's default initialisation; see the module docstring)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int] = (64, 64), activation: str = "relu"):
        super().__init__()
        self.net = mlp(obs_dim, hidden_sizes, n_actions, activation, output_gain=None)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class ValueNetwork(nn.Module):
    """``V(s)``: one number per observation (shape ``[...]``, the last dim squeezed)."""

    def __init__(self, obs_dim: int, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh"):
        super().__init__()
        self.net = mlp(obs_dim, hidden_sizes, 1, activation, VALUE_GAIN)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)


class CategoricalPolicy(nn.Module):
    """``pi(a|s)`` over discrete actions: logits from an MLP, a ``Categorical`` distribution."""

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh"):
        super().__init__()
        self.net = mlp(obs_dim, hidden_sizes, n_actions, activation, POLICY_GAIN)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)

    def distribution(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self(obs))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs).argmax(dim=-1)


class GaussianPolicy(nn.Module):
    """``pi(a|s) = N(mu(s), diag(sigma^2))`` with a state-independent, learned log-std per action dimension."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh",
                 initial_log_std: float = 0.0):
        super().__init__()
        self.mean = mlp(obs_dim, hidden_sizes, action_dim, activation, POLICY_GAIN)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(initial_log_std)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mean(obs)

    def distribution(self, obs: torch.Tensor) -> Independent:
        mean = self(obs)
        return Independent(Normal(mean, self.log_std.exp().expand_as(mean)), 1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)
