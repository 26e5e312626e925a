"""GRPO's pieces (Chapter 11): group advantages, the four loss types against a hand-written loop and
against TRL's own GRPOTrainer loss, and the bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.llm.grpo import group_advantages, grpo_loss, importance_log_ratio, overlong_penalty
from rlkit.losses import SAMPLER_CORRECTIONS, sampler_correction_weights
from tests.llm.trl_support import tiny_model_and_tokenizer, trl_cpu_config

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def batch(lengths, width=None, seed=0, drift=0.3):
    """Log-probs, old log-probs, reference log-probs, advantages and a right-padded mask."""
    generator = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    shape = (len(lengths), width)
    old = -torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 0.1
    logprobs = old + drift * torch.randn(shape, generator=generator, dtype=torch.float64)
    ref = old + 0.2 * torch.randn(shape, generator=generator, dtype=torch.float64)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    advantages = torch.randn(len(lengths), generator=generator, dtype=torch.float64)
    return logprobs.requires_grad_(), old, ref, advantages, mask


def loop_loss(
    logprobs, old, ref, advantages, mask, eps, eps_high, loss_type, max_len, beta, sequence
):
    """The loss written out token by token with Python floats."""
    logprobs = logprobs.detach()
    rows, total_tokens = [], 0
    for i in range(len(advantages)):
        n = int(mask[i].sum())
        total_tokens += n
        log_ratios = [float(logprobs[i, t] - old[i, t]) for t in range(n)]
        seq_ratio = math.exp(sum(log_ratios) / n)
        terms = []
        for t in range(n):
            r = seq_ratio if sequence else math.exp(log_ratios[t])
            a = float(advantages[i])
            term = -min(r * a, min(max(r, 1 - eps), 1 + eps_high) * a)
            if beta:
                d = float(ref[i, t] - logprobs[i, t])
                term += beta * (math.exp(d) - d - 1)
            terms.append(term)
        rows.append(terms)
    if loss_type == "grpo":
        return sum(sum(t) / len(t) for t in rows) / len(rows)
    if loss_type == "dr_grpo":
        return sum(map(sum, rows)) / (len(rows) * max_len)
    return sum(map(sum, rows)) / total_tokens


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("sequence", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_equals_a_hand_written_loop(loss_type, sequence, beta):
    logprobs, old, ref, advantages, mask = batch([3, 7, 5, 1], width=8)
    eps, eps_high = (3e-2, 4e-2) if sequence else (0.2, 0.28)
    loss = grpo_loss(
        logprobs,
        old,
        advantages,
        mask,
        eps,
        eps_high,
        loss_type,
        8,
        ref,
        beta,
        "sequence" if sequence else "token",
    )
    expected = loop_loss(
        logprobs, old, ref, advantages, mask, eps, eps_high, loss_type, 8, beta, sequence
    )
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_loss_types_agree_when_every_completion_has_one_length():
    logprobs, old, ref, advantages, mask = batch([6, 6, 6, 6], width=9)
    losses = {
        kind: grpo_loss(
            logprobs, old, advantages, mask, loss_type=kind, max_completion_length=6
        ).item()
        for kind in LOSS_TYPES
    }
    assert losses["bnpo"] == pytest.approx(losses["grpo"], rel=1e-12)
    assert losses["dapo"] == pytest.approx(losses["grpo"], rel=1e-12)
    assert losses["dr_grpo"] == pytest.approx(losses["grpo"], rel=1e-12)
    # with a longer max_completion_length, dr_grpo is the same loss scaled down
    longer = grpo_loss(
        logprobs, old, advantages, mask, loss_type="dr_grpo", max_completion_length=8
    ).item()
    assert longer == pytest.approx(losses["grpo"] * 6 / 8, rel=1e-12)


def test_per_sequence_normalisation_weighs_short_completions_more():
    """The length bias Dr. GRPO named: under "grpo" each token of a completion of length n weighs
    1 / n, so a short answer's tokens count more than a long one's; the token mean ("bnpo")
    weighs every token alike."""
    short, long_ = 2, 8
    logprobs = torch.zeros(2, long_, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1] * short + [0] * (long_ - short), [1] * long_])
    advantages = torch.tensor([1.0, 1.0], dtype=torch.float64)
    weights = {}
    for kind in ("grpo", "bnpo"):
        (grad,) = torch.autograd.grad(
            grpo_loss(logprobs, logprobs.detach(), advantages, mask, loss_type=kind), logprobs
        )
        weights[kind] = (grad[0, 0].item(), grad[1, 0].item())
    # the gradient of -r A at r = 1 is -A times the token's weight
    assert weights["grpo"] == pytest.approx((-1 / (2 * short), -1 / (2 * long_)))
    assert weights["bnpo"] == pytest.approx((-1 / (short + long_), -1 / (short + long_)))
    # so with positive advantages, grpo favours short correct answers; with negative ones it
    # punishes long wrong answers less per token: the sign of the bias
    assert abs(weights["grpo"][0]) > abs(weights["grpo"][1])


def test_dapo_gives_the_same_gradient_with_and_without_accumulation():
    logprobs, old, _, advantages, mask = batch([2, 7, 5, 3, 8, 1], width=8)
    whole = grpo_loss(logprobs, old, advantages, mask, loss_type="dapo")
    (expected,) = torch.autograd.grad(whole, logprobs)
    tokens = int(mask.sum())
    accumulated = torch.zeros_like(logprobs)
    for part in (slice(0, 2), slice(2, 5), slice(5, 6)):
        piece = grpo_loss(
            logprobs[part],
            old[part],
            advantages[part],
            mask[part],
            loss_type="dapo",
            num_tokens_in_batch=tokens,
        )
        (grad,) = torch.autograd.grad(piece, logprobs)
        accumulated += grad
    torch.testing.assert_close(accumulated, expected, rtol=1e-12, atol=1e-15)
    # bnpo's per-micro-batch token means, averaged, are another gradient
    bnpo = (
        sum(
            grpo_loss(logprobs[part], old[part], advantages[part], mask[part], loss_type="bnpo")
            for part in (slice(0, 2), slice(2, 5), slice(5, 6))
        )
        / 3
    )
    (other,) = torch.autograd.grad(bnpo, logprobs)
    assert not torch.allclose(other, expected)


def test_the_loss_ignores_padding_and_what_it_holds():
    logprobs, old, ref, advantages, mask = batch([3, 5, 2], width=5)
    base = grpo_loss(logprobs, old, advantages, mask, 0.2, 0.28, "grpo", None, ref, 0.1)
    wider = [
        torch.nn.functional.pad(t, (0, 4), value=value)
        for t, value in ((logprobs.detach(), 50.0), (old, -50.0), (ref, float("nan")))
    ]
    wide_mask = torch.nn.functional.pad(mask, (0, 4))
    for kind in ("grpo", "bnpo", "dapo"):
        narrow = grpo_loss(logprobs, old, advantages, mask, 0.2, 0.28, kind, None, ref, 0.1)
        padded = grpo_loss(
            wider[0], wider[1], advantages, wide_mask, 0.2, 0.28, kind, None, wider[2], 0.1
        )
        assert padded.item() == pytest.approx(narrow.item(), rel=1e-12)
    assert torch.isfinite(base)


def test_first_step_ratio_is_one_and_the_gradient_is_the_policy_gradient():
    logprobs, _, _, advantages, mask = batch([4, 6, 2])
    loss = grpo_loss(logprobs, logprobs.detach(), advantages, mask, loss_type="bnpo")
    (grad,) = torch.autograd.grad(loss, logprobs)
    expected = -advantages[:, None] * mask / mask.sum()
    torch.testing.assert_close(grad, expected.to(grad.dtype), rtol=1e-12, atol=1e-15)


def test_sequence_log_ratio_is_the_completion_s_mean_token_log_ratio():
    logprobs, old, _, _, mask = batch([3, 5, 2], width=6)
    tokens = importance_log_ratio(logprobs, old, mask, "token")
    sequence = importance_log_ratio(logprobs, old, mask, "sequence")
    for row, length in enumerate([3, 5, 2]):
        token_ratios = [(logprobs[row, t] - old[row, t]).item() for t in range(length)]
        assert tokens[row, :length].tolist() == pytest.approx(token_ratios, abs=1e-12)
        assert tokens[row, length:].abs().sum() == 0
        mean = sum(token_ratios) / length
        assert sequence[row, :length].tolist() == pytest.approx([mean] * length, abs=1e-12)


# ---- group advantages ------------------------------------------------------------------------


def test_group_advantages_match_the_written_out_formula():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 1.0, 1.0])
    advantages = group_advantages(rewards, 4)
    for g in range(2):
        group = rewards[4 * g : 4 * g + 4].double()
        expected = (group - group.mean()) / (group.std() + 1e-4)
        torch.testing.assert_close(
            advantages[4 * g : 4 * g + 4].double(), expected, rtol=1e-6, atol=1e-6
        )
    batch_scaled = group_advantages(rewards, 4, scale="batch")
    means = rewards.view(2, 4).mean(1).repeat_interleave(4)
    torch.testing.assert_close(batch_scaled, (rewards - means) / (rewards.std() + 1e-4))
    torch.testing.assert_close(group_advantages(rewards, 4, scale="none"), rewards - means)


def test_leave_one_out_is_the_mean_baseline_times_g_over_g_minus_one():
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.5, 0.2, 0.9])
    loo = group_advantages(rewards, 3, scale="none", baseline="leave_one_out")
    expected = torch.stack(
        [rewards[i] - (rewards.view(2, 3)[i // 3].sum() - rewards[i]) / 2 for i in range(6)]
    )
    torch.testing.assert_close(loo, expected)
    torch.testing.assert_close(loo, group_advantages(rewards, 3, scale="none") * 3 / 2)


def test_a_constant_group_gives_zeros_never_nan():
    rewards = torch.tensor([0.1] * 3 + [0.7, 0.7, 0.2] + [1 / 3] * 3)
    for scale in ("group", "batch", "none"):
        for baseline in ("mean", "leave_one_out"):
            advantages = group_advantages(rewards, 3, scale, baseline)
            assert torch.isfinite(advantages).all()
            assert advantages[:3].eq(0).all() and advantages[6:].eq(0).all()
            assert advantages[3:6].ne(0).all()


def test_overlong_penalty_is_dapo_s_soft_punishment():
    lengths = torch.tensor([4, 6, 7, 8, 9])
    penalty = overlong_penalty(lengths, max_length=8, buffer=4)
    torch.testing.assert_close(penalty, torch.tensor([0.0, -0.5, -0.75, -1.0, -1.0]))


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: group_advantages(torch.zeros(6), 4), "rewards"),
        (lambda: group_advantages(torch.zeros(6), 1), "group_size"),
        (lambda: group_advantages(torch.zeros(6), 3, scale="std"), "scale"),
        (lambda: group_advantages(torch.zeros(6), 3, baseline="median"), "baseline"),
    ],
)
def test_bad_advantage_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(loss_type="token_mean"), "loss_type"),
        (dict(loss_type="dr_grpo"), "max_completion_length"),
        (dict(clip_eps=0.2, clip_eps_high=0.1), "clip_eps_high"),
        (dict(beta=0.1), "ref_logprobs"),
        (dict(importance_sampling="group"), "importance_sampling"),
    ],
)
def test_bad_loss_input_names_the_field(kwargs, field):
    logprobs, old, _, advantages, mask = batch([2, 3])
    with pytest.raises(ValueError, match=field):
        grpo_loss(logprobs, old, advantages, mask, **kwargs)


# ---- TRL ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trl_trainer(tmp_path_factory):
    """TRL's GRPOTrainer on a tiny model, one process, one accumulation step; its per-token
    log-prob function is patched per call to return the log-probs under test."""
    trl = pytest.importorskip("trl", minversion="1.0")
    from datasets import Dataset

    model, tokenizer = tiny_model_and_tokenizer()
    args = trl_cpu_config(
        trl.GRPOConfig,
        tmp_path_factory.mktemp("trl-grpo"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        gradient_accumulation_steps=1,
        beta=0.0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["S123456:"] * 8}),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # what training_step sets
    return trainer


def trl_loss(
    trainer,
    logprobs,
    old,
    ref,
    advantages,
    mask,
    loss_type,
    eps,
    eps_high,
    beta,
    level,
    num_items,
    **extra_inputs,
):
    trainer.loss_type, trainer.beta = loss_type, beta
    trainer.epsilon_low, trainer.epsilon_high = eps, eps_high
    trainer.importance_sampling_level = level
    trainer.max_completion_length = mask.shape[1]
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (
        logprobs,
        torch.zeros_like(logprobs),
    )
    inputs = {
        "prompt_ids": torch.zeros(len(advantages), 1, dtype=torch.long),
        "prompt_mask": torch.ones(len(advantages), 1, dtype=torch.long),
        "completion_ids": torch.zeros_like(mask),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": num_items,
        **extra_inputs,
    }
    if beta:
        inputs["ref_per_token_logps"] = ref
    return trainer._compute_loss(trainer.model, inputs)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize(
    "eps, eps_high, beta, level",
    [
        (0.2, 0.2, 0.0, "token"),
        (0.2, 0.28, 0.0, "token"),
        (0.2, 0.2, 0.04, "token"),
        (3e-2, 4e-2, 0.0, "sequence"),
        (3e-2, 4e-2, 0.04, "sequence"),
    ],
)
def test_loss_equals_trl_grpo_trainer_loss(trl_trainer, loss_type, eps, eps_high, beta, level):
    """What was compared: TRL 1.x's GRPOTrainer._compute_loss, its own code from the per-token
    log-probs on, with its log-prob function patched to return ``logprobs``; given
    old_per_token_logps (so the ratio is not 1 and the clip is exercised), ref_per_token_logps,
    the advantages, the completion mask and num_items_in_batch, in one process with one
    accumulation step; against grpo_loss on the same tensors, in float32."""
    logprobs, old, ref, advantages, mask = batch([3, 8, 5, 1, 6, 8], width=8, drift=0.15)
    logprobs, old, ref, advantages = (t.detach().float() for t in (logprobs, old, ref, advantages))
    num_items = int(mask.sum())
    expected = trl_loss(
        trl_trainer,
        logprobs,
        old,
        ref,
        advantages,
        mask.float(),
        loss_type,
        eps,
        eps_high,
        beta,
        level,
        num_items,
    )
    ours = grpo_loss(
        logprobs, old, advantages, mask, eps, eps_high, loss_type, 8, ref, beta, level, num_items
    )
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)
    # the clip was exercised: some ratios lie outside the range
    ratio = (logprobs - old).exp()[mask.bool()]
    assert ((ratio > 1 + eps_high) | (ratio < 1 - eps)).any()


@pytest.mark.parametrize("mode", SAMPLER_CORRECTIONS)
@pytest.mark.parametrize("loss_type, beta", [("grpo", 0.0), ("grpo", 0.04), ("dapo", 0.04)])
def test_the_sampler_correction_weighs_the_loss_as_trl_does(trl_trainer, mode, loss_type, beta):
    """What was compared: TRL 1.x's GRPOTrainer._compute_loss with its vLLM importance-sampling
    correction on (``use_vllm`` and ``vllm_importance_sampling_correction`` set on the trainer,
    ``importance_sampling_ratio`` in its inputs), which multiplies each token's clipped term by
    the ratio before adding the KL term; given rlkit's weights (TRL computes its ratio inline while
    it generates, so the weights themselves are compared with the written-out correction in
    tests/test_losses.py), against grpo_loss with ``sampler_logprobs``, in float32."""
    logprobs, old, ref, advantages, mask = batch([3, 8, 5, 1, 6, 8], width=8, drift=0.15)
    logprobs, old, ref, advantages = (t.detach().float() for t in (logprobs, old, ref, advantages))
    sampler = old + 0.5 * torch.randn(old.shape, generator=torch.Generator().manual_seed(9))
    weights = sampler_correction_weights(old, sampler, mask, mode, cap=1.5)
    trl_trainer.use_vllm, trl_trainer.vllm_importance_sampling_correction = True, True
    try:
        expected = trl_loss(
            trl_trainer,
            logprobs,
            old,
            ref,
            advantages,
            mask.float(),
            loss_type,
            0.2,
            0.2,
            beta,
            "token",
            int(mask.sum()),
            importance_sampling_ratio=(weights[:, :1] if mode.startswith("sequence") else weights),
        )
    finally:
        trl_trainer.use_vllm, trl_trainer.vllm_importance_sampling_correction = False, False
    settings = dict(
        loss_type=loss_type,
        max_completion_length=8,
        ref_logprobs=ref,
        beta=beta,
        num_tokens_in_batch=int(mask.sum()),
    )
    ours = grpo_loss(
        logprobs,
        old,
        advantages,
        mask,
        0.2,
        **settings,
        sampler_logprobs=sampler,
        sampler_correction=mode,
        sampler_cap=1.5,
    )
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)
    uncorrected = grpo_loss(logprobs, old, advantages, mask, 0.2, **settings)
    assert abs(ours.item() - uncorrected.item()) > 1e-3  # the correction mattered
