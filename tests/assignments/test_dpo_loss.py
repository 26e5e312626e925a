"""The DPO-loss assignment (Chapter 12) end to end: nbgrader releases it, autogrades submissions,
and the marks tell a correct solution from stubs, subtly wrong solutions and calls into rlkit (the
checks are those of standard.py)."""

from __future__ import annotations

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant
from tests.assignments.standard import StandardAssignmentTests

pytestmark = pytest.mark.assignments

SEQUENCE, LOSS = "sequence_logprobs", "dpo_loss"
TEST_SEQUENCE, TEST_LOSS = "test_sequence_logprobs", "test_dpo_loss"
TEST_FAR, TEST_CDPO = "test_dpo_loss_far_apart", "test_conservative_dpo"
LOSS_TESTS = frozenset({TEST_LOSS, TEST_FAR, TEST_CDPO})

# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------

TOKEN_MEAN = """
def sequence_logprobs(token_logprobs, mask):
    real = mask.bool()
    total = torch.where(real, token_logprobs, torch.zeros_like(token_logprobs)).sum(dim=1)
    return total / mask.sum(dim=1)  # BUG: the sum is asked, not the mean per token
"""

PADDING_MULTIPLIED = """
def sequence_logprobs(token_logprobs, mask):
    return (token_logprobs * mask).sum(dim=1)  # BUG: -inf * 0 is NaN
"""

REFERENCE_NOT_SUBTRACTED = """
def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta, label_smoothing=0.0):
    h = policy_chosen_logps - policy_rejected_logps  # BUG: minus the reference's margin
    right, flipped = -F.logsigmoid(beta * h), -F.logsigmoid(-beta * h)
    return ((1 - label_smoothing) * right + label_smoothing * flipped).mean()
"""

BETA_OUTSIDE_THE_SIGMOID = """
def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta, label_smoothing=0.0):
    h = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    right, flipped = -beta * F.logsigmoid(h), -beta * F.logsigmoid(-h)  # BUG: sigmoid(beta h)
    return ((1 - label_smoothing) * right + label_smoothing * flipped).mean()
"""

LOG_OF_SIGMOID = """
def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta, label_smoothing=0.0):
    h = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    right = -torch.log(torch.sigmoid(beta * h))  # BUG: sigmoid underflows to 0 far apart
    flipped = -torch.log(torch.sigmoid(-beta * h))
    return ((1 - label_smoothing) * right + label_smoothing * flipped).mean()
"""

SMOOTHING_IGNORED = """
def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta, label_smoothing=0.0):
    h = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(beta * h).mean()  # BUG: label_smoothing left out
"""

ROBUST_NUMERATOR = """
def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta, label_smoothing=0.0):
    h = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    right, flipped = -F.logsigmoid(beta * h), -F.logsigmoid(-beta * h)
    return ((1 - label_smoothing) * right - label_smoothing * flipped).mean()  # BUG: + eps * flipped
"""

# ---- Cheats: rlkit's own code. The grader must make them fail. -----------------------------------

IMPORTS_RLKIT_SEQUENCE = """
from rlkit.llm.dpo import sequence_logprobs as _rlkit_sequence_logprobs


def sequence_logprobs(token_logprobs, mask):
    return _rlkit_sequence_logprobs(token_logprobs, mask)
"""

IMPORTS_RLKIT_LOSS_AT_CALL_TIME = """
def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta, label_smoothing=0.0):
    from rlkit.llm.dpo import dpo_loss as rlkit_dpo_loss

    return rlkit_dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                          ref_rejected_logps, beta, label_smoothing=label_smoothing)
"""


class TestDPOLoss(StandardAssignmentTests):
    assignment = grading.Assignment("dpo_loss")
    points = {TEST_SEQUENCE: 2.0, TEST_LOSS: 3.0, TEST_FAR: 2.0, TEST_CDPO: 3.0}
    solution_cells = frozenset({SEQUENCE, LOSS})
    default_seed = "3817529"
    feedback_student = "d_beta_outside_the_sigmoid"
    hidden_secrets = ("def _hidden_loss",)
    hidden_cases = "_hidden_cases"
    wrong = {
        "a_token_mean": Variant(
            {SEQUENCE: TOKEN_MEAN},
            frozenset({TEST_SEQUENCE}),
            "the mean per token where the sequence's sum is asked",
        ),
        "b_padding_multiplied": Variant(
            {SEQUENCE: PADDING_MULTIPLIED},
            frozenset({TEST_SEQUENCE}),
            "padding multiplied by 0, which leaves NaN where it holds -inf",
        ),
        "c_reference_not_subtracted": Variant(
            {LOSS: REFERENCE_NOT_SUBTRACTED},
            LOSS_TESTS,
            "the reference's log-probabilities are not subtracted",
        ),
        "d_beta_outside_the_sigmoid": Variant(
            {LOSS: BETA_OUTSIDE_THE_SIGMOID},
            frozenset({TEST_LOSS, TEST_CDPO}),
            "-beta log sigmoid(h) where -log sigmoid(beta h) is asked (the two agree far apart)",
        ),
        "e_log_of_sigmoid": Variant(
            {LOSS: LOG_OF_SIGMOID},
            frozenset({TEST_FAR}),
            "log(sigmoid(z)), -inf where sigmoid underflows",
        ),
        "f_label_smoothing_ignored": Variant(
            {LOSS: SMOOTHING_IGNORED}, frozenset({TEST_CDPO}), "label_smoothing is left out"
        ),
        "g_robust_numerator": Variant(
            {LOSS: ROBUST_NUMERATOR},
            frozenset({TEST_CDPO}),
            "the flipped term subtracted (robust DPO's numerator), not added",
        ),
    }
    cheats = {
        "i_imports_rlkit": Variant(
            {SEQUENCE: IMPORTS_RLKIT_SEQUENCE},
            frozenset({TEST_SEQUENCE}),
            "rlkit's sequence_logprobs, imported before the guard runs",
        ),
        "i_imports_rlkit_at_call_time": Variant(
            {LOSS: IMPORTS_RLKIT_LOSS_AT_CALL_TIME},
            LOSS_TESTS,
            "rlkit's dpo_loss, imported inside the function after the guard has run",
        ),
    }
