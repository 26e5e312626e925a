"""What every language-model trainer shares (Chapters 8 and 9, and the RLHF chapters after them).

A trainer builds its model and tokenizer, then ``LanguageModelTrainer.prepare`` makes them ready to
train: the context-length check, LoRA adapters when ``lora_rank`` is set (through ``peft``), AdamW
with weight decay on the weight matrices only, and bf16 autocast where the device has it. Each
update is one ``optimizer_step``: the warm-up and cosine learning rate, the batch's gradient
accumulated over its micro-batches, the global-norm clip, one AdamW step. The state (model,
optimizer, the trainer's own generators) goes into checkpoints through ``Trainer``, which also saves
the global RNGs and stops on a non-finite loss.

With LoRA, the model without its adapters is the frozen model it started from: ``base_model``
gives it, and the RLHF chapters' reference policy is computed that way, with no second copy of the
weights.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from rlkit.llm.generation import PromptBatch
from rlkit.llm.models import FAMILIES, context_length
from rlkit.losses import (
    SAMPLER_CORRECTIONS,
    approx_kl,
    masked_mean,
    masked_whiten,
    zero_padding,
)
from rlkit.training import (
    Trainer,
    TrainResult,
    is_count,
    is_finite_number,
    is_seed,
    require,
    require_device,
    require_rank,
    seed_everything,
    set_learning_rate,
    warmup_cosine,
)

MicroBatchLoss = Callable[[object], tuple[torch.Tensor, dict[str, torch.Tensor | float]]]


@dataclass
class LanguageModelTrainingConfig:
    """The optimization settings of every language-model trainer; its config adds its own fields
    (and may change these defaults)."""

    learning_rate: float = 1e-3  # AdamW's peak step size, after a linear warm-up
    # steps of linear warm-up from 0 to learning_rate, then cosine decay to 10% of it
    warmup_steps: int = 100
    weight_decay: float = 0.0  # AdamW's decoupled weight decay (never on biases and norms)
    max_grad_norm: float = 1.0  # clip the global gradient norm to this
    # examples per forward pass: a batch's gradient is accumulated over micro-batches of this size
    # (None: the whole batch in one pass)
    micro_batch_size: int | None = None
    # autocast the forward passes to bfloat16 (None: on a CUDA device that supports it, never on
    # the CPU)
    bf16: bool | None = None
    # train LoRA adapters of this rank (through peft) instead of every weight (None: all weights)
    lora_rank: int | None = None
    lora_alpha: float = 16.0  # LoRA's update is scaled by lora_alpha / lora_rank
    seed: int = 0  # seeds initialisation, the data and its order
    device: str = "cpu"  # "cpu" or "cuda"

    def __post_init__(self) -> None:
        require(
            is_finite_number(self.learning_rate) and 0 < self.learning_rate <= 1,
            "learning_rate",
            "in (0, 1]",
            self.learning_rate,
        )
        require(
            is_count(self.warmup_steps, minimum=0),
            "warmup_steps",
            "an integer >= 0",
            self.warmup_steps,
        )
        require(
            is_finite_number(self.weight_decay) and self.weight_decay >= 0,
            "weight_decay",
            "a number >= 0",
            self.weight_decay,
        )
        require(
            is_finite_number(self.max_grad_norm) and self.max_grad_norm > 0,
            "max_grad_norm",
            "a number > 0",
            self.max_grad_norm,
        )
        require(
            self.micro_batch_size is None or is_count(self.micro_batch_size),
            "micro_batch_size",
            "None or an integer >= 1",
            self.micro_batch_size,
        )
        require(self.bf16 in (None, True, False), "bf16", "None, True or False", self.bf16)
        require(
            self.lora_rank is None or is_count(self.lora_rank),
            "lora_rank",
            "None or an integer >= 1",
            self.lora_rank,
        )
        require(
            is_finite_number(self.lora_alpha) and self.lora_alpha > 0,
            "lora_alpha",
            "a number > 0",
            self.lora_alpha,
        )
        require(is_seed(self.seed), "seed", "an integer in [0, 2**32)", self.seed)
        require_device(self.device)
        require(
            not self.bf16 or uses_bf16(self),
            "bf16",
            f"None or False on {self.device!r} (bf16 autocast is for CUDA devices that support it)",
            self.bf16,
        )


@dataclass
class LanguageModelResult(TrainResult):
    """A language-model trainer's result: the trained model (``agent``, also ``model``), its
    tokenizer and the history."""

    tokenizer: Any = None

    @property
    def model(self) -> PreTrainedModel:
        return self.agent


def uses_bf16(config: LanguageModelTrainingConfig) -> bool:
    """Whether the forward passes autocast to bfloat16: on a CUDA device that supports it, unless
    ``bf16`` is False."""
    device = torch.device(config.device)
    capable = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return capable and config.bf16 is not False


def with_lora(model: PreTrainedModel, rank: int, alpha: float) -> PreTrainedModel:
    """``model`` with LoRA adapters of ``rank`` on every linear layer of its transformer (peft's
    ``"all-linear"``), all other weights frozen; a reward model's score head stays trainable."""
    from peft import LoraConfig, get_peft_model  # only LoRA runs need peft

    task = "SEQ_CLS" if hasattr(model, "score") else "CAUSAL_LM"
    adapters = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type=task
    )
    with warnings.catch_warnings():
        # peft 0.21 calls transformers 5's deprecated alias is_gradient_checkpointing: not ours
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        return get_peft_model(model, adapters)


def adamw_with_decay_groups(
    model: torch.nn.Module, learning_rate: float, weight_decay: float
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters: weight decay on matrices, none on biases, norms and
    other vectors (the usual split, nanoGPT's and Hugging Face's)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=learning_rate,
    )


def require_fits_context(
    model: PreTrainedModel, length: int, field: str, value, what: str = "the longest sequence"
) -> None:
    """A ValueError naming ``field`` unless ``length`` tokens fit the model's context."""
    limit = context_length(model)
    require(
        limit is None or length <= limit,
        field,
        f"small enough that {what} ({length} tokens) fits the model's context ({limit})",
        value,
    )


def require_tiny_model_fields(config) -> None:
    """The checks of a config's fields for a tiny model built from scratch (``tiny_config``)."""
    require(config.family in FAMILIES, "family", f"one of {FAMILIES}", config.family)
    for name in ("hidden_size", "num_layers", "num_heads"):
        require(is_count(getattr(config, name)), name, "an integer >= 1", getattr(config, name))
    require(
        config.hidden_size % config.num_heads == 0,
        "hidden_size",
        f"a multiple of num_heads ({config.num_heads})",
        config.hidden_size,
    )


def split(batch: Sequence, size: int | None) -> list[Sequence]:
    """``batch`` cut into micro-batches of ``size`` (the last may be smaller; None: one)."""
    size = len(batch) if size is None else size
    return [batch[start : start + size] for start in range(0, len(batch), size)]


class OneProcess:
    """What a trainer or driver combines over data-parallel ranks, when there is one: nothing.
    (Chapter 13's ranks combine over ``torch.distributed``: ``rlkit.systems.spmd.AcrossRanks``.)"""

    world_size = 1

    def mean(self, value: float) -> float:
        """The mean of a statistic over the ranks."""
        return value

    def whiten(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``masked_whiten`` over every rank's valid entries."""
        return masked_whiten(x, mask)


def rank_share(items: list, rank: int, world_size: int, field: str) -> list:
    """Rank ``rank``'s share of a fixed list for data parallelism: every ``world_size``-th item
    from ``rank``, as many on every rank (the last few of an uneven split are left out)."""
    require_rank(rank, world_size)
    require(
        len(items) >= world_size,
        field,
        f"at least one item per rank ({world_size})",
        len(items),
    )
    usable = len(items) - len(items) % world_size
    return items[:usable][rank::world_size]


class LanguageModelTrainer(Trainer):
    """The outline every language-model trainer shares; a subclass builds its model and tokenizer,
    calls ``prepare``, and makes each update one ``optimizer_step``."""

    def __init__(self, config: LanguageModelTrainingConfig):
        super().__init__(config)
        seed_everything(config.seed)
        # data parallelism (Chapter 13's SPMD workers) sets this: after a batch's gradient is
        # accumulated, every rank's gradient is replaced by the ranks' mean (eq-data-parallel); it
        # is given the batch's total weight (its tokens, where the loss is a token mean)
        self.average_gradients: Callable[[torch.nn.Module, float], None] | None = None
        # and this, for the statistics an algorithm takes over the whole batch
        self.ranks = OneProcess()

    def prepare(self, model: PreTrainedModel, longest: int, length_field: str, layout: str) -> None:
        """Check that the ``longest`` sequence (its ``layout``; ``length_field`` sets its length)
        fits the context, add the LoRA adapters (``lora_rank``), move the model to the device, and
        build the optimizer."""
        config = self.config
        require_fits_context(model, longest, length_field, getattr(config, length_field), layout)
        if config.lora_rank is not None:
            model = with_lora(model, config.lora_rank, config.lora_alpha)
        self.model = model.to(config.device).train()
        self.optimizer = adamw_with_decay_groups(
            self.model, config.learning_rate, config.weight_decay
        )

    def optimizer_step(
        self,
        micro_batches: list,
        weights: list[float],
        loss_of: MicroBatchLoss,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        peak_learning_rate: float | None = None,
    ) -> dict[str, float]:
        """One optimizer step on a batch: its mean loss (the micro-batches' losses weighted by
        ``weights``, e.g. their token counts) backpropagated one micro-batch at a time, the global
        norm clipped, one AdamW step at the scheduled learning rate. The loss, the gradient norm,
        the learning rate, and ``loss_of``'s other metrics (weighted the same way).

        The trainer's model and optimizer at ``learning_rate``, unless given: a second trained
        network (RLHF's critic) steps the same way with its own optimizer and peak step size."""
        config = self.config
        model = self.model if model is None else model
        optimizer = self.optimizer if optimizer is None else optimizer
        peak = config.learning_rate if peak_learning_rate is None else peak_learning_rate
        learning_rate = peak * warmup_cosine(
            self.updates_done, config.warmup_steps, self.num_updates
        )
        set_learning_rate(optimizer, learning_rate)
        optimizer.zero_grad(set_to_none=True)
        total = sum(weights)
        sums: dict[str, float] = {}
        for micro_batch, weight in zip(micro_batches, weights):
            with self.autocast():
                loss, metrics = loss_of(micro_batch)
            # one micro-batch: the loss itself, so that accumulation changes no bit; a batch of no
            # weight (GRPO's "dapo" on completions all truncated and masked) adds nothing
            share = 1.0 if len(micro_batches) == 1 else weight / total if total else 0.0
            (loss if share == 1.0 else loss * share).backward()
            for name, value in {"loss": loss, **metrics}.items():
                number = value.item() if torch.is_tensor(value) else float(value)
                sums[name] = sums.get(name, 0.0) + share * number
        if self.average_gradients is not None:
            self.average_gradients(model, total)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in model.parameters() if p.requires_grad], config.max_grad_norm
        )
        optimizer.step()
        return {**sums, "grad_norm": grad_norm.item(), "learning_rate": learning_rate}

    def stepped_models(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        """The models this trainer's steps update, each with its optimizer, by name: the policy (or
        the reward model) as ``"policy"``; RLHF-PPO adds its critic. Data parallelism (Chapter
        13) starts these from rank 0's weights and averages their gradients. (A worker role that
        holds no policy, Chapter 13's critic or reward, has no ``"policy"``.)"""
        return {} if self.model is None else {"policy": (self.model, self.optimizer)}

    def shard_data(self, rank: int, world_size: int) -> None:
        """Data parallelism (Chapter 13's ``rlkit.systems.data_parallel``): this rank trains on
        its share of every batch; ranks built from one config split each global batch."""
        self.data.shard(rank, world_size)

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast where ``uses_bf16``; otherwise nothing."""
        if uses_bf16(self.config):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def _load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


@contextlib.contextmanager
def base_model(model: PreTrainedModel) -> Iterator[PreTrainedModel]:
    """The model without its LoRA adapters, for the forward passes inside the block: the frozen
    model training started from (the reference policy of RLHF), with no copy of its weights."""
    require(
        hasattr(model, "disable_adapter"),
        "model",
        "a model with LoRA adapters (lora_rank set); without them, keep a frozen copy instead",
        type(model).__name__,
    )
    with model.disable_adapter():
        yield model


def trainable_share(model: torch.nn.Module) -> float:
    """The fraction of the model's weights that training changes (1 without LoRA)."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad) / max(1, total)


class PhaseTimer:
    """Seconds spent in each named phase of an iteration (Chapter 13 distributes these phases). On
    CUDA each phase waits for the device at its start and end: kernels run asynchronously, and
    their time would otherwise be counted in whichever later phase first waits for a result."""

    def __init__(self, phases: Sequence[str], device: str | torch.device = "cpu"):
        self.seconds = {phase: 0.0 for phase in phases}
        device = torch.device(device)
        self.synchronize = (
            (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        )

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.synchronize()
            self.seconds[phase] += time.perf_counter() - start


def rows(prompts: PromptBatch, index: torch.Tensor) -> PromptBatch:
    """The prompts of the rows ``index``."""
    return PromptBatch(
        prompts.input_ids[index], prompts.attention_mask[index], prompts.position_ids[index]
    )


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in eval mode with every weight's gradient off: it takes part, it does not learn."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model.eval()


# ---- A sampler that is not the trainer (Chapter 13's rollout/training mismatch) -----------------

SAMPLER_DTYPES = ("float32", "bfloat16")


def require_sampler_settings(config) -> None:
    """The checks of a config's ``sampler_dtype``, ``sampler_lag``, ``sampler_correction`` and
    ``sampler_cap`` (GRPO's and RLHF-PPO's)."""
    require(
        config.sampler_dtype in SAMPLER_DTYPES,
        "sampler_dtype",
        f"one of {SAMPLER_DTYPES}",
        config.sampler_dtype,
    )
    require(
        is_count(config.sampler_lag, minimum=0),
        "sampler_lag",
        "an integer >= 0",
        config.sampler_lag,
    )
    require(
        config.sampler_correction is None or config.sampler_correction in SAMPLER_CORRECTIONS,
        "sampler_correction",
        f"None or one of {SAMPLER_CORRECTIONS}",
        config.sampler_correction,
    )
    require(
        is_finite_number(config.sampler_cap) and config.sampler_cap >= 1,
        "sampler_cap",
        "a finite number >= 1",
        config.sampler_cap,
    )


def wants_separate_sampler(config) -> bool:
    """A copy of the policy samples (rounded or stale weights), not the policy itself."""
    return config.sampler_dtype != "float32" or config.sampler_lag > 0


class SeparateSampler:
    """A copy of the policy that samples in its place, to inject the rollout/training mismatch of
    systems whose generator is not the trainer in a controlled way: its weights rounded to
    ``dtype`` and ``lag`` iterations old. ``sync`` before each iteration's sampling."""

    def __init__(self, policy: torch.nn.Module, dtype: str, lag: int):
        self.model = frozen(copy.deepcopy(policy).to(dtype=getattr(torch, dtype)))
        self.lag = lag
        self.states: collections.deque = collections.deque(maxlen=lag + 1)

    def sync(self, policy: torch.nn.Module) -> None:
        """The policy's weights of ``lag`` iterations ago (the oldest kept, on the CPU; in the
        first iterations, the start's), rounded to the sampler's dtype."""
        state = policy.state_dict()
        if self.lag == 0:  # the current weights: no copy to keep
            self.model.load_state_dict(state)
            return
        self.states.append({name: value.detach().cpu().clone() for name, value in state.items()})
        self.model.load_state_dict(self.states[0])

    def state_dict(self) -> list[dict]:
        """The stale weights a resumed run needs (none without a lag)."""
        return list(self.states)

    def load_state_dict(self, states: list[dict]) -> None:
        self.states.clear()
        self.states.extend(states)


def sampler_mismatch(
    trainer_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
) -> dict[str, torch.Tensor]:
    """How far the sampler's policy is from the trainer's on the sampled tokens:
    ``sampler_kl``, the k3 estimate of KL(sampler || trainer) per token (eq-sampler-kl:
    ``approx_kl`` with the sampler as the old policy), and ``sampler_ratio_over_cap``, the share
    of tokens whose own importance ratio exceeds ``cap`` (per token whatever the correction's
    mode: a sequence mode may cut more)."""
    log_ratio = zero_padding(trainer_logprobs - sampler_logprobs, mask)
    return {
        "sampler_kl": approx_kl(trainer_logprobs, sampler_logprobs, mask),
        "sampler_ratio_over_cap": masked_mean(
            (log_ratio > math.log(cap)).to(log_ratio.dtype), mask
        ),
    }
