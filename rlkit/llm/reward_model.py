"""Reward models learned from pairwise preferences (Bradley-Terry), and how to read them correctly.

A reward model is a transformer with a one-output head; ``r(x, y)`` is that output at the last real
token of ``<bos> prompt completion <eos>`` (the EOS), so the whole response has been seen. Trained
on pairs ``(x, y_w, y_l)`` where a labeller preferred ``y_w``, it maximises the Bradley-Terry
likelihood P(y_w > y_l | x) = sigmoid(r(x, y_w) - r(x, y_l)) (eq-bradley-terry, eq-bt-loss).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from rlkit.checkpoint import folder_built_once
from rlkit.llm.generation import right_pad
from rlkit.llm.models import (
    build_reward_model,
    load_causal_lm,
    load_tokenizer,
    require_matching_pad,
    reward_model_from_causal_lm,
    tiny_config,
)
from rlkit.llm.tasks import PreferenceOracle, PreferencePair, SortTask, require_label_noise
from rlkit.llm.tokenizer import (
    build_char_tokenizer,
    max_prompt_tokens,
    prompt_token_ids,
    require_pad_token,
)
from rlkit.llm.trainer import (
    LanguageModelTrainer,
    LanguageModelTrainingConfig,
    rank_share,
    require_tiny_model_fields,
    split,
)
from rlkit.training import (
    TrainResult,
    eval_mode,
    fit,
    is_count,
    is_finite_number,
    random_state,
    require,
    set_random_state,
)


def bradley_terry_loss(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    margin: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """``mean(-log sigmoid(r_w - r_l - margin))`` (eq-bt-loss); log 2 when the two rewards are
    equal.

    ``margin`` (Llama 2's) asks the chosen reward to win by at least that much: larger for pairs a
    labeller found clearly different. ``logsigmoid`` stays finite where ``log(sigmoid(.))``
    underflows.
    """
    if chosen_rewards.shape != rejected_rewards.shape:
        raise ValueError(
            "chosen_rewards and rejected_rewards must have one shape, got "
            f"{tuple(chosen_rewards.shape)} and {tuple(rejected_rewards.shape)}"
        )
    difference = chosen_rewards - rejected_rewards
    if margin is not None:
        difference = difference - margin
    return -F.logsigmoid(difference).mean()


@dataclass
class ScoredBatch:
    input_ids: torch.Tensor  # [B, T]: <bos> prompt completion <eos>, right-padded
    attention_mask: torch.Tensor


def scoring_batch(
    tokenizer, prompts: list[str], completions: list[str], device: str | torch.device = "cpu"
) -> ScoredBatch:
    """``<bos> prompt completion <eos>`` per pair, right-padded: the layout a reward model reads."""
    require(
        len(prompts) == len(completions) and len(prompts) > 0,
        "completions",
        f"as many completions as prompts ({len(prompts)}), at least one",
        len(completions),
    )
    pad_id = require_pad_token(tokenizer)
    # batched calls: the fast tokenizer encodes a whole list at once, twice as fast as a loop
    prompt_ids = prompt_token_ids(tokenizer, prompts)
    completion_ids = tokenizer(list(completions), add_special_tokens=False)["input_ids"]
    sequences = [
        prompt + completion + [tokenizer.eos_token_id]
        for prompt, completion in zip(prompt_ids, completion_ids)
    ]
    return ScoredBatch(*right_pad(sequences, pad_id, device))


def sequence_rewards(reward_model: PreTrainedModel, batch: ScoredBatch) -> torch.Tensor:
    """``r(x, y)`` per row, ``[B]``: the score head at each row's last non-pad token (Hugging Face's
    pooling)."""
    return (
        reward_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        .logits.squeeze(-1)
        .float()
    )


def score(
    reward_model: PreTrainedModel,
    tokenizer,
    prompts: list[str],
    completions: list[str],
    batch_size: int = 512,
) -> torch.Tensor:
    """Rewards of many (prompt, completion) pairs, without gradients, in batches."""
    with torch.no_grad():
        return torch.cat(
            [
                sequence_rewards(
                    reward_model,
                    scoring_batch(
                        tokenizer,
                        prompts[i : i + batch_size],
                        completions[i : i + batch_size],
                        reward_model.device,
                    ),
                )
                for i in range(0, len(prompts), batch_size)
            ]
        ).cpu()


def pair_rewards(
    reward_model: PreTrainedModel, tokenizer, pairs: list[PreferencePair]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r(x, y_w), r(x, y_l))`` for a batch of pairs, in one forward pass over chosen and rejected
    together."""
    require(len(pairs) > 0, "pairs", "a non-empty list of preference pairs", pairs)
    prompts = [pair.prompt for pair in pairs]
    batch = scoring_batch(
        tokenizer,
        prompts * 2,
        [p.chosen for p in pairs] + [p.rejected for p in pairs],
        reward_model.device,
    )
    rewards = sequence_rewards(reward_model, batch)
    return rewards[: len(pairs)], rewards[len(pairs) :]


def pairwise_accuracy(
    reward_model: PreTrainedModel, tokenizer, pairs: list[PreferencePair]
) -> float:
    """The fraction of pairs where the reward model scores the labelled-chosen completion higher."""
    require(len(pairs) > 0, "pairs", "a non-empty list of preference pairs", pairs)
    prompts = [pair.prompt for pair in pairs]
    chosen = score(reward_model, tokenizer, prompts, [pair.chosen for pair in pairs])
    rejected = score(reward_model, tokenizer, prompts, [pair.rejected for pair in pairs])
    return (chosen > rejected).float().mean().item()


@dataclass
class RewardModelConfig(LanguageModelTrainingConfig):
    """The reward model's settings; the optimization fields it shares with every language-model
    trainer (LoRA, micro-batches, bf16) are ``LanguageModelTrainingConfig``'s."""

    # start from this saved causal LM's transformer (None: a fresh tiny model)
    sft_model_path: str | None = None
    family: str = "llama"  # architecture of the fresh tiny model: "llama", "qwen2" or "gpt2"
    hidden_size: int = 64  # width of the fresh tiny model
    num_layers: int = 2  # transformer blocks of the fresh tiny model
    num_heads: int = 4  # attention heads of the fresh tiny model
    num_digits: int = 6  # digits of the sort task the oracle judges
    label_noise: float = 0.1  # probability that the oracle's label is flipped
    num_train_pairs: int = 12800  # labelled pairs to train on
    num_heldout_pairs: int = 1000  # labelled pairs on held-out prompts, for accuracy
    epochs: int = 3  # passes over the training pairs
    # pairs per optimizer step (more, smaller steps learned the close pairs better than 64)
    batch_size: int = 32
    learning_rate: float = 2e-3  # AdamW's peak step size, after a linear warm-up
    warmup_steps: int = 50  # steps of linear warm-up, then cosine decay to 10% of learning_rate
    # ask r(chosen) to beat r(rejected) by at least this (0: the plain Bradley-Terry loss)
    margin: float = 0.0
    eval_every: int = 100  # held-out accuracy every this many steps

    def __post_init__(self):
        super().__post_init__()
        require(
            self.sft_model_path is None or isinstance(self.sft_model_path, (str, os.PathLike)),
            "sft_model_path",
            "None or a folder saved with save_pretrained",
            self.sft_model_path,
        )
        require_tiny_model_fields(self)
        for name in (
            "num_digits",
            "num_train_pairs",
            "num_heldout_pairs",
            "epochs",
            "batch_size",
            "eval_every",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require_label_noise(self.label_noise)
        require(
            is_finite_number(self.margin) and self.margin >= 0,
            "margin",
            "a number >= 0",
            self.margin,
        )
        require(
            self.num_heldout_pairs <= 10**self.num_digits // 2,
            "num_heldout_pairs",
            f"at most half the number of {self.num_digits}-digit sort prompts "
            f"({10**self.num_digits // 2})",
            self.num_heldout_pairs,
        )


@dataclass
class RewardModelResult(TrainResult):
    tokenizer: Any = None
    heldout_pairs: list[PreferencePair] | None = None
    train_pairs: list[PreferencePair] | None = None
    oracle: PreferenceOracle | None = None

    @property
    def model(self) -> PreTrainedModel:
        return self.agent


class RewardModelTrainer(LanguageModelTrainer):
    """Bradley-Terry training on the oracle's labelled pairs, one optimizer step per
    ``run_update``."""

    algorithm = "reward_model"

    def __init__(self, config: RewardModelConfig, train_pairs: list[PreferencePair] | None = None):
        super().__init__(config)
        self.oracle = PreferenceOracle(SortTask(config.num_digits), config.label_noise)
        self.heldout_pairs = self.oracle.pairs(
            config.num_heldout_pairs, seed=config.seed, split="heldout"
        )
        heldout_prompts = {pair.prompt for pair in self.heldout_pairs}
        self.train_pairs = (
            train_pairs
            if train_pairs is not None
            else self.oracle.pairs(
                config.num_train_pairs, seed=config.seed, exclude=heldout_prompts
            )
        )
        require(
            len(self.train_pairs) > 0,
            "train_pairs",
            "a non-empty list of preference pairs",
            self.train_pairs,
        )
        if config.sft_model_path is None:
            self.tokenizer = build_char_tokenizer()
            model = build_reward_model(
                tiny_config(
                    self.tokenizer,
                    config.family,
                    config.hidden_size,
                    config.num_layers,
                    config.num_heads,
                ),
                config.seed,
            )
        else:
            self.tokenizer = load_tokenizer(config.sft_model_path)
            model = reward_model_from_causal_lm(
                load_causal_lm(config.sft_model_path, dtype=torch.float32), config.seed
            )
        require_matching_pad(model, self.tokenizer)
        # <bos> prompt completion <eos>, where a candidate completion adds at most 3 tokens
        task = self.oracle.task
        longest = max_prompt_tokens(self.tokenizer, task) + task.max_answer_length + 3 + 1
        self.prepare(model, longest, "num_digits", "<bos> prompt completion <eos>")
        self.order_rng = random.Random(config.seed)
        self.steps_per_epoch = -(-len(self.train_pairs) // config.batch_size)
        self.order: list[int] = []

    @property
    def subject(self) -> str:
        return (
            f"sort preferences ({self.config.num_digits} digits, label noise "
            f"{self.config.label_noise})"
        )

    @property
    def num_updates(self) -> int:
        return self.config.epochs * self.steps_per_epoch

    def shard_data(self, rank: int, world_size: int) -> None:
        """This rank's share of the training pairs, every ``world_size``-th from ``rank`` (as
        many on every rank: the last few of an uneven split are left out), in passes of its own
        order; each rank's batch is then its share of a global batch ``world_size`` times
        larger."""
        self.train_pairs = rank_share(self.train_pairs, rank, world_size, "num_train_pairs")
        self.steps_per_epoch = -(-len(self.train_pairs) // self.config.batch_size)

    def _next_batch(self) -> list[PreferencePair]:
        step_in_epoch = self.updates_done % self.steps_per_epoch
        if step_in_epoch == 0:
            self.order = list(range(len(self.train_pairs)))
            self.order_rng.shuffle(self.order)
        indices = self.order[
            step_in_epoch * self.config.batch_size : (step_in_epoch + 1) * self.config.batch_size
        ]
        return [self.train_pairs[index] for index in indices]

    def _update(self) -> dict[str, float]:
        config, step = self.config, self.updates_done + 1
        micro_batches = split(self._next_batch(), config.micro_batch_size)
        row = {
            "step": step,
            **self.optimizer_step(
                micro_batches, [len(pairs) for pairs in micro_batches], self._loss
            ),
        }
        if step % config.eval_every == 0 or step == self.num_updates:
            with eval_mode(self.model):
                row["heldout_accuracy"] = pairwise_accuracy(
                    self.model, self.tokenizer, self.heldout_pairs
                )
        return row

    def _loss(self, pairs: list[PreferencePair]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """eq-bt-loss on a batch of pairs, with the accuracy and the mean reward gap."""
        chosen, rejected = pair_rewards(self.model, self.tokenizer, pairs)
        loss = bradley_terry_loss(chosen, rejected, self.config.margin or None)
        with torch.no_grad():
            accuracy = (chosen > rejected).float().mean()
            return loss, {"accuracy": accuracy, "reward_gap": (chosen - rejected).mean()}

    def _state(self) -> dict:
        return {
            **super()._state(),
            "order": list(self.order),
            "order_rng": random_state(self.order_rng),
        }

    def _load_state(self, state: dict) -> None:
        super()._load_state(state)
        self.order = list(state["order"])
        set_random_state(self.order_rng, state["order_rng"])

    def evaluate(self, num_prompts: int | None = None, seed: int = 0) -> dict[str, float]:
        """Held-out pairwise accuracy, beside the best any model can reach on these noisy labels
        (``label_ceiling``); the pairs are fixed by the config (``num_heldout_pairs``), so
        ``num_prompts`` and ``seed`` are not used."""
        with torch.no_grad(), eval_mode(self.model):
            accuracy = pairwise_accuracy(self.model, self.tokenizer, self.heldout_pairs)
        return {
            "heldout_accuracy": accuracy,
            "label_ceiling": label_ceiling(self.oracle, self.heldout_pairs),
        }

    def result(self) -> RewardModelResult:
        return RewardModelResult(
            self.config,
            self.model,
            self.history,
            tokenizer=self.tokenizer,
            heldout_pairs=self.heldout_pairs,
            train_pairs=self.train_pairs,
            oracle=self.oracle,
        )


def label_ceiling(oracle: PreferenceOracle, pairs: list[PreferencePair]) -> float:
    """The best held-out accuracy any model can have: the fraction of labels the noiseless rule
    agrees with."""
    return sum(oracle.agrees(pair) for pair in pairs) / len(pairs)


def train_reward_model(
    config: RewardModelConfig,
    train_pairs: list[PreferencePair] | None = None,
    progress: bool = False,
) -> RewardModelResult:
    """Fit a reward model to preference pairs (the oracle's, unless ``train_pairs`` are given)."""
    return fit(RewardModelTrainer(config, train_pairs), progress=progress)


def reward_model_starting_point(
    folder: str | os.PathLike, sft_folder: str | os.PathLike, seed: int = 0
) -> Path:
    """Chapter 9's reward model for the RL chapters, trained with the default ``RewardModelConfig``
    from the SFT model in ``sft_folder`` (``sft_starting_point``) and saved in ``folder``, or reused
    when a model made from the same settings is already there (``folder_built_once``: parallel
    processes train it once; any other non-empty folder is refused, never deleted)."""
    config = RewardModelConfig(sft_model_path=str(sft_folder), seed=seed)
    # the SFT model's own record, so that a rebuilt SFT folder (other settings) is noticed
    sft_record = Path(sft_folder) / "sft_config.json"
    made_from = json.loads(sft_record.read_text()) if sft_record.is_file() else None

    def build(partial: Path) -> None:
        result = train_reward_model(config)
        result.model.save_pretrained(partial)
        result.tokenizer.save_pretrained(partial)
        (partial / "reward_model_history.json").write_text(json.dumps(result.history))

    settings = {**asdict(config), "sft_config": made_from}
    return folder_built_once(folder, settings, "reward_model_config.json", build)


def rlhf_starting_point(cache: str | os.PathLike, seed: int = 0) -> tuple[Path, Path]:
    """Seed ``seed``'s start for the RL chapters, ``(sft_folder, reward_model_folder)``:
    ``sft_starting_point`` in ``cache/sft-start-{seed}`` and the reward model trained from it in
    ``cache/reward-start-{seed}``, each built once. Tests, benchmarks and the sweep name them alike,
    so that one run's cache serves them all. (The reward model's record holds the SFT folder's
    path: resolved, a cache named relatively and absolutely is one cache.)"""
    from rlkit.llm.sft import sft_starting_point

    cache = Path(cache).resolve()
    sft = sft_starting_point(cache / f"sft-start-{seed}", seed=seed)
    return sft, reward_model_starting_point(cache / f"reward-start-{seed}", sft, seed)
