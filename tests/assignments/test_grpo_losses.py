"""The GRPO-losses assignment (Chapter 11) end to end: nbgrader releases it, autogrades submissions,
and the marks tell a correct solution from stubs, subtly wrong solutions and calls into rlkit (the
checks are those of standard.py)."""

from __future__ import annotations

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant
from tests.assignments.standard import StandardAssignmentTests

pytestmark = pytest.mark.assignments

ADVANTAGES, LOSS = "group_advantages", "grpo_loss"
TEST_SPREAD, TEST_CONSTANT = "test_advantages_with_spread", "test_constant_groups"
TEST_CLIP, TEST_KL = "test_clipped_surrogate", "test_kl_penalty"

# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------
GROUP_STD_OVER_BATCH = """
def group_advantages(rewards, group_size):
    grouped = rewards.view(-1, group_size)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)) / (rewards.std() + 1e-4)  # BUG: the group's std
    constant = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(advantages), advantages).view(-1)
"""

GROUP_POPULATION_STD = """
def group_advantages(rewards, group_size):
    grouped = rewards.view(-1, group_size)
    std = grouped.std(dim=1, keepdim=True, unbiased=False)  # BUG: the unbiased std (G - 1)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)) / (std + 1e-4)
    constant = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(advantages), advantages).view(-1)
"""

GROUP_NAN_WHEN_CONSTANT = """
def group_advantages(rewards, group_size):
    grouped = rewards.view(-1, group_size)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)) / grouped.std(dim=1, keepdim=True)  # BUG: 0 / 0, and no 1e-4
    return advantages.view(-1)
"""

LOSS_TOKEN_MEAN_OVER_BATCH = """
def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta):
    valid = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype)
    ratio = torch.exp(torch.where(valid, logprobs - old_logprobs.detach(), zero))
    a = advantages.detach()[:, None]
    terms = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    d = torch.where(valid, ref_logprobs.detach() - logprobs, zero)
    terms = torch.where(valid, terms + beta * (torch.exp(d) - d - 1), zero)
    return terms.sum() / mask.sum()  # BUG: each completion's mean, then the mean over completions
"""

LOSS_NOT_CLIPPED = """
def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta):
    valid = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype)
    ratio = torch.exp(torch.where(valid, logprobs - old_logprobs.detach(), zero))
    a = advantages.detach()[:, None]
    terms = -ratio * a  # BUG: the clipped term is missing
    d = torch.where(valid, ref_logprobs.detach() - logprobs, zero)
    terms = torch.where(valid, terms + beta * (torch.exp(d) - d - 1), zero)
    return (terms.sum(dim=1) / mask.sum(dim=1)).mean()
"""

LOSS_RATIO_INVERTED = """
def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta):
    valid = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype)
    ratio = torch.exp(torch.where(valid, old_logprobs.detach() - logprobs, zero))  # BUG: pi / pi_old
    a = advantages.detach()[:, None]
    terms = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    d = torch.where(valid, ref_logprobs.detach() - logprobs, zero)
    terms = torch.where(valid, terms + beta * (torch.exp(d) - d - 1), zero)
    return (terms.sum(dim=1) / mask.sum(dim=1)).mean()
"""

LOSS_KL_WRONG_DIRECTION = """
def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta):
    valid = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype)
    ratio = torch.exp(torch.where(valid, logprobs - old_logprobs.detach(), zero))
    a = advantages.detach()[:, None]
    terms = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    d = torch.where(valid, logprobs - ref_logprobs.detach(), zero)  # BUG: d = log pi_ref - log pi
    terms = torch.where(valid, terms + beta * (torch.exp(d) - d - 1), zero)
    return (terms.sum(dim=1) / mask.sum(dim=1)).mean()
"""

LOSS_KL_ON_PADDING = """
def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta):
    valid = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype)
    ratio = torch.exp(torch.where(valid, logprobs - old_logprobs.detach(), zero))
    a = advantages.detach()[:, None]
    terms = torch.where(valid, -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a), zero)
    d = ref_logprobs.detach() - logprobs
    terms = terms + beta * (torch.exp(d) - d - 1)  # BUG: the penalty is summed over padding too
    return (terms.sum(dim=1) / mask.sum(dim=1)).mean()
"""

# ---- Cheats: rlkit's own code. The grader must make them fail. -----------------------------------

IMPORTS_RLKIT_ADVANTAGES = """
from rlkit.llm.grpo import group_advantages as _rlkit_group_advantages


def group_advantages(rewards, group_size):
    return _rlkit_group_advantages(rewards, group_size)
"""

IMPORTS_RLKIT_LOSS_AT_CALL_TIME = """
def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta):
    from rlkit.llm.grpo import grpo_loss as rlkit_grpo_loss

    return rlkit_grpo_loss(logprobs, old_logprobs, advantages, mask, clip_eps,
                           ref_logprobs=ref_logprobs, beta=beta)
"""


class TestGRPOLosses(StandardAssignmentTests):
    assignment = grading.Assignment("grpo_losses")
    points = {TEST_SPREAD: 3.0, TEST_CONSTANT: 2.0, TEST_CLIP: 3.0, TEST_KL: 2.0}
    solution_cells = frozenset({ADVANTAGES, LOSS})
    default_seed = "2416093"
    feedback_student = "g_kl_wrong_direction"
    hidden_secrets = ("def _hidden_loss",)
    hidden_cases = "_hidden_cases"
    wrong = {
        "a_std_over_the_batch": Variant(
            {ADVANTAGES: GROUP_STD_OVER_BATCH},
            frozenset({TEST_SPREAD}),
            "the advantages are scaled by the batch's std, not the group's",
        ),
        "b_population_std": Variant(
            {ADVANTAGES: GROUP_POPULATION_STD},
            frozenset({TEST_SPREAD}),
            "the std divides by G, not G - 1",
        ),
        "c_nan_on_a_constant_group": Variant(
            {ADVANTAGES: GROUP_NAN_WHEN_CONSTANT},
            frozenset({TEST_SPREAD, TEST_CONSTANT}),
            "no 1e-4 in the denominator: a constant group gives 0 / 0",
        ),
        "d_token_mean_over_the_batch": Variant(
            {LOSS: LOSS_TOKEN_MEAN_OVER_BATCH},
            frozenset({TEST_CLIP}),
            "the token mean over the batch where each completion's mean is asked",
        ),
        "e_not_clipped": Variant(
            {LOSS: LOSS_NOT_CLIPPED}, frozenset({TEST_CLIP}), "the clipped term is missing"
        ),
        "f_ratio_inverted": Variant(
            {LOSS: LOSS_RATIO_INVERTED}, frozenset({TEST_CLIP}), "the ratio is pi_old / pi"
        ),
        "g_kl_wrong_direction": Variant(
            {LOSS: LOSS_KL_WRONG_DIRECTION},
            frozenset({TEST_KL}),
            "the k3 estimator of KL(pi_ref || pi), not KL(pi || pi_ref)",
        ),
        "h_kl_on_padding": Variant(
            {LOSS: LOSS_KL_ON_PADDING},
            frozenset({TEST_KL}),
            "the penalty is summed over padding too",
        ),
    }
    cheats = {
        "i_imports_rlkit": Variant(
            {ADVANTAGES: IMPORTS_RLKIT_ADVANTAGES},
            frozenset({TEST_SPREAD, TEST_CONSTANT}),
            "rlkit's group_advantages, imported before the guard runs",
        ),
        "i_imports_rlkit_at_call_time": Variant(
            {LOSS: IMPORTS_RLKIT_LOSS_AT_CALL_TIME},
            frozenset({TEST_CLIP, TEST_KL}),
            "rlkit's grpo_loss, imported inside the function after the guard has run",
        ),
    }

    def test_the_wrong_kl_direction_is_caught_only_by_hidden_cases(self, course, graded):
        """Its visible case is symmetric (log ratios 1 and -1 swap places), so only the hidden
        cases tell the two directions apart."""
        self.assignment.check_caught_only_by_hidden_cases(
            course, "g_kl_wrong_direction", frozenset({TEST_KL})
        )
