"""The reward-model assignment (Chapter 9) end to end: nbgrader releases it, autogrades
submissions, and the marks tell a correct solution from stubs, subtly wrong solutions and calls into
rlkit (the checks are those of standard.py)."""

from __future__ import annotations

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant
from tests.assignments.standard import StandardAssignmentTests

pytestmark = pytest.mark.assignments

LOSS, LAST = "bradley_terry_loss", "last_token_rewards"
TEST_LOSS, TEST_FAR = "test_bradley_terry_loss", "test_bradley_terry_far_apart_and_margin"
TEST_RIGHT, TEST_LEFT = "test_last_token_right_padded", "test_last_token_left_padded"
LOSS_TESTS, LAST_TESTS = frozenset({TEST_LOSS, TEST_FAR}), frozenset({TEST_RIGHT, TEST_LEFT})

# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------

SIGN_FLIPPED = """
def bradley_terry_loss(chosen_rewards, rejected_rewards, margin=None):
    difference = rejected_rewards - chosen_rewards  # BUG: chosen - rejected
    if margin is not None:
        difference = difference - margin
    return -F.logsigmoid(difference).mean()
"""

LOG_OF_SIGMOID = """
def bradley_terry_loss(chosen_rewards, rejected_rewards, margin=None):
    difference = chosen_rewards - rejected_rewards
    if margin is not None:
        difference = difference - margin
    return -torch.log(torch.sigmoid(difference)).mean()  # BUG: -inf where sigmoid underflows
"""

MARGIN_ADDED = """
def bradley_terry_loss(chosen_rewards, rejected_rewards, margin=None):
    difference = chosen_rewards - rejected_rewards
    if margin is not None:
        difference = difference + margin  # BUG: the chosen must win by the margin
    return -F.logsigmoid(difference).mean()
"""

SUM_NOT_MEAN = """
def bradley_terry_loss(chosen_rewards, rejected_rewards, margin=None):
    difference = chosen_rewards - rejected_rewards
    if margin is not None:
        difference = difference - margin
    return -F.logsigmoid(difference).sum()  # BUG: mean
"""

LAST_COLUMN = """
def last_token_rewards(values, attention_mask):
    return values[:, -1]  # BUG: padding in a right-padded row shorter than the batch
"""

FIRST_PAD = """
def last_token_rewards(values, attention_mask):
    first_pad = attention_mask.sum(dim=1).clamp(max=values.shape[1] - 1)  # BUG: one past the last token
    return values.gather(1, first_pad.unsqueeze(1)).squeeze(1)
"""

COUNT_MINUS_ONE = """
def last_token_rewards(values, attention_mask):
    last = attention_mask.sum(dim=1) - 1  # BUG: right padding only
    return values.gather(1, last.unsqueeze(1)).squeeze(1)
"""

FIRST_REAL_TOKEN = """
def last_token_rewards(values, attention_mask):
    first_real = attention_mask.argmax(dim=1)  # BUG: argmax returns the first maximum
    return values.gather(1, first_real.unsqueeze(1)).squeeze(1)
"""

# ---- Cheats: rlkit's own code. The grader must make them fail. -----------------------------------

IMPORTS_RLKIT_LOSS = """
from rlkit.llm.reward_model import bradley_terry_loss
"""

IMPORTS_RLKIT_AT_CALL_TIME = """
def bradley_terry_loss(chosen_rewards, rejected_rewards, margin=None):
    from rlkit.llm.reward_model import bradley_terry_loss as library

    return library(chosen_rewards, rejected_rewards, margin)
"""


class TestBradleyTerry(StandardAssignmentTests):
    assignment = grading.Assignment("bradley_terry")
    points = {TEST_LOSS: 2.0, TEST_FAR: 2.0, TEST_RIGHT: 3.0, TEST_LEFT: 3.0}
    solution_cells = frozenset({LOSS, LAST})
    default_seed = "2236067"
    feedback_student = "e_last_column"
    hidden_secrets = ("def _hidden_last_token",)
    hidden_cases = "_hidden_bt_cases"
    wrong = {
        "a_sign_flipped": Variant(
            {LOSS: SIGN_FLIPPED}, LOSS_TESTS, "trains the model to prefer the rejected completion"
        ),
        "b_log_of_sigmoid": Variant(
            {LOSS: LOG_OF_SIGMOID},
            frozenset({TEST_FAR}),
            "log(sigmoid(.)): infinite once a pair's rewards are far apart the wrong way",
        ),
        "c_margin_added": Variant(
            {LOSS: MARGIN_ADDED},
            frozenset({TEST_FAR}),
            "the margin helps the chosen instead of asking it to win by that much",
        ),
        "d_sum_not_mean": Variant(
            {LOSS: SUM_NOT_MEAN}, LOSS_TESTS, "the loss and its gradient grow with the batch"
        ),
        "e_last_column": Variant(
            {LAST: LAST_COLUMN},
            frozenset({TEST_RIGHT}),
            "reads padding in right-padded rows shorter than the batch",
        ),
        "f_first_pad": Variant(
            {LAST: FIRST_PAD}, LAST_TESTS, "one column past the last real token"
        ),
        "g_count_minus_one": Variant(
            {LAST: COUNT_MINUS_ONE},
            frozenset({TEST_LEFT}),
            "the number of real tokens minus one: right only when the padding is on the right",
        ),
        "h_first_real_token": Variant(
            {LAST: FIRST_REAL_TOKEN}, LAST_TESTS, "argmax of the mask: the first real token"
        ),
    }
    cheats = {
        "i_imports_rlkit": Variant(
            {LOSS: IMPORTS_RLKIT_LOSS},
            LOSS_TESTS,
            "rlkit's bradley_terry_loss, imported before the guard runs",
        ),
        "i_imports_rlkit_at_call_time": Variant(
            {LOSS: IMPORTS_RLKIT_AT_CALL_TIME},
            LOSS_TESTS,
            "rlkit's bradley_terry_loss, imported inside the function after the guard has run",
        ),
    }
