"""RLHF with PPO (Chapter 10): the KL-shaped, token-level reward and the four-model trainer.

The RLHF objective is ``max E[r(x, y)] - beta KL(pi || pi_ref)``. PPO optimises it token by token
(Ziegler et al., 2019; DeepSpeed-Chat and ColossalAI's PPO trainers): each response token earns
``-kl_coef`` times a per-token estimate of the KL to the reference policy, and the last real token
also earns the reward model's score, clipped. Token-level GAE over these rewards is
``rlkit.advantages.gae(rewards, values, gamma, lam, mask=response_mask)``: the last real token ends
the episode, and nothing flows back from the padding.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from rlkit.advantages import gae
from rlkit.llm.evaluation import held_out_scores, heldout_prompts
from rlkit.llm.generation import (
    PromptBatch,
    ResponseBatch,
    generate,
    response_logprobs,
    sequence_layout,
)
from rlkit.llm.models import (
    ValueHeadModel,
    load_causal_lm,
    load_reward_model,
    load_tokenizer,
    require_matching_pad,
)
from rlkit.llm.reward_model import score
from rlkit.llm.tasks import PreferenceOracle, SortTask, TaskData
from rlkit.llm.tokenizer import max_prompt_tokens, require_pad_token
from rlkit.llm.trainer import (
    LanguageModelResult,
    LanguageModelTrainer,
    LanguageModelTrainingConfig,
    PhaseTimer,
    SeparateSampler,
    adamw_with_decay_groups,
    base_model,
    frozen,
    require_sampler_settings,
    rows,
    sampler_mismatch,
    split,
    wants_separate_sampler,
)
from rlkit.losses import (
    KL_ESTIMATORS,
    approx_kl,
    clip_fraction,
    clipped_policy_loss,
    clipped_value_loss,
    kl_estimate,
    masked_whiten,
)
from rlkit.training import (
    is_count,
    is_finite_number,
    random_state,
    require,
    set_random_state,
)

__all__ = [
    "AdaptiveKLController",
    "RLHFPPOConfig",
    "RLHFPPOTrainer",
    "compute_rewards",
    "last_token_index",
    "response_values",
]


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Each row's last column whose mask is 1, ``[B]`` (for right- or left-padded rows alike)."""
    columns = torch.arange(mask.shape[1], device=mask.device)
    return (columns * (mask != 0)).argmax(dim=1)


def compute_rewards(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    clip_reward: float,
    kl_kind: str = "k1",
) -> torch.Tensor:
    """Per-token rewards ``[B, T_resp]``: ``-kl_coef * KL_t`` on each valid response token, plus the
    score clipped to ``[-clip_reward, clip_reward]`` once, at each row's last valid token; 0 on
    padding (eq-rlhf-reward).

    ``logprobs`` and ``ref_logprobs`` are the sampled tokens' log-probabilities under the policy
    and the reference (``[B, T_resp]``), ``scores`` the reward model's ``[B]``, ``mask`` 1 on the
    response's tokens. ``KL_t`` is ``kl_estimate(logprobs, ref_logprobs, kl_kind)``: k1, the log
    ratio, as DeepSpeed-Chat and TRL put in the reward (its sum over a response is an unbiased
    estimate of the sequence's KL). No gradient flows: the rewards are PPO's fixed targets.
    """
    require(is_finite_number(kl_coef) and kl_coef >= 0, "kl_coef", "a number >= 0", kl_coef)
    require(
        is_finite_number(clip_reward) and clip_reward > 0,
        "clip_reward",
        "a number > 0",
        clip_reward,
    )
    require(kl_kind in KL_ESTIMATORS, "kl_kind", f"one of {KL_ESTIMATORS}", kl_kind)
    require(
        logprobs.dim() == 2 and ref_logprobs.shape == logprobs.shape == mask.shape,
        "ref_logprobs and mask",
        f"[B, T_resp] tensors of the shape of logprobs, {tuple(logprobs.shape)}",
        (tuple(ref_logprobs.shape), tuple(mask.shape)),
    )
    require(
        scores.shape == (logprobs.shape[0],),
        "scores",
        f"a [B] tensor, B = {logprobs.shape[0]}",
        tuple(scores.shape),
    )
    lengths = (mask != 0).sum(dim=1)
    require(
        bool((lengths > 0).all()),
        "mask",
        "at least one response token in every row (an empty response has no token to reward)",
        lengths.tolist(),
    )
    with torch.no_grad():
        valid = (mask != 0).to(logprobs.dtype)
        kl = kl_estimate(logprobs.detach() * valid, ref_logprobs.detach() * valid, kl_kind)
        rewards = -kl_coef * kl * valid
        last = last_token_index(mask)
        rows = torch.arange(rewards.shape[0], device=rewards.device)
        rewards[rows, last] += scores.detach().to(rewards.dtype).clamp(-clip_reward, clip_reward)
    return rewards


class AdaptiveKLController:
    """Ziegler et al.'s (2019) controller of ``kl_coef``: a proportional step towards a target KL.

    After each batch, with ``e = clip(KL / target - 1, -0.2, 0.2)`` (eq-adaptive-kl),
    ``kl_coef <- kl_coef * (1 + e * n / horizon)``, where ``n`` counts the batch's samples: the
    coefficient grows while the policy drifts faster than the target allows and shrinks while it
    stays closer. The clip bounds the step, so one odd batch cannot swing the coefficient.
    """

    def __init__(self, kl_coef: float, target: float, horizon: int):
        require(is_finite_number(kl_coef) and kl_coef > 0, "kl_coef", "a number > 0", kl_coef)
        require(is_finite_number(target) and target > 0, "target_kl", "a number > 0", target)
        require(
            is_count(horizon),
            "kl_horizon",
            "an integer >= 1",
            horizon,
        )
        self.value, self.target, self.horizon = float(kl_coef), float(target), horizon

    def update(self, kl: float, num_samples: int) -> float:
        """The new coefficient, after a batch of ``num_samples`` whose mean KL was ``kl``."""
        require(is_finite_number(kl), "kl", "a finite number", kl)
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * num_samples / self.horizon
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


# ---- The trainer: four models, one iteration in named phases. ----------------------------------

REWARD_SOURCES = ("model", "task")
CRITIC_SOURCES = ("reward_model", "policy")
PHASES = ("generate", "score", "reference", "values", "rewards", "advantages", "ppo_epochs")
# the models a trainer holds besides the actor (Chapter 13's roles each hold only theirs)
OTHER_MODELS = ("reference", "critic", "reward_model")
PPO_STEPS = ("actor", "critic")


@dataclass
class RLHFPPOConfig(LanguageModelTrainingConfig):
    """RLHF with PPO on the sort task; the optimization fields of ``LanguageModelTrainingConfig``
    drive the actor, ``critic_learning_rate`` the critic. The defaults are the settings Chapter 10
    trains and tests with (tiny models: a step size far above a large model's)."""

    # where each model comes from, so that a run folder can rebuild them (None: passed to the
    # trainer's constructor)
    sft_folder: str | None = None  # the actor's start and the reference: an SFT run's saved model
    reward_model_folder: str | None = None  # Chapter 9's saved reward model
    reward: str = "model"  # "model": the reward model's score; "task": the task's exact match
    critic_from: str = "reward_model"  # the critic's backbone: "reward_model" or "policy"
    num_digits: int = 6  # the sort task's prompt length
    num_iterations: int = 120  # iterations of generate, score, ..., PPO epochs
    batch_size: int = 32  # prompts per iteration, one response each
    minibatch_size: int = 16  # responses per PPO step
    ppo_epochs: int = 2  # passes over each iteration's responses
    max_new_tokens: int = 8  # the response's length limit (the answer and its EOS fit)
    temperature: float = 0.7  # for sampling and for every log-probability recomputed
    kl_coef: float = 0.1  # beta of the KL penalty in the reward (the start, with target_kl)
    kl_kind: str = "k1"  # the per-token KL estimate in the reward: "k1", "k2" or "k3"
    # Ziegler et al.'s adaptive kl_coef aims at this KL, the mean over responses of the summed k1
    # estimate, whatever kl_kind the reward uses (None: fixed)
    target_kl: float | None = None
    kl_horizon: int = 10_000  # the adaptive controller's horizon, in responses
    clip_eps: float = 0.2  # PPO's ratio clip
    value_clip_eps: float | None = 0.2  # the value clip around the old values (None: plain MSE)
    critic_learning_rate: float = 1e-4  # the critic's own AdamW step size
    gamma: float = 1.0  # the discount over response tokens
    lam: float = 0.95  # GAE's lambda over response tokens
    clip_reward: float = 5.0  # the score is clipped to [-clip_reward, clip_reward]
    whiten_advantages: bool = True  # normalise advantages over each iteration's valid tokens
    # subtracted from the score of a response without EOS, before the clip (as TRL does; the
    # clipped total stays in [-clip_reward, clip_reward])
    missing_eos_penalty: float | None = None
    learning_rate: float = 1e-4  # the actor's AdamW step size
    warmup_steps: int = 0  # in iterations
    # a sampler that is not the trainer (Chapter 13's mismatch, injected): a copy of the actor with
    # its weights rounded to this dtype ("float32" and a lag of 0: the actor samples itself)
    sampler_dtype: str = "float32"
    sampler_lag: int = 0  # iterations by which the sampler's weights lag the actor's
    # truncated importance sampling of the policy loss against it (None, or one of TRL's modes:
    # "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    sampler_correction: str | None = None
    sampler_cap: float = 3.0  # the importance weight above which it is truncated or masked

    def __post_init__(self) -> None:
        super().__post_init__()
        require_sampler_settings(self)
        require(self.reward in REWARD_SOURCES, "reward", f"one of {REWARD_SOURCES}", self.reward)
        require(
            self.critic_from in CRITIC_SOURCES,
            "critic_from",
            f"one of {CRITIC_SOURCES}",
            self.critic_from,
        )
        for name in (
            "num_digits",
            "num_iterations",
            "batch_size",
            "minibatch_size",
            "ppo_epochs",
            "max_new_tokens",
            "kl_horizon",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            self.minibatch_size <= self.batch_size,
            "minibatch_size",
            f"at most batch_size ({self.batch_size})",
            self.minibatch_size,
        )
        require(
            is_finite_number(self.kl_coef) and self.kl_coef >= 0,
            "kl_coef",
            "a number >= 0",
            self.kl_coef,
        )
        require(self.kl_kind in KL_ESTIMATORS, "kl_kind", f"one of {KL_ESTIMATORS}", self.kl_kind)
        require(
            self.target_kl is None or (is_finite_number(self.target_kl) and self.target_kl > 0),
            "target_kl",
            "None or a number > 0",
            self.target_kl,
        )
        require(
            self.target_kl is None or self.kl_coef > 0,
            "kl_coef",
            "a number > 0 when target_kl adapts it",
            self.kl_coef,
        )
        for name in ("temperature", "clip_eps", "clip_reward", "critic_learning_rate"):
            value = getattr(self, name)
            require(is_finite_number(value) and value > 0, name, "a number > 0", value)
        require(
            self.value_clip_eps is None
            or (is_finite_number(self.value_clip_eps) and self.value_clip_eps > 0),
            "value_clip_eps",
            "None or a number > 0",
            self.value_clip_eps,
        )
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            require(is_finite_number(value) and 0 <= value <= 1, name, "in [0, 1]", value)
        require(
            self.missing_eos_penalty is None
            or (is_finite_number(self.missing_eos_penalty) and self.missing_eos_penalty >= 0),
            "missing_eos_penalty",
            "None or a number >= 0",
            self.missing_eos_penalty,
        )


def require_reads_actor_tokens(critic: ValueHeadModel, actor: PreTrainedModel) -> None:
    """A critic that reads the actor's tokens: its embedding table is the actor's vocabulary."""
    vocabulary = critic.backbone.get_input_embeddings().num_embeddings
    require(
        vocabulary == actor.get_input_embeddings().num_embeddings,
        "critic",
        "a critic that reads the actor's tokens (its embedding table has "
        f"{actor.get_input_embeddings().num_embeddings} rows, the actor's vocabulary)",
        f"a critic whose embedding table has {vocabulary} rows",
    )


def rollout_stats(task, prompts, texts, scores, batch: ResponseBatch, ref_logprobs) -> dict:
    """An iteration's row: the mean score and task reward, the KL to the reference (the mean over
    responses of the summed k1 estimate, which the adaptive controller reads) and the length."""
    valid = batch.response_mask.to(batch.logprobs.dtype)
    return {
        "score": scores.mean().item(),
        "task_reward": sum(map(task.reward, prompts, texts)) / len(prompts),
        "kl": ((batch.logprobs - ref_logprobs) * valid).sum(dim=1).mean().item(),
        "response_length": valid.sum(dim=1).mean().item(),
    }


def shaped_rewards(
    batch: ResponseBatch,
    ref_logprobs: torch.Tensor,
    scores: torch.Tensor,
    kl_coef: float,
    config: RLHFPPOConfig,
) -> torch.Tensor:
    """``compute_rewards`` (eq-rlhf-reward) of a sampled batch with the config's clip and KL
    estimate, at this iteration's ``kl_coef``."""
    return compute_rewards(
        batch.logprobs,
        ref_logprobs,
        scores,
        batch.response_mask,
        kl_coef,
        config.clip_reward,
        config.kl_kind,
    )


def ppo_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    config: RLHFPPOConfig,
    whiten: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = masked_whiten,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE over the response (eq-token-gae), whitened over the batch's valid tokens when
    ``whiten_advantages``; the advantages and the critic's targets, the returns. (``whiten``:
    Chapter 13's data-parallel ranks whiten over every rank's tokens.)"""
    advantages, returns = gae(rewards, values, config.gamma, config.lam, mask=mask)
    if config.whiten_advantages:
        advantages = whiten(advantages, mask)
    return advantages, returns


def response_values(
    critic: ValueHeadModel, prompts: PromptBatch, response_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``V(s_t)`` for each response token, ``[B, T_resp]``: the critic's output at the column
    before the token, the state the policy chose it in (the same shift as the logits); 0 on
    padding."""
    input_ids, attention_mask, position_ids = sequence_layout(prompts, response_ids, mask)
    values = critic(input_ids, attention_mask, position_ids)
    start = prompts.input_ids.shape[1] - 1
    return values[:, start : start + response_ids.shape[1]] * mask


class RLHFPPOTrainer(LanguageModelTrainer):
    """PPO on a language model with the RLHF reward, holding the four models of ColossalAI's PPO
    trainer: the actor (trained), the critic (trained), the reference (the actor's start, frozen)
    and the reward model (frozen).

    Each ``run_update`` is one iteration, in named, timed phases: generate responses to a batch of
    prompts, score them, the reference's log-probabilities, the critic's values, the KL-shaped
    rewards (eq-rlhf-reward), token-level GAE (whitened over valid tokens), and ``ppo_epochs``
    passes of clipped policy and value steps over minibatches. Dropout is off in every model
    throughout (they stay in eval mode; gradients still flow), so that the log-probabilities of
    sampling and of training are one computation and the first ratio is exactly 1.

    With ``sampler_dtype`` or ``sampler_lag`` a copy of the actor samples instead (rounded or
    stale weights: Chapter 13's rollout/training mismatch, injected); the actor recomputes the
    old log-probabilities, the history measures the mismatch (``sampler_kl``,
    ``sampler_ratio_over_cap``), and ``sampler_correction`` weighs the policy loss by truncated
    importance sampling.

    ``keep`` names the models besides the actor that this trainer holds (all of them: the single
    process); Chapter 13's worker roles each keep only their own.
    """

    algorithm = "rlhf_ppo"

    def __init__(
        self,
        config: RLHFPPOConfig,
        actor: PreTrainedModel | None = None,
        tokenizer=None,
        reference: PreTrainedModel | None = None,
        critic: ValueHeadModel | None = None,
        reward_model: PreTrainedModel | None = None,
        reward_tokenizer=None,
        keep: Collection[str] = OTHER_MODELS,
    ):
        super().__init__(config)
        require(
            not isinstance(keep, str) and set(keep) <= set(OTHER_MODELS),
            "keep",
            f"a collection of names from {OTHER_MODELS}",
            keep,
        )
        self.keep = frozenset(keep)
        self.task = SortTask(config.num_digits)
        self.data = TaskData(self.task, seed=config.seed)
        if actor is None:
            require(config.sft_folder is not None, "sft_folder", "a saved SFT model's folder", None)
            actor = load_causal_lm(config.sft_folder, dtype=torch.float32)
            tokenizer = load_tokenizer(config.sft_folder)
        require(tokenizer is not None, "tokenizer", "the actor's tokenizer", tokenizer)
        self.tokenizer = tokenizer
        self.reward_model, self.reward_tokenizer = None, None
        builds_critic = critic is None
        needs_reward_model = "reward_model" in keep or (
            builds_critic and config.critic_from == "reward_model"
        )
        if config.reward == "model" and needs_reward_model:
            if reward_model is None:
                require(
                    config.reward_model_folder is not None,
                    "reward_model_folder",
                    "a saved reward model's folder (reward='model')",
                    None,
                )
                reward_model = load_reward_model(config.reward_model_folder, torch.float32)
                reward_tokenizer = load_tokenizer(config.reward_model_folder)
            reward_tokenizer = reward_tokenizer or tokenizer  # a tokenizer of its own is allowed
            require_pad_token(reward_tokenizer)
            require_matching_pad(reward_model, reward_tokenizer)
            self.reward_model = frozen(reward_model.to(config.device))
            self.reward_tokenizer = reward_tokenizer
        if builds_critic:
            # built even where it is not kept: its new value head draws from torch's random
            # streams, and a trainer that keeps only some models (Chapter 13's roles) must sample
            # what the whole trainer samples
            critic = self._critic_from_config(actor, tokenizer)
        if "critic" in keep:
            require_reads_actor_tokens(critic, actor)
        else:
            critic = None
        if "reward_model" not in keep:  # it was loaded only to build the critic from
            self.reward_model = None
        longest = max_prompt_tokens(tokenizer, self.task) + config.max_new_tokens
        layout = "<bos> prompt response (num_digits and max_new_tokens)"
        self.prepare(actor, longest, "num_digits", layout)
        self.model.eval()  # dropout off; see the class docstring
        # with LoRA, the reference is the actor with its adapters disabled: no second copy
        require(
            reference is None or config.lora_rank is None,
            "reference",
            "None when lora_rank is set (the reference is the actor with its adapters disabled)",
            type(reference).__name__,
        )
        self.reference = reference
        if config.lora_rank is None and self.reference is None and "reference" in keep:
            self.reference = copy.deepcopy(actor)
        if self.reference is not None:
            self.reference = frozen(self.reference.to(config.device))
        self.critic, self.critic_optimizer = None, None
        if "critic" in keep:
            self.critic = critic.to(config.device).eval()
            self.critic_optimizer = adamw_with_decay_groups(
                self.critic, config.critic_learning_rate, config.weight_decay
            )
        self.kl_controller = (
            AdaptiveKLController(config.kl_coef, config.target_kl, config.kl_horizon)
            if config.target_kl is not None
            else None
        )
        self.kl_coef = config.kl_coef
        self.shuffle = torch.Generator().manual_seed(config.seed)
        self.sampler = None
        if wants_separate_sampler(config):
            self.sampler = SeparateSampler(self.model, config.sampler_dtype, config.sampler_lag)

    def _critic_from_config(self, actor, tokenizer) -> ValueHeadModel:
        """The critic's backbone: the reward model's (it already reads sequences for their
        quality) or the actor's. It must read the actor's tokens, so a reward model with a
        tokenizer of its own cannot be the critic's start."""
        if self.config.critic_from == "policy":
            return ValueHeadModel.from_pretrained_model(actor)
        require(
            self.reward_model is not None,
            "critic_from",
            "'policy' when there is no reward model (reward='task')",
            self.config.critic_from,
        )
        require(
            self.reward_tokenizer.get_vocab() == tokenizer.get_vocab(),
            "critic_from",
            "'policy' when the reward model has a tokenizer of its own (the critic reads the "
            "policy's tokens)",
            self.config.critic_from,
        )
        return ValueHeadModel.from_pretrained_model(self.reward_model)

    @property
    def subject(self) -> str:
        return f"sort ({self.config.num_digits} digits), reward from the {self.config.reward}"

    @property
    def num_updates(self) -> int:
        return self.config.num_iterations

    # ---- one iteration ---------------------------------------------------------------------------

    def _update(self) -> dict[str, float]:
        self._require_every_model("a whole iteration")
        config, timer = self.config, PhaseTimer(PHASES, self.config.device)
        prompts = [example.prompt for example in self.data.train_batch(config.batch_size)]
        # the rollout's forward passes run under the same autocast as the training steps, so that
        # old and new log-probabilities (and values) are one computation and the first ratio is 1
        with timer("generate"), self.autocast():
            batch, sampler_logprobs = self._generate(prompts)
        mask = batch.response_mask
        with timer("score"):  # decoding included: the reward model reads text
            texts = batch.texts(self.tokenizer)
            scores = self._scores(prompts, texts, batch)
        with torch.no_grad(), self.autocast():
            with timer("reference"):
                ref_logprobs = self.reference_logprobs(batch)
            with timer("values"):
                values = response_values(self.critic, batch.prompts, batch.response_ids, mask)
            with timer("rewards"):
                rewards = shaped_rewards(batch, ref_logprobs, scores, self.kl_coef, config)
            with timer("advantages"):
                advantages, returns = ppo_advantages(
                    rewards, values, mask, config, self.ranks.whiten
                )
        with timer("ppo_epochs"):
            rollout = Minibatch.of(batch, advantages, returns, values, sampler_logprobs)
            stats = self._ppo_epochs(rollout)
        row = {
            "iteration": self.updates_done + 1,
            **rollout_stats(self.task, prompts, texts, scores, batch, ref_logprobs),
            "kl_coef": self.kl_coef,
            **stats,
            **{f"seconds_{phase}": seconds for phase, seconds in timer.seconds.items()},
        }
        if self.kl_controller is not None:
            responses = config.batch_size * self.ranks.world_size
            self.kl_coef = self.kl_controller.update(self.ranks.mean(row["kl"]), responses)
        return row

    def stepped_models(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        """The policy, and the critic where this trainer keeps it."""
        stepped = super().stepped_models()
        if self.critic is not None:
            stepped["critic"] = (self.critic, self.critic_optimizer)
        return stepped

    def _generate(self, prompts: list[str]) -> tuple[ResponseBatch, torch.Tensor | None]:
        """One response per prompt, from the actor or (``sampler_dtype``, ``sampler_lag``) its
        separate sampler; then the batch's log-probabilities are the actor's (PPO's old ones, and
        the KL's), and the sampler's come beside them."""
        config = self.config
        if self.sampler is None:
            batch = generate(
                self.model, self.tokenizer, prompts, config.max_new_tokens, config.temperature
            )
            # a correction against the actor itself weighs every token 1 (as GRPO's does)
            own = batch.logprobs.clone() if config.sampler_correction is not None else None
            return batch, own
        self.sampler.sync(self.model)
        batch = generate(
            self.sampler.model, self.tokenizer, prompts, config.max_new_tokens, config.temperature
        )
        with torch.no_grad():
            actor_logprobs = batch.logprobs_under(self.model)
        return dataclasses.replace(batch, logprobs=actor_logprobs), batch.logprobs

    def _scores(self, prompts: list[str], texts: list[str], batch: ResponseBatch) -> torch.Tensor:
        """The reward model's score of each decoded response (re-tokenized with its own tokenizer),
        or the task's verifiable reward; ``missing_eos_penalty`` off a response without EOS."""
        if self.config.reward == "task":
            scores = torch.tensor(list(map(self.task.reward, prompts, texts)))
        else:
            require(
                self.reward_model is not None,
                "keep",
                "'reward_model' among the kept models, to score with it",
                tuple(sorted(self.keep)),
            )
            scores = score(self.reward_model, self.reward_tokenizer, prompts, texts)
        scores = scores.to(batch.logprobs.device, batch.logprobs.dtype)
        if self.config.missing_eos_penalty is not None:
            ended = batch.ended(self.tokenizer.eos_token_id)
            scores = scores - self.config.missing_eos_penalty * (~ended).to(scores.dtype)
        return scores

    def reference_logprobs(self, batch: ResponseBatch) -> torch.Tensor:
        """The sampled tokens' log-probabilities under the reference, at the sampling
        temperature."""
        if self.reference is None:  # LoRA: the actor without its adapters
            with base_model(self.model) as reference:
                return batch.logprobs_under(reference)
        return batch.logprobs_under(self.reference)

    def _ppo_epochs(
        self, rollout: Minibatch, steps: Collection[str] = PPO_STEPS
    ) -> dict[str, float]:
        """``ppo_epochs`` passes over the responses in shuffled minibatches: a clipped policy step
        of the actor and a clipped value step of the critic on each. ``first_ratio_error`` is the
        largest ``|ratio - 1|`` of the first minibatch (averaged over its micro-batches, if any):
        0 up to rounding, since the rollout and the update compute the same log-probabilities.
        ``steps``: only the actor's or the critic's (the two never read each other's weights, so
        workers of their own take the same steps on the same minibatches)."""
        require(
            set(steps) <= set(PPO_STEPS) and len(steps) > 0,
            "steps",
            f"names from {PPO_STEPS}",
            steps,
        )
        config, sums, num_steps = self.config, {}, 0
        first_ratio_error = None
        for _ in range(config.ppo_epochs):
            order = torch.randperm(config.batch_size, generator=self.shuffle)
            for start in range(0, config.batch_size, config.minibatch_size):
                minibatch = rollout.select(order[start : start + config.minibatch_size])
                pieces = [
                    minibatch.select(torch.tensor(part))
                    for part in split(range(len(minibatch.response_ids)), config.micro_batch_size)
                ]
                weights = [float(piece.mask.sum()) for piece in pieces]
                actor = self._actor_step(pieces, weights) if "actor" in steps else {}
                critic = self._critic_step(pieces, weights) if "critic" in steps else {}
                if first_ratio_error is None and "actor" in steps:
                    first_ratio_error = actor["ratio_error"]
                actor.pop("ratio_error", None)
                for name, value in {**actor, **critic}.items():
                    sums[name] = sums.get(name, 0.0) + value
                num_steps += 1
        first = {"first_ratio_error": first_ratio_error} if "actor" in steps else {}
        return {**first, **{k: v / num_steps for k, v in sums.items()}}

    def _actor_step(self, pieces: list[Minibatch], weights: list[float]) -> dict[str, float]:
        """One AdamW step of the actor on the clipped surrogate (eq-ppo-clip), over a minibatch's
        micro-batches (``pieces``, weighted by their token counts)."""
        config = self.config

        def loss_of(piece: Minibatch):
            logprobs = response_logprobs(
                self.model, piece.prompts, piece.response_ids, piece.mask, config.temperature
            )
            correction = {}
            if config.sampler_correction is not None:
                correction = dict(
                    sampler_logprobs=piece.sampler_logprobs,
                    sampler_correction=config.sampler_correction,
                    sampler_cap=config.sampler_cap,
                )
            loss = clipped_policy_loss(
                logprobs,
                piece.old_logprobs,
                piece.advantages,
                config.clip_eps,
                piece.mask,
                **correction,
            )
            with torch.no_grad():
                valid = piece.mask != 0
                ratio = (logprobs - piece.old_logprobs).exp()
                metrics = {
                    "clip_fraction": clip_fraction(
                        logprobs, piece.old_logprobs, config.clip_eps, piece.mask
                    ),
                    "approx_kl": approx_kl(logprobs, piece.old_logprobs, piece.mask),
                    "ratio_error": (ratio[valid] - 1).abs().max(),
                }
                if piece.sampler_logprobs is not None:
                    metrics |= sampler_mismatch(
                        piece.old_logprobs, piece.sampler_logprobs, piece.mask, config.sampler_cap
                    )
                return loss, metrics

        stats = self.optimizer_step(pieces, weights, loss_of)
        stats["policy_loss"] = stats.pop("loss")
        stats["grad_norm_actor"] = stats.pop("grad_norm")
        stats.pop("learning_rate")
        return stats

    def _critic_step(self, pieces: list[Minibatch], weights: list[float]) -> dict[str, float]:
        """One AdamW step of the critic on the clipped value loss (eq-ppo-value-clip), over the
        same micro-batches, with its own optimizer at ``critic_learning_rate``'s schedule."""
        config = self.config

        def loss_of(piece: Minibatch):
            values = response_values(self.critic, piece.prompts, piece.response_ids, piece.mask)
            loss = clipped_value_loss(
                values, piece.old_values, piece.returns, config.value_clip_eps, piece.mask
            )
            return loss, {}

        stats = self.optimizer_step(
            pieces,
            weights,
            loss_of,
            model=self.critic,
            optimizer=self.critic_optimizer,
            peak_learning_rate=config.critic_learning_rate,
        )
        return {"value_loss": stats["loss"], "grad_norm_critic": stats["grad_norm"]}

    def evaluate(
        self, num_prompts: int | None = None, seed: int = 0, per_prompt: bool = False
    ) -> dict:
        """The policy on the first ``num_prompts`` held-out prompts (None: all 500;
        ``held_out_scores``): exact
        match, the oracle's gold score and the reward model's proxy score, greedy and sampled at
        the training temperature, and the KL to the reference (``per_prompt``: lists over the
        prompts, and the completions)."""
        prompts = heldout_prompts(self.data, num_prompts)
        has_reference = self.reference is not None or self.config.lora_rank is not None
        with torch.no_grad(), self.autocast():
            return held_out_scores(
                self.model,
                self.tokenizer,
                self.task,
                prompts,
                self.config.max_new_tokens,
                self.config.temperature,
                oracle=PreferenceOracle(self.task),
                reward_model=self.reward_model,
                reward_tokenizer=self.reward_tokenizer,
                reference_logprobs=self.reference_logprobs if has_reference else None,
                seed=seed,
                per_prompt=per_prompt,
            )

    def result(self) -> RLHFPPOResult:
        return RLHFPPOResult(
            self.config, self.model, self.history, critic=self.critic, tokenizer=self.tokenizer
        )

    # ---- state -------------------------------------------------------------------------------

    def _require_every_model(self, what: str) -> None:
        require(
            self.keep == set(OTHER_MODELS),
            "keep",
            f"every model {OTHER_MODELS} for {what} (a trainer of one of Chapter 13's roles "
            "holds only its own)",
            tuple(sorted(self.keep)),
        )

    def _state(self) -> dict:
        self._require_every_model("a checkpoint")
        return {
            **super()._state(),
            "critic": self.critic.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "kl_coef": self.kl_coef,
            "shuffle": self.shuffle.get_state(),
            "data_rng": random_state(self.data.train_rng),
            "sampler_states": [] if self.sampler is None else self.sampler.state_dict(),
        }

    def _load_state(self, state: dict) -> None:
        super()._load_state(state)
        self.critic.load_state_dict(state["critic"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.kl_coef = float(state["kl_coef"])
        if self.kl_controller is not None:
            self.kl_controller.value = self.kl_coef
        self.shuffle.set_state(state["shuffle"])
        set_random_state(self.data.train_rng, state["data_rng"])
        if self.sampler is not None:
            self.sampler.load_state_dict(state.get("sampler_states", []))


class RLHFPPOResult(LanguageModelResult):
    """The trained actor (``agent``, also ``model``), its critic and tokenizer, and the history."""


@dataclass
class Minibatch:
    """A minibatch of an iteration's responses with everything PPO's two steps read."""

    prompts: PromptBatch
    response_ids: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_values: torch.Tensor
    sampler_logprobs: torch.Tensor | None = None  # a separate sampler's, when there is one

    @classmethod
    def of(cls, batch: ResponseBatch, advantages, returns, old_values, sampler_logprobs=None):
        """An iteration's whole rollout: the sampled batch (its log-probabilities are PPO's old
        ones) with its advantages, returns and values."""
        return cls(
            batch.prompts,
            batch.response_ids,
            batch.response_mask,
            batch.logprobs,
            advantages,
            returns,
            old_values,
            sampler_logprobs,
        )

    def select(self, index: torch.Tensor) -> Minibatch:
        """The rows ``index``."""
        index = index.to(self.response_ids.device)
        fields = ("response_ids", "mask", "old_logprobs", "advantages", "returns", "old_values")
        sampler = None if self.sampler_logprobs is None else self.sampler_logprobs[index]
        return Minibatch(
            rows(self.prompts, index), *(getattr(self, name)[index] for name in fields), sampler
        )
