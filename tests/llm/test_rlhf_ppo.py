"""compute_rewards against a plain loop, and the correctness checklist items it owns: the clipped
score once per row at the last valid token, no KL penalty when the policy is the reference,
nothing on padding and nothing that padding changes, and clear errors for bad input."""

from __future__ import annotations

import pytest
import torch

from rlkit.advantages import gae
from rlkit.llm.rlhf_ppo import compute_rewards, last_token_index
from rlkit.losses import KL_ESTIMATORS


def reference_rewards(logprobs, ref_logprobs, scores, mask, kl_coef, clip_reward, kl_kind):
    """One row and one token at a time, in Python floats."""
    out = torch.zeros(logprobs.shape, dtype=torch.float64)
    for b in range(logprobs.shape[0]):
        valid = [t for t in range(logprobs.shape[1]) if mask[b, t] != 0]
        for t in valid:
            log_r = float(ref_logprobs[b, t]) - float(logprobs[b, t])
            kl = {
                "k1": -log_r,
                "k2": 0.5 * log_r**2,
                "k3": torch.tensor(log_r).expm1().item() - log_r,
            }
            out[b, t] = -kl_coef * kl[kl_kind]
        out[b, valid[-1]] += min(max(float(scores[b]), -clip_reward), clip_reward)
    return out


def random_batch(seed, batch=5, length=7):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0] = length  # one row without padding
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    logprobs = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3
    ref_logprobs = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3
    scores = 4 * torch.randn(batch, generator=gen, dtype=torch.float64)
    return logprobs, ref_logprobs, scores, mask


@pytest.mark.parametrize("kl_kind", KL_ESTIMATORS)
@pytest.mark.parametrize("seed", range(4))
def test_rewards_match_a_plain_loop(seed, kl_kind):
    logprobs, ref_logprobs, scores, mask = random_batch(seed)
    got = compute_rewards(logprobs, ref_logprobs, scores, mask, 0.1, 2.0, kl_kind)
    want = reference_rewards(logprobs, ref_logprobs, scores, mask, 0.1, 2.0, kl_kind)
    torch.testing.assert_close(got, want)


def test_the_clipped_score_appears_once_at_the_last_valid_token():
    logprobs, _, scores, mask = random_batch(0)
    rewards = compute_rewards(logprobs, logprobs.clone(), scores, mask, 0.5, 1.5)
    # the policy is the reference: no KL penalty anywhere, so only the scores remain
    nonzero = rewards.nonzero().tolist()
    last = (mask.sum(dim=1) - 1).long()
    assert nonzero == [[b, int(last[b])] for b in range(len(scores)) if scores[b] != 0]
    torch.testing.assert_close(rewards.sum(dim=1), scores.clamp(-1.5, 1.5))


def test_padding_neither_gets_a_reward_nor_changes_one():
    logprobs, ref_logprobs, scores, mask = random_batch(1)
    rewards = compute_rewards(logprobs, ref_logprobs, scores, mask, 0.2, 3.0)
    assert (rewards[mask == 0] == 0).all()
    # three more columns of padding, holding garbage log-probs
    pad = torch.full((mask.shape[0], 3), -50.0, dtype=torch.float64)
    wider = compute_rewards(
        torch.cat([logprobs, pad], 1),
        torch.cat([ref_logprobs, pad + 7], 1),
        scores,
        torch.cat([mask, torch.zeros_like(pad)], 1),
        0.2,
        3.0,
    )
    torch.testing.assert_close(wider[:, : mask.shape[1]], rewards)
    assert (wider[:, mask.shape[1] :] == 0).all()


def test_token_level_gae_does_not_leak_into_padding_and_padding_does_not_change_it():
    logprobs, ref_logprobs, scores, mask = random_batch(2)
    rewards = compute_rewards(logprobs, ref_logprobs, scores, mask, 0.05, 5.0)
    values = torch.randn(
        mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9)
    )
    advantages, returns = gae(rewards, values, 1.0, 0.95, mask=mask)
    assert (advantages[mask == 0] == 0).all() and (returns[mask == 0] == 0).all()
    for b in range(mask.shape[0]):  # each row alone, cut at its last valid token: the same numbers
        n = int(mask[b].sum())
        alone, _ = gae(rewards[b : b + 1, :n], values[b : b + 1, :n], 1.0, 0.95)
        torch.testing.assert_close(advantages[b, :n], alone[0])


def test_last_token_index_reads_right_and_left_padding():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 1, 1], [1, 0, 0, 0]])
    assert last_token_index(mask).tolist() == [1, 3, 3, 0]


def test_rewards_carry_no_gradient():
    logprobs, ref_logprobs, scores, mask = random_batch(3)
    logprobs.requires_grad_()
    assert not compute_rewards(logprobs, ref_logprobs, scores, mask, 0.1, 1.0).requires_grad


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(kl_coef=-0.1), "kl_coef must be a number >= 0"),
        (dict(kl_coef=float("nan")), "kl_coef must be a number >= 0"),
        (dict(clip_reward=0.0), "clip_reward must be a number > 0"),
        (dict(kl_kind="k4"), "kl_kind must be one of"),
    ],
)
def test_bad_settings_name_the_field(change, field):
    logprobs, ref_logprobs, scores, mask = random_batch(0)
    settings = dict(kl_coef=0.1, clip_reward=1.0, kl_kind="k1") | change
    with pytest.raises(ValueError, match=field):
        compute_rewards(logprobs, ref_logprobs, scores, mask, **settings)


def test_an_empty_response_and_mismatched_shapes_are_refused():
    logprobs, ref_logprobs, scores, mask = random_batch(0)
    empty = mask.clone()
    empty[2] = 0
    with pytest.raises(ValueError, match="mask must be at least one response token in every row"):
        compute_rewards(logprobs, ref_logprobs, scores, empty, 0.1, 1.0)
    with pytest.raises(ValueError, match="scores must be a \\[B\\] tensor"):
        compute_rewards(logprobs, ref_logprobs, scores[:-1], mask, 0.1, 1.0)
    with pytest.raises(ValueError, match="ref_logprobs and mask must be"):
        compute_rewards(logprobs, ref_logprobs[:, :-1], scores, mask, 0.1, 1.0)


# ---- The seed's code: DeepSpeed-Chat's compute_rewards on the same batch. ------------------------


def full_sequence_layout(logprobs, ref_logprobs, mask, prompt_length):
    """rlkit's response columns placed where DeepSpeed-Chat keeps them: log-prob column i holds
    token i + 1 of prompt-and-response, so response token t sits at column prompt_length - 1 + t;
    the prompt's columns hold log-probs that the rewards must not read (here 0)."""
    batch = logprobs.shape[0]
    prompt_cols = torch.zeros(batch, prompt_length - 1, dtype=logprobs.dtype)
    attention = torch.cat([torch.ones(batch, prompt_length), mask], dim=1)
    return (
        torch.cat([prompt_cols, logprobs], 1),
        torch.cat([prompt_cols, ref_logprobs], 1),
        attention[:, 1:].long(),  # DeepSpeed-Chat's action_mask (integers)
    )


def test_deepspeed_chat_agrees_where_no_response_is_padded():
    from tests.oracles import deepspeed_chat_compute_rewards

    logprobs, ref_logprobs, scores, _ = random_batch(4)
    mask = torch.ones_like(logprobs)  # every response fills the batch's width
    prompt_length = 3
    ds_logprobs, ds_ref, action_mask = full_sequence_layout(
        logprobs, ref_logprobs, mask, prompt_length
    )
    ds = deepspeed_chat_compute_rewards(
        torch.zeros(len(scores), prompt_length), ds_logprobs, ds_ref, scores, action_mask, 0.1, 2.0
    )
    ours = compute_rewards(logprobs, ref_logprobs, scores, mask, 0.1, 2.0)
    torch.testing.assert_close(ds[:, prompt_length - 1 :], ours)


def test_deepspeed_chat_puts_the_score_one_past_a_padded_responses_last_token():
    """``ends = start + action_mask[:, start:].sum(1) + 1`` counts the response's n tokens from
    ``start``, so ``rewards[j, start:ends[j]][-1]`` is column start + n: the first padding column,
    one past the last token (start + n - 1). Only a response that fills the width gets the score on
    its last token, because the slice is cut at the end of the tensor. (DeepSpeed-Chat builds its
    mask as ``seq != pad_token_id``: where the pad id is the EOS id, EOS falls outside the mask and
    that column is the EOS itself. Here, as in rlkit, the mask includes the EOS.)"""
    from tests.oracles import deepspeed_chat_compute_rewards

    logprobs, ref_logprobs, scores, mask = random_batch(5)
    prompt_length, width = 3, mask.shape[1]
    ds_logprobs, ds_ref, action_mask = full_sequence_layout(
        logprobs, ref_logprobs, mask, prompt_length
    )
    same = logprobs.clone()
    ds = deepspeed_chat_compute_rewards(
        torch.zeros(len(scores), prompt_length),
        ds_logprobs,
        ds_logprobs.clone(),
        scores,
        action_mask,
        0.1,
        100.0,
    )[:, prompt_length - 1 :]
    ours = compute_rewards(same, same.clone(), scores, mask, 0.1, 100.0)
    lengths = mask.sum(1).long()
    for row, n in enumerate(lengths.tolist()):
        assert ours[row].nonzero().flatten().tolist() == [n - 1]  # the last token
        where = n if n < width else width - 1  # DeepSpeed-Chat: the first pad, unless none
        assert ds[row].nonzero().flatten().tolist() == [where]
    assert (lengths < width).any(), "the batch must hold a padded response"


# ---- Ziegler et al.'s adaptive KL coefficient. -----------------------------------------------


def test_adaptive_kl_follows_its_closed_form():
    from rlkit.llm.rlhf_ppo import AdaptiveKLController

    controller = AdaptiveKLController(kl_coef=0.1, target=6.0, horizon=10_000)
    # at the target: unchanged; far above it: the step is clipped at +20% of n / horizon
    assert controller.update(6.0, 256) == pytest.approx(0.1)
    for _ in range(5):
        controller.update(60.0, 256)
    assert controller.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10_000) ** 5)
    # below it, proportionally: KL = 5.4 is 10% under the target
    before = controller.value
    assert controller.update(5.4, 1_000) == pytest.approx(before * (1 - 0.1 * 1_000 / 10_000))
    copy = AdaptiveKLController(kl_coef=1.0, target=1.0, horizon=1)
    copy.load_state_dict(controller.state_dict())
    assert copy.value == controller.value


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(kl_coef=0.0, target=1.0, horizon=10), "kl_coef must be a number > 0"),
        (dict(kl_coef=0.1, target=-1.0, horizon=10), "target_kl must be a number > 0"),
        (dict(kl_coef=0.1, target=1.0, horizon=0), "kl_horizon must be an integer >= 1"),
    ],
)
def test_adaptive_kl_refuses_bad_settings(settings, field):
    from rlkit.llm.rlhf_ppo import AdaptiveKLController

    with pytest.raises(ValueError, match=field):
        AdaptiveKLController(**settings)
