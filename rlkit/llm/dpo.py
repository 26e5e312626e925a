"""DPO and its family (Chapter 12): preference optimisation as a classification loss on the
policy's own log-probabilities, with no reward model and no sampling.

The KL-regularised objective of Chapter 10 has a closed-form optimum, pi*(y|x) proportional to
pi_ref(y|x) exp(r(x, y) / beta); solved for the reward, r(x, y) = beta log(pi*(y|x) /
pi_ref(y|x)) + beta log Z(x), and put into Chapter 9's Bradley-Terry model, the partition function
Z(x) cancels between the two answers to one prompt (Rafailov et al., 2023). What is left is the
Bradley-Terry loss on the *implicit rewards* beta (log pi - log pi_ref) of the chosen and the
rejected answer (eq-dpo-loss). The variants change that loss:

- conservative DPO (Mitchell, 2023): labels flipped with probability ``label_smoothing``;
- robust DPO (Chowdhury et al., 2024): the unbiased form under such flips (``loss_type="robust"``);
- IPO (Azar et al., 2024): a squared loss towards a margin of 1/(2 beta) (``loss_type="ipo"``),
  which does not drive the margin to infinity on deterministic preferences; TRL applies it to mean
  per-token log-probabilities;
- SimPO (Meng et al., 2024): no reference at all, length-normalised log-probabilities and a target
  margin (``simpo_loss``).

The functions take sequence log-probabilities as given (``sequence_logprobs`` sums or averages
Chapter 8's per-token ``response_logprobs``). Names follow TRL's ``DPOConfig``: ``beta``,
``loss_type``, ``label_smoothing``, ``precompute_ref_log_probs``; SimPO's ``gamma`` is TRL's
``simpo_gamma``.

``DPOTrainer`` trains a policy on preference pairs: Chapter 9's labelled pairs (offline), or pairs
the policy samples itself and the oracle labels at each step (online DPO, the bridge back to RL).
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from rlkit.llm.evaluation import held_out_scores, heldout_prompts, means, win_outcomes
from rlkit.llm.generation import (
    DECODERS,
    PromptBatch,
    generate,
    left_pad,
    response_logprobs,
    right_pad,
)
from rlkit.llm.models import (
    load_causal_lm,
    load_reward_model,
    load_tokenizer,
    require_matching_pad,
)
from rlkit.llm.reward_model import bradley_terry_loss, score
from rlkit.llm.tasks import (
    PreferenceOracle,
    PreferencePair,
    SortTask,
    TaskData,
    preferred,
    require_label_noise,
)
from rlkit.llm.tokenizer import max_prompt_tokens, prompt_token_ids, require_pad_token
from rlkit.llm.trainer import (
    LanguageModelResult,
    LanguageModelTrainer,
    LanguageModelTrainingConfig,
    base_model,
    frozen,
    rank_share,
    split,
)
from rlkit.losses import zero_padding
from rlkit.training import (
    is_count,
    is_finite_number,
    random_state,
    require,
    set_random_state,
)

__all__ = [
    "DPO_LOSS_TYPES",
    "DPOConfig",
    "DPOTrainer",
    "dpo_loss",
    "implicit_rewards",
    "collate_pairs",
    "pair_batch",
    "tokenize_pairs",
    "sequence_logprobs",
    "simpo_loss",
]

DPO_LOSS_TYPES = ("sigmoid", "robust", "ipo")
TRAINER_LOSS_TYPES = (*DPO_LOSS_TYPES, "simpo")
PAIRS = ("offline", "online")
LABELLERS = ("oracle", "reward_model")


def sequence_logprobs(
    token_logprobs: torch.Tensor, mask: torch.Tensor, average: bool = False
) -> torch.Tensor:
    """``[B]``: each answer's log-probability, the sum of its tokens' (``[B, T]``, the response
    layout's ``response_logprobs``) over ``mask``; with ``average`` their mean per token (IPO's
    and SimPO's length normalisation). What padding holds never counts."""
    require(
        token_logprobs.dim() == 2 and mask.shape == token_logprobs.shape,
        "mask",
        f"a [B, T] tensor of the shape of token_logprobs, {tuple(token_logprobs.shape)}",
        tuple(mask.shape),
    )
    lengths = mask.sum(dim=1)
    require(bool((lengths > 0).all()), "mask", "at least one answer token in every row", lengths)
    total = zero_padding(token_logprobs, mask).sum(dim=1)
    return total / lengths.to(total.dtype) if average else total


def implicit_rewards(
    policy_logps: torch.Tensor, ref_logps: torch.Tensor, beta: float = 0.1
) -> torch.Tensor:
    """DPO's implicit reward of each answer, ``beta * (log pi(y|x) - log pi_ref(y|x))``
    (eq-dpo-implicit-reward): the reward, up to a function of the prompt alone, for which the
    policy is the optimum of the KL-regularised objective."""
    return beta * (policy_logps - ref_logps)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The mean over the batch of DPO's loss (eq-dpo-loss) on the sequence log-probabilities of
    the chosen and the rejected answers (``[B]`` each), under the policy and the reference.

    With ``h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))``:

    - ``"sigmoid"``: ``-log sigmoid(beta h)``, the Bradley-Terry loss of the implicit rewards; with
      ``label_smoothing`` eps > 0, conservative DPO, ``-(1 - eps) log sigmoid(beta h) - eps log
      sigmoid(-beta h)`` (TRL 1.x's "sigmoid" ignores ``label_smoothing``);
    - ``"robust"``: ``(-(1 - eps) log sigmoid(beta h) + eps log sigmoid(-beta h)) / (1 - 2 eps)``,
      unbiased for the clean loss when each label is flipped with probability eps;
    - ``"ipo"``: ``(h - 1 / (2 beta))^2``; pass mean per-token log-probabilities
      (``sequence_logprobs(..., average=True)``), as TRL's trainer does for it (an averaging the
      IPO paper does not write, which TRL confirmed with its authors); no label smoothing.

    It is log 2 for "sigmoid" when the policy equals the reference (h = 0).
    """
    require(loss_type in DPO_LOSS_TYPES, "loss_type", f"one of {DPO_LOSS_TYPES}", loss_type)
    require(is_finite_number(beta) and beta > 0, "beta", "a number > 0", beta)
    _require_label_smoothing(label_smoothing)
    require(
        loss_type != "ipo" or label_smoothing == 0,
        "label_smoothing",
        "0 for loss_type 'ipo' (its squared loss has no flipped-label form)",
        label_smoothing,
    )
    _require_one_shape(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    chosen = implicit_rewards(policy_chosen_logps, ref_chosen_logps, beta)
    rejected = implicit_rewards(policy_rejected_logps, ref_rejected_logps, beta)
    if loss_type == "ipo":
        margin = (chosen - rejected) / beta
        return ((margin - 1 / (2 * beta)) ** 2).mean()
    right, flipped = bradley_terry_loss(chosen, rejected), bradley_terry_loss(rejected, chosen)
    if loss_type == "robust":
        return ((1 - label_smoothing) * right - label_smoothing * flipped) / (
            1 - 2 * label_smoothing
        )
    return (1 - label_smoothing) * right + label_smoothing * flipped


def simpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    beta: float = 2.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """SimPO's loss (eq-simpo-loss), the mean over the batch of ``-log sigmoid(beta (a_w - a_l) -
    gamma)``: no reference model; ``a`` is the answer's *mean* per-token log-probability
    (``sequence_logprobs(..., average=True)``), so that a longer answer is not a likelier one,
    and ``gamma`` (TRL's ``simpo_gamma``) a target margin. With ``label_smoothing`` eps, the
    conservative form, as TRL's ``CPOTrainer(loss_type="simpo")`` computes it."""
    require(is_finite_number(beta) and beta > 0, "beta", "a number > 0", beta)
    require(is_finite_number(gamma), "gamma", "a finite number (the target margin)", gamma)
    _require_label_smoothing(label_smoothing)
    _require_one_shape(
        policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps
    )
    chosen, rejected = beta * policy_chosen_logps, beta * policy_rejected_logps
    right = bradley_terry_loss(chosen, rejected, margin=gamma)
    flipped = bradley_terry_loss(rejected, chosen, margin=-gamma)  # the label flipped
    return (1 - label_smoothing) * right + label_smoothing * flipped


def _require_label_smoothing(label_smoothing: float) -> None:
    require(
        is_finite_number(label_smoothing) and 0 <= label_smoothing < 0.5,
        "label_smoothing",
        "a number in [0, 0.5) (the probability that a label is flipped)",
        label_smoothing,
    )


def _require_one_shape(**tensors: torch.Tensor) -> None:
    """Every tensor ``[B]``, of one shape (a ValueError naming the first that is not)."""
    names = list(tensors)
    first = tensors[names[0]]
    require(first.dim() == 1, names[0], "a [B] tensor, one log-probability per answer", first.shape)
    for name in names[1:]:
        require(
            tensors[name].shape == first.shape,
            name,
            f"a tensor of the shape of {names[0]}, {tuple(first.shape)}",
            tuple(tensors[name].shape),
        )


# ---- the trainer ---------------------------------------------------------------------------------


@dataclass
class DPOConfig(LanguageModelTrainingConfig):
    """DPO on the sort task's preference pairs; the optimization fields of
    ``LanguageModelTrainingConfig`` drive the policy. The defaults are Chapter 12's settings."""

    sft_folder: str | None = None  # the policy's start and its reference: a saved SFT model
    num_digits: int = 6  # the sort task's prompt length
    label_noise: float = 0.1  # the oracle's probability of naming the worse completion
    # "offline": Chapter 9's labelled pairs (completions of random quality, drawn once);
    # "online": at each step two completions per prompt sampled from the policy, labelled by the
    # oracle (ties dropped)
    pairs: str = "offline"
    # who labels the online pairs: "oracle" (Chapter 9's hidden labeller) or "reward_model" (the
    # reward model saved at reward_model_folder, Chapter 9's learned stand-in for it)
    labeller: str = "oracle"
    reward_model_folder: str | None = None  # the saved reward model that labels, if it does
    # offline: labelled pairs drawn (twice Chapter 9's 12,800: one pass over new pairs did better
    # than two over the same); online: the prompts sampled over training
    num_train_pairs: int = 25600
    epochs: int = 1  # passes over the training pairs
    batch_size: int = 64  # pairs per optimizer step
    beta: float = 0.5  # the KL regularisation's strength: the implicit reward's scale
    loss_type: str = "sigmoid"  # "sigmoid" (DPO), "robust", "ipo" or "simpo"
    label_smoothing: float = 0.0  # conservative DPO's assumed label-flip probability
    simpo_gamma: float = 0.5  # SimPO's target margin (loss_type "simpo", which needs no reference)
    # compute the reference's log-probabilities of every offline pair once, before training, so
    # that the reference model leaves memory (it is reloaded from sft_folder to evaluate)
    precompute_ref_log_probs: bool = True
    max_new_tokens: int = 8  # the completion's length limit, sampling online and evaluating
    temperature: float = 0.6  # online sampling's and the sampled evaluation's temperature
    # online sampling's decoder: "kv_loop", rlkit's decoding loop (less overhead per token, which
    # dominates for small models), or "hf", model.generate
    decoder: str = "kv_loop"
    learning_rate: float = 1e-4  # AdamW's peak step size
    warmup_steps: int = 10  # in optimizer steps

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_digits", "num_train_pairs", "epochs", "batch_size", "max_new_tokens"):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(self.pairs in PAIRS, "pairs", f"one of {PAIRS}", self.pairs)
        require(self.labeller in LABELLERS, "labeller", f"one of {LABELLERS}", self.labeller)
        require(
            self.labeller == "oracle" or self.pairs == "online",
            "labeller",
            "'oracle' for offline pairs (they are Chapter 9's, labelled by the oracle)",
            self.labeller,
        )
        require(
            self.labeller == "oracle" or self.reward_model_folder is not None,
            "reward_model_folder",
            "a saved reward model's folder (labeller='reward_model')",
            None,
        )
        require_label_noise(self.label_noise)
        require(
            self.loss_type in TRAINER_LOSS_TYPES,
            "loss_type",
            f"one of {TRAINER_LOSS_TYPES}",
            self.loss_type,
        )
        for name in ("beta", "temperature"):
            value = getattr(self, name)
            require(is_finite_number(value) and value > 0, name, "a number > 0", value)
        _require_label_smoothing(self.label_smoothing)
        require(
            self.loss_type != "ipo" or self.label_smoothing == 0,
            "label_smoothing",
            "0 for loss_type 'ipo' (its squared loss has no flipped-label form)",
            self.label_smoothing,
        )
        require(
            is_finite_number(self.simpo_gamma), "simpo_gamma", "a finite number", self.simpo_gamma
        )
        require(self.decoder in DECODERS, "decoder", f"one of {DECODERS}", self.decoder)
        require(
            isinstance(self.precompute_ref_log_probs, bool),
            "precompute_ref_log_probs",
            "True or False",
            self.precompute_ref_log_probs,
        )

    @property
    def uses_reference(self) -> bool:
        return self.loss_type != "simpo"

    @property
    def averages_tokens(self) -> bool:
        """IPO and SimPO read each answer's mean per-token log-probability, the others its sum."""
        return self.loss_type in ("ipo", "simpo")


@dataclass
class PairBatch:
    """Preference pairs in the response-only layout: rows ``0..B-1`` the chosen answers, rows
    ``B..2B-1`` the rejected ones, each after its prompt; one forward pass scores both."""

    prompts: PromptBatch  # [2B, P], left-padded <bos> prompt
    response_ids: torch.Tensor  # [2B, T], answer <eos>, right-padded
    response_mask: torch.Tensor  # [2B, T]: 1 on the answer's tokens and its EOS

    def sequence_logprobs(self, model: PreTrainedModel, average: bool) -> tuple:
        """``(log pi(y_w | x), log pi(y_l | x))``, ``[B]`` each (summed or, ``average``, the
        mean per token)."""
        tokens = response_logprobs(model, self.prompts, self.response_ids, self.response_mask)
        both = sequence_logprobs(tokens, self.response_mask, average)
        return both.chunk(2)


@dataclass(frozen=True)
class TokenizedPair:
    """A pair's token ids: ``<bos> prompt``, and each answer followed by ``<eos>``."""

    prompt: list[int]
    chosen: list[int]
    rejected: list[int]


def tokenize_pairs(tokenizer, pairs: list[PreferencePair]) -> list[TokenizedPair]:
    """Each pair's token ids, in three batched tokenizer calls; a pair whose two answers are one
    is refused (the loss has nothing to compare)."""
    require(len(pairs) > 0, "pairs", "a non-empty list of preference pairs", pairs)
    for index, pair in enumerate(pairs):
        require(
            pair.chosen != pair.rejected,
            f"pairs[{index}]",
            "a pair whose chosen and rejected answers differ",
            pair,
        )
    prompts = prompt_token_ids(tokenizer, [pair.prompt for pair in pairs])
    answers = tokenizer(
        [pair.chosen for pair in pairs] + [pair.rejected for pair in pairs],
        add_special_tokens=False,
    )["input_ids"]
    answers = [ids + [tokenizer.eos_token_id] for ids in answers]
    return [
        TokenizedPair(prompt, chosen, rejected)
        for prompt, chosen, rejected in zip(prompts, answers[: len(pairs)], answers[len(pairs) :])
    ]


def collate_pairs(
    pairs: list[TokenizedPair], pad_id: int, device: str | torch.device = "cpu"
) -> PairBatch:
    """Tokenized pairs as one ``PairBatch``: chosen rows first, then rejected."""
    prompts = [pair.prompt for pair in pairs] * 2
    ids, mask = right_pad(
        [pair.chosen for pair in pairs] + [pair.rejected for pair in pairs], pad_id, device
    )
    return PairBatch(left_pad(prompts, pad_id, device), ids, mask)


def pair_batch(
    tokenizer, pairs: list[PreferencePair], device: str | torch.device = "cpu"
) -> PairBatch:
    """The pairs in the layout the policy scores (``PairBatch``)."""
    return collate_pairs(tokenize_pairs(tokenizer, pairs), require_pad_token(tokenizer), device)


class DPOTrainer(LanguageModelTrainer):
    """DPO (or IPO, robust DPO, SimPO) on preference pairs, one optimizer step per
    ``run_update``.

    Offline, the pairs are Chapter 9's: the oracle's labels on completions of random quality, drawn
    once (``num_train_pairs``), read ``epochs`` times in shuffled batches; with
    ``precompute_ref_log_probs`` the reference scores them all before the first step and is then
    let go. Online, each step samples two completions for each of ``batch_size`` fresh prompts from
    the policy and the oracle labels them (ties dropped): the pairs follow the policy, as RL's
    samples do. The reference is the SFT model the policy starts from (with LoRA, the policy with
    its adapters disabled).
    """

    algorithm = "dpo"

    def __init__(
        self,
        config: DPOConfig,
        policy: PreTrainedModel | None = None,
        tokenizer=None,
        train_pairs: list[PreferencePair] | None = None,
    ):
        super().__init__(config)
        self.task = SortTask(config.num_digits)
        self.data = TaskData(self.task, seed=config.seed)
        self.oracle = PreferenceOracle(self.task, config.label_noise)
        if policy is None:
            require(config.sft_folder is not None, "sft_folder", "a saved SFT model's folder", None)
            policy = load_causal_lm(config.sft_folder, dtype=torch.float32)
            tokenizer = load_tokenizer(config.sft_folder)
        require(tokenizer is not None, "tokenizer", "the policy's tokenizer", tokenizer)
        self.tokenizer = tokenizer
        # an oracle candidate adds at most 3 digits; online completions end by max_new_tokens
        answer = max(self.task.max_answer_length + 3, config.max_new_tokens) + 1
        self.prepare(
            policy,
            max_prompt_tokens(tokenizer, self.task) + answer,
            "num_digits",
            "<bos> prompt answer <eos> (num_digits and max_new_tokens)",
        )
        self.model.eval()  # dropout off: the log-probabilities are the reference's at the start
        self.pad_id = require_pad_token(tokenizer)
        self.train_pairs = self._offline_pairs(train_pairs) if config.pairs == "offline" else []
        # tokenized once, as the pairs are fixed: a step only pads its batch
        self.train_tokens = tokenize_pairs(tokenizer, self.train_pairs) if self.train_pairs else []
        precompute = bool(self.train_pairs) and config.uses_reference
        precompute = precompute and config.precompute_ref_log_probs
        # a frozen copy of the start, unless LoRA's base model serves, or the reference is only
        # needed now (precomputed) and later reloaded from sft_folder to evaluate
        keep_copy = config.uses_reference and config.lora_rank is None
        keep_copy = keep_copy and not (precompute and config.sft_folder is not None)
        self.reference = frozen(copy.deepcopy(policy).to(config.device)) if keep_copy else None
        self.ref_logps = None
        if precompute:  # before the first step the policy is the reference
            self.ref_logps = self._reference_logps(self.train_tokens, at_start=True)
        self.order_rng = random.Random(config.seed)
        self.sample_rng = random.Random(f"dpo-online-{config.seed}")
        self.reward_model = None
        if config.labeller == "reward_model":
            reward_model = load_reward_model(config.reward_model_folder, torch.float32)
            require_matching_pad(reward_model, tokenizer)
            self.reward_model = frozen(reward_model.to(config.device))
        self.order: list[int] = []

    def _offline_pairs(self, given: list[PreferencePair] | None) -> list[PreferencePair]:
        """The given pairs, or the oracle's on training prompts (never a held-out one)."""
        if given is not None:
            require(len(given) > 0, "train_pairs", "a non-empty list of preference pairs", given)
            return list(given)
        heldout = {example.prompt for example in self.data.heldout}
        return self.oracle.pairs(self.config.num_train_pairs, self.config.seed, exclude=heldout)

    @property
    def subject(self) -> str:
        return f"sort preferences ({self.config.num_digits} digits, {self.config.pairs})"

    @property
    def num_updates(self) -> int:
        pairs = len(self.train_pairs) if self.train_pairs else self.config.num_train_pairs
        return self.config.epochs * -(-pairs // self.config.batch_size)

    # ---- reference ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def reference_model(self) -> Iterator[PreTrainedModel]:
        """The reference policy: the kept copy, the policy without its adapters (LoRA), or, after
        ``precompute_ref_log_probs`` let the copy go, the SFT model loaded again."""
        if self.config.lora_rank is not None:
            with base_model(self.model) as reference:
                yield reference
        elif self.reference is not None:
            yield self.reference
        else:
            yield frozen(
                load_causal_lm(self.config.sft_folder, dtype=torch.float32).to(self.config.device)
            )

    def _reference_logps(
        self, pairs: list[TokenizedPair], chunk: int = 512, at_start: bool = False
    ) -> torch.Tensor:
        """``[N, 2]``: the reference's log-probabilities of each pair's chosen and rejected
        answer (``at_start``: before any step, when the policy without LoRA is the reference)."""
        average, parts = self.config.averages_tokens, []
        if at_start and self.config.lora_rank is None:
            reference_context = contextlib.nullcontext(self.model)
        else:
            reference_context = self.reference_model()
        with reference_context as reference, torch.no_grad(), self.autocast():
            for start in range(0, len(pairs), chunk):
                batch = collate_pairs(pairs[start : start + chunk], self.pad_id, self.model.device)
                parts.append(torch.stack(batch.sequence_logprobs(reference, average), dim=1))
        return torch.cat(parts)

    # ---- one step -----------------------------------------------------------------------------

    def _update(self) -> dict[str, float]:
        config = self.config
        pairs, ref_logps, stats = self._next_pairs()
        row = {"step": self.updates_done + 1, **stats}
        if not pairs:  # online, every pair a tie: nothing to learn from this step
            return row
        pieces = list(
            zip(split(pairs, config.micro_batch_size), split(ref_logps, config.micro_batch_size))
        )
        return row | self.optimizer_step(pieces, [len(piece[0]) for piece in pieces], self._loss)

    def _next_pairs(self) -> tuple[list[TokenizedPair], torch.Tensor, dict[str, float]]:
        """The step's pairs with their reference log-probabilities (``[B, 2]``; zeros for SimPO)."""
        if self.config.pairs == "online":
            labelled, stats = self._online_pairs()
            pairs = tokenize_pairs(self.tokenizer, labelled) if labelled else []
        else:
            index = self._next_indices()
            pairs, stats = [self.train_tokens[i] for i in index], {}
            if self.ref_logps is not None:
                return pairs, self.ref_logps[index], stats
        if not self.config.uses_reference or not pairs:
            return pairs, torch.zeros(len(pairs), 2, device=self.model.device), stats
        return pairs, self._reference_logps(pairs), stats

    def shard_data(self, rank: int, world_size: int) -> None:
        """Offline: this rank's share of the fixed pairs (their tokens and reference
        log-probabilities with them), every ``world_size``-th from ``rank``, as many on every
        rank; online: its share of each step's prompts."""
        if self.config.pairs == "online":
            super().shard_data(rank, world_size)
            return
        index = rank_share(list(range(len(self.train_pairs))), rank, world_size, "num_train_pairs")
        self.train_pairs = [self.train_pairs[i] for i in index]
        self.train_tokens = [self.train_tokens[i] for i in index]
        if self.ref_logps is not None:
            self.ref_logps = self.ref_logps[index]

    def _next_indices(self) -> list[int]:
        """The next batch of a shuffled pass over the training pairs."""
        size = self.config.batch_size
        steps = -(-len(self.train_pairs) // size)
        step_in_epoch = self.updates_done % steps
        if step_in_epoch == 0:
            self.order = list(range(len(self.train_pairs)))
            self.order_rng.shuffle(self.order)
        return self.order[step_in_epoch * size : (step_in_epoch + 1) * size]

    def _online_pairs(self) -> tuple[list[PreferencePair], dict[str, float]]:
        """Two completions of the policy for each of ``batch_size`` fresh prompts, labelled by the
        oracle (or, ``labeller="reward_model"``, by the reward model's scores); a tie (two answers
        scored alike, e.g. both right) teaches nothing and is dropped. (The answers are tokenized
        again from their text: the character tokenizer gives back the sampled ids; a BPE tokenizer
        may split a text otherwise than it was sampled.)"""
        config = self.config
        prompts = [example.prompt for example in self.data.train_batch(config.batch_size)]
        repeated = [prompt for prompt in prompts for _ in range(2)]
        with torch.no_grad(), self.autocast():
            batch = generate(
                self.model,
                self.tokenizer,
                repeated,
                config.max_new_tokens,
                config.temperature,
                decoder=config.decoder,
                with_logprobs=False,  # the loss reads the answers' log-probs under its own pass
            )
        texts = batch.texts(self.tokenizer)
        if self.reward_model is None:
            labelled = [
                self.oracle.compare(prompt, texts[2 * i], texts[2 * i + 1], self.sample_rng)
                for i, prompt in enumerate(prompts)
            ]
        else:
            rewards = score(self.reward_model, self.tokenizer, repeated, texts).tolist()
            labelled = [
                preferred(prompt, texts[2 * i : 2 * i + 2], rewards[2 * i : 2 * i + 2])
                for i, prompt in enumerate(prompts)
            ]
        exact = list(map(self.task.reward, repeated, texts))
        pairs = [pair for pair in labelled if pair is not None]
        stats = {
            "pairs_kept": len(pairs) / len(prompts),
            "exact_match_sampled": sum(exact) / len(exact),
        }
        return pairs, stats

    def _loss(self, piece) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The config's loss on a micro-batch of pairs, with DPO's usual metrics: the implicit
        rewards of chosen and rejected (eq-dpo-implicit-reward), their margin and how often the
        chosen one's is larger (the reward accuracy)."""
        config = self.config
        pairs, ref_logps = piece
        batch = collate_pairs(pairs, self.pad_id, self.model.device)
        chosen, rejected = batch.sequence_logprobs(self.model, config.averages_tokens)
        if config.loss_type == "simpo":
            loss = simpo_loss(
                chosen, rejected, config.beta, config.simpo_gamma, config.label_smoothing
            )
            ref_chosen = ref_rejected = torch.zeros_like(chosen)
        else:
            ref_chosen, ref_rejected = ref_logps[:, 0], ref_logps[:, 1]
            loss = dpo_loss(
                chosen,
                rejected,
                ref_chosen,
                ref_rejected,
                config.beta,
                config.loss_type,
                config.label_smoothing,
            )
        with torch.no_grad():
            reward_chosen = implicit_rewards(chosen, ref_chosen, config.beta)
            reward_rejected = implicit_rewards(rejected, ref_rejected, config.beta)
            return loss, {
                "reward_chosen": reward_chosen.mean(),
                "reward_rejected": reward_rejected.mean(),
                "reward_margin": (reward_chosen - reward_rejected).mean(),
                "reward_accuracy": (reward_chosen > reward_rejected).float().mean(),
                "logp_chosen": chosen.mean(),
                "logp_rejected": rejected.mean(),
            }

    # ---- evaluation and state -----------------------------------------------------------------

    def evaluate(
        self, num_prompts: int | None = None, seed: int = 0, per_prompt: bool = False
    ) -> dict:
        """The policy on the first ``num_prompts`` held-out prompts (None: all 500;
        ``held_out_scores``): exact match and the oracle's gold score, greedy and sampled at
        ``temperature``, the KL to the reference, and ``win_rate``: how often the oracle prefers
        the policy's greedy answer to the reference's (a tie counts one half;
        ``win_rate_sampled``: the same for answers sampled at ``temperature``)."""
        config = self.config
        prompts = heldout_prompts(self.data, num_prompts)
        with self.reference_model() as reference, torch.no_grad(), self.autocast():
            scores = held_out_scores(
                self.model,
                self.tokenizer,
                self.task,
                prompts,
                config.max_new_tokens,
                config.temperature,
                oracle=self.oracle,
                reference_logprobs=lambda batch: batch.logprobs_under(reference),
                seed=seed,
                per_prompt=True,
            )
            baseline = held_out_scores(
                reference,
                self.tokenizer,
                self.task,
                prompts,
                config.max_new_tokens,
                config.temperature,
                seed=seed,
                per_prompt=True,
            )
        for suffix in ("", "_sampled"):
            scores[f"win_rate{suffix}"] = win_outcomes(
                self.oracle,
                prompts,
                scores[f"completions{suffix}"],
                baseline[f"completions{suffix}"],
            )
        return scores if per_prompt else means(scores)

    def result(self) -> LanguageModelResult:
        return LanguageModelResult(self.config, self.model, self.history, tokenizer=self.tokenizer)

    def _state(self) -> dict:
        return {
            **super()._state(),
            "order": list(self.order),
            "order_rng": random_state(self.order_rng),
            "sample_rng": random_state(self.sample_rng),
            "data_rng": random_state(self.data.train_rng),
        }

    def _load_state(self, state: dict) -> None:
        super()._load_state(state)
        self.order = list(state["order"])
        set_random_state(self.order_rng, state["order_rng"])
        set_random_state(self.sample_rng, state["sample_rng"])
        set_random_state(self.data.train_rng, state["data_rng"])
