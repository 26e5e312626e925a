"""Small networks shared by every deep algorithm in the book: MLP torsos, Q, value and policy heads.

Orthogonal initialisation (Saxe et al., 2014), as the PPO implementation details prescribe: hidden
layers with gain sqrt(2), a policy head with gain 0.01 (a near-uniform first policy), value heads
with gain 1. Q-networks keep PyTorch's default initialisation, as DQN implementations (SB3, CleanRL)
do: the DQN presets are tuned for it, and with orthogonal gains the same preset learned far worse in
our runs.
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
HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)


def layer_init(layer: nn.Linear, gain: float = HIDDEN_GAIN, bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with the given gain, constant bias."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(
    in_dim: int,
    hidden_sizes: Sequence[int],
    out_dim: int,
    activation: str = "tanh",
    output_gain: float | None = VALUE_GAIN,
) -> nn.Sequential:
    """``in_dim -> hidden... -> out_dim`` with the activation between layers and none after the
    last.

    ``output_gain=None`` keeps PyTorch's default initialisation for every layer.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if in_dim < 1 or out_dim < 1 or any(size < 1 for size in hidden_sizes):
        raise ValueError(
            f"layer sizes must be >= 1, got in_dim={in_dim}, hidden_sizes={list(hidden_sizes)}, "
            f"out_dim={out_dim}"
        )
    layers: list[nn.Module] = []
    init = (lambda layer, gain=HIDDEN_GAIN: layer) if output_gain is None else layer_init
    for size in hidden_sizes:
        layers += [init(nn.Linear(in_dim, size)), ACTIVATIONS[activation]()]
        in_dim = size
    layers.append(init(nn.Linear(in_dim, out_dim), output_gain))
    return nn.Sequential(*layers)


class QNetwork(nn.Module):
    """``Q(s, .)``: one output per discrete action (PyTorch's default initialisation; see the module
    docstring)."""

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "relu",
    ):
        super().__init__()
        self.net = mlp(obs_dim, hidden_sizes, n_actions, activation, output_gain=None)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class ValueNetwork(nn.Module):
    """``V(s)``: one number per observation (shape ``[...]``, the last dim squeezed)."""

    def __init__(
        self, obs_dim: int, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh"
    ):
        super().__init__()
        self.net = mlp(obs_dim, hidden_sizes, 1, activation, VALUE_GAIN)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)


class CategoricalPolicy(nn.Module):
    """``pi(a|s)`` over discrete actions: logits from an MLP, a ``Categorical`` distribution."""

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
    ):
        super().__init__()
        self.net = mlp(obs_dim, hidden_sizes, n_actions, activation, POLICY_GAIN)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)

    def distribution(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self(obs))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs).argmax(dim=-1)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a, log pi(a|s))`` with ``a ~ pi(.|s)`` (``categorical_sample``)."""
        return categorical_sample(self(obs))

    def log_prob_and_entropy(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log pi(a|s), H(pi(.|s)))``, equal to the ``Categorical`` distribution's, with
        gradients."""
        return categorical_log_prob_and_entropy(self(obs), actions)


class GaussianPolicy(nn.Module):
    """``pi(a|s) = N(mu(s), diag(sigma^2))`` with a state-independent, learned log-std per action
    dimension."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        initial_log_std: float = 0.0,
    ):
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

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a, log pi(a|s))`` with ``a ~ N(mu(s), sigma^2)`` (unbounded: the caller clips to the
        action bounds)."""
        return gaussian_sample(self(obs), self.log_std)

    def log_prob_and_entropy(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log pi(a|s), H(pi(.|s)))``, equal to the ``distribution``'s, with gradients."""
        return gaussian_log_prob_and_entropy(self(obs), self.log_std, actions)


def categorical_sample(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, log pi(a))`` with ``a ~ Categorical(logits)``, in a few elementwise operations.

    Inverse-CDF sampling: the first action whose cumulative probability exceeds a uniform draw.
    ``torch.multinomial``, behind ``Categorical.sample``, costs more than a whole small network on a
    batch of eight. The draw is scaled to the cumulative sum's last entry, which rounds to a little
    below or above 1: so it never lands past the last action with a non-zero probability.
    """
    logp = torch.log_softmax(logits, dim=-1)
    cumulative = logp.exp().cumsum(dim=-1)
    uniform = torch.rand(logp.shape[:-1] + (1,), device=logp.device) * cumulative[..., -1:]
    actions = (cumulative <= uniform).sum(dim=-1).clamp_max(logp.shape[-1] - 1)
    return actions, logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def categorical_log_prob_and_entropy(
    logits: torch.Tensor, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log pi(a), H(pi))`` of ``Categorical(logits)``, with gradients."""
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(
        dim=-1
    )


def gaussian_sample(mean: torch.Tensor, log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, log pi(a))`` with ``a ~ N(mean, diag(exp(log_std)^2))``."""
    actions = mean + log_std.exp() * torch.randn_like(mean)
    return actions, gaussian_log_prob_and_entropy(mean, log_std, actions)[0]


def gaussian_log_prob_and_entropy(
    mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Diagonal Gaussian log-density and entropy, each summed over the action dimensions, with
    gradients."""
    z = (actions - mean) * torch.exp(-log_std)
    logprobs = (-0.5 * z.pow(2) - log_std - HALF_LOG_TWO_PI).sum(dim=-1)
    return logprobs, (0.5 + HALF_LOG_TWO_PI + log_std).sum().expand(mean.shape[:-1])


class ActorCritic(nn.Module):
    """A policy MLP and a value MLP of the same hidden sizes, with separate torsos, computed as one
    network.

    Slice 0 of every stacked weight is the actor, slice 1 the critic: each layer is one batched
    matrix product (``torch.baddbmm``) for both, so a forward pass costs the operations of one small
    MLP, not two (the actor-critic's speed on a CPU is the number of operations, not their size).
    The result is the same function as ``CategoricalPolicy`` or ``GaussianPolicy`` plus
    ``ValueNetwork`` with the same weights (``tests/test_nets.py`` checks it), with the same
    initialisation: orthogonal, gain sqrt(2) in hidden layers, 0.01 for the policy head and 1 for
    the value head. The critic's head is padded to the actor's width; only its column 0 is read, so
    the padding gets no gradient and stays 0.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        continuous: bool = False,
        initial_log_std: float = 0.0,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        # Two ordinary MLPs give the initial weights (their init is the one the book describes),
        # then are dropped.
        actor = mlp(obs_dim, hidden_sizes, action_dim, activation, POLICY_GAIN)
        critic = mlp(obs_dim, hidden_sizes, 1, activation, VALUE_GAIN)
        self.num_layers = len(hidden_sizes) + 1
        for index, (actor_layer, critic_layer) in enumerate(zip(actor[::2], critic[::2])):
            weight = torch.zeros(2, actor_layer.in_features, actor_layer.out_features)
            bias = torch.zeros(2, 1, actor_layer.out_features)
            weight[0], bias[0, 0] = actor_layer.weight.detach().T, actor_layer.bias.detach()
            critic_width = critic_layer.out_features
            weight[1, :, :critic_width], bias[1, 0, :critic_width] = (
                critic_layer.weight.detach().T,
                critic_layer.bias.detach(),
            )
            self.register_parameter(f"weight{index}", nn.Parameter(weight))
            self.register_parameter(f"bias{index}", nn.Parameter(bias))
        self.activation = {"tanh": torch.tanh, "relu": torch.relu}[activation]
        self.continuous = continuous
        self.log_std = (
            nn.Parameter(torch.full((action_dim,), float(initial_log_std))) if continuous else None
        )

    @classmethod
    def for_spaces(
        cls,
        observation_space,
        action_space,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        initial_log_std: float = 0.0,
    ) -> ActorCritic:
        """A categorical policy for ``Discrete`` actions, a Gaussian one for ``Box`` actions."""
        continuous = not hasattr(action_space, "n")
        action_dim = int(action_space.shape[0]) if continuous else int(action_space.n)
        return cls(
            int(observation_space.shape[0]),
            action_dim,
            hidden_sizes,
            activation,
            continuous,
            initial_log_std,
        )

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(weight [2, in, out], bias [2, 1, out])`` per layer, read from the registered
        parameters each time (so that ``load_state_dict(assign=True)`` and
        ``torch.func.functional_call`` reach ``forward``)."""
        parameters = self._parameters
        return [
            (parameters[f"weight{index}"], parameters[f"bias{index}"])
            for index in range(self.num_layers)
        ]

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(policy output, V(s))``: logits (or Gaussian means) ``[..., action_dim]`` and values
        ``[...]``."""
        hidden = (obs if obs.dim() == 2 else obs.reshape(-1, obs.shape[-1])).expand(2, -1, -1)
        layers = self.layers
        for weight, bias in layers[:-1]:
            hidden = self.activation(torch.baddbmm(bias, hidden, weight))
        weight, bias = layers[-1]
        out = torch.baddbmm(bias, hidden, weight)
        head, values = out[0], out[1, :, 0]
        if obs.dim() != 2:
            head, values = head.reshape(*obs.shape[:-1], -1), values.reshape(obs.shape[:-1])
        return head, values

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)[1]

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample ``a ~ pi(.|s)``; return ``(actions, log pi(a|s), V(s))`` from one forward pass."""
        head, values = self(obs)
        actions, logprobs = (
            gaussian_sample(head, self.log_std) if self.continuous else categorical_sample(head)
        )
        return actions, logprobs, values

    def log_prob_entropy_and_value(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log pi(a|s), entropy of pi(.|s), V(s))`` for stored observations and actions, with
        gradients."""
        head, values = self(obs)
        if self.continuous:
            return (*gaussian_log_prob_and_entropy(head, self.log_std, actions), values)
        return (*categorical_log_prob_and_entropy(head, actions), values)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The most probable action (the Gaussian's mean for continuous actions)."""
        head = self(obs)[0]
        return head if self.continuous else head.argmax(dim=-1)


class ValueView(nn.Module):
    """``V(s)`` of an ``ActorCritic`` as a module of its own (``TrainResult.critic``); shares its
    parameters."""

    def __init__(self, agent: ActorCritic):
        super().__init__()
        self.agent = agent

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.agent.value(obs)


def flatten_parameters(module: nn.Module) -> nn.Parameter:
    """Move every parameter of ``module`` into one contiguous buffer; return it as a single
    ``Parameter``.

    The module's parameters become views of that buffer, and their gradients views of its gradient
    (autograd accumulates into an existing ``.grad`` in place), so an optimizer or a gradient clip
    over the one flat parameter does a handful of large operations instead of a handful per layer.
    Call it after moving the module to its device; zero gradients with ``set_to_none=False``.
    """
    parameters = list(module.parameters())
    flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in parameters]))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for parameter in parameters:
        size = parameter.numel()
        parameter.data = flat.data[offset : offset + size].view_as(parameter)
        parameter.grad = flat.grad[offset : offset + size].view_as(parameter)
        offset += size
    return flat


def adam_move(
    parameter: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    steps: int | float,
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> None:
    """Adam's move once the moments are updated:
    ``theta <- theta - lr m_hat / (sqrt(v_hat) + eps)``, with the bias corrections
    ``m_hat = m / (1 - b1^t)`` and ``v_hat = v / (1 - b2^t)``, computed as ``torch.optim.Adam``
    computes them (callers hold ``torch.no_grad``)."""
    beta1, beta2 = betas
    denominator = (exp_avg_sq.sqrt() / (1.0 - beta2**steps) ** 0.5).add_(eps)
    parameter.addcdiv_(exp_avg, denominator, value=-lr / (1.0 - beta1**steps))


class FlatAdam:
    """Adam (Kingma & Ba, 2015) for one flat parameter (``flatten_parameters``): a drop-in for
    ``torch.optim.Adam([flat], lr, betas, eps)`` in seven tensor operations per step.

    The same arithmetic as ``torch.optim.Adam`` (``tests/test_nets.py`` compares them step by step),
    without its per-call machinery (hooks, per-parameter state, foreach grouping), which costs more
    than the arithmetic itself when PPO takes thousands of steps on a network of a few thousand
    weights. Like a torch optimizer it keeps ``lr`` in ``param_groups``.
    """

    def __init__(
        self,
        params,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ):
        params = list(params)
        if len(params) != 1:
            raise ValueError(
                "params must be one flat parameter (rlkit.nets.flatten_parameters), got "
                f"{len(params)} tensors"
            )
        self.flat = params[0]
        self.param_groups = [{"params": params, "lr": lr, "betas": tuple(betas), "eps": eps}]
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(self.flat), torch.zeros_like(self.flat)
        self.steps = 0

    @property
    def lr(self) -> float:
        return self.param_groups[0]["lr"]

    @torch.no_grad()
    def step(self) -> None:
        """``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``,
        ``theta <- theta - lr m_hat / (sqrt(v_hat) + eps)``."""
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        grad = self.flat.grad
        self.steps += 1
        self.exp_avg.lerp_(grad, 1.0 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        adam_move(
            self.flat,
            self.exp_avg,
            self.exp_avg_sq,
            self.steps,
            group["lr"],
            group["betas"],
            group["eps"],
        )

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the gradient in place, always: the module's gradients are views of it."""
        self.flat.grad.zero_()

    def state_dict(self) -> dict:
        group = self.param_groups[0]
        return {
            "lr": group["lr"],
            "betas": group["betas"],
            "eps": group["eps"],
            "steps": self.steps,
            "exp_avg": self.exp_avg,
            "exp_avg_sq": self.exp_avg_sq,
        }

    def load_state_dict(self, state: dict) -> None:
        group = self.param_groups[0]
        group["lr"], group["betas"], group["eps"] = state["lr"], tuple(state["betas"]), state["eps"]
        self.steps = state["steps"]
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
