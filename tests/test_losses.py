"""rlkit.losses against DeepSpeed-Chat's actor and critic losses, closed forms and exact KLs."""

import math

import pytest
import torch

from rlkit.losses import (
    SAMPLER_CORRECTIONS,
    approx_kl,
    clip_fraction,
    clipped_policy_loss,
    clipped_surrogate_terms,
    clipped_value_loss,
    entropy,
    explained_variance,
    kl_estimate,
    masked_mean,
    masked_whiten,
    policy_gradient_loss,
    sampler_correction_weights,
)
from tests.oracles import deepspeed_chat_actor_loss, deepspeed_chat_critic_loss


def right_padded_mask(batch, length, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    return (torch.arange(length)[None, :] < lengths[:, None]).double()


def test_masked_mean_counts_only_valid_entries():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_mean(x, mask) == pytest.approx(2.0)
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 3.0]))
    assert masked_mean(x) == pytest.approx(x.mean().item())
    with pytest.raises(ValueError, match="no valid entries"):
        masked_mean(x, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="mask"):
        masked_mean(x, torch.ones(3))


def test_masked_whiten_standardises_valid_entries_and_zeroes_padding():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 9, generator=gen, dtype=torch.float64) * 3 + 5
    mask = right_padded_mask(4, 9, seed=1)
    whitened = masked_whiten(x, mask)
    valid = whitened[mask.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-12)
    assert valid.var(unbiased=True).item() == pytest.approx(1.0, rel=1e-6)
    assert torch.all(whitened[~mask.bool()] == 0)
    x2 = x.clone()
    x2[~mask.bool()] = 1e9  # padding must not move the statistics
    torch.testing.assert_close(masked_whiten(x2, mask), whitened)


def test_policy_gradient_loss_is_minus_mean_logprob_times_advantage_and_detaches_advantages():
    logprobs = torch.randn(3, 4, requires_grad=True)
    advantages = torch.randn(3, 4, requires_grad=True)
    mask = right_padded_mask(3, 4).float()
    loss = policy_gradient_loss(logprobs, advantages, mask)
    expected = -(logprobs * advantages * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    assert advantages.grad is None
    torch.testing.assert_close(logprobs.grad, -advantages.detach() * mask / mask.sum())


@pytest.mark.parametrize("seed", range(5))
def test_clipped_policy_loss_equals_deepspeed_chat(seed):
    gen = torch.Generator().manual_seed(seed)
    logprobs = torch.randn(5, 7, generator=gen, dtype=torch.float64) * 0.3
    old_logprobs = logprobs + torch.randn(5, 7, generator=gen, dtype=torch.float64) * 0.3
    advantages = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    mask = right_padded_mask(5, 7, seed)
    ours = clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, mask=mask)
    theirs = deepspeed_chat_actor_loss(logprobs, old_logprobs, advantages, mask, 0.2)
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-12)


def test_clipped_policy_loss_is_minus_mean_advantage_at_ratio_one():
    logprobs = torch.randn(4, 6, dtype=torch.float64)
    advantages = torch.randn(4, 6, dtype=torch.float64)
    mask = right_padded_mask(4, 6)
    loss = clipped_policy_loss(logprobs, logprobs.clone(), advantages, mask=mask)
    assert loss.item() == pytest.approx(-masked_mean(advantages, mask).item(), abs=1e-12)


@pytest.mark.parametrize(
    "log_ratio, advantage, gradient_is_zero",
    [
        (math.log(1.5), 1.0, True),  # positive advantage, ratio above 1 + eps: clipped
        (math.log(0.5), -1.0, True),  # negative advantage, ratio below 1 - eps: clipped
        (math.log(1.1), 1.0, False),  # inside the range
        # positive advantage, ratio below: the unclipped term is the max
        (
            math.log(0.5),
            1.0,
            False,
        ),
        (math.log(1.5), -1.0, False),  # negative advantage, ratio above: unclipped, pessimistic
    ],
)
def test_clipped_policy_loss_gradient_vanishes_exactly_on_the_clipped_side(
    log_ratio, advantage, gradient_is_zero
):
    old = torch.zeros(1, 1, dtype=torch.float64)
    new = torch.full((1, 1), log_ratio, dtype=torch.float64, requires_grad=True)
    clipped_policy_loss(
        new, old, torch.full((1, 1), advantage, dtype=torch.float64), clip_eps=0.2
    ).backward()
    assert (new.grad.item() == 0.0) == gradient_is_zero


def test_clip_eps_high_widens_only_the_upper_side():
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = torch.tensor([[math.log(1.25), math.log(0.75)]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    symmetric = clipped_policy_loss(new, old, advantages, clip_eps=0.2)
    higher = clipped_policy_loss(new, old, advantages, clip_eps=0.2, clip_eps_high=0.28)
    assert symmetric.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert higher.item() == pytest.approx((-1.25 + 0.8) / 2)
    # 1.25 and 0.75 both outside [0.8, 1.2]
    assert clip_fraction(new, old, 0.2).item() == pytest.approx(1.0)
    assert clip_fraction(new, old, 0.2, clip_eps_high=0.28).item() == pytest.approx(0.5)


@pytest.mark.parametrize("seed", range(5))
def test_clipped_value_loss_equals_deepspeed_chat(seed):
    gen = torch.Generator().manual_seed(seed)
    values, old_values, returns = (
        torch.randn(5, 7, generator=gen, dtype=torch.float64) for _ in range(3)
    )
    mask = right_padded_mask(5, 7, seed)
    ours = clipped_value_loss(values, old_values, returns, clip_eps=0.2, mask=mask)
    assert ours.item() == pytest.approx(
        deepspeed_chat_critic_loss(values, old_values, returns, mask, 0.2).item()
    )


def test_clipped_value_loss_is_half_mse_inside_the_clip_range_and_without_clipping():
    gen = torch.Generator().manual_seed(0)
    old_values = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    # |V - V_old| < 0.2
    values = old_values + 0.1 * torch.rand(3, 5, generator=gen, dtype=torch.float64)
    returns = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    half_mse = 0.5 * ((values - returns) ** 2).mean()
    assert clipped_value_loss(values, old_values, returns, clip_eps=0.2).item() == pytest.approx(
        half_mse.item()
    )
    far = old_values + 5.0
    assert clipped_value_loss(far, old_values, returns, clip_eps=None).item() == pytest.approx(
        (0.5 * ((far - returns) ** 2).mean()).item()
    )


def test_entropy_matches_torch_distributions_and_log_n_for_uniform():
    logits = torch.randn(3, 4, 6, dtype=torch.float64)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy(logits), expected)
    assert entropy(torch.zeros(1, 6)).item() == pytest.approx(math.log(6), rel=1e-6)


def test_entropy_ignores_masked_actions():
    masked = torch.tensor([[0.0, 0.0, float("-inf")]])
    assert entropy(masked).item() == pytest.approx(math.log(2))


def test_k3_is_non_negative_everywhere():
    log_ratio = torch.linspace(-30, 30, 10001, dtype=torch.float64)
    assert torch.all(kl_estimate(torch.zeros_like(log_ratio), log_ratio, "k3") >= 0)
    assert torch.all(kl_estimate(torch.zeros(100), torch.randn(100) * 5, "k3") >= 0)


def test_k1_and_k2_are_their_closed_forms():
    logprobs, ref = torch.randn(4, 5), torch.randn(4, 5)
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k1"), logprobs - ref)
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k2"), 0.5 * (logprobs - ref) ** 2)


@pytest.mark.parametrize("seed", range(3))
def test_monte_carlo_means_of_k1_and_k3_match_the_exact_kl_of_two_categoricals(seed):
    gen = torch.Generator().manual_seed(seed)
    p_logits, q_logits = (
        torch.randn(8, generator=gen, dtype=torch.float64),
        torch.randn(8, generator=gen, dtype=torch.float64),
    )
    log_p, log_q = torch.log_softmax(p_logits, 0), torch.log_softmax(q_logits, 0)
    exact = (log_p.exp() * (log_p - log_q)).sum()
    samples = torch.multinomial(log_p.exp(), 200_000, replacement=True, generator=gen)
    for kind in ("k1", "k3"):
        per_sample = kl_estimate(log_p[samples], log_q[samples], kind)
        standard_error = per_sample.std() / math.sqrt(samples.numel())
        assert abs(per_sample.mean() - exact) < 4 * standard_error, kind
    k2 = kl_estimate(log_p[samples], log_q[samples], "k2").mean()
    assert k2 > 0  # biased but close when p and q are close; not asserted equal


def test_approx_kl_is_k3_of_old_against_new_and_explained_variance_bounds():
    old = torch.randn(100, dtype=torch.float64)
    new = old + 0.1 * torch.randn(100, dtype=torch.float64)
    expected = ((new - old).exp() - 1 - (new - old)).mean()
    assert approx_kl(new, old).item() == pytest.approx(expected.item())
    returns = torch.randn(50, dtype=torch.float64)
    assert explained_variance(returns, returns).item() == pytest.approx(1.0)
    assert explained_variance(
        torch.full_like(returns, returns.mean().item()), returns
    ).item() == pytest.approx(0.0)


@pytest.mark.parametrize(
    "call, name",
    [
        (
            lambda: clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3)),
            "old_logprobs",
        ),
        (
            lambda: clipped_policy_loss(
                torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), clip_eps=0.0
            ),
            "clip_eps",
        ),
        (
            lambda: clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3, 2)),
            "advantages",
        ),
        (
            lambda: clipped_value_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2)),
            "returns",
        ),
        (
            lambda: clipped_value_loss(
                torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), clip_eps=-1
            ),
            "clip_eps",
        ),
        (
            lambda: policy_gradient_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2)),
            "mask",
        ),
        (lambda: kl_estimate(torch.zeros(3), torch.zeros(3), "k4"), "kind"),
        (lambda: kl_estimate(torch.zeros(3), torch.zeros(4), "k1"), "ref_logprobs"),
    ],
)
def test_bad_input_raises_a_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize("garbage", [100.0, float("inf"), float("-inf"), float("nan")])
def test_garbage_on_padding_reaches_neither_a_loss_nor_a_gradient(garbage):
    """Padding holds anything in practice (a log-prob of a pad token, a value read past the EOS):
    the masked losses and diagnostics must equal the ones computed with zeros there, with finite
    gradients that are 0 there."""
    torch.manual_seed(0)
    mask = right_padded_mask(4, 6, seed=2).float()
    padding = ~mask.bool()

    def inputs(fill):
        tensors = [torch.randn(4, 6) for _ in range(5)]
        for tensor in tensors:
            tensor[padding] = fill
        return [tensor.requires_grad_() for tensor in tensors]

    def results(tensors):
        logprobs, old_logprobs, advantages, values, returns = tensors
        return {
            "masked_mean": masked_mean(logprobs, mask),
            "masked_mean_rows": masked_mean(logprobs, mask, dim=1).sum(),
            "masked_whiten": masked_whiten(advantages, mask).square().sum(),
            "policy_gradient_loss": policy_gradient_loss(logprobs, advantages, mask),
            "clipped_policy_loss": clipped_policy_loss(
                logprobs, old_logprobs, advantages, 0.2, mask
            ),
            "clipped_value_loss": clipped_value_loss(values, old_logprobs, returns, 0.2, mask),
            "approx_kl": approx_kl(logprobs, old_logprobs, mask),
            "clip_fraction": clip_fraction(logprobs, old_logprobs, 0.2, mask),
            "explained_variance": explained_variance(values, returns, mask),
        }

    dirty, clean = inputs(garbage), inputs(0.0)
    for tensor_dirty, tensor_clean in zip(dirty, clean):  # the same valid entries
        tensor_clean.data[~padding] = tensor_dirty.data[~padding]
    dirty_results, clean_results = results(dirty), results(clean)
    for name, value in dirty_results.items():
        torch.testing.assert_close(value, clean_results[name], msg=name)
        if value.requires_grad:
            gradients = torch.autograd.grad(
                value, [t for t in dirty if t.requires_grad], allow_unused=True
            )
            for gradient in gradients:
                if gradient is not None:
                    assert torch.isfinite(gradient).all(), name
                    assert torch.all(gradient[padding] == 0), name


# ---- truncated importance sampling for a sampler that is not the trainer ------------------------


def hand_written_sampler_weights(old, sampler, mask, mode, cap):
    """TRL's correction (GRPOTrainer, vllm_importance_sampling_mode), written out row by row in
    Python floats: a token's ratio exp(old - sampler), or a sequence's, the exp of its real tokens'
    summed log ratios; above the cap, truncated to it or set to 0; padding 0."""
    weights = torch.zeros_like(old, dtype=torch.float64)
    for b in range(old.shape[0]):
        real = [t for t in range(old.shape[1]) if mask[b, t] == 1]
        sequence = math.exp(sum(float(old[b, t] - sampler[b, t]) for t in real))
        for t in real:
            w = (
                sequence
                if mode.startswith("sequence")
                else math.exp(float(old[b, t] - sampler[b, t]))
            )
            weights[b, t] = min(w, cap) if mode.endswith("truncate") else (0.0 if w > cap else w)
    return weights


def sampler_case(seed, batch=8, length=7):
    gen = torch.Generator().manual_seed(seed)
    mask = right_padded_mask(batch, length, seed=seed)
    old = -3 * torch.rand(batch, length, generator=gen, dtype=torch.float64)
    sampler = old + 0.6 * torch.randn(batch, length, generator=gen, dtype=torch.float64)
    sampler[~mask.bool()] = float("inf")  # padding holds anything
    return old, sampler, mask


@pytest.mark.parametrize("mode", SAMPLER_CORRECTIONS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampler_correction_weights_equal_the_written_out_correction(mode, seed):
    old, sampler, mask = sampler_case(seed)
    got = sampler_correction_weights(old, sampler, mask, mode, cap=1.5)
    want = hand_written_sampler_weights(old, sampler, mask, mode, 1.5)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the case reaches both sides of the cap, so truncation and masking are exercised
    ratios = hand_written_sampler_weights(old, sampler, mask, mode, math.inf)
    assert (ratios > 1.5).any() and ((ratios > 0) & (ratios < 1.5)).any()


@pytest.mark.parametrize("mode", SAMPLER_CORRECTIONS)
def test_a_sampler_that_is_the_trainer_changes_nothing(mode):
    """Sampler and trainer agree: every weight is 1 on real tokens, and the loss is the
    uncorrected one, value and gradient."""
    old, _, mask = sampler_case(3)
    gen = torch.Generator().manual_seed(4)
    advantages = torch.randn(8, 7, generator=gen, dtype=torch.float64)
    logprobs = old + 0.3 * torch.randn(8, 7, generator=gen, dtype=torch.float64)
    assert torch.equal(sampler_correction_weights(old, old.clone(), mask, mode), mask)

    def loss_and_gradient(**correction):
        start = logprobs.clone().requires_grad_()
        loss = clipped_policy_loss(start, old, advantages, 0.2, mask, **correction)
        return loss, torch.autograd.grad(loss, start)[0]

    plain = loss_and_gradient()
    corrected = loss_and_gradient(sampler_logprobs=old.clone(), sampler_correction=mode)
    torch.testing.assert_close(corrected, plain, rtol=1e-15, atol=0)


def test_the_weights_scale_each_term_of_ppo_loss_and_carry_no_gradient():
    """clipped_policy_loss with a sampler is the token mean of weight x clipped term; the weights
    are constants even when the sampler's log-probabilities require a gradient."""
    old, sampler, mask = sampler_case(5)
    gen = torch.Generator().manual_seed(6)
    advantages = torch.randn(8, 7, generator=gen, dtype=torch.float64)
    logprobs = (old + 0.3 * torch.randn(8, 7, generator=gen, dtype=torch.float64)).requires_grad_()
    sampler = sampler.requires_grad_()
    loss = clipped_policy_loss(
        logprobs, old, advantages, 0.2, mask, sampler_logprobs=sampler, sampler_cap=2.0
    )
    weights = hand_written_sampler_weights(old, sampler.detach(), mask, "token_truncate", 2.0)
    terms = clipped_surrogate_terms(torch.exp(logprobs - old), advantages, 0.2)
    want = (torch.where(mask.bool(), weights * terms, 0.0)).sum() / mask.sum()
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    loss.backward()
    assert sampler.grad is None and torch.isfinite(logprobs.grad).all()


@pytest.mark.parametrize(
    ("keywords", "name"),
    [
        (dict(mode="tis"), "sampler_correction"),
        (dict(cap=0.5), "sampler_cap"),
        (dict(cap=float("nan")), "sampler_cap"),
        (dict(cap=float("inf")), "sampler_cap"),
        (dict(sampler_logprobs=torch.zeros(2, 4)), "sampler_logprobs"),
    ],
)
def test_bad_sampler_correction_settings_name_the_field(keywords, name):
    arguments = dict(old_logprobs=torch.zeros(2, 3), sampler_logprobs=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=name):
        sampler_correction_weights(**(arguments | keywords))


def test_a_sequence_correction_needs_one_sequence_a_row():
    with pytest.raises(ValueError, match="sequence_mask"):
        sampler_correction_weights(torch.zeros(6), torch.zeros(6), None, "sequence_mask")
