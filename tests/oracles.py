"""Reference implementations the tests (and bench/gae.py) trust: plain loops, no cleverness.

``deepspeed_chat_gae`` is the reverse loop of DeepSpeed-Chat's PPO trainer
(``get_advantages_and_returns``): one Python step per time index, vectorised over the batch, with
the episode ends (``dones``), bootstrap (``last_value``) and token ``mask`` of
``rlkit.advantages.gae`` added the plain way.
"""

from __future__ import annotations

import torch


def deepspeed_chat_gae(rewards, values, gamma, lam, dones=None, last_value=None, mask=None):
    lastgaelam = 0
    advantages_reversed = []
    length = rewards.size()[-1]
    dones = torch.zeros_like(rewards) if dones is None else dones.to(rewards.dtype)
    mask = torch.ones_like(rewards) if mask is None else mask.to(rewards.dtype)
    for t in reversed(range(length)):
        if t < length - 1:
            nextvalues = values[:, t + 1]
            # the last valid token before padding ends its episode
            nextnonterminal = (1.0 - dones[:, t]) * mask[:, t + 1]
        else:
            nextvalues = 0.0 if last_value is None else last_value
            nextnonterminal = 1.0 - dones[:, t]
        delta = rewards[:, t] + gamma * nextvalues * nextnonterminal - values[:, t]
        lastgaelam = (delta + gamma * lam * nextnonterminal * lastgaelam) * mask[:, t]
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = (advantages + values) * mask
    return advantages.detach(), returns.detach()


def loop_discounted_returns(rewards, gamma, dones=None, last_value=None):
    """G_t = r_t + gamma * (1 - done_t) * G_{t+1}, one row and one step at a time, in Python
    floats."""
    batch, length = rewards.shape
    out = torch.zeros(batch, length, dtype=torch.float64)
    for b in range(batch):
        running = 0.0 if last_value is None else float(last_value[b])
        for t in reversed(range(length)):
            done = 0.0 if dones is None else float(dones[b, t])
            running = float(rewards[b, t]) + gamma * (1.0 - done) * running
            out[b, t] = running
    return out


def deepspeed_chat_actor_loss(logprobs, old_logprobs, advantages, mask, cliprange):
    """DeepSpeed-Chat's ``actor_loss_fn``."""
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    return torch.sum(torch.max(pg_loss1, pg_loss2) * mask) / mask.sum()


def deepspeed_chat_critic_loss(values, old_values, returns, mask, cliprange_value):
    """DeepSpeed-Chat's ``critic_loss_fn``."""
    values_clipped = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    vf_loss1 = (values - returns) ** 2
    vf_loss2 = (values_clipped - returns) ** 2
    return 0.5 * torch.sum(torch.max(vf_loss1, vf_loss2) * mask) / mask.sum()


def deepspeed_chat_compute_rewards(
    prompts, log_probs, ref_log_probs, reward_score, action_mask, kl_ctl, clip_reward_value
):
    """DeepSpeed-Chat's ``DeepSpeedPPOTrainer.compute_rewards``, line for line.

    It works in the full-sequence layout: ``log_probs[:, i]`` is the log-probability of token
    ``i + 1`` of prompt-and-response, and ``action_mask`` is the attention mask without its first
    column, so the response's tokens sit at ``log_probs[:, start:]`` with
    ``start = prompts.shape[1] - 1``.
    """
    kl_divergence_estimate = -kl_ctl * (log_probs - ref_log_probs)
    rewards = kl_divergence_estimate
    start = prompts.shape[1] - 1
    ends = start + action_mask[:, start:].sum(1) + 1
    reward_clip = torch.clamp(reward_score, -clip_reward_value, clip_reward_value)
    batch_size = log_probs.shape[0]
    for j in range(batch_size):
        rewards[j, start : ends[j]][-1] += reward_clip[j]
    return rewards
