"""RLHF with PPO (Chapter 10, in progress): the KL-shaped, token-level reward.

The RLHF objective is ``max E[r(x, y)] - beta KL(pi || pi_ref)``. PPO optimises it token by token
(Ziegler et al., 2019; DeepSpeed-Chat and ColossalAI's PPO trainers): each response token earns
``-kl_coef`` times a per-token estimate of the KL to the reference policy, and the last real token
also earns the reward model's score, clipped. Token-level GAE over these rewards is
``rlkit.advantages.gae(rewards, values, gamma, lam, mask=response_mask)``: the last real token ends
the episode, and nothing flows back from the padding.
"""

from __future__ import annotations

import torch

from rlkit.losses import KL_ESTIMATORS, kl_estimate
from rlkit.training import is_finite_number, require

__all__ = ["AdaptiveKLController", "compute_rewards", "last_token_index"]


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Each row's last column whose mask is 1, ``[B]`` (for right- or left-padded rows alike)."""
    columns = torch.arange(mask.shape[1], device=mask.device)
    return (columns * (mask != 0)).argmax(dim=1)


def compute_rewards(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    clip_reward: float,
    kl_kind: str = "k1",
) -> torch.Tensor:
    """Per-token rewards ``[B, T_resp]``: ``-kl_coef * KL_t`` on each valid response token, plus the
    score clipped to ``[-clip_reward, clip_reward]`` once, at each row's last valid token; 0 on
    padding (eq-rlhf-reward).

    ``logprobs`` and ``ref_logprobs`` are the sampled tokens' log-probabilities under the policy
    and the reference (``[B, T_resp]``), ``scores`` the reward model's ``[B]``, ``mask`` 1 on the
    response's tokens. ``KL_t`` is ``kl_estimate(logprobs, ref_logprobs, kl_kind)``: k1, the log
    ratio, as DeepSpeed-Chat and TRL put in the reward (its sum over a response is an unbiased
    estimate of the sequence's KL). No gradient flows: the rewards are PPO's fixed targets.
    """
    require(is_finite_number(kl_coef) and kl_coef >= 0, "kl_coef", "a number >= 0", kl_coef)
    require(
        is_finite_number(clip_reward) and clip_reward > 0,
        "clip_reward",
        "a number > 0",
        clip_reward,
    )
    require(kl_kind in KL_ESTIMATORS, "kl_kind", f"one of {KL_ESTIMATORS}", kl_kind)
    require(
        logprobs.dim() == 2 and ref_logprobs.shape == logprobs.shape == mask.shape,
        "ref_logprobs and mask",
        f"[B, T_resp] tensors of the shape of logprobs, {tuple(logprobs.shape)}",
        (tuple(ref_logprobs.shape), tuple(mask.shape)),
    )
    require(
        scores.shape == (logprobs.shape[0],),
        "scores",
        f"a [B] tensor, B = {logprobs.shape[0]}",
        tuple(scores.shape),
    )
    lengths = (mask != 0).sum(dim=1)
    require(
        bool((lengths > 0).all()),
        "mask",
        "at least one response token in every row (an empty response has no token to reward)",
        lengths.tolist(),
    )
    with torch.no_grad():
        valid = (mask != 0).to(logprobs.dtype)
        kl = kl_estimate(logprobs.detach() * valid, ref_logprobs.detach() * valid, kl_kind)
        rewards = -kl_coef * kl * valid
        last = last_token_index(mask)
        rows = torch.arange(rewards.shape[0], device=rewards.device)
        rewards[rows, last] += scores.detach().to(rewards.dtype).clamp(-clip_reward, clip_reward)
    return rewards


class AdaptiveKLController:
    """Ziegler et al.'s (2019) controller of ``kl_coef``: a proportional step towards a target KL.

    After each batch, with ``e = clip(KL / target - 1, -0.2, 0.2)`` (eq-adaptive-kl),
    ``kl_coef <- kl_coef * (1 + e * n / horizon)``, where ``n`` counts the batch's samples: the
    coefficient grows while the policy drifts faster than the target allows and shrinks while it
    stays closer. The clip bounds the step, so one odd batch cannot swing the coefficient.
    """

    def __init__(self, kl_coef: float, target: float, horizon: int):
        require(is_finite_number(kl_coef) and kl_coef > 0, "kl_coef", "a number > 0", kl_coef)
        require(is_finite_number(target) and target > 0, "target_kl", "a number > 0", target)
        require(
            isinstance(horizon, int) and not isinstance(horizon, bool) and horizon >= 1,
            "kl_horizon",
            "an integer >= 1",
            horizon,
        )
        self.value, self.target, self.horizon = float(kl_coef), float(target), horizon

    def update(self, kl: float, num_samples: int) -> float:
        """The new coefficient, after a batch of ``num_samples`` whose mean KL was ``kl``."""
        require(is_finite_number(kl), "kl", "a finite number", kl)
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * num_samples / self.horizon
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])
