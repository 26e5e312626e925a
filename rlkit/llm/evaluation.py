"""A language-model policy on held-out prompts: what ``rlkit eval`` reports for a language-model
run, and what Chapter 10's over-optimisation sweep measures.

Greedy answers give the task's exact match, the hidden labeller's noiseless score (the *gold*
score) and the reward model's (the *proxy*); answers sampled at the training temperature give the
same three for the distribution RL optimises, and the KL to the reference policy: the mean over
prompts of the response's summed log-ratio, an unbiased estimate of KL(pi || pi_ref) per response.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from rlkit.llm.generation import ResponseBatch, generate
from rlkit.llm.reward_model import score
from rlkit.llm.tasks import PreferenceOracle, Task, TaskData
from rlkit.training import eval_mode, is_count, require

__all__ = ["held_out_scores", "heldout_prompts", "means", "win_outcomes"]


def heldout_prompts(data: TaskData, num_prompts: int | None = None) -> list[str]:
    """The first ``num_prompts`` of ``data``'s held-out prompts, all of them for None (a ValueError
    naming ``num_prompts`` unless it is None or an integer from 1 to their number)."""
    if num_prompts is None:
        return [example.prompt for example in data.heldout]
    require(
        is_count(num_prompts) and num_prompts <= len(data.heldout),
        "num_prompts",
        f"an integer in [1, {len(data.heldout)}]",
        num_prompts,
    )
    return [example.prompt for example in data.heldout[:num_prompts]]


def held_out_scores(
    model: PreTrainedModel,
    tokenizer,
    task: Task,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    oracle: PreferenceOracle | None = None,
    reward_model: PreTrainedModel | None = None,
    reward_tokenizer=None,
    reference_logprobs: Callable[[ResponseBatch], torch.Tensor] | None = None,
    seed: int = 0,
    per_prompt: bool = False,
) -> dict[str, float] | dict[str, list[float]]:
    """``exact_match``, ``gold`` (with an ``oracle``) and ``proxy`` (with a ``reward_model``) of
    greedy answers to ``prompts``; the same with the suffix ``_sampled`` for answers sampled at
    ``temperature``, and ``kl`` (with ``reference_logprobs``, the reference's log-probabilities of a
    batch's sampled tokens at its temperature). Sampling draws from a generator seeded with ``seed``
    and leaves torch's global one as it was. ``per_prompt``: each score's list over the prompts
    instead of its mean (for intervals), and the completions, as ``completions`` and
    ``completions_sampled``."""
    require(len(prompts) > 0, "prompts", "a non-empty list", prompts)
    scores = {}
    for greedy, suffix in ((True, ""), (False, "_sampled")):
        with torch.random.fork_rng(), eval_mode(model):
            torch.manual_seed(seed)
            batch = generate(model, tokenizer, prompts, max_new_tokens, temperature, greedy=greedy)
        texts = batch.texts(tokenizer)
        scores[f"completions{suffix}"] = texts
        scores[f"exact_match{suffix}"] = list(map(task.reward, prompts, texts))
        if oracle is not None:
            scores[f"gold{suffix}"] = list(map(oracle.score, prompts, texts))
        if reward_model is not None:
            proxy = score(reward_model, reward_tokenizer or tokenizer, prompts, texts)
            scores[f"proxy{suffix}"] = proxy.tolist()
        if not greedy and reference_logprobs is not None:
            with torch.no_grad():
                log_ratio = (batch.logprobs - reference_logprobs(batch)) * batch.response_mask
            scores["kl"] = log_ratio.sum(dim=1).tolist()
    return scores if per_prompt else means(scores)


def means(scores: dict[str, list]) -> dict[str, float]:
    """Each per-prompt score's mean over the prompts (the completions left out)."""
    return {
        name: sum(values) / len(values)
        for name, values in scores.items()
        if not name.startswith("completions")
    }


def win_outcomes(
    oracle: PreferenceOracle, prompts: list[str], completions: list[str], baseline: list[str]
) -> list[float]:
    """Per prompt, whether the oracle's noiseless score prefers ``completions`` to ``baseline``'s
    answer: 1 for a win, 1/2 for a tie, 0 for a loss. Their mean is the win rate over the
    baseline."""
    require(
        len(prompts) == len(completions) == len(baseline),
        "baseline",
        f"one answer per prompt ({len(prompts)} prompts, {len(completions)} completions)",
        len(baseline),
    )
    outcomes = []
    for prompt, completion, other in zip(prompts, completions, baseline):
        ours, theirs = oracle.score(prompt, completion), oracle.score(prompt, other)
        outcomes.append(1.0 if ours > theirs else 0.5 if ours == theirs else 0.0)
    return outcomes
