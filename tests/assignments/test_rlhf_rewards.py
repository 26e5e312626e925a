"""The RLHF-rewards assignment (Chapter 10) end to end: nbgrader releases it, autogrades
submissions, and the marks tell a correct solution from stubs, subtly wrong solutions and calls into
rlkit (the checks are those of standard.py)."""

from __future__ import annotations

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant
from tests.assignments.standard import StandardAssignmentTests

pytestmark = pytest.mark.assignments

REWARDS, GAE = "kl_shaped_rewards", "token_gae"
TEST_KL, TEST_SCORE = "test_kl_penalty", "test_score_at_last_token"
TEST_FULL, TEST_PADDED = "test_gae_full_rows", "test_gae_padded_rows"
REWARD_TESTS, GAE_TESTS = frozenset({TEST_KL, TEST_SCORE}), frozenset({TEST_FULL, TEST_PADDED})

# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------

KL_SIGN_FLIPPED = """
def kl_shaped_rewards(logprobs, ref_logprobs, scores, mask, kl_coef, clip_reward):
    rewards = kl_coef * (logprobs - ref_logprobs) * mask  # BUG: the penalty rewards drifting away
    columns = torch.arange(mask.shape[1], device=mask.device)
    last = (columns * (mask != 0)).argmax(dim=1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] += scores.clamp(-clip_reward, clip_reward)
    return rewards
"""

KL_ON_PADDING = """
def kl_shaped_rewards(logprobs, ref_logprobs, scores, mask, kl_coef, clip_reward):
    rewards = -kl_coef * (logprobs - ref_logprobs)  # BUG: padding's log-probabilities count too
    columns = torch.arange(mask.shape[1], device=mask.device)
    last = (columns * (mask != 0)).argmax(dim=1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] += scores.clamp(-clip_reward, clip_reward)
    return rewards
"""

SCORE_AT_FIRST_PAD = """
def kl_shaped_rewards(logprobs, ref_logprobs, scores, mask, kl_coef, clip_reward):
    rewards = -kl_coef * (logprobs - ref_logprobs) * mask
    first_pad = mask.sum(dim=1).long().clamp(max=mask.shape[1] - 1)  # BUG: one past the last token
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, first_pad] += scores.clamp(-clip_reward, clip_reward)
    return rewards
"""

SCORE_NOT_CLIPPED = """
def kl_shaped_rewards(logprobs, ref_logprobs, scores, mask, kl_coef, clip_reward):
    rewards = -kl_coef * (logprobs - ref_logprobs) * mask
    columns = torch.arange(mask.shape[1], device=mask.device)
    last = (columns * (mask != 0)).argmax(dim=1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] += scores  # BUG: clip to [-clip_reward, clip_reward]
    return rewards
"""

GAE_LEAKS_INTO_PADDING = """
def token_gae(rewards, values, mask, gamma, lam):
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage  # BUG: the mask is ignored
        next_value = values[:, t]
        advantages[:, t] = next_advantage
    return advantages, advantages + values
"""

BOOTSTRAPS_FROM_PADDING = """
def token_gae(rewards, values, mask, gamma, lam):
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        next_value = values[:, t]  # BUG: the last real token bootstraps from the padding's value
        advantages[:, t] = next_advantage
    return advantages, (advantages + values) * mask
"""

NO_GAMMA_IN_LAMBDA_TERM = """
def token_gae(rewards, values, mask, gamma, lam):
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = (delta + lam * next_advantage) * mask[:, t]  # BUG: gamma * lam
        next_value = values[:, t] * mask[:, t]
        advantages[:, t] = next_advantage
    return advantages, (advantages + values) * mask
"""

RETURNS_ARE_ADVANTAGES = """
def token_gae(rewards, values, mask, gamma, lam):
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        next_value = values[:, t] * mask[:, t]
        advantages[:, t] = next_advantage
    return advantages, advantages  # BUG: the critic's target is A + V
"""

# ---- Cheats: rlkit's own code. The grader must make them fail. -----------------------------------

IMPORTS_RLKIT_REWARDS = """
from rlkit.llm.rlhf_ppo import compute_rewards


def kl_shaped_rewards(logprobs, ref_logprobs, scores, mask, kl_coef, clip_reward):
    return compute_rewards(logprobs, ref_logprobs, scores, mask, kl_coef, clip_reward)
"""

IMPORTS_RLKIT_GAE_AT_CALL_TIME = """
def token_gae(rewards, values, mask, gamma, lam):
    from rlkit.advantages import gae

    return gae(rewards, values, gamma, lam, mask=mask)
"""


class TestRLHFRewards(StandardAssignmentTests):
    assignment = grading.Assignment("rlhf_rewards")
    points = {TEST_KL: 3.0, TEST_SCORE: 2.0, TEST_FULL: 2.0, TEST_PADDED: 3.0}
    solution_cells = frozenset({REWARDS, GAE})
    default_seed = "1732051"
    feedback_student = "e_gae_leaks_into_padding"
    hidden_secrets = ("def _hidden_gae",)
    hidden_cases = "_hidden_cases"
    wrong = {
        "a_kl_sign_flipped": Variant(
            {REWARDS: KL_SIGN_FLIPPED},
            frozenset({TEST_KL}),
            "the penalty pays the policy for drifting from the reference",
        ),
        "b_kl_on_padding": Variant(
            {REWARDS: KL_ON_PADDING},
            frozenset({TEST_KL}),
            "padding's log-probabilities enter the reward",
        ),
        "c_score_at_first_pad": Variant(
            {REWARDS: SCORE_AT_FIRST_PAD},
            frozenset({TEST_SCORE}),
            "the score lands on the first pad, one past the last real token",
        ),
        "d_score_not_clipped": Variant(
            {REWARDS: SCORE_NOT_CLIPPED}, frozenset({TEST_SCORE}), "the score is not clipped"
        ),
        "e_gae_leaks_into_padding": Variant(
            {GAE: GAE_LEAKS_INTO_PADDING},
            frozenset({TEST_PADDED}),
            "GAE runs through the padding: its values reach the real tokens",
        ),
        "f_bootstraps_from_padding": Variant(
            {GAE: BOOTSTRAPS_FROM_PADDING},
            frozenset({TEST_PADDED}),
            "the last real token bootstraps from the value stored on the padding after it",
        ),
        "g_no_gamma_in_lambda_term": Variant(
            {GAE: NO_GAMMA_IN_LAMBDA_TERM}, GAE_TESTS, "A_t = delta_t + lam A_{t+1}"
        ),
        "h_returns_are_advantages": Variant(
            {GAE: RETURNS_ARE_ADVANTAGES}, GAE_TESTS, "the returns miss the values"
        ),
    }
    cheats = {
        "i_imports_rlkit": Variant(
            {REWARDS: IMPORTS_RLKIT_REWARDS},
            REWARD_TESTS,
            "rlkit's compute_rewards, imported before the guard runs",
        ),
        "i_imports_rlkit_at_call_time": Variant(
            {GAE: IMPORTS_RLKIT_GAE_AT_CALL_TIME},
            GAE_TESTS,
            "rlkit's gae, imported inside the function after the guard has run",
        ),
    }
