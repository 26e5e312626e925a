"""The GRPO trainer on tiny models built from a config: the first step is the policy gradient (ratio
1), no reference without a KL term, a frozen reference with one, the LoRA reference is the base
model, dynamic sampling keeps the batch's size and trains on informative groups, truncated
completions can be masked, the same seed gives the same run, a resumed run equals the
uninterrupted one, every phase is timed, and bad settings name their field. A sampler that is not
the trainer (bf16 or stale weights) samples, its mismatch is measured, the old log-probabilities
stay the trainer's, and truncated importance sampling weighs the step's loss."""

from __future__ import annotations

import copy

import pytest
import torch

from rlkit.llm.grpo import PHASES, GRPOConfig, GRPOTrainer, PhaseTimer
from rlkit.llm.models import build_causal_lm, tiny_config
from rlkit.llm.tokenizer import build_char_tokenizer

SMALL = dict(num_iterations=3, prompts_per_iteration=4, group_size=4, num_digits=4)


def trainer_for(config, **kwargs):
    tokenizer = build_char_tokenizer()
    policy = build_causal_lm(tiny_config(tokenizer), seed=config.seed)
    return GRPOTrainer(config, policy=policy, tokenizer=tokenizer, **kwargs)


def run(trainer, iterations):
    for _ in range(iterations):
        trainer.run_update()
    return trainer.history


def without_timings(rows):
    return [{k: v for k, v in row.items() if not k.startswith("seconds_")} for row in rows]


def resumed_after(config, saved_at, iterations, folder):
    """The history (without timings) of a run saved after ``saved_at`` iterations, loaded into a
    new trainer and run on to ``iterations``."""
    first = trainer_for(config)
    run(first, saved_at)
    torch.save(first.state_dict(), folder / "state.pt")
    resumed = trainer_for(config)
    resumed.load_state_dict(torch.load(folder / "state.pt", weights_only=True))
    return without_timings(run(resumed, iterations - saved_at))


def test_one_step_per_batch_is_on_policy_and_every_phase_is_timed():
    trainer = trainer_for(GRPOConfig(**SMALL))
    row = run(trainer, 1)[0]
    assert row["clip_fraction"] == 0.0  # the old log-probs are the current ones: ratio 1
    for phase in PHASES:
        assert row[f"seconds_{phase}"] >= 0.0
    assert row["seconds_generate"] > 0 and row["seconds_policy"] > 0
    for name in ("reward", "exact_match_sampled", "zero_variance_groups", "completion_length"):
        assert name in row


def test_without_a_kl_term_no_reference_is_kept_and_with_one_it_stays_frozen():
    assert trainer_for(GRPOConfig(**SMALL)).reference is None
    trainer = trainer_for(GRPOConfig(**SMALL, beta=0.1, learning_rate=1e-2))
    before = copy.deepcopy(trainer.reference.state_dict())
    history = run(trainer, 2)
    assert all(not p.requires_grad and p.grad is None for p in trainer.reference.parameters())
    for key, value in trainer.reference.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # sampled by the reference itself
    assert history[1]["kl"] > 0.0


def test_several_epochs_clip_and_match_the_rollout_s_log_probs():
    config = GRPOConfig(**SMALL, num_epochs=3, minibatch_size=8, learning_rate=1e-2)
    row = run(trainer_for(config), 1)[0]
    assert row["clip_fraction"] > 0.0  # later epochs moved the ratio out of the range


def test_with_lora_the_reference_is_the_base_model():
    pytest.importorskip("peft")
    tokenizer = build_char_tokenizer()
    policy = build_causal_lm(tiny_config(tokenizer), seed=0)
    base = copy.deepcopy(policy).eval()
    trainer = GRPOTrainer(
        GRPOConfig(**SMALL, beta=0.1, lora_rank=4, learning_rate=1e-2),
        policy=policy,
        tokenizer=tokenizer,
    )
    assert trainer.reference is None
    run(trainer, 2)
    assert all("lora" in name for name, p in trainer.model.named_parameters() if p.requires_grad)
    from rlkit.llm.generation import generate

    torch.manual_seed(0)
    batch = generate(base, tokenizer, ["S1234:", "S4321:"], 5)
    with torch.no_grad():
        reference = trainer.reference_logprobs(batch)
    torch.testing.assert_close(reference, batch.logprobs, atol=1e-6, rtol=0)


def test_dynamic_sampling_keeps_the_batch_size_and_prefers_informative_groups():
    # the exact-match reward of an untrained model is 0 almost everywhere: most groups are constant
    config = GRPOConfig(**SMALL, reward="exact", dynamic_sampling_rounds=2)
    trainer = trainer_for(config)
    row = run(trainer, 1)[0]
    assert row["sampling_rounds"] == 3.0  # it looked twice more for groups with signal
    assert row["zero_variance_groups"] == 1.0 and row["zero_variance_groups_trained"] == 1.0


def test_dynamic_sampling_assembles_groups_from_several_rounds():
    """The assembled batch holds each chosen group's rows whole, its rewards beside them."""

    config = GRPOConfig(**SMALL, dynamic_sampling_rounds=3)
    trainer = trainer_for(config)
    timer = PhaseTimer(PHASES)
    rounds = [trainer._sample(timer) for _ in range(2)]
    chosen = [(0, 1), (1, 0), (1, 3), (0, 2)]
    rollout = trainer._assemble(rounds, sorted(chosen))
    assert rollout.batch.response_ids.shape[0] == 16
    for position, (r, g) in enumerate(sorted(chosen)):
        source = rounds[r].batch
        for i in range(4):
            row, src = position * 4 + i, g * 4 + i
            valid = int(source.response_mask[src].sum())
            assert torch.equal(
                rollout.batch.response_ids[row, :valid], source.response_ids[src, :valid]
            )
            assert torch.equal(rollout.batch.logprobs[row, :valid], source.logprobs[src, :valid])
            assert int(rollout.batch.response_mask[row].sum()) == valid


def test_truncated_completions_can_be_masked_out_of_the_loss():
    config = GRPOConfig(**SMALL, max_new_tokens=2, mask_truncated_completions=True)
    trainer = trainer_for(config)
    rollout, _ = trainer._rollout(PhaseTimer(PHASES))
    ended = (rollout.batch.response_ids == trainer.tokenizer.eos_token_id).any(dim=1)
    assert torch.equal(rollout.loss_mask.sum(dim=1) > 0, ended)


def test_the_same_seed_gives_the_same_run_and_a_resumed_run_equals_the_whole(tmp_path):
    config = GRPOConfig(**SMALL, seed=3, beta=0.05, num_epochs=2, minibatch_size=8)
    whole = run(trainer_for(config), 3)
    assert without_timings(run(trainer_for(config), 3)) == without_timings(whole)
    other = run(trainer_for(GRPOConfig(**SMALL, seed=4)), 3)
    assert without_timings(other) != without_timings(whole)
    assert resumed_after(config, 1, 3, tmp_path) == without_timings(whole)


def test_micro_batches_give_the_gradient_of_the_whole_batch():
    """Each loss type's micro-batch weights add up to the whole batch's loss: the accumulated
    gradient is the same (compared before the optimizer step, since Adam's first step divides by
    the gradient's own size and would magnify rounding)."""
    for loss_type in ("grpo", "bnpo", "dapo", "dr_grpo"):
        gradients = []
        for size in (None, 4):
            trainer = trainer_for(GRPOConfig(**SMALL, loss_type=loss_type, micro_batch_size=size))
            trainer.optimizer.step = lambda: None
            run(trainer, 1)
            gradients.append([p.grad.clone() for p in trainer.model.parameters()])
        if loss_type == "bnpo":  # TRL's bnpo averages the micro-batches' token means: another
            # gradient when the micro-batches hold different numbers of tokens
            assert any(not torch.allclose(a, b) for a, b in zip(*gradients))
            continue
        for whole, split in zip(*gradients):
            torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-8, msg=loss_type)


def test_fit_returns_the_trained_policy():
    from rlkit.training import fit

    result = fit(trainer_for(GRPOConfig(**SMALL | dict(num_iterations=1))))
    assert result.model is result.agent and result.tokenizer is not None
    assert len(result.history) == 1


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(group_size=1), "group_size"),
        (dict(loss_type="sum"), "loss_type"),
        (dict(clip_eps=0.2, clip_eps_high=0.1), "clip_eps_high"),
        (dict(minibatch_size=5), "minibatch_size"),
        (dict(scale="std"), "scale"),
        (dict(baseline="median"), "baseline"),
        (dict(reward="gold"), "reward"),
        (dict(overlong_buffer=8), "overlong_buffer"),
        (dict(importance_sampling="group"), "importance_sampling"),
        (dict(beta=-0.1), "beta"),
        (dict(dynamic_sampling_rounds=-1), "dynamic_sampling_rounds"),
        (dict(sampler_dtype="float16"), "sampler_dtype"),
        (dict(sampler_lag=-1), "sampler_lag"),
        (dict(sampler_correction="tis"), "sampler_correction"),
        (dict(sampler_cap=0.5), "sampler_cap"),
    ],
)
def test_bad_settings_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**SMALL | change)


# ---- a sampler that is not the trainer ----------------------------------------------------------


def test_a_bf16_sampler_samples_from_rounded_weights_and_its_mismatch_is_measured():
    """The sampler is a bf16 copy of the policy: its weights are the policy's rounded, the policy
    stays float32, and the history measures the mismatch: a small positive KL(sampler ||
    trainer) on the sampled tokens, which is 0 when the policy samples itself."""
    trainer = trainer_for(GRPOConfig(**SMALL, sampler_dtype="bfloat16"))
    trainer.sampler.sync(trainer.model)
    assert next(trainer.sampler.model.parameters()).dtype == torch.bfloat16
    assert next(trainer.model.parameters()).dtype == torch.float32
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(
            trainer.sampler.model.state_dict()[name], value.to(torch.bfloat16), rtol=0, atol=0
        )
    assert not trainer.sampler.states  # no lag: no copy of the weights is kept
    row = run(trainer, 1)[0]
    assert 0 < row["sampler_kl"] < 0.05 and row["sampler_ratio_over_cap"] == 0.0
    itself = run(trainer_for(GRPOConfig(**SMALL, sampler_correction="token_truncate")), 1)[0]
    assert itself["sampler_kl"] == pytest.approx(0.0, abs=1e-6)


def test_a_stale_sampler_lags_the_policy_by_its_lag():
    """With sampler_lag 2, iteration k samples with the weights the policy had before iteration
    k - 2 (the start's in the first three), and the mismatch grows once the policy has moved."""
    config = GRPOConfig(**SMALL | dict(num_iterations=5), sampler_lag=2, learning_rate=1e-2)
    trainer = trainer_for(config)
    weights_before = []
    for _ in range(4):
        weights_before.append(copy.deepcopy(trainer.model.state_dict()))
        trainer.run_update()
        expected = weights_before[max(0, len(weights_before) - 3)]
        for name, value in trainer.sampler.model.state_dict().items():
            assert torch.equal(value, expected[name]), name
    kl = [row["sampler_kl"] for row in trainer.history]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[3] > kl[0]


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_the_correction_weighs_the_loss_by_the_trainer_over_the_sampler(mode):
    """With a stale sampler and the correction on, the trainer's step minimises grpo_loss with
    the sampler's log-probabilities, which differs from the uncorrected loss on the rollout."""
    from rlkit.llm.generation import response_logprobs
    from rlkit.llm.grpo import grpo_loss

    config = GRPOConfig(
        **SMALL, sampler_lag=1, learning_rate=1e-2, sampler_correction=mode, sampler_cap=1.2
    )
    trainer = trainer_for(config)
    trainer.run_update()  # the policy moves away from the sampler's weights
    trainer.sampler.sync(trainer.model)
    rollout, _ = trainer._rollout(PhaseTimer(PHASES))
    batch = rollout.batch
    with torch.no_grad():
        logprobs = response_logprobs(
            trainer.model, batch.prompts, batch.response_ids, batch.response_mask, 0.6
        )
        trainer_over_sampler = (logprobs - rollout.sampler_logprobs)[batch.response_mask.bool()]
    assert (trainer_over_sampler.abs() > 1e-3).any()  # the sampler is not the trainer
    arguments = (logprobs, logprobs, rollout.advantages, rollout.loss_mask)
    corrected = grpo_loss(
        *arguments,
        sampler_logprobs=rollout.sampler_logprobs,
        sampler_correction=mode,
        sampler_cap=1.2,
    )
    plain = grpo_loss(*arguments)
    assert abs(corrected.item() - plain.item()) > 1e-6
    step = trainer._policy_epochs(rollout)  # the trainer's own step on this rollout
    assert step["policy_loss"] == pytest.approx(corrected.item(), rel=1e-5, abs=1e-7)


def test_a_resumed_run_with_a_stale_sampler_equals_the_whole(tmp_path):
    config = GRPOConfig(
        **SMALL | dict(num_iterations=4),
        sampler_lag=2,
        sampler_dtype="bfloat16",
        sampler_correction="token_truncate",
        learning_rate=1e-2,
    )
    whole = run(trainer_for(config), 4)
    assert resumed_after(config, 2, 4, tmp_path) == without_timings(whole)


def test_with_several_epochs_the_old_log_probs_are_the_trainer_s_not_the_sampler_s():
    """Off policy (two epochs of minibatches), the ratio's old log-probabilities come from the
    trainer's own pass over the sampled tokens; the sampler's are kept apart, also when dynamic
    sampling assembles the batch from several rounds."""
    from rlkit.llm.generation import response_logprobs

    config = GRPOConfig(
        **SMALL,
        sampler_dtype="bfloat16",
        num_epochs=2,
        minibatch_size=8,
        dynamic_sampling_rounds=2,
        sampler_correction="sequence_truncate",
    )
    trainer = trainer_for(config)
    trainer.sampler.sync(trainer.model)
    rollout, stats = trainer._rollout(PhaseTimer(PHASES))
    assert stats["sampling_rounds"] > 1  # the batch was assembled from several rounds
    batch, mask = rollout.batch, rollout.batch.response_mask.bool()
    with torch.no_grad():
        trainer_logprobs = response_logprobs(
            trainer.model, batch.prompts, batch.response_ids, batch.response_mask, 0.6
        )
    torch.testing.assert_close(batch.logprobs[mask], trainer_logprobs[mask])
    assert rollout.sampler_logprobs.shape == batch.logprobs.shape
    assert not torch.allclose(rollout.sampler_logprobs[mask], trainer_logprobs[mask])
    assert run(trainer, 1)[0]["sampler_kl"] > 0
