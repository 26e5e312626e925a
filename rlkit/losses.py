"""Losses and estimators shared by REINFORCE, A2C, PPO and the RLHF chapters.

All take batch-first tensors and an optional ``mask`` (1 on valid entries). A loss returns a scalar:
the mean over valid entries (the token mean). Diagnostics are separate functions, so a loss is just
a loss.
"""

from __future__ import annotations

import torch

__all__ = [
    "masked_mean",
    "zero_padding",
    "masked_whiten",
    "policy_gradient_loss",
    "clipped_policy_loss",
    "clipped_surrogate_terms",
    "sampler_correction_weights",
    "clipped_value_loss",
    "entropy",
    "kl_estimate",
    "approx_kl",
    "clip_fraction",
    "explained_variance",
]

KL_ESTIMATORS = ("k1", "k2", "k3")
# truncated importance sampling for a sampler that is not the trainer, named as TRL names them
# (GRPOConfig.vllm_importance_sampling_mode): the ratio per token or per sequence, truncated from
# above at the cap or masked (set to 0) above it
SAMPLER_CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def _check_same_shape(
    reference_name: str, reference: torch.Tensor, **others: torch.Tensor | None
) -> None:
    for name, tensor in others.items():
        if tensor is not None and tuple(tensor.shape) != tuple(reference.shape):
            raise ValueError(
                f"{name} must have the shape of {reference_name} {tuple(reference.shape)}, got "
                f"{tuple(tensor.shape)}"
            )


def _check_clip(name: str, value: float | None) -> None:
    if value is not None and not float(value) > 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def zero_padding(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x`` with its padded entries (mask 0) set to 0, *before* any arithmetic touches them.

    Padding can hold anything (a log-ratio of 100, ``inf``, ``nan``): multiplying by the mask
    afterwards gives ``inf * 0 = nan``, in the loss and in the gradient. Selecting with
    ``torch.where`` does not.
    """
    return (
        x
        if mask is None
        else torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    )


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None
) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` is 1 (all entries when ``mask`` is None).

    With ``dim``, a row with no valid entry has mean 0 (so padding-only rows add nothing to a loss).
    Whatever the padding holds never reaches the result or the gradient (``zero_padding``).
    """
    if mask is None:
        return x.mean() if dim is None else x.mean(dim=dim)
    _check_same_shape("x", x, mask=mask)
    valid_sum = zero_padding(x, mask)
    mask = mask.to(x.dtype)
    if dim is None:
        count = mask.sum()
        if count == 0:
            raise ValueError("mask has no valid entries: the mean over them is undefined")
        return valid_sum.sum() / count
    return valid_sum.sum(dim=dim) / mask.sum(dim=dim).clamp_min(1.0)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8
) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and (unbiased) variance over valid entries only.

    Entries where the mask is 0 come back as 0. Used to normalise advantages per minibatch.
    """
    x = zero_padding(x, mask)
    mean = masked_mean(x, mask)
    centred = x - mean
    count = x.numel() if mask is None else mask.sum()
    if count < 2:
        raise ValueError(f"masked_whiten needs at least 2 valid entries, got {int(count)}")
    variance = masked_mean(centred**2, mask) * count / (count - 1)
    whitened = centred * torch.rsqrt(variance + eps)
    return whitened if mask is None else whitened * mask.to(x.dtype)


def policy_gradient_loss(
    logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """REINFORCE / actor-critic surrogate ``-mean(log pi(a|s) * A)`` (Chapter 5 derives it).

    Its gradient is the policy-gradient estimate. The advantages are treated as constants
    (detached): a critic must never learn through the actor's loss.
    """
    _check_same_shape("logprobs", logprobs, advantages=advantages, mask=mask)
    return -masked_mean(
        zero_padding(logprobs, mask) * zero_padding(advantages.detach(), mask), mask
    )


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    mask: torch.Tensor | None = None,
    clip_eps_high: float | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    sampler_correction: str = "token_truncate",
    sampler_cap: float = 3.0,
) -> torch.Tensor:
    """PPO's clipped surrogate (Chapter 7):
    ``mean(max(-A * rho, -A * clip(rho, 1 - eps, 1 + eps_high)))``.

    ``rho = exp(logprobs - old_logprobs)``; ``clip_eps_high`` (default ``clip_eps``) allows the
    asymmetric "clip-higher" range of DAPO. The max of the two negated terms is the pessimistic
    bound: on the clipped side the gradient is zero.

    ``sampler_logprobs``: the log-probabilities under which a separate generator sampled the
    actions (another engine, dtype or weight version than the trainer's ``old_logprobs``); each
    term is then weighted by ``sampler_correction_weights`` (truncated importance sampling).
    """
    _check_same_shape(
        "logprobs", logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask
    )
    ratio = torch.exp(zero_padding(logprobs - old_logprobs.detach(), mask))
    terms = clipped_surrogate_terms(
        ratio, zero_padding(advantages.detach(), mask), clip_eps, clip_eps_high
    )
    if sampler_logprobs is not None:
        terms = terms * sampler_correction_weights(
            old_logprobs, sampler_logprobs, mask, sampler_correction, sampler_cap
        )
    return masked_mean(terms, mask)


def sampler_correction_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
    mode: str = "token_truncate",
    cap: float = 3.0,
) -> torch.Tensor:
    """Truncated importance sampling's weights for samples drawn by a generator
    that is not the trainer (eq-tis-token, eq-tis-sequence): the trainer's probability of each
    sampled token over the sampler's, ``w = exp(old_logprobs - sampler_logprobs)``, constants (no
    gradient), 0 on padding.

    ``mode`` (TRL's ``vllm_importance_sampling_mode``): ``"token_*"`` weighs each token by its own
    ratio; ``"sequence_*"`` weighs every token of a sequence (a row of ``[B, T]``) by the
    sequence's ratio, the product of its tokens' (``exp`` of their summed log ratios).
    ``"*_truncate"`` lowers a weight above ``cap`` to ``cap``; ``"*_mask"`` sets it to 0, dropping
    the token or the sequence. The shape is ``old_logprobs``'.
    """
    if mode not in SAMPLER_CORRECTIONS:
        raise ValueError(f"sampler_correction must be one of {SAMPLER_CORRECTIONS}, got {mode!r}")
    if not 1.0 <= float(cap) < float("inf"):
        raise ValueError(
            f"sampler_cap must be a finite number >= 1 (1: no weight above 1), got {cap!r}"
        )
    _check_same_shape("old_logprobs", old_logprobs, sampler_logprobs=sampler_logprobs, mask=mask)
    if mode.startswith("sequence") and old_logprobs.dim() != 2:
        raise ValueError(
            f"sampler_correction {mode!r} needs [B, T] log-probabilities, one sequence a row; got "
            f"{tuple(old_logprobs.shape)}"
        )
    with torch.no_grad():
        log_ratio = zero_padding(old_logprobs - sampler_logprobs, mask)
        if mode.startswith("sequence"):
            log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(old_logprobs)
        weights = torch.exp(log_ratio)
        if mode.endswith("truncate"):
            weights = torch.clamp(weights, max=cap)
        else:
            weights = torch.where(weights > cap, torch.zeros_like(weights), weights)
        return zero_padding(weights, mask)


def clipped_surrogate_terms(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> torch.Tensor:
    """The clipped surrogate entry by entry, no reduction:
    ``max(-A * rho, -A * clip(rho, 1 - eps, 1 + eps_high)) = -min(rho A, clip(rho) A)``
    (eq-ppo-clip). ``clipped_policy_loss`` takes its token mean; GRPO's loss types sum it other
    ways."""
    _check_clip("clip_eps", clip_eps)
    _check_clip("clip_eps_high", clip_eps_high)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    return torch.maximum(unclipped, clipped)


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip_eps: float | None = 0.2,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Critic loss ``0.5 * mean(max((V - R)^2, (V_clip - R)^2))`` (Chapter 7).

    ``V_clip = V_old + clip(V - V_old, -eps, eps)``. With ``clip_eps=None`` it is ``0.5 * MSE``.
    """
    _check_same_shape("values", values, old_values=old_values, returns=returns, mask=mask)
    _check_clip("clip_eps", clip_eps)
    values, returns = zero_padding(values, mask), zero_padding(returns.detach(), mask)
    old_values = zero_padding(old_values, mask)
    squared_error = (values - returns) ** 2
    if clip_eps is not None:
        old_values = old_values.detach()
        clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
        squared_error = torch.maximum(squared_error, (clipped - returns) ** 2)
    return 0.5 * masked_mean(squared_error, mask)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum_a pi(a) log pi(a)`` of the categorical distribution at each position (last
    dim).

    Actions masked out with ``-inf`` logits have probability 0 and contribute 0 (not
    ``0 * -inf = nan``).
    """
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    return -torch.where(probs > 0, probs * logp, torch.zeros_like(logp)).sum(dim=-1)


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Chapter 10; Schulman
    2020); no reduction.

    With ``log_r = ref_logprobs - logprobs``: k1 = -log_r (unbiased, can be negative),
    k2 = log_r^2 / 2 (biased, low variance), k3 = exp(log_r) - log_r - 1 (unbiased and >= 0).
    """
    _check_same_shape("logprobs", logprobs, ref_logprobs=ref_logprobs)
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kind must be one of {KL_ESTIMATORS}, got {kind!r}")
    log_ratio = ref_logprobs - logprobs
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    return torch.expm1(log_ratio) - log_ratio


def approx_kl(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Diagnostic: k3 estimate of KL(pi_old || pi) over the rollout's samples, as PPO
    implementations log it."""
    with torch.no_grad():
        return masked_mean(
            kl_estimate(zero_padding(old_logprobs, mask), zero_padding(logprobs, mask), "k3"), mask
        )


def clip_fraction(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    clip_eps: float = 0.2,
    mask: torch.Tensor | None = None,
    clip_eps_high: float | None = None,
) -> torch.Tensor:
    """Diagnostic: fraction of valid entries whose ratio lies outside
    ``[1 - eps, 1 + eps_high]``."""
    _check_same_shape("logprobs", logprobs, old_logprobs=old_logprobs, mask=mask)
    _check_clip("clip_eps", clip_eps)
    _check_clip("clip_eps_high", clip_eps_high)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    with torch.no_grad():
        ratio = torch.exp(zero_padding(logprobs - old_logprobs, mask))
        outside = (ratio < 1.0 - clip_eps) | (ratio > 1.0 + high)
        return masked_mean(outside.to(logprobs.dtype), mask)


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Diagnostic: ``1 - Var[R - V] / Var[R]`` over valid entries (1 is perfect, <= 0 is no better
    than a constant)."""
    _check_same_shape("values", values, returns=returns, mask=mask)
    with torch.no_grad():
        values, returns = zero_padding(values, mask), zero_padding(returns, mask)
        returns_variance = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
        residual = returns - values
        residual_variance = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
        if returns_variance == 0:
            return torch.tensor(float("nan"), dtype=values.dtype)
        return 1.0 - residual_variance / returns_variance
