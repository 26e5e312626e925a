"""The RLHF-PPO trainer's correctness checklist, on tiny models built from a config: the first
ratio is 1, no KL penalty while the actor is the reference, the frozen models stay frozen and
bit-identical, the LoRA reference is the base model, the same seed gives the same run, every phase
is timed, and bad input is refused with the field named."""

from __future__ import annotations

import copy

import pytest
import torch

from rlkit.llm.models import ValueHeadModel, build_causal_lm, build_reward_model, tiny_config
from rlkit.llm.rlhf_ppo import PHASES, RLHFPPOConfig, RLHFPPOTrainer
from rlkit.llm.tokenizer import TASK_ALPHABET, build_char_tokenizer

SMALL = dict(num_iterations=2, batch_size=8, minibatch_size=4, ppo_epochs=2, num_digits=4)


def four_models(tokenizer, seed=0):
    actor = build_causal_lm(tiny_config(tokenizer), seed=seed)
    reward_model = build_reward_model(tiny_config(tokenizer), seed=seed + 1)
    return actor, reward_model


def trainer_for(config, tokenizer=None, **models):
    tokenizer = tokenizer or build_char_tokenizer()
    actor, reward_model = four_models(tokenizer, config.seed)
    models = {"actor": actor, "reward_model": reward_model, **models}
    return RLHFPPOTrainer(config, tokenizer=tokenizer, **models)


def without_timings(rows):
    """History rows without their seconds, which no two runs share."""
    return [{k: v for k, v in row.items() if not k.startswith("seconds_")} for row in rows]


def run(trainer, iterations):
    for _ in range(iterations):
        trainer.run_update()
    return trainer.history


def test_the_first_ratio_is_one_and_the_first_kl_zero():
    trainer = trainer_for(RLHFPPOConfig(**SMALL))
    first = run(trainer, 1)[0]
    assert first["first_ratio_error"] < 1e-6
    assert abs(first["kl"]) < 1e-6  # the actor is still the reference when it samples
    later = run(trainer, 1)[1]
    assert later["kl"] != 0.0  # one iteration of steps moved it


def test_the_reference_and_the_reward_model_get_no_gradient_and_do_not_change():
    trainer = trainer_for(RLHFPPOConfig(**SMALL))
    frozen = {
        name: copy.deepcopy(model.state_dict())
        for name, model in (("reference", trainer.reference), ("reward", trainer.reward_model))
    }
    actor_before = copy.deepcopy(trainer.model.state_dict())
    run(trainer, 2)
    for name, model in (("reference", trainer.reference), ("reward", trainer.reward_model)):
        assert all(p.grad is None and not p.requires_grad for p in model.parameters()), name
        for key, value in model.state_dict().items():
            assert torch.equal(value, frozen[name][key]), (name, key)
    assert any(
        not torch.equal(value, actor_before[key])
        for key, value in trainer.model.state_dict().items()
    ), "the actor should have learned"


def test_every_phase_is_timed_and_the_history_holds_the_diagnostics():
    row = run(trainer_for(RLHFPPOConfig(**SMALL)), 1)[0]
    for phase in PHASES:
        assert row[f"seconds_{phase}"] >= 0.0
    assert row["seconds_generate"] > 0 and row["seconds_ppo_epochs"] > 0
    for name in ("score", "task_reward", "kl_coef", "policy_loss", "value_loss", "clip_fraction"):
        assert name in row


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    first = run(trainer_for(RLHFPPOConfig(**SMALL, seed=3)), 2)
    second = run(trainer_for(RLHFPPOConfig(**SMALL, seed=3)), 2)
    assert without_timings(first) == without_timings(second)
    other = run(trainer_for(RLHFPPOConfig(**SMALL, seed=4)), 2)
    assert without_timings(other) != without_timings(first)


def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path):
    config = RLHFPPOConfig(**SMALL | dict(num_iterations=3), seed=5)
    whole = run(trainer_for(config), 3)
    first = trainer_for(config)
    run(first, 1)
    path = tmp_path / "state.pt"
    torch.save(first.state_dict(), path)
    resumed = trainer_for(config)
    resumed.load_state_dict(torch.load(path, weights_only=True))
    rest = run(resumed, 2)
    assert without_timings(rest) == without_timings(whole)


def test_with_lora_the_reference_is_the_base_model_and_only_adapters_learn():
    pytest.importorskip("peft")
    tokenizer = build_char_tokenizer()
    actor, reward_model = four_models(tokenizer)
    base = copy.deepcopy(actor)
    trainer = RLHFPPOTrainer(
        RLHFPPOConfig(**SMALL, lora_rank=4, learning_rate=1e-3),
        actor=actor,
        tokenizer=tokenizer,
        reward_model=reward_model,
    )
    assert trainer.reference is None
    frozen_before = {
        name: p.detach().clone()
        for name, p in trainer.model.named_parameters()
        if not p.requires_grad
    }
    run(trainer, 2)
    for name, p in trainer.model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen_before[name]), name
    assert all("lora" in name for name, p in trainer.model.named_parameters() if p.requires_grad)
    # the disabled adapter's log-probs are the base model's
    from rlkit.llm.generation import generate, response_logprobs
    from rlkit.llm.trainer import base_model

    torch.manual_seed(0)
    batch = generate(base.eval(), tokenizer, ["S1234:", "S4321:"], 5)
    arguments = (batch.prompts, batch.response_ids, batch.response_mask)
    with base_model(trainer.model) as reference, torch.no_grad():
        disabled = response_logprobs(reference, *arguments)
    torch.testing.assert_close(disabled, response_logprobs(base, *arguments), atol=1e-6, rtol=0)
    # and the adapters did change the policy (a zero update would make the check above trivial)
    with torch.no_grad():
        adapted = response_logprobs(trainer.model, *arguments)
    assert (adapted - disabled).abs().max() > 1e-4


def test_the_task_reward_needs_no_reward_model_and_the_critic_starts_from_the_policy():
    tokenizer = build_char_tokenizer()
    actor, _ = four_models(tokenizer)
    trainer = RLHFPPOTrainer(
        RLHFPPOConfig(**SMALL, reward="task", critic_from="policy"),
        actor=actor,
        tokenizer=tokenizer,
    )
    row = run(trainer, 1)[0]
    assert row["score"] == row["task_reward"]  # the score is the exact match itself


def test_a_reward_model_with_a_tokenizer_of_its_own_scores_the_decoded_text():
    tokenizer = build_char_tokenizer()
    own = build_char_tokenizer(alphabet="9876543210:S")  # the same characters, other ids
    assert own.get_vocab() != tokenizer.get_vocab()
    actor = build_causal_lm(tiny_config(tokenizer), seed=0)
    reward_model = build_reward_model(tiny_config(own), seed=1)
    trainer = RLHFPPOTrainer(
        RLHFPPOConfig(**SMALL, critic_from="policy"),
        actor=actor,
        tokenizer=tokenizer,
        reward_model=reward_model,
        reward_tokenizer=own,
    )
    row = run(trainer, 1)[0]
    assert row["first_ratio_error"] < 1e-6
    # the critic must read the actor's tokens: not the reward model's backbone, here
    with pytest.raises(ValueError, match="critic_from must be 'policy' when the reward model has"):
        RLHFPPOTrainer(
            RLHFPPOConfig(**SMALL),
            actor=actor,
            tokenizer=tokenizer,
            reward_model=reward_model,
            reward_tokenizer=own,
        )


def test_a_critic_on_another_vocabulary_is_refused():
    tokenizer = build_char_tokenizer()
    wider = build_char_tokenizer(alphabet=TASK_ALPHABET + "#@")  # two more tokens
    other = build_causal_lm(tiny_config(wider), seed=2)
    with pytest.raises(ValueError, match="critic must be a critic that reads the actor's tokens"):
        trainer_for(
            RLHFPPOConfig(**SMALL), tokenizer, critic=ValueHeadModel.from_pretrained_model(other)
        )


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(kl_coef=-0.1), "kl_coef must be a number >= 0"),
        (dict(clip_reward=0.0), "clip_reward must be a number > 0"),
        (dict(minibatch_size=16), "minibatch_size must be at most batch_size"),
        (dict(reward="human"), "reward must be one of"),
        (dict(critic_from="nowhere"), "critic_from must be one of"),
        (dict(target_kl=-1.0), "target_kl must be None or a number > 0"),
        (dict(lam=1.5), "lam must be in"),
        (dict(sampler_dtype="float16"), "sampler_dtype must be one of"),
        (dict(sampler_lag=-1), "sampler_lag must be an integer >= 0"),
        (dict(sampler_correction="clip"), "sampler_correction must be None or one of"),
        (dict(sampler_cap=0.5), "sampler_cap must be a finite number >= 1"),
    ],
)
def test_bad_settings_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        RLHFPPOConfig(**SMALL | change)


def test_a_reward_model_without_a_pad_id_is_refused():
    tokenizer = build_char_tokenizer()
    actor, reward_model = four_models(tokenizer)
    reward_model.config.pad_token_id = None
    with pytest.raises(ValueError, match="pad_token_id"):
        RLHFPPOTrainer(
            RLHFPPOConfig(**SMALL), actor=actor, tokenizer=tokenizer, reward_model=reward_model
        )


def test_a_separate_reference_with_lora_is_refused():
    tokenizer = build_char_tokenizer()
    actor, reward_model = four_models(tokenizer)
    with pytest.raises(ValueError, match="reference must be None when lora_rank is set"):
        RLHFPPOTrainer(
            RLHFPPOConfig(**SMALL, lora_rank=4),
            actor=actor,
            tokenizer=tokenizer,
            reference=copy.deepcopy(actor),
            reward_model=reward_model,
        )


def test_the_critic_values_each_token_from_the_state_it_was_chosen_in():
    """V(s_t) for response token t is the critic's output on the prompt and the response's first
    t tokens alone: the column before the token (a causal model cannot see what comes after)."""
    from rlkit.llm.generation import generate, sequence_layout
    from rlkit.llm.models import ValueHeadModel
    from rlkit.llm.rlhf_ppo import response_values

    tokenizer = build_char_tokenizer()
    actor, _ = four_models(tokenizer)
    critic = ValueHeadModel.from_pretrained_model(actor).eval()
    torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(0))
    batch = generate(actor.eval(), tokenizer, ["S1234:", "S12:"], 5)
    with torch.no_grad():
        values = response_values(critic, batch.prompts, batch.response_ids, batch.response_mask)
        ids, attention, positions = sequence_layout(
            batch.prompts, batch.response_ids, batch.response_mask
        )
        width = batch.prompts.input_ids.shape[1]
        for t in range(batch.response_ids.shape[1]):
            prefix = critic(
                ids[:, : width + t], attention[:, : width + t], positions[:, : width + t]
            )
            want = prefix[:, -1] * batch.response_mask[:, t]
            torch.testing.assert_close(values[:, t], want, atol=1e-5, rtol=1e-5)


def test_a_response_without_eos_loses_the_penalty_before_the_clip():
    from rlkit.llm.generation import ResponseBatch

    trainer = trainer_for(RLHFPPOConfig(**SMALL, reward="task", critic_from="policy"))
    trainer.config.missing_eos_penalty = 0.5
    eos, pad, digit = trainer.tokenizer.eos_token_id, trainer.tokenizer.pad_token_id, 7
    response_ids = torch.tensor([[digit, eos, pad], [digit, digit, digit]])
    batch = ResponseBatch(
        None, response_ids, torch.tensor([[1, 1, 0], [1, 1, 1]]), torch.zeros(2, 3), 1.0
    )
    scores = trainer._scores(["S12:", "S12:"], ["9", "999"], batch)
    assert scores.tolist() == [0.0, -0.5]  # both wrong (0); the second never ended
    with pytest.raises(ValueError, match="missing_eos_penalty must be None or a number >= 0"):
        RLHFPPOConfig(**SMALL, missing_eos_penalty=-1.0)


def test_the_adaptive_kl_coefficient_moves_and_resumes_exactly(tmp_path):
    config = RLHFPPOConfig(**SMALL | dict(num_iterations=3), seed=6, target_kl=0.01, kl_horizon=8)
    whole = run(trainer_for(config), 3)
    assert len({row["kl_coef"] for row in whole}) == 3  # it changed after every iteration
    first = trainer_for(config)
    run(first, 1)
    torch.save(first.state_dict(), tmp_path / "state.pt")
    resumed = trainer_for(config)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert without_timings(run(resumed, 2)) == without_timings(whole)  # its history included


def test_fit_returns_the_trained_actor_and_critic():
    from rlkit.training import fit

    result = fit(trainer_for(RLHFPPOConfig(**SMALL | dict(num_iterations=1))))
    assert result.model is result.agent and result.critic is not None
    assert len(result.history) == 1 and result.tokenizer is not None


def test_a_bf16_sampler_samples_the_old_log_probs_stay_the_actor_s_and_the_mismatch_shows():
    """A bf16 copy of the actor samples: the ratio's old log-probabilities (and the KL in the
    reward) are the float32 actor's, so the first ratio is still exactly 1, and the history
    measures the sampler's small mismatch; with the actor sampling itself there is none."""
    trainer = trainer_for(RLHFPPOConfig(**SMALL, sampler_dtype="bfloat16"))
    row = run(trainer, 1)[0]
    assert next(trainer.sampler.model.parameters()).dtype == torch.bfloat16
    assert row["first_ratio_error"] < 1e-6 and abs(row["kl"]) < 1e-6
    assert 0 < row["sampler_kl"] < 0.05
    itself = run(trainer_for(RLHFPPOConfig(**SMALL)), 1)[0]
    assert "sampler_kl" not in itself


def test_the_correction_weighs_the_actor_s_loss_and_a_resumed_stale_run_equals_the_whole(
    tmp_path,
):
    """With a stale sampler and truncated importance sampling, the actor's loss is the clipped
    surrogate weighted by the capped trainer-over-sampler ratios (checked against the loss
    function on the same minibatch); a run saved and resumed equals the whole."""
    from rlkit.llm.rlhf_ppo import Minibatch, clipped_policy_loss

    config = RLHFPPOConfig(
        **SMALL | dict(num_iterations=3, ppo_epochs=1, minibatch_size=8),
        sampler_lag=1,
        sampler_correction="token_truncate",
        sampler_cap=1.1,
        learning_rate=1e-2,
        seed=3,
    )
    whole = run(trainer_for(config), 3)
    assert whole[-1]["sampler_kl"] > whole[0]["sampler_kl"]  # the lag shows once the actor moved
    first = trainer_for(config)
    run(first, 1)
    torch.save(first.state_dict(), tmp_path / "state.pt")
    resumed = trainer_for(config)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert without_timings(run(resumed, 2)) == without_timings(whole)

    # the loss the actor's step takes, against the function, on a hand-made minibatch
    trainer = trainer_for(config)
    run(trainer, 1)
    batch, sampler_logprobs = trainer._generate(["1234", "4321", "2413", "3142"] * 2)
    advantages = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(0))
    piece = Minibatch(
        batch.prompts,
        batch.response_ids,
        batch.response_mask,
        batch.logprobs,
        advantages * batch.response_mask,
        torch.zeros_like(advantages),
        torch.zeros_like(advantages),
        sampler_logprobs,
    )
    expected = clipped_policy_loss(
        batch.logprobs,
        batch.logprobs,
        piece.advantages,
        config.clip_eps,
        piece.mask,
        sampler_logprobs=sampler_logprobs,
        sampler_correction="token_truncate",
        sampler_cap=1.1,
    )
    plain = clipped_policy_loss(
        batch.logprobs, batch.logprobs, piece.advantages, config.clip_eps, piece.mask
    )
    assert abs(expected.item() - plain.item()) > 1e-6
    step = trainer._actor_step([piece], [float(piece.mask.sum())])
    assert step["policy_loss"] == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)


def test_a_trainer_that_keeps_only_some_models_refuses_what_needs_the_others():
    """Chapter 13's roles build the trainer with only their own models: a whole iteration, a
    checkpoint or a score without the reward model is refused by name, never a crash inside."""
    tokenizer = build_char_tokenizer()
    actor, reward_model = four_models(tokenizer)
    config = RLHFPPOConfig(**SMALL)
    kept = RLHFPPOTrainer(config, actor, tokenizer, reward_model=reward_model, keep=("critic",))
    assert kept.critic is not None and kept.reference is None and kept.reward_model is None
    for call in (kept.run_update, kept.state_dict):
        with pytest.raises(ValueError, match="keep"):
            call()
    with pytest.raises(ValueError, match="keep"):
        kept._scores(["1 2"], ["1 2"], None)
    with pytest.raises(ValueError, match="keep"):
        RLHFPPOTrainer(config, actor, tokenizer, reward_model=reward_model, keep="critic")


def test_the_models_a_trainer_steps_are_the_policy_and_the_critic_it_keeps():
    """What data parallelism starts from rank 0 and averages: the critic only where it is kept."""
    tokenizer = build_char_tokenizer()
    actor, reward_model = four_models(tokenizer)
    config = RLHFPPOConfig(**SMALL)
    whole = RLHFPPOTrainer(config, actor, tokenizer, reward_model=reward_model)
    assert whole.stepped_models() == {
        "policy": (whole.model, whole.optimizer),
        "critic": (whole.critic, whole.critic_optimizer),
    }
    rollout = RLHFPPOTrainer(config, actor, tokenizer, reward_model=reward_model, keep=())
    assert rollout.stepped_models() == {"policy": (rollout.model, rollout.optimizer)}
