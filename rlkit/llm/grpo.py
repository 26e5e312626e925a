"""GRPO and its family (Chapter 11): group advantages instead of a critic, and the loss types that
differ in how the per-token terms are summed into one number.

GRPO (Shao et al., 2024) samples a group of ``G`` completions for each prompt and uses the group as
the baseline: a completion's advantage is its reward minus the group's mean, divided by the group's
standard deviation (eq-grpo-advantage). Every token of the completion gets that advantage, and the
clipped surrogate of PPO is summed over tokens and completions (eq-grpo-objective). The variants
change one line each:

- RLOO (Ahmadian et al., 2024): the baseline leaves the completion itself out
  (``baseline="leave_one_out"``);
- Dr. GRPO (Liu et al., 2025): no division by the std (``scale="none"``) and a constant
  normaliser instead of each completion's length (``loss_type="dr_grpo"``);
- DAPO (Yu et al., 2025): a wider upper clip (``clip_eps_high``), the token mean over the whole
  batch (``loss_type="dapo"``), groups with one reward resampled (``dynamic_sampling``), a soft
  penalty for over-long completions (``overlong_buffer``);
- GSPO (Zheng et al., 2025): one importance ratio per completion, the geometric mean of its
  tokens' ratios (``importance_sampling="sequence"``).

The names follow TRL's ``GRPOConfig`` where TRL has the option: ``clip_eps`` is ``epsilon``,
``clip_eps_high`` ``epsilon_high``, ``scale`` ``scale_rewards``, ``importance_sampling``
``importance_sampling_level``, ``beta`` ``beta``, ``group_size`` ``num_generations``.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from rlkit.llm.evaluation import held_out_scores, heldout_prompts
from rlkit.llm.generation import (
    DECODERS,
    ResponseBatch,
    concatenate_responses,
    generate,
    response_logprobs,
)
from rlkit.llm.models import load_causal_lm, load_tokenizer
from rlkit.llm.tasks import TASKS, TaskData, make_task
from rlkit.llm.tokenizer import max_prompt_tokens, require_chat_template, require_pad_token
from rlkit.llm.trainer import (
    LanguageModelResult,
    LanguageModelTrainer,
    LanguageModelTrainingConfig,
    PhaseTimer,
    SeparateSampler,
    base_model,
    frozen,
    require_sampler_settings,
    rows,
    sampler_mismatch,
    split,
    wants_separate_sampler,
)
from rlkit.losses import (
    clip_fraction,
    clipped_surrogate_terms,
    kl_estimate,
    masked_mean,
    sampler_correction_weights,
    zero_padding,
)
from rlkit.training import (
    is_count,
    is_finite_number,
    random_state,
    require,
    set_random_state,
)

__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "group_advantages",
    "grpo_loss",
    "overlong_penalty",
]

SCALES = ("group", "batch", "none")
BASELINES = ("mean", "leave_one_out")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IMPORTANCE_SAMPLING = ("token", "sequence")
STD_EPS = 1e-4  # added to the std before dividing, as TRL does


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "group", baseline: str = "mean"
) -> torch.Tensor:
    """One advantage per completion, ``[B]``, from the rewards of ``B / group_size`` groups of
    consecutive completions to one prompt (eq-grpo-advantage).

    ``baseline``: ``"mean"``, the group's mean reward (GRPO), or ``"leave_one_out"``, the mean of
    the *other* completions' rewards (RLOO). ``scale`` (TRL's ``scale_rewards``): divide by the
    group's standard deviation (``"group"``), by the whole batch's (``"batch"``), or not at all
    (``"none"``, Dr. GRPO's choice); the std is the unbiased one, and ``1e-4`` is added to it.

    Since ``r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_j r_j)``, the leave-one-out
    advantage is the mean one times ``G / (G - 1)``: the same direction, a longer step. With
    ``scale="group"`` it is that, divided by the group's std (TRL's RLOO trainer does not divide
    by default). A group whose rewards are all equal carries no signal: its advantages are exactly
    0, never NaN.
    """
    require(
        is_count(group_size, minimum=2),
        "group_size",
        "an integer >= 2 (a group baseline needs at least two completions per prompt)",
        group_size,
    )
    require(scale in SCALES, "scale", f"one of {SCALES}", scale)
    require(baseline in BASELINES, "baseline", f"one of {BASELINES}", baseline)
    require(
        rewards.dim() == 1 and rewards.numel() % group_size == 0 and rewards.numel() > 0,
        "rewards",
        f"a [B] tensor with B a multiple of group_size ({group_size})",
        tuple(rewards.shape),
    )
    rewards = rewards.float()
    grouped = rewards.view(-1, group_size)
    if baseline == "mean":
        baselines = grouped.mean(dim=1, keepdim=True)
    else:
        baselines = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    advantages = grouped - baselines
    if scale == "group":
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + STD_EPS)
    elif scale == "batch":
        advantages = advantages / (rewards.std() + STD_EPS)
    constant = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(advantages), advantages).view(-1)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    importance_sampling: str = "token",
    num_tokens_in_batch: int | float | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    sampler_correction: str = "token_truncate",
    sampler_cap: float = 3.0,
) -> torch.Tensor:
    """GRPO's loss on a batch of completions (eq-grpo-objective): the per-token term
    ``-min(r A, clip(r, 1 - clip_eps, 1 + clip_eps_high) A) + beta * KL_t`` summed into one number
    by ``loss_type`` (eq-grpo-loss-types).

    ``logprobs``, ``old_logprobs``, ``ref_logprobs`` and ``mask`` are ``[B, T]`` (the response
    layout: 1 on the completion's tokens), ``advantages`` ``[B]``. ``r`` is the token's ratio
    ``exp(logprobs - old_logprobs)``, or with ``importance_sampling="sequence"`` (GSPO; TRL's
    ``importance_sampling_level``) the completion's: ``exp`` of the mean over its tokens of the log
    ratio. ``clip_eps_high`` (TRL's ``epsilon_high``; None: ``clip_eps``) widens the upper clip
    (DAPO's clip-higher). ``KL_t`` is the k3 estimate of KL(pi || pi_ref), ``exp(ref - logp) - (ref
    - logp) - 1``; ``beta = 0`` needs no ``ref_logprobs``.

    ``loss_type``:
    - ``"grpo"``: each completion's token mean, then the mean over completions;
    - ``"bnpo"``: the token mean over the batch;
    - ``"dr_grpo"``: the token sum divided by ``B * max_completion_length``;
    - ``"dapo"``: the token sum divided by ``num_tokens_in_batch``, the number of completion tokens
      in the whole batch that gradient accumulation splits into micro-batches (TRL's
      ``num_items_in_batch``; None: this batch's, which makes it ``"bnpo"``).

    ``sampler_logprobs`` (``[B, T]``): the log-probabilities of a generator that is not the trainer
    (another engine, dtype or weight version); the clipped term of each token is then weighted by
    ``sampler_correction_weights(old_logprobs, sampler_logprobs, mask, sampler_correction,
    sampler_cap)`` (truncated importance sampling, as TRL's ``vllm_importance_sampling_*``), the KL
    term is not.
    """
    require(loss_type in LOSS_TYPES, "loss_type", f"one of {LOSS_TYPES}", loss_type)
    require(
        importance_sampling in IMPORTANCE_SAMPLING,
        "importance_sampling",
        f"one of {IMPORTANCE_SAMPLING}",
        importance_sampling,
    )
    require(is_finite_number(clip_eps) and clip_eps > 0, "clip_eps", "a number > 0", clip_eps)
    require(
        clip_eps_high is None or (is_finite_number(clip_eps_high) and clip_eps_high >= clip_eps),
        "clip_eps_high",
        f"None or a number >= clip_eps ({clip_eps})",
        clip_eps_high,
    )
    require(
        loss_type != "dr_grpo" or is_count(max_completion_length),
        "max_completion_length",
        "an integer >= 1 for loss_type 'dr_grpo' (its constant normaliser)",
        max_completion_length,
    )
    require(is_finite_number(beta) and beta >= 0, "beta", "a number >= 0", beta)
    require(
        beta == 0 or ref_logprobs is not None,
        "ref_logprobs",
        "the reference's log-probabilities when beta > 0",
        None,
    )
    require(
        logprobs.dim() == 2 and old_logprobs.shape == logprobs.shape == mask.shape,
        "old_logprobs and mask",
        f"[B, T] tensors of the shape of logprobs, {tuple(logprobs.shape)}",
        (tuple(old_logprobs.shape), tuple(mask.shape)),
    )
    require(
        advantages.shape == (logprobs.shape[0],),
        "advantages",
        f"a [B] tensor, one per completion (B = {logprobs.shape[0]})",
        tuple(advantages.shape),
    )
    log_ratio = importance_log_ratio(logprobs, old_logprobs, mask, importance_sampling)
    terms = clipped_surrogate_terms(
        log_ratio.exp(), advantages.detach().unsqueeze(1), clip_eps, clip_eps_high
    )
    if sampler_logprobs is not None:
        terms = terms * sampler_correction_weights(
            old_logprobs, sampler_logprobs, mask, sampler_correction, sampler_cap
        )
    if beta > 0:
        terms = terms + beta * kl_estimate(
            zero_padding(logprobs, mask), zero_padding(ref_logprobs.detach(), mask), "k3"
        )
    return reduce_token_terms(terms, mask, loss_type, max_completion_length, num_tokens_in_batch)


def importance_log_ratio(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling: str = "token",
) -> torch.Tensor:
    """``[B, T]``: each token's log ratio ``logprobs - old_logprobs`` (0 on padding), or with
    ``"sequence"`` (GSPO) its completion's mean log ratio on every one of its tokens, the log of
    the length-normalised sequence ratio (eq-gspo-ratio)."""
    log_ratio = zero_padding(logprobs - old_logprobs.detach(), mask)
    if importance_sampling == "sequence":
        log_ratio = masked_mean(log_ratio, mask, dim=1).unsqueeze(1).expand_as(logprobs)
    return log_ratio


def reduce_token_terms(
    terms: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    num_tokens_in_batch: int | float | None = None,
) -> torch.Tensor:
    """The per-token terms ``[B, T]`` summed into the loss the way ``loss_type`` says
    (eq-grpo-loss-types); padding adds nothing."""
    terms = zero_padding(terms, mask)
    if loss_type == "grpo":
        return masked_mean(terms, mask, dim=1).mean()
    if loss_type == "dr_grpo":
        return terms.sum() / (terms.shape[0] * max_completion_length)
    if loss_type == "dapo" and num_tokens_in_batch is not None:
        return terms.sum() / num_tokens_in_batch
    return terms.sum() / mask.sum().clamp(min=1)  # "bnpo", and "dapo" on one batch


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int) -> torch.Tensor:
    """DAPO's soft over-long punishment, ``[B]``: 0 up to ``max_length - buffer`` tokens, then
    falling linearly to -1 at ``max_length``, and -1 beyond it (TRL's ``get_soft_overlong_
    punishment``)."""
    require(
        is_count(buffer) and buffer < max_length,
        "overlong_buffer",
        f"an integer in [1, max_new_tokens) ({max_length})",
        buffer,
    )
    lengths = lengths.float()
    free = max_length - buffer
    return torch.where(
        lengths <= free,
        torch.zeros_like(lengths),
        torch.clamp((free - lengths) / buffer, min=-1.0),
    )


# ---- The trainer ---------------------------------------------------------------------------------

REWARDS = ("exact", "positions")
PHASES = ("generate", "score", "reference", "advantages", "policy")


@dataclass
class GRPOConfig(LanguageModelTrainingConfig):
    """GRPO on a task with a verifiable reward (Chapter 11's sort task by default); the
    optimization fields of ``LanguageModelTrainingConfig`` drive the policy. The defaults are
    Chapter 11's settings."""

    # the policy's start (and the reference): a saved SFT model's folder, or any causal LM's
    # folder or hub name (HuggingFaceTB/SmolLM2-135M-Instruct loads from its packaged copy)
    sft_folder: str | None = None
    # "sort", "addition" or "addition_question" (a chat task, for an instruct model)
    task: str = "sort"
    num_digits: int = 6  # the task's size: the sort task's prompt length, addition's operands
    # "exact": 1 for the exact answer, else 0; "positions": the share of the answer's positions
    # right (partial credit, a signal where exact answers are rare)
    reward: str = "positions"
    num_iterations: int = 600  # iterations of sample, score, advantages, update
    prompts_per_iteration: int = 8  # distinct prompts per iteration
    group_size: int = 8  # completions per prompt (TRL's num_generations)
    max_new_tokens: int = 8  # the completion's length limit (TRL's max_completion_length)
    # for sampling and for every log-probability recomputed: at 1.0 the under-trained start
    # answers 3% of prompts exactly and its partial credit is noisy; at 0.6 it learns steadily
    temperature: float = 0.6
    scale: str = "group"  # divide advantages by the std of the "group", the "batch", or "none"
    baseline: str = "mean"  # the group baseline: "mean" (GRPO) or "leave_one_out" (RLOO)
    loss_type: str = "grpo"  # "grpo", "bnpo", "dr_grpo" or "dapo"
    clip_eps: float = 0.2  # the ratio clip (TRL's epsilon)
    clip_eps_high: float | None = None  # the upper clip (TRL's epsilon_high; None: clip_eps)
    importance_sampling: str = "token"  # the ratio per "token", or per "sequence" (GSPO)
    beta: float = 0.0  # the KL penalty's weight (0: no reference model is kept)
    num_epochs: int = 1  # passes over each iteration's completions (TRL's num_iterations)
    # completions per optimizer step (None: the whole iteration's, one step per epoch)
    minibatch_size: int | None = None
    # DAPO's dynamic sampling: groups whose rewards are all equal are dropped and more prompts
    # sampled, up to this many extra rounds per iteration (0: off)
    dynamic_sampling_rounds: int = 0
    # DAPO's soft over-long punishment over the last this many tokens (None: off)
    overlong_buffer: int | None = None
    mask_truncated_completions: bool = False  # a completion without EOS adds nothing to the loss
    # "kv_loop": rlkit's decoding loop (decode_with_cache: generate's tokens with less overhead
    # per token, which dominates for small models); "hf": model.generate
    decoder: str = "kv_loop"
    learning_rate: float = 3e-4  # the policy's AdamW step size (1e-3 unlearns the start first)
    warmup_steps: int = 0  # in optimizer steps
    # a sampler that is not the trainer, to inject the rollout/training mismatch in a controlled
    # way: a copy of the policy with its weights rounded to this dtype ("float32" and a lag of 0:
    # the policy samples itself; with the trainer's own bf16 autocast on CUDA, a bf16 sampler
    # differs less, mostly in norms, embeddings and the residual stream)
    sampler_dtype: str = "float32"
    sampler_lag: int = 0  # iterations by which the sampler's weights lag the policy's
    # truncated importance sampling against that mismatch (rlkit.losses.sampler_correction_weights):
    # None, or one of TRL's modes ("token_truncate", "token_mask", "sequence_truncate",
    # "sequence_mask")
    sampler_correction: str | None = None
    sampler_cap: float = 3.0  # the importance weight above which it is truncated or masked

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.reward in REWARDS, "reward", f"one of {REWARDS}", self.reward)
        require(self.task in TASKS, "task", f"one of {tuple(TASKS)}", self.task)
        require_sampler_settings(self)
        for name in (
            "num_digits",
            "num_iterations",
            "prompts_per_iteration",
            "max_new_tokens",
            "num_epochs",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            is_count(self.group_size, minimum=2),
            "group_size",
            "an integer >= 2 (the group is the baseline)",
            self.group_size,
        )
        require(self.scale in SCALES, "scale", f"one of {SCALES}", self.scale)
        require(self.baseline in BASELINES, "baseline", f"one of {BASELINES}", self.baseline)
        require(self.loss_type in LOSS_TYPES, "loss_type", f"one of {LOSS_TYPES}", self.loss_type)
        require(
            self.importance_sampling in IMPORTANCE_SAMPLING,
            "importance_sampling",
            f"one of {IMPORTANCE_SAMPLING}",
            self.importance_sampling,
        )
        for name in ("temperature", "clip_eps"):
            value = getattr(self, name)
            require(is_finite_number(value) and value > 0, name, "a number > 0", value)
        require(
            self.clip_eps_high is None
            or (is_finite_number(self.clip_eps_high) and self.clip_eps_high >= self.clip_eps),
            "clip_eps_high",
            f"None or a number >= clip_eps ({self.clip_eps})",
            self.clip_eps_high,
        )
        require(is_finite_number(self.beta) and self.beta >= 0, "beta", "a number >= 0", self.beta)
        batch = self.prompts_per_iteration * self.group_size
        require(
            self.minibatch_size is None
            or (is_count(self.minibatch_size) and batch % self.minibatch_size == 0),
            "minibatch_size",
            f"None or a divisor of prompts_per_iteration * group_size ({batch})",
            self.minibatch_size,
        )
        require(
            is_count(self.dynamic_sampling_rounds, minimum=0),
            "dynamic_sampling_rounds",
            "an integer >= 0",
            self.dynamic_sampling_rounds,
        )
        require(
            self.overlong_buffer is None
            or (is_count(self.overlong_buffer) and self.overlong_buffer < self.max_new_tokens),
            "overlong_buffer",
            f"None or an integer in [1, max_new_tokens) ({self.max_new_tokens})",
            self.overlong_buffer,
        )
        require(self.decoder in DECODERS, "decoder", f"one of {DECODERS}", self.decoder)
        require(
            isinstance(self.mask_truncated_completions, bool),
            "mask_truncated_completions",
            "True or False",
            self.mask_truncated_completions,
        )

    @property
    def batch_size(self) -> int:
        """Completions per iteration."""
        return self.prompts_per_iteration * self.group_size

    @property
    def one_step_per_batch(self) -> bool:
        """One epoch of one minibatch: the policy that sampled is the one that steps."""
        return self.num_epochs == 1 and self.minibatch_size in (None, self.batch_size)

    @property
    def separate_sampler(self) -> bool:
        """A copy of the policy samples (rounded or stale weights), not the policy itself."""
        return wants_separate_sampler(self)


@dataclass
class Sampled:
    """One round of sampling: groups of ``group_size`` consecutive rows answer one prompt."""

    batch: ResponseBatch
    prompts: list[str]  # each prompt once per completion
    texts: list[str]
    rewards: torch.Tensor  # [B]: the task's reward, shaped (over-long penalty) when asked
    ref_logprobs: torch.Tensor | None  # [B, T]: the reference's, when beta > 0
    # [B, T]: the sampler's, when it is not the trainer or the correction is on
    sampler_logprobs: torch.Tensor | None = None

    def constant_groups(self, group_size: int) -> torch.Tensor:
        """``[B / group_size]``: True for a group whose rewards are all equal (no signal)."""
        grouped = self.rewards.view(-1, group_size)
        return (grouped == grouped[:, :1]).all(dim=1)


def padded_rows(
    parts: list[tuple[Sampled, torch.Tensor]], field: str, width: int
) -> torch.Tensor | None:
    """The rows ``index`` of each round's ``[B, T]`` tensor ``field`` (None where the rounds
    have none), right-padded with 0 to ``width`` columns and stacked."""
    if getattr(parts[0][0], field) is None:
        return None
    chosen = []
    for sampled, index in parts:
        values = getattr(sampled, field)
        rows_ = values[index.to(values.device)]
        chosen.append(torch.nn.functional.pad(rows_, (0, width - values.shape[1])))
    return torch.cat(chosen)


def task_rewards(
    task, config: GRPOConfig, prompts: list[str], texts: list[str], batch: ResponseBatch
) -> torch.Tensor:
    """``[B]``: the task's reward of each completion (``config.reward``: exact or per position),
    plus DAPO's over-long penalty when ``config.overlong_buffer`` is set."""
    reward = task.reward if config.reward == "exact" else task.position_reward
    rewards = torch.tensor(list(map(reward, prompts, texts)), dtype=torch.float32)
    if config.overlong_buffer is not None:
        lengths = batch.response_mask.sum(dim=1).cpu()
        rewards = rewards + overlong_penalty(lengths, config.max_new_tokens, config.overlong_buffer)
    return rewards


@dataclass
class Rollout:
    """An iteration's completions with what the loss reads."""

    batch: ResponseBatch
    advantages: torch.Tensor  # [B]
    loss_mask: torch.Tensor  # [B, T]: the response mask, less masked truncated completions
    ref_logprobs: torch.Tensor | None
    sampler_logprobs: torch.Tensor | None = None  # [B, T]: the sampler's, where Sampled has them


def sampling_stats(sampled: Sampled, task, eos_token_id: int, group_size: int) -> dict[str, float]:
    """What the sampler produced: reward, exact answers, the share of groups with one reward (zero
    variance: no signal), lengths, truncations."""
    mask = sampled.batch.response_mask
    ended = sampled.batch.ended(eos_token_id)
    exact = list(map(task.reward, sampled.prompts, sampled.texts))
    return {
        "reward": sampled.rewards.mean().item(),
        "exact_match_sampled": sum(exact) / len(exact),
        "zero_variance_groups": sampled.constant_groups(group_size).float().mean().item(),
        "completion_length": mask.sum(dim=1).float().mean().item(),
        "truncated": (~ended).float().mean().item(),
    }


def rollout_from(
    batch: ResponseBatch,
    rewards: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    sampler_logprobs: torch.Tensor | None,
    config: GRPOConfig,
    eos_token_id: int,
) -> Rollout:
    """The completions with their group advantages (eq-grpo-advantage) and loss mask (the
    response mask, less the truncated completions when ``mask_truncated_completions``)."""
    advantages = group_advantages(rewards, config.group_size, config.scale, config.baseline)
    loss_mask = batch.response_mask
    if config.mask_truncated_completions:
        loss_mask = loss_mask * batch.ended(eos_token_id).unsqueeze(1).to(loss_mask.dtype)
    advantages = advantages.to(batch.response_ids.device)
    return Rollout(batch, advantages, loss_mask, ref_logprobs, sampler_logprobs)


class GRPOTrainer(LanguageModelTrainer):
    """GRPO on a language model with a verifiable reward: no critic, no reward model; a reference
    model only when ``beta > 0`` (with LoRA, the policy with its adapters disabled).

    Each ``run_update`` is one iteration in named, timed phases: sample ``group_size``
    completions for each of ``prompts_per_iteration`` prompts, score them with the task's reward,
    the reference's log-probabilities (``beta > 0``), the group advantages (eq-grpo-advantage),
    and ``num_epochs`` passes of ``grpo_loss`` steps. The policy stays in eval mode (dropout off)
    so that sampling and training compute one log-probability; with one epoch of one step the old
    log-probabilities are the current ones detached (the ratio is exactly 1, its gradient is the
    policy gradient's), and no second forward pass computes them.

    With ``sampler_dtype`` or ``sampler_lag`` a copy of the policy samples instead (rounded
    weights, or weights ``sampler_lag`` iterations old): the rollout/training mismatch of systems
    whose generator is not the trainer, injected in a controlled way. The history measures it
    (``sampler_kl``, ``sampler_ratio_over_cap``), and ``sampler_correction`` weighs the loss by
    truncated importance sampling.
    """

    algorithm = "grpo"

    def __init__(
        self,
        config: GRPOConfig,
        policy: PreTrainedModel | None = None,
        tokenizer=None,
        reference: PreTrainedModel | None = None,
        keep_reference: bool = True,
    ):
        super().__init__(config)
        self.task = make_task(config.task, num_digits=config.num_digits)
        self.data = TaskData(self.task, seed=config.seed)
        if policy is None:
            require(
                config.sft_folder is not None,
                "sft_folder",
                "a saved SFT model's folder, or a causal LM's folder or hub name",
                None,
            )
            policy = load_causal_lm(config.sft_folder, dtype=torch.float32)
            tokenizer = load_tokenizer(config.sft_folder)
        require(tokenizer is not None, "tokenizer", "the policy's tokenizer", tokenizer)
        if self.task.chat:
            require_chat_template(tokenizer, config.task)
        self.tokenizer = tokenizer
        longest = max_prompt_tokens(tokenizer, self.task) + config.max_new_tokens
        layout = "prompt completion (num_digits and max_new_tokens)"
        self.prepare(policy, longest, "num_digits", layout)
        self.model.eval()  # dropout off; see the class docstring
        require(
            reference is None or config.lora_rank is None,
            "reference",
            "None when lora_rank is set (the reference is the policy with its adapters disabled)",
            type(reference).__name__,
        )
        self.reference = None
        # keep_reference=False: another worker holds the reference (Chapter 13's roles) and the
        # rollouts bring its log-probabilities
        if config.beta > 0 and config.lora_rank is None and keep_reference:
            self.reference = frozen((reference or copy.deepcopy(policy)).to(config.device))
        self.shuffle = torch.Generator().manual_seed(config.seed)
        self.sampler = None
        if config.separate_sampler:
            self.sampler = SeparateSampler(self.model, config.sampler_dtype, config.sampler_lag)

    @property
    def on_policy(self) -> bool:
        return self.config.one_step_per_batch

    @property
    def subject(self) -> str:
        return f"{self.config.task} ({self.config.num_digits} digits), {self.config.reward} reward"

    @property
    def num_updates(self) -> int:
        return self.config.num_iterations

    # ---- one iteration ---------------------------------------------------------------------------

    def _update(self) -> dict[str, float]:
        config = self.config
        timer = PhaseTimer(PHASES, config.device)
        if self.sampler is not None:
            self.sampler.sync(self.model)
        rollout, stats = self._rollout(timer)
        with timer("policy"):
            stats |= self._policy_epochs(rollout)
        return {
            "iteration": self.updates_done + 1,
            **stats,
            **{f"seconds_{phase}": seconds for phase, seconds in timer.seconds.items()},
        }

    def _rollout(self, timer: PhaseTimer) -> tuple[Rollout, dict[str, float]]:
        """Sample and score groups of completions. With dynamic sampling (DAPO), the groups whose
        rewards are all equal are set aside and more prompts sampled, up to
        ``dynamic_sampling_rounds`` extra rounds; if the informative groups still do not fill the
        batch, set-aside groups do (their advantages are 0), so every iteration has one size."""
        config = self.config
        rounds = [self._sample(timer)]
        stats = self._rollout_stats(rounds[0])
        chosen = [(0, group) for group in range(config.prompts_per_iteration)]
        if config.dynamic_sampling_rounds > 0:
            informative = [
                (0, g)
                for g in torch.nonzero(~rounds[0].constant_groups(config.group_size))
                .flatten()
                .tolist()
            ]
            while (
                len(informative) < config.prompts_per_iteration
                and len(rounds) <= config.dynamic_sampling_rounds
            ):
                rounds.append(self._sample(timer))
                constant = rounds[-1].constant_groups(config.group_size)
                informative += [
                    (len(rounds) - 1, g) for g in range(len(constant)) if not constant[g]
                ]
            filler = [
                (r, g)
                for r in range(len(rounds))
                for g in range(config.prompts_per_iteration)
                if (r, g) not in informative
            ]
            chosen = sorted((informative + filler)[: config.prompts_per_iteration])
            stats["sampling_rounds"] = float(len(rounds))
        with timer("advantages"):
            rollout = self._assemble(rounds, chosen)
        stats["zero_variance_groups_trained"] = float(
            (rollout.advantages.view(-1, config.group_size) == 0).all(dim=1).float().mean()
        )
        return rollout, stats

    @property
    def has_reference(self) -> bool:
        """A reference this process can ask: a frozen copy, or (LoRA) the disabled adapters."""
        return self.config.beta > 0 and (
            self.reference is not None or self.config.lora_rank is not None
        )

    @property
    def keeps_sampler_logprobs(self) -> bool:
        return self.sampler is not None or self.config.sampler_correction is not None

    def _sample(self, timer: PhaseTimer) -> Sampled:
        """``group_size`` completions for each of ``prompts_per_iteration`` fresh prompts, their
        rewards, and (``beta > 0``) the reference's log-probabilities."""
        config = self.config
        prompts = [
            example.prompt for example in self.data.train_batch(config.prompts_per_iteration)
        ]
        repeated = [prompt for prompt in prompts for _ in range(config.group_size)]
        with timer("generate"):
            batch, sampler_logprobs = self.generate_completions(repeated)
        with timer("score"):
            texts = batch.texts(self.tokenizer)
            rewards = task_rewards(self.task, config, repeated, texts, batch)
        ref_logprobs = None
        if config.beta > 0:
            with timer("reference"), torch.no_grad(), self.autocast():
                ref_logprobs = self.reference_logprobs(batch)
        return Sampled(batch, repeated, texts, rewards, ref_logprobs, sampler_logprobs)

    def generate_completions(self, prompts: list[str]) -> tuple[ResponseBatch, torch.Tensor | None]:
        """One completion of each prompt (a group repeats its prompt) from the sampler, or the
        policy itself; the batch carries the trainer's old log-probabilities where the loss needs
        them, and the sampler's come beside it where they are kept."""
        config = self.config
        with self.autocast():
            batch = generate(
                self.model if self.sampler is None else self.sampler.model,
                self.tokenizer,
                prompts,
                config.max_new_tokens,
                config.temperature,
                decoder=config.decoder,
                # on policy, the loss detaches the current log-probs: no pass computes old ones
                with_logprobs=not self.on_policy or self.keeps_sampler_logprobs,
            )
            sampler_logprobs = batch.logprobs if self.keeps_sampler_logprobs else None
            if self.sampler is not None and not self.on_policy:
                # the ratio's old log-probabilities are the trainer's, not the sampler's
                with torch.no_grad():
                    trainer_logprobs = batch.logprobs_under(self.model)
                batch = dataclasses.replace(batch, logprobs=trainer_logprobs)
        return batch, sampler_logprobs

    def _rollout_stats(self, sampled: Sampled) -> dict[str, float]:
        return sampling_stats(
            sampled, self.task, self.tokenizer.eos_token_id, self.config.group_size
        )

    def _assemble(self, rounds: list[Sampled], chosen: list[tuple[int, int]]) -> Rollout:
        """The chosen groups ``(round, group)`` as one batch, with their advantages and loss
        mask."""
        config, size = self.config, self.config.group_size
        if len(rounds) == 1 and len(chosen) == config.prompts_per_iteration:
            batch, rewards = rounds[0].batch, rounds[0].rewards
            ref, sampler = rounds[0].ref_logprobs, rounds[0].sampler_logprobs
        else:
            parts = []
            for number, sampled in enumerate(rounds):
                groups = [group for r, group in chosen if r == number]
                if groups:
                    index = torch.tensor(
                        [group * size + i for group in groups for i in range(size)]
                    )
                    parts.append((sampled, index))
            batch = concatenate_responses(
                [sampled.batch.select(index) for sampled, index in parts],
                require_pad_token(self.tokenizer),
            )
            rewards = torch.cat([sampled.rewards[index] for sampled, index in parts])
            width = batch.response_ids.shape[1]
            ref = padded_rows(parts, "ref_logprobs", width)
            sampler = padded_rows(parts, "sampler_logprobs", width)
        return rollout_from(batch, rewards, ref, sampler, config, self.tokenizer.eos_token_id)

    def reference_logprobs(self, batch: ResponseBatch) -> torch.Tensor:
        """The sampled tokens' log-probabilities under the reference, at the sampling
        temperature."""
        if self.reference is None:  # LoRA: the policy without its adapters
            with base_model(self.model) as reference:
                return batch.logprobs_under(reference)
        return batch.logprobs_under(self.reference)

    def _policy_epochs(self, rollout: Rollout) -> dict[str, float]:
        """``num_epochs`` passes over the completions, one ``grpo_loss`` step per minibatch."""
        config = self.config
        size = config.minibatch_size or config.batch_size
        sums, steps = {}, 0
        for _ in range(config.num_epochs):
            order = (
                torch.arange(config.batch_size)
                if size == config.batch_size
                else torch.randperm(config.batch_size, generator=self.shuffle)
            )
            for start in range(0, config.batch_size, size):
                stats = self._policy_step(rollout, order[start : start + size])
                for name, value in stats.items():
                    sums[name] = sums.get(name, 0.0) + value
                steps += 1
        return {name: value / steps for name, value in sums.items()}

    def _policy_step(self, rollout: Rollout, index: torch.Tensor):
        """One AdamW step on ``grpo_loss`` over the rows ``index``, in micro-batches weighted so
        that their sum is the loss of the whole minibatch."""
        config = self.config
        batch = rollout.batch
        pieces = [index[part] for part in split(range(len(index)), config.micro_batch_size)]
        pieces = [piece.to(batch.response_ids.device) for piece in pieces]
        weights = [self._weight(rollout, piece) for piece in pieces]

        def loss_of(piece: torch.Tensor):
            mask = rollout.loss_mask[piece]
            logprobs = response_logprobs(
                self.model,
                rows(batch.prompts, piece),
                batch.response_ids[piece],
                batch.response_mask[piece],
                config.temperature,
            )
            old = logprobs.detach() if self.on_policy else batch.logprobs[piece]
            sampler = None if rollout.sampler_logprobs is None else rollout.sampler_logprobs[piece]
            correction = {}
            if config.sampler_correction is not None:
                correction = dict(
                    sampler_logprobs=sampler,
                    sampler_correction=config.sampler_correction,
                    sampler_cap=config.sampler_cap,
                )
            loss = grpo_loss(
                logprobs,
                old,
                rollout.advantages[piece],
                mask,
                config.clip_eps,
                config.clip_eps_high,
                config.loss_type,
                config.max_new_tokens,
                None if rollout.ref_logprobs is None else rollout.ref_logprobs[piece],
                config.beta,
                config.importance_sampling,
                **correction,
            )
            with torch.no_grad():
                log_ratio = importance_log_ratio(logprobs, old, mask, config.importance_sampling)
                metrics = {
                    # the share of tokens whose ratio (the token's or, GSPO, its completion's)
                    # lies outside [1 - clip_eps, 1 + clip_eps_high]
                    "clip_fraction": clip_fraction(
                        log_ratio,
                        torch.zeros_like(log_ratio),
                        config.clip_eps,
                        mask,
                        config.clip_eps_high,
                    ),
                    # the sampled tokens' mean surprisal: an estimate of the policy's entropy per
                    # token at the sampling temperature (exact in expectation on fresh samples)
                    "entropy": masked_mean(-logprobs, mask),
                }
                if rollout.ref_logprobs is not None:
                    kl = kl_estimate(logprobs, rollout.ref_logprobs[piece], "k3")
                    metrics["kl"] = masked_mean(kl, mask)
                if sampler is not None:
                    metrics |= sampler_mismatch(old, sampler, mask, config.sampler_cap)
            return loss, metrics

        stats = self.optimizer_step(pieces, weights, loss_of)
        stats["policy_loss"] = stats.pop("loss")
        return stats

    def _weight(self, rollout: Rollout, piece: torch.Tensor) -> float:
        """A micro-batch's share of the minibatch's loss: its completions for the per-completion
        normalisers ("grpo", "dr_grpo"), its tokens for "dapo" (its token mean times its share of
        the tokens is its token sum over all the minibatch's tokens), and equal shares for "bnpo"
        (TRL's average of the micro-batches' token means)."""
        loss_type = self.config.loss_type
        if loss_type in ("grpo", "dr_grpo"):
            return float(len(piece))
        if loss_type == "dapo":
            return float(rollout.loss_mask[piece].sum())
        return 1.0

    def evaluate(
        self, num_prompts: int | None = None, seed: int = 0, per_prompt: bool = False
    ) -> dict:
        """The policy on the first ``num_prompts`` held-out prompts (None: all 500): exact match,
        greedy and sampled at the training temperature, and the KL to the reference when one is
        kept (``held_out_scores``)."""
        prompts = heldout_prompts(self.data, num_prompts)
        reference = self.reference_logprobs if self.has_reference else None
        with torch.no_grad(), self.autocast():
            return held_out_scores(
                self.model,
                self.tokenizer,
                self.task,
                prompts,
                self.config.max_new_tokens,
                self.config.temperature,
                reference_logprobs=reference,
                seed=seed,
                per_prompt=per_prompt,
            )

    def result(self) -> LanguageModelResult:
        return LanguageModelResult(self.config, self.model, self.history, tokenizer=self.tokenizer)

    def _state(self) -> dict:
        state = {
            **super()._state(),
            "shuffle": self.shuffle.get_state(),
            "data_rng": random_state(self.data.train_rng),
        }
        if self.sampler is not None and self.sampler.states:  # stale weights (sampler_lag > 0)
            state["sampler_states"] = self.sampler.state_dict()
        return state

    def _load_state(self, state: dict) -> None:
        super()._load_state(state)
        self.shuffle.set_state(state["shuffle"])
        set_random_state(self.data.train_rng, state["data_rng"])
        if self.sampler is not None:
            self.sampler.load_state_dict(state.get("sampler_states", []))
