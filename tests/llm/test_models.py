"""Tiny models from configs, loading by path, the critic, and where a reward model reads its
reward."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.llm.models import (
    FAMILIES,
    ValueHeadModel,
    build_causal_lm,
    build_reward_model,
    count_parameters,
    load_causal_lm,
    load_reward_model,
    reward_model_from_causal_lm,
    tiny_config,
)
from rlkit.llm.reward_model import scoring_batch, sequence_rewards


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_models_have_about_a_hundred_thousand_parameters(tokenizer, family):
    model = build_causal_lm(tiny_config(tokenizer, family))
    assert 50_000 <= count_parameters(model) <= 150_000
    assert model.config.pad_token_id == tokenizer.pad_token_id != model.config.eos_token_id
    assert model.config.vocab_size == len(tokenizer)


def test_the_seed_fixes_the_initial_weights_and_leaves_the_global_generator_alone(tokenizer):
    config = tiny_config(tokenizer)
    torch.manual_seed(5)
    first = build_causal_lm(config, seed=1)
    after = torch.rand(1)
    torch.manual_seed(5)
    second = build_causal_lm(config, seed=1)
    assert torch.equal(torch.rand(1), after)
    for a, b in zip(first.parameters(), second.parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(
        next(build_causal_lm(config, seed=2).parameters()), next(first.parameters())
    )


def test_save_pretrained_and_load_by_path_give_the_same_logits(tokenizer, tmp_path):
    model = build_causal_lm(tiny_config(tokenizer, "qwen2"), seed=3).eval()
    model.save_pretrained(tmp_path)
    loaded = load_causal_lm(tmp_path, dtype=torch.float32)
    ids = torch.tensor([tokenizer("S318402:")["input_ids"]])
    for (name, saved), reloaded in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(saved, reloaded), name  # the weights come back bit for bit
    with torch.no_grad():
        # The same operations on the same weights, but in other buffers: MKL may pick code paths by
        # memory alignment (its docs on conditional numerical reproducibility), so a float32
        # tolerance.
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert isinstance(loaded, type(AutoModelForCausalLM.from_config(model.config)))
    assert load_causal_lm(tmp_path, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_load_refuses_an_unknown_device(tmp_path):
    with pytest.raises(ValueError, match="device must be"):
        load_causal_lm(tmp_path, device="tpu")


def test_critic_gives_one_value_per_position_starts_at_zero_and_round_trips(tokenizer, tmp_path):
    model = build_causal_lm(tiny_config(tokenizer), seed=0)
    critic = ValueHeadModel.from_pretrained_model(model)
    ids = torch.tensor([tokenizer("S318402:")["input_ids"]] * 2)
    values = critic(ids, torch.ones_like(ids))
    assert values.shape == ids.shape and torch.all(values == 0)
    torch.nn.init.normal_(critic.value_head.weight)
    critic.save_pretrained(tmp_path)
    reloaded = ValueHeadModel.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(ids, torch.ones_like(ids)), critic(ids, torch.ones_like(ids))
        )
    # the backbone is a copy of the policy's transformer
    for (
        key,
        value,
    ) in model.base_model.state_dict().items():
        assert torch.equal(critic.backbone.state_dict()[key], value)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reward_is_read_at_the_last_real_token_whatever_the_right_padding(tokenizer, family):
    reward_model = build_reward_model(tiny_config(tokenizer, family), seed=0).eval()
    torch.nn.init.normal_(reward_model.score.weight)
    prompts, completions = ["S318402:", "S12:", "S9:"], ["012348", "12", ""]
    batch = scoring_batch(tokenizer, prompts, completions)
    with torch.no_grad():
        rewards = sequence_rewards(reward_model, batch)
        more_padding = torch.nn.functional.pad(
            batch.input_ids, (0, 5), value=tokenizer.pad_token_id
        )
        padded = sequence_rewards(
            reward_model,
            type(batch)(more_padding, torch.nn.functional.pad(batch.attention_mask, (0, 5))),
        )
        torch.testing.assert_close(padded, rewards, atol=1e-5, rtol=0)
        # each sequence alone: no padding
        for row, (prompt, completion) in enumerate(zip(prompts, completions)):
            ids = torch.tensor(
                [tokenizer(prompt + completion)["input_ids"] + [tokenizer.eos_token_id]]
            )
            hidden = reward_model.base_model(input_ids=ids).last_hidden_state
            assert rewards[row].item() == pytest.approx(
                reward_model.score(hidden[0, -1]).item(), abs=1e-5
            )


def test_reward_model_from_an_sft_model_copies_its_transformer(tokenizer):
    model = build_causal_lm(tiny_config(tokenizer), seed=4)
    reward_model = reward_model_from_causal_lm(model)
    for key, value in model.base_model.state_dict().items():
        assert torch.equal(reward_model.base_model.state_dict()[key], value)
    assert reward_model.config.num_labels == 1


def test_a_reward_model_config_without_a_pad_token_is_refused(tokenizer, tmp_path):
    config = tiny_config(tokenizer)
    config.pad_token_id = None
    with pytest.raises(ValueError, match="pad_token_id = None"):
        build_reward_model(config)
    good = build_reward_model(tiny_config(tokenizer))
    good.config.pad_token_id = None
    good.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="pad_token_id = None"):
        load_reward_model(tmp_path)


def test_a_reward_model_whose_pad_is_eos_is_refused(tokenizer):
    config = tiny_config(tokenizer)
    config.pad_token_id = config.eos_token_id
    with pytest.raises(ValueError, match="pad_token_id = eos_token_id"):
        build_reward_model(config)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(family="mamba"), "family"),
        (dict(hidden_size=65), "hidden_size"),
        (dict(num_layers=0), "num_layers"),
        (dict(max_positions=1.5), "max_positions"),
    ],
)
def test_bad_model_settings_are_refused(tokenizer, kwargs, field):
    with pytest.raises(ValueError, match=f"{field} must be"):
        tiny_config(tokenizer, **kwargs)


def test_critic_of_a_bf16_model_runs_and_keeps_its_head_in_float32(tokenizer, tmp_path):
    model = build_causal_lm(tiny_config(tokenizer), seed=0).to(torch.bfloat16)
    critic = ValueHeadModel.from_pretrained_model(model)
    ids = torch.tensor([tokenizer("S318402:")["input_ids"]])
    values = critic(ids, torch.ones_like(ids))
    assert values.dtype == torch.float32 and critic.value_head.weight.dtype == torch.float32
    critic.save_pretrained(tmp_path)
    assert (
        ValueHeadModel.from_pretrained(tmp_path)(ids, torch.ones_like(ids)).dtype == torch.float32
    )


def test_critic_values_do_not_change_with_left_padding(tokenizer):
    critic = ValueHeadModel.from_pretrained_model(
        build_causal_lm(tiny_config(tokenizer, "gpt2"), seed=0)
    ).eval()
    torch.nn.init.normal_(critic.value_head.weight)
    ids = tokenizer("S318402:")["input_ids"]
    alone = critic(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
    padded = critic(
        torch.tensor([[tokenizer.pad_token_id] * 3 + ids]), torch.tensor([[0] * 3 + [1] * len(ids)])
    )
    torch.testing.assert_close(padded[:, 3:], alone, atol=1e-5, rtol=0)
