"""The response log-probs and SFT loss assignment (Chapter 8) end to end: nbgrader releases it,
autogrades submissions, and the marks tell a correct solution from stubs, subtly wrong solutions
and calls into rlkit (the checks are those of standard.py)."""

from __future__ import annotations

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant
from tests.assignments.standard import StandardAssignmentTests

pytestmark = pytest.mark.assignments

LOGPROBS, LOSS = "response_logprobs", "completion_loss"
TEST_LOGPROBS, TEST_PADDED = "test_response_logprobs", "test_response_logprobs_padding_temperature"
TEST_LOSS, TEST_RAGGED = "test_completion_loss", "test_completion_loss_ragged"
LOGPROB_TESTS, LOSS_TESTS = (
    frozenset({TEST_LOGPROBS, TEST_PADDED}),
    frozenset({TEST_LOSS, TEST_RAGGED}),
)

# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------

NO_SHIFT = """
def response_logprobs(logits, input_ids, response_mask, temperature=1.0):
    prompt_length = input_ids.shape[1] - response_mask.shape[1]
    predicting = logits[:, prompt_length:] / temperature  # BUG: the column before predicts
    tokens = input_ids[:, prompt_length:]
    logprobs = torch.log_softmax(predicting, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return logprobs * response_mask
"""

PADDING_KEPT = """
def response_logprobs(logits, input_ids, response_mask, temperature=1.0):
    prompt_length = input_ids.shape[1] - response_mask.shape[1]
    predicting = logits[:, prompt_length - 1 : -1] / temperature
    tokens = input_ids[:, prompt_length:]
    return torch.log_softmax(predicting, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # BUG: * response_mask
"""

TEMPERATURE_AFTER_SOFTMAX = """
def response_logprobs(logits, input_ids, response_mask, temperature=1.0):
    prompt_length = input_ids.shape[1] - response_mask.shape[1]
    predicting = logits[:, prompt_length - 1 : -1]
    tokens = input_ids[:, prompt_length:]
    logprobs = torch.log_softmax(predicting, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return logprobs / temperature * response_mask  # BUG: the logits are divided, before the softmax
"""

PROBABILITIES_NOT_LOGS = """
def response_logprobs(logits, input_ids, response_mask, temperature=1.0):
    prompt_length = input_ids.shape[1] - response_mask.shape[1]
    predicting = logits[:, prompt_length - 1 : -1] / temperature
    tokens = input_ids[:, prompt_length:]
    probs = torch.softmax(predicting, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # BUG: log_softmax
    return probs * response_mask
"""

COUNTS_THE_PROMPT = """
def completion_loss(logits, input_ids, loss_mask):
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
    token_logprobs = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    real = (torch.cumsum(loss_mask, dim=1) < loss_mask.sum(dim=1, keepdim=True)) | (loss_mask == 1)
    mask = real[:, 1:].to(token_logprobs.dtype)  # BUG: every real token, prompt included
    return -(token_logprobs * mask).sum() / mask.sum()
"""

MEAN_OF_ROW_MEANS = """
def completion_loss(logits, input_ids, loss_mask):
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
    token_logprobs = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = loss_mask[:, 1:].to(token_logprobs.dtype)
    return (-(token_logprobs * mask).sum(dim=1) / mask.sum(dim=1)).mean()  # BUG: one mean over tokens
"""

MASK_NOT_SHIFTED = """
def completion_loss(logits, input_ids, loss_mask):
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
    token_logprobs = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = loss_mask[:, :-1].to(token_logprobs.dtype)  # BUG: the mask of the targets, loss_mask[:, 1:]
    return -(token_logprobs * mask).sum() / mask.sum()
"""

# ---- Cheats: rlkit's own code. The grader must make them fail. -----------------------------------

WRAPS_RLKIT_LOGPROBS = """
import types

from rlkit.llm.generation import PromptBatch
from rlkit.llm.generation import response_logprobs as _library


class _GivenLogits:
    def __init__(self, logits):
        self.logits = logits

    def forward(self, **inputs):
        return types.SimpleNamespace(logits=self.logits)

    __call__ = forward


def response_logprobs(logits, input_ids, response_mask, temperature=1.0):
    prompt_length = input_ids.shape[1] - response_mask.shape[1]
    prompt = input_ids[:, :prompt_length]
    prompts = PromptBatch(prompt, torch.ones_like(prompt), torch.zeros_like(prompt))
    return _library(_GivenLogits(logits), prompts, input_ids[:, prompt_length:], response_mask, temperature)
"""

WRAPS_RLKIT_LOSS_AT_CALL_TIME = """
def completion_loss(logits, input_ids, loss_mask):
    import types

    from rlkit.llm.sft import IGNORE_INDEX, SFTBatch
    from rlkit.llm.sft import completion_loss as library

    labels = input_ids.masked_fill(loss_mask == 0, IGNORE_INDEX)
    model = lambda **inputs: types.SimpleNamespace(logits=logits)
    return library(model, SFTBatch(input_ids, torch.ones_like(input_ids), labels))
"""


class TestResponseLogprobs(StandardAssignmentTests):
    assignment = grading.Assignment("response_logprobs")
    points = {TEST_LOGPROBS: 3.0, TEST_PADDED: 2.0, TEST_LOSS: 3.0, TEST_RAGGED: 2.0}
    solution_cells = frozenset({LOGPROBS, LOSS})
    default_seed = "1732050"
    feedback_student = "f_mean_of_row_means"
    hidden_secrets = ("def _hidden_completion_loss",)
    hidden_cases = "_hidden_generation_cases"
    wrong = {
        "a_no_shift": Variant(
            {LOGPROBS: NO_SHIFT},
            LOGPROB_TESTS,
            "each token scored by the logits at its own column, which have already seen it",
        ),
        "b_padding_kept": Variant(
            {LOGPROBS: PADDING_KEPT},
            frozenset({TEST_PADDED}),
            "padding after EOS gets a log-probability: a response's sum counts tokens never sampled",
        ),
        "c_temperature_after_softmax": Variant(
            {LOGPROBS: TEMPERATURE_AFTER_SOFTMAX},
            frozenset({TEST_PADDED}),
            "log-probs divided by the temperature: not the distribution the sampler drew from",
        ),
        "d_probabilities_not_logs": Variant(
            {LOGPROBS: PROBABILITIES_NOT_LOGS}, LOGPROB_TESTS, "softmax where log_softmax belongs"
        ),
        "e_counts_the_prompt": Variant(
            {LOSS: COUNTS_THE_PROMPT},
            LOSS_TESTS,
            "the loss over prompt tokens too: the model learns to write prompts",
        ),
        "f_mean_of_row_means": Variant(
            {LOSS: MEAN_OF_ROW_MEANS},
            frozenset({TEST_RAGGED}),
            "short answers weigh as much as long ones: not Hugging Face's loss",
        ),
        "g_mask_not_shifted": Variant(
            {LOSS: MASK_NOT_SHIFTED},
            LOSS_TESTS,
            "the mask of the predicting columns: off by one, it trains on the last prompt token",
        ),
    }
    cheats = {
        "h_wraps_rlkit_logprobs": Variant(
            {LOGPROBS: WRAPS_RLKIT_LOGPROBS},
            LOGPROB_TESTS,
            "rlkit's response_logprobs on a model that returns the given logits",
        ),
        "h_wraps_rlkit_loss_at_call_time": Variant(
            {LOSS: WRAPS_RLKIT_LOSS_AT_CALL_TIME},
            LOSS_TESTS,
            "rlkit's completion_loss, imported inside the function after the guard has run",
        ),
    }
