"""Discounted returns and generalised advantage estimation (GAE).

One implementation serves every chapter: CartPole passes ``[num_envs, num_steps]`` tensors with
``dones``; a language model passes ``[batch, response_length]`` tensors with a token ``mask``.

Both quantities solve the same backward linear recurrence,

    x_t = a_t + c_t * x_{t+1},        x_T = 0,                  (eq-linear-recurrence)

with ``a_t = r_t`` and ``c_t = gamma`` for returns (eq-return-recursive), and ``a_t = delta_t`` and
``c_t = gamma * lam`` for GAE (eq-gae). An episode end sets ``c_t = 0``, so nothing flows across it.
The recurrence is solved for all ``t`` at once by a log-depth parallel scan instead of a Python loop
over time (Chapter 1, "Two ways to compute GAE").
"""

from __future__ import annotations

import torch

__all__ = ["discounted_returns", "gae"]


def _check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def _check_like(name: str, tensor: torch.Tensor | None, shape: torch.Size) -> None:
    if tensor is not None and tuple(tensor.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have shape {tuple(shape)} (like rewards), got {tuple(tensor.shape)}"
        )


def _check_batch_time(rewards: torch.Tensor) -> None:
    if not isinstance(rewards, torch.Tensor) or rewards.ndim != 2:
        shape = (
            tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        )
        raise ValueError(f"rewards must be a [B, T] tensor (batch first), got {shape}")
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a floating-point tensor, got {rewards.dtype}")


def _check_last_value(last_value: torch.Tensor | None, batch: int) -> None:
    if last_value is not None and tuple(last_value.shape) != (batch,):
        raise ValueError(
            f"last_value must have shape ({batch},) (one value per row), got "
            f"{tuple(last_value.shape)}"
        )


def reverse_linear_scan(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Solve ``x_t = a_t + c_t * x_{t+1}`` (eq-linear-recurrence) backwards over the last dim,
    ``x_T = 0``.

    Hillis-Steele scan: after the pass with offset ``s``, ``a_t`` holds the sum of the next ``2s``
    terms and ``c_t`` the product of the next ``2s`` factors, so ``ceil(log2 T)`` passes of
    whole-tensor operations replace ``T`` small ones. A zero factor (an episode end) stops
    everything behind it.
    """
    length = a.shape[-1]
    offset = 1
    while offset < length:
        head_a, head_c = a[..., :-offset], c[..., :-offset]
        a = torch.cat([torch.addcmul(head_a, head_c, a[..., offset:]), a[..., -offset:]], dim=-1)
        if offset * 2 < length:  # the last pass never reads the products again
            c = torch.cat([head_c * c[..., offset:], c[..., -offset:]], dim=-1)
        offset *= 2
    return a


def discounted_returns(
    rewards: torch.Tensor,
    gamma: float,
    dones: torch.Tensor | None = None,
    last_value: torch.Tensor | None = None,
) -> torch.Tensor:
    """Discounted return ``G_t = r_t + gamma * (1 - done_t) * G_{t+1}`` (eq-return-recursive) for
    ``[B, T]``.

    ``dones[:, t] = 1`` ends the episode after step ``t``: nothing after it is added. ``last_value``
    (shape ``[B]``) bootstraps after the last step, ``G_T = last_value`` (0 when None), unless the
    last step is itself an episode end. No gradient flows through the result.
    """
    _check_batch_time(rewards)
    _check_unit_interval("gamma", gamma)
    _check_like("dones", dones, rewards.shape)
    _check_last_value(last_value, rewards.shape[0])
    with torch.no_grad():
        not_done = torch.ones_like(rewards) if dones is None else 1.0 - dones.to(rewards.dtype)
        discounts = gamma * not_done
        terms = rewards.detach().clone()
        if last_value is not None:
            terms[:, -1] += discounts[:, -1] * last_value.detach().to(rewards.dtype)
        return reverse_linear_scan(terms, discounts)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    gamma: float,
    lam: float,
    dones: torch.Tensor | None = None,
    last_value: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (eq-gae, eq-gae-sum) for ``[B, T]`` tensors; returns
    ``(advantages, returns)``.

    ``delta_t = r_t + gamma * (1 - end_t) * V_{t+1} - V_t`` (eq-td-error) and
    ``A_t = delta_t + gamma * lam * (1 - end_t) * A_{t+1}`` (eq-gae);
    ``returns = advantages + values`` is the critic's target (the lambda-return). Neither carries a
    gradient.

    - ``dones[:, t] = 1``: the episode ended after step ``t``; no bootstrap and no flow across it. A
      truncated step is the caller's job: add ``gamma * V(final_observation)`` to its reward and
      mark it done.
    - ``last_value`` (``[B]``): ``V_T``, the bootstrap after the last step (0 when None).
    - ``mask`` (``[B, T]``, 1 on valid tokens of right-padded rows): the end of a row's valid part
      is an episode end, and advantages and returns are 0 where the mask is 0. A row valid up to
      ``T - 1`` still bootstraps from ``last_value``.
    """
    _check_batch_time(rewards)
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lam", lam)
    for name, tensor in (("values", values), ("dones", dones), ("mask", mask)):
        _check_like(name, tensor, rewards.shape)
    _check_last_value(last_value, rewards.shape[0])
    with torch.no_grad():
        rewards, values = rewards.detach(), values.detach().to(rewards.dtype)
        bootstrap = (
            torch.zeros_like(values[:, :1])
            if last_value is None
            else last_value.detach().to(rewards.dtype)[:, None]
        )
        next_values = torch.cat([values[:, 1:], bootstrap], dim=1)
        ends = torch.zeros_like(rewards) if dones is None else dones.to(rewards.dtype)
        if mask is not None:  # the last valid token before padding ends its episode
            valid = mask.to(rewards.dtype)
            next_valid = torch.cat([valid[:, 1:], torch.ones_like(valid[:, :1])], dim=1)
            ends = torch.maximum(ends, valid * (1.0 - next_valid))
        not_done = 1.0 - ends
        deltas = rewards + gamma * not_done * next_values - values
        discounts = (gamma * lam) * not_done
        if mask is not None:
            deltas, discounts = deltas * valid, discounts * valid
        advantages = reverse_linear_scan(deltas, discounts)
        returns = advantages + values
        if mask is not None:
            returns = returns * valid
    return advantages, returns
