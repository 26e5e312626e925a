"""The RL-systems assignment (Chapter 13) end to end: nbgrader releases it, autogrades submissions,
and the marks tell a correct solution from stubs, subtly wrong solutions and calls into rlkit (the
checks are those of standard.py)."""

from __future__ import annotations

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant
from tests.assignments.standard import StandardAssignmentTests

pytestmark = pytest.mark.assignments

WEIGHTS, SCHEDULE = "truncated_importance_weights", "rollout_schedule"
TEST_TOKEN, TEST_SEQUENCE = "test_token_weights", "test_sequence_weights"
TEST_REQUESTS, TEST_STALENESS = "test_schedule_requests", "test_schedule_staleness"

# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------
WEIGHTS_INVERTED = """
def truncated_importance_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap):
    with torch.no_grad():
        valid = mask.bool()
        zero = torch.zeros((), dtype=trainer_logprobs.dtype)
        log_ratio = torch.where(valid, sampler_logprobs - trainer_logprobs, zero)  # BUG: sampler / trainer
        if mode.startswith("sequence"):
            log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(log_ratio)
        weights = torch.exp(log_ratio)
        if mode.endswith("truncate"):
            weights = torch.clamp(weights, max=cap)
        else:
            weights = torch.where(weights > cap, zero, weights)
        return torch.where(valid, weights, zero)
"""

WEIGHTS_IN_FLOAT32 = """
def truncated_importance_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap):
    with torch.no_grad():
        valid = mask.bool()
        zero = torch.zeros((), dtype=trainer_logprobs.dtype)
        log_ratio = torch.where(valid, trainer_logprobs - sampler_logprobs, zero)
        if mode.startswith("sequence"):
            log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(log_ratio)
        weights = torch.exp(log_ratio)
        if mode.endswith("truncate"):
            weights = torch.clamp(weights, max=cap)
        else:
            weights = torch.where(weights > cap, zero, weights)
        return torch.where(valid, weights, zero).float()  # BUG: not the log-probabilities' dtype
"""

WEIGHTS_ON_PADDING = """
def truncated_importance_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap):
    with torch.no_grad():
        valid = mask.bool()
        zero = torch.zeros((), dtype=trainer_logprobs.dtype)
        log_ratio = torch.where(valid, trainer_logprobs - sampler_logprobs, zero)
        if mode.startswith("sequence"):
            log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(log_ratio)
        weights = torch.exp(log_ratio)
        if mode.endswith("truncate"):
            weights = torch.clamp(weights, max=cap)
        else:
            weights = torch.where(weights > cap, zero, weights)
        return weights  # BUG: padding keeps a weight
"""

MASK_TRUNCATES = """
def truncated_importance_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap):
    with torch.no_grad():
        valid = mask.bool()
        zero = torch.zeros((), dtype=trainer_logprobs.dtype)
        log_ratio = torch.where(valid, trainer_logprobs - sampler_logprobs, zero)
        if mode.startswith("sequence"):
            log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(log_ratio)
        weights = torch.clamp(torch.exp(log_ratio), max=cap)  # BUG: the mask modes truncate too
        return torch.where(valid, weights, zero)
"""

SEQUENCE_OF_TRUNCATED_TOKENS = """
def truncated_importance_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap):
    with torch.no_grad():
        valid = mask.bool()
        zero = torch.zeros((), dtype=trainer_logprobs.dtype)
        log_ratio = torch.where(valid, trainer_logprobs - sampler_logprobs, zero)
        weights = torch.exp(log_ratio)
        if mode.startswith("sequence"):
            weights = torch.clamp(weights, max=cap).prod(dim=1, keepdim=True).expand_as(weights)  # BUG: the product of truncated ratios
        if mode.endswith("truncate"):
            weights = torch.clamp(weights, max=cap)
        else:
            weights = torch.where(weights > cap, zero, weights)
        return torch.where(valid, weights, zero)
"""

SEQUENCE_GEOMETRIC_MEAN = """
def truncated_importance_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap):
    with torch.no_grad():
        valid = mask.bool()
        zero = torch.zeros((), dtype=trainer_logprobs.dtype)
        log_ratio = torch.where(valid, trainer_logprobs - sampler_logprobs, zero)
        if mode.startswith("sequence"):
            log_ratio = (log_ratio.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True)).expand_as(log_ratio)  # BUG: the mean, GSPO's ratio
        weights = torch.exp(log_ratio)
        if mode.endswith("truncate"):
            weights = torch.clamp(weights, max=cap)
        else:
            weights = torch.where(weights > cap, zero, weights)
        return torch.where(valid, weights, zero)
"""

SCHEDULE_PAST_THE_END = """
def rollout_schedule(num_iterations, staleness):
    schedule, asked, version = [], 0, {}
    for k in range(1, num_iterations + 1):
        ahead = k + staleness  # BUG: batches past the run are asked for
        requested = list(range(asked + 1, ahead + 1))
        for batch in requested:
            version[batch] = k - 1
        asked = max(asked, ahead)
        schedule.append(
            {"requested": requested, "version": version[k], "staleness": k - 1 - version[k]}
        )
    return schedule
"""

SCHEDULE_COUNTS_THIS_UPDATE = """
def rollout_schedule(num_iterations, staleness):
    schedule, asked, version = [], 0, {}
    for k in range(1, num_iterations + 1):
        ahead = min(k + staleness, num_iterations)
        requested = list(range(asked + 1, ahead + 1))
        for batch in requested:
            version[batch] = k  # BUG: iteration k's own update is not sent yet
        asked = max(asked, ahead)
        schedule.append(
            {"requested": requested, "version": version[k], "staleness": k - 1 - version[k]}
        )
    return schedule
"""

SCHEDULE_ALWAYS_THE_BOUND = """
def rollout_schedule(num_iterations, staleness):
    schedule, asked = [], 0
    for k in range(1, num_iterations + 1):
        ahead = min(k + staleness, num_iterations)
        requested = list(range(asked + 1, ahead + 1))
        asked = max(asked, ahead)
        # BUG: every batch taken to be exactly `staleness` behind, the first ones too
        schedule.append({"requested": requested, "version": k - 1 - staleness, "staleness": staleness})
    return schedule
"""

SCHEDULE_ONE_BATCH_SHORT = """
def rollout_schedule(num_iterations, staleness):
    schedule, asked, version = [], 0, {}
    for k in range(1, num_iterations + 1):
        ahead = max(k, min(k + staleness - 1, num_iterations))  # BUG: one batch fewer ahead
        requested = list(range(asked + 1, ahead + 1))
        for batch in requested:
            version[batch] = k - 1
        asked = max(asked, ahead)
        schedule.append(
            {"requested": requested, "version": version[k], "staleness": k - 1 - version[k]}
        )
    return schedule
"""

# ---- Cheats: rlkit's own code. The grader must make them fail. -----------------------------------

IMPORTS_RLKIT_WEIGHTS = """
from rlkit.losses import sampler_correction_weights


def truncated_importance_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap):
    return sampler_correction_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap)
"""

IMPORTS_RLKIT_WEIGHTS_AT_CALL_TIME = """
def truncated_importance_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap):
    from rlkit.losses import sampler_correction_weights

    return sampler_correction_weights(trainer_logprobs, sampler_logprobs, mask, mode, cap)
"""


class TestRLSystems(StandardAssignmentTests):
    assignment = grading.Assignment("rl_systems")
    points = {TEST_TOKEN: 3.0, TEST_SEQUENCE: 2.0, TEST_REQUESTS: 2.0, TEST_STALENESS: 3.0}
    solution_cells = frozenset({WEIGHTS, SCHEDULE})
    default_seed = "5180362"
    feedback_student = "e_sequence_geometric_mean"
    hidden_secrets = ("def _hidden_weights", "def _hidden_schedule")
    hidden_cases = "_hidden_cases"
    wrong = {
        "a_ratio_inverted": Variant(
            {WEIGHTS: WEIGHTS_INVERTED},
            frozenset({TEST_TOKEN, TEST_SEQUENCE}),
            "the sampler's probability over the trainer's",
        ),
        "b_weights_on_padding": Variant(
            {WEIGHTS: WEIGHTS_ON_PADDING},
            frozenset({TEST_TOKEN, TEST_SEQUENCE}),
            "padding keeps a weight",
        ),
        "c_mask_modes_truncate": Variant(
            {WEIGHTS: MASK_TRUNCATES},
            frozenset({TEST_TOKEN, TEST_SEQUENCE}),
            "a weight over the cap is lowered to it where it should be dropped",
        ),
        "d_sequence_of_truncated_tokens": Variant(
            {WEIGHTS: SEQUENCE_OF_TRUNCATED_TOKENS},
            frozenset({TEST_SEQUENCE}),
            "the sequence's weight is the product of its tokens' truncated weights",
        ),
        "e_sequence_geometric_mean": Variant(
            {WEIGHTS: SEQUENCE_GEOMETRIC_MEAN},
            frozenset({TEST_SEQUENCE}),
            "the sequence's weight is the geometric mean of its tokens' ratios (GSPO's ratio)",
        ),
        "f_requests_past_the_end": Variant(
            {SCHEDULE: SCHEDULE_PAST_THE_END},
            frozenset({TEST_REQUESTS}),
            "batches past the end of the run are asked for",
        ),
        "g_counts_this_iteration_s_update": Variant(
            {SCHEDULE: SCHEDULE_COUNTS_THIS_UPDATE},
            frozenset({TEST_STALENESS}),
            "a batch asked for at iteration k is counted with k updates, not k - 1",
        ),
        "h_always_the_bound": Variant(
            {SCHEDULE: SCHEDULE_ALWAYS_THE_BOUND},
            frozenset({TEST_STALENESS}),
            "every batch is taken to be exactly the bound behind, the first ones too",
        ),
        "k_weights_in_float32": Variant(
            {WEIGHTS: WEIGHTS_IN_FLOAT32},
            frozenset({TEST_TOKEN, TEST_SEQUENCE}),
            "the weights come back in float32 whatever the log-probabilities' dtype",
        ),
        "i_one_batch_short": Variant(
            {SCHEDULE: SCHEDULE_ONE_BATCH_SHORT},
            frozenset({TEST_REQUESTS, TEST_STALENESS}),
            "the worker is asked for one batch fewer ahead than the bound",
        ),
    }
    cheats = {
        "j_imports_rlkit": Variant(
            {WEIGHTS: IMPORTS_RLKIT_WEIGHTS},
            frozenset({TEST_TOKEN, TEST_SEQUENCE}),
            "rlkit's sampler_correction_weights, imported before the guard runs",
        ),
        "j_imports_rlkit_at_call_time": Variant(
            {WEIGHTS: IMPORTS_RLKIT_WEIGHTS_AT_CALL_TIME},
            frozenset({TEST_TOKEN, TEST_SEQUENCE}),
            "rlkit's sampler_correction_weights, imported inside the function after the guard",
        ),
    }
