"""DPO and its family (Chapter 12): preference optimisation as a classification loss on the
policy's own log-probabilities, with no reward model and no sampling.

The KL-regularised objective of Chapter 10 has a closed-form optimum, pi*(y|x) proportional to
pi_ref(y|x) exp(r(x, y) / beta); solved for the reward, r(x, y) = beta log(pi*(y|x) /
pi_ref(y|x)) + beta log Z(x), and put into Chapter 9's Bradley-Terry model, the partition function
Z(x) cancels between the two answers to one prompt (Rafailov et al., 2023). What is left is the
Bradley-Terry loss on the *implicit rewards* beta (log pi - log pi_ref) of the chosen and the
rejected answer (eq-dpo-loss). The variants change that loss:

- conservative DPO (Mitchell, 2023): labels flipped with probability ``label_smoothing``;
- robust DPO (Chowdhury et al., 2024): the unbiased form under such flips (``loss_type="robust"``);
- IPO (Azar et al., 2024): a squared loss towards a margin of 1/(2 beta) (``loss_type="ipo"``),
  which does not drive the margin to infinity on deterministic preferences; TRL applies it to mean
  per-token log-probabilities;
- SimPO (Meng et al., 2024): no reference at all, length-normalised log-probabilities and a target
  margin (``simpo_loss``).

The functions take sequence log-probabilities as given (``sequence_logprobs`` sums or averages
Chapter 8's per-token ``response_logprobs``). Names follow TRL's ``DPOConfig``: ``beta``,
``loss_type``, ``label_smoothing``; SimPO's ``gamma`` is TRL's ``simpo_gamma``.
"""

from __future__ import annotations

import torch

from rlkit.llm.reward_model import bradley_terry_loss
from rlkit.losses import zero_padding
from rlkit.training import is_finite_number, require

__all__ = [
    "DPO_LOSS_TYPES",
    "dpo_loss",
    "implicit_rewards",
    "sequence_logprobs",
    "simpo_loss",
]

DPO_LOSS_TYPES = ("sigmoid", "robust", "ipo")


def sequence_logprobs(
    token_logprobs: torch.Tensor, mask: torch.Tensor, average: bool = False
) -> torch.Tensor:
    """``[B]``: each answer's log-probability, the sum of its tokens' (``[B, T]``, the response
    layout's ``response_logprobs``) over ``mask``; with ``average`` their mean per token (IPO's
    and SimPO's length normalisation). What padding holds never counts."""
    require(
        token_logprobs.dim() == 2 and mask.shape == token_logprobs.shape,
        "mask",
        f"a [B, T] tensor of the shape of token_logprobs, {tuple(token_logprobs.shape)}",
        tuple(mask.shape),
    )
    lengths = mask.sum(dim=1)
    require(bool((lengths > 0).all()), "mask", "at least one answer token in every row", lengths)
    total = zero_padding(token_logprobs, mask).sum(dim=1)
    return total / lengths.to(total.dtype) if average else total


def implicit_rewards(
    policy_logps: torch.Tensor, ref_logps: torch.Tensor, beta: float = 0.1
) -> torch.Tensor:
    """DPO's implicit reward of each answer, ``beta * (log pi(y|x) - log pi_ref(y|x))``
    (eq-dpo-implicit-reward): the reward, up to a function of the prompt alone, for which the
    policy is the optimum of the KL-regularised objective."""
    return beta * (policy_logps - ref_logps)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The mean over the batch of DPO's loss (eq-dpo-loss) on the sequence log-probabilities of
    the chosen and the rejected answers (``[B]`` each), under the policy and the reference.

    With ``h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))``:

    - ``"sigmoid"``: ``-log sigmoid(beta h)``, the Bradley-Terry loss of the implicit rewards; with
      ``label_smoothing`` eps > 0, conservative DPO, ``-(1 - eps) log sigmoid(beta h) - eps log
      sigmoid(-beta h)`` (TRL 1.x's "sigmoid" ignores ``label_smoothing``);
    - ``"robust"``: ``(-(1 - eps) log sigmoid(beta h) + eps log sigmoid(-beta h)) / (1 - 2 eps)``,
      unbiased for the clean loss when each label is flipped with probability eps;
    - ``"ipo"``: ``(h - 1 / (2 beta))^2``; pass mean per-token log-probabilities
      (``sequence_logprobs(..., average=True)``), as TRL's trainer does for it (an averaging the
      IPO paper does not write, which TRL confirmed with its authors); no label smoothing.

    It is log 2 for "sigmoid" when the policy equals the reference (h = 0).
    """
    require(loss_type in DPO_LOSS_TYPES, "loss_type", f"one of {DPO_LOSS_TYPES}", loss_type)
    require(is_finite_number(beta) and beta > 0, "beta", "a number > 0", beta)
    _require_label_smoothing(label_smoothing)
    require(
        loss_type != "ipo" or label_smoothing == 0,
        "label_smoothing",
        "0 for loss_type 'ipo' (its squared loss has no flipped-label form)",
        label_smoothing,
    )
    _require_one_shape(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    chosen = implicit_rewards(policy_chosen_logps, ref_chosen_logps, beta)
    rejected = implicit_rewards(policy_rejected_logps, ref_rejected_logps, beta)
    if loss_type == "ipo":
        margin = (chosen - rejected) / beta
        return ((margin - 1 / (2 * beta)) ** 2).mean()
    right, flipped = bradley_terry_loss(chosen, rejected), bradley_terry_loss(rejected, chosen)
    if loss_type == "robust":
        return ((1 - label_smoothing) * right - label_smoothing * flipped) / (
            1 - 2 * label_smoothing
        )
    return (1 - label_smoothing) * right + label_smoothing * flipped


def simpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    beta: float = 2.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """SimPO's loss (eq-simpo-loss), the mean over the batch of ``-log sigmoid(beta (a_w - a_l) -
    gamma)``: no reference model; ``a`` is the answer's *mean* per-token log-probability
    (``sequence_logprobs(..., average=True)``), so that a longer answer is not a likelier one,
    and ``gamma`` (TRL's ``simpo_gamma``) a target margin. With ``label_smoothing`` eps, the
    conservative form, as TRL's ``CPOTrainer(loss_type="simpo")`` computes it."""
    require(is_finite_number(beta) and beta > 0, "beta", "a number > 0", beta)
    require(is_finite_number(gamma), "gamma", "a finite number (the target margin)", gamma)
    _require_label_smoothing(label_smoothing)
    _require_one_shape(
        policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps
    )
    chosen, rejected = beta * policy_chosen_logps, beta * policy_rejected_logps
    right = bradley_terry_loss(chosen, rejected, margin=gamma)
    flipped = bradley_terry_loss(rejected, chosen, margin=-gamma)  # the label flipped
    return (1 - label_smoothing) * right + label_smoothing * flipped


def _require_label_smoothing(label_smoothing: float) -> None:
    require(
        is_finite_number(label_smoothing) and 0 <= label_smoothing < 0.5,
        "label_smoothing",
        "a number in [0, 0.5) (the probability that a label is flipped)",
        label_smoothing,
    )


def _require_one_shape(**tensors: torch.Tensor) -> None:
    """Every tensor ``[B]``, of one shape (a ValueError naming the first that is not)."""
    names = list(tensors)
    first = tensors[names[0]]
    require(first.dim() == 1, names[0], "a [B] tensor, one log-probability per answer", first.shape)
    for name in names[1:]:
        require(
            tensors[name].shape == first.shape,
            name,
            f"a tensor of the shape of {names[0]}, {tuple(first.shape)}",
            tuple(tensors[name].shape),
        )
