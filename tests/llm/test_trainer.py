"""The language-model trainer base: decay groups, gradient accumulation over micro-batches, LoRA
through peft (the reference policy from the disabled adapter), exact resume, its config checks."""

import copy

import pytest
import torch

from rlkit.llm.generation import generate, response_logprobs
from rlkit.llm.reward_model import RewardModelConfig, RewardModelTrainer
from rlkit.llm.sft import SFTConfig, SFTTrainer
from rlkit.llm.trainer import adamw_with_decay_groups, base_model, split, trainable_share
from rlkit.training import fit

pytest.importorskip("peft")

SMALL_SFT = dict(batch_size=16, max_steps=6, eval_every=6, num_heldout=20, warmup_steps=2)
SMALL_RM = dict(num_train_pairs=64, num_heldout_pairs=16, epochs=1, batch_size=16, eval_every=4)


def steps(trainer, count):
    for _ in range(count):
        trainer.run_update()
    return trainer


def test_weight_decay_falls_on_matrices_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    decay, no_decay = adamw_with_decay_groups(model, 1e-3, 0.1).param_groups
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 3])]
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(no_decay["params"]) == 3  # the linear bias, the norm's weight and bias


def test_split_cuts_a_batch_into_micro_batches():
    assert split(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert split(list(range(7)), None) == [list(range(7))]


def test_micro_batches_give_the_full_batch_step():
    """The same step up to float rounding: the micro-batches' mean losses weighted by their answer
    tokens are the batch's mean loss."""
    whole = steps(SFTTrainer(SFTConfig(**SMALL_SFT)), 3)
    accumulated = steps(SFTTrainer(SFTConfig(**SMALL_SFT, micro_batch_size=5)), 3)
    for ours, theirs in zip(accumulated.model.parameters(), whole.model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    for ours, theirs in zip(accumulated.history, whole.history):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)


def test_micro_batches_of_no_weight_give_a_zero_gradient():
    """GRPO's "dapo" on completions all truncated and masked weighs every micro-batch 0: the step
    adds no gradient, where dividing by the total would stop the run."""
    trainer = SFTTrainer(SFTConfig(**SMALL_SFT))

    def loss_of(_):
        return sum(parameter.sum() for parameter in trainer.model.parameters()), {}

    stats = trainer.optimizer_step([0, 1], [0.0, 0.0], loss_of)
    assert stats["grad_norm"] == 0.0


def test_reward_model_micro_batches_give_the_full_batch_step():
    whole = steps(RewardModelTrainer(RewardModelConfig(**SMALL_RM)), 2)
    accumulated = steps(RewardModelTrainer(RewardModelConfig(**SMALL_RM, micro_batch_size=6)), 2)
    for ours, theirs in zip(accumulated.model.parameters(), whole.model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    for name in ("loss", "accuracy", "reward_gap"):
        assert accumulated.history[-1][name] == pytest.approx(whole.history[-1][name], abs=1e-5)


def test_lora_trains_the_adapters_only():
    trainer = SFTTrainer(SFTConfig(**SMALL_SFT, lora_rank=4))
    frozen = {
        name: p.detach().clone()
        for name, p in trainer.model.named_parameters()
        if not p.requires_grad
    }
    adapters = {
        name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad
    }
    assert adapters and all("lora_" in name for name in adapters)
    assert 0 < trainable_share(trainer.model) < 0.5
    steps(trainer, 3)
    weights = dict(trainer.model.named_parameters())
    assert all(torch.equal(weights[name], before) for name, before in frozen.items())
    assert any(not torch.equal(weights[name], before) for name, before in adapters.items())


def test_the_disabled_adapter_is_the_model_training_started_from():
    """The reference policy of RLHF with no second copy: log-probs through ``base_model`` equal
    the untouched model's after the adapters have trained."""
    trainer = SFTTrainer(SFTConfig(**SMALL_SFT, lora_rank=4))
    untouched_model = SFTTrainer(SFTConfig(**SMALL_SFT)).model  # the same seed: the same start
    steps(trainer, 6)
    prompts = [example.prompt for example in trainer.data.heldout[:8]]
    torch.manual_seed(0)
    responses = generate(trainer.model, trainer.tokenizer, prompts, 8)
    args = (responses.prompts, responses.response_ids, responses.response_mask)
    with torch.no_grad():
        adapted = response_logprobs(trainer.model, *args)
        with base_model(trainer.model) as reference:
            disabled = response_logprobs(reference, *args)
        untouched = response_logprobs(untouched_model, *args)
    torch.testing.assert_close(disabled, untouched, rtol=0, atol=1e-6)
    assert not torch.allclose(adapted, untouched, atol=1e-3)  # the adapters did change the policy


def test_base_model_needs_adapters():
    trainer = SFTTrainer(SFTConfig(**SMALL_SFT))
    with pytest.raises(ValueError, match="model must be a model with LoRA adapters"):
        with base_model(trainer.model):
            pass


def test_a_lora_reward_model_trains_its_score_head():
    trainer = RewardModelTrainer(RewardModelConfig(**SMALL_RM, lora_rank=4))
    trainable = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert any("score" in name for name in trainable) and any("lora_" in name for name in trainable)
    steps(trainer, 2)
    assert trainer.history[-1]["grad_norm"] > 0


def test_a_lora_run_resumes_exactly():
    config = SFTConfig(**SMALL_SFT, lora_rank=4)
    straight = fit(SFTTrainer(config))
    first = steps(SFTTrainer(config), 3)
    state = copy.deepcopy(first.state_dict())
    resumed = SFTTrainer(config)
    resumed.load_state_dict(state)
    result = fit(resumed)
    assert result.history == straight.history
    for ours, theirs in zip(result.model.parameters(), straight.model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("micro_batch_size", 0, "micro_batch_size must be None or an integer >= 1"),
        ("lora_rank", 0, "lora_rank must be None or an integer >= 1"),
        ("lora_alpha", -1.0, "lora_alpha must be a number > 0"),
        ("bf16", "yes", "bf16 must be None, True or False"),
        ("learning_rate", 0.0, r"learning_rate must be in \(0, 1\]"),
    ],
)
def test_bad_training_settings_raise_naming_the_field(field, value, match):
    for config_class in (SFTConfig, RewardModelConfig):
        with pytest.raises(ValueError, match=match):
            config_class(**{field: value})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_bf16_is_refused_on_the_cpu():
    with pytest.raises(ValueError, match="bf16 must be None or False on 'cpu'"):
        SFTConfig(bf16=True)
    assert SFTConfig(bf16=None).bf16 is None  # auto: off on the CPU
