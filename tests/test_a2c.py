"""A2C: the loss and the n-step advantages against hand loops, the update against SB3's recipe, bad
input."""

import copy

import pytest
import torch

from rlkit.a2c import (
    A2CConfig,
    a2c_loss,
    make_agent,
    make_optimizer,
    rollout_loss,
    train,
    update,
)
from rlkit.actor_critic import advantages_and_returns, clip_grad_norm
from rlkit.nets import flatten_parameters
from rlkit.rollouts import RolloutCollector, make_vector_env


def hand_n_step(rewards, values, dones, last_value, gamma):
    """R_t = r_t + gamma R_{t+1}, R_n = V(s_n), cut at episode ends: the n-step return, one step at
    a time."""
    returns = torch.zeros_like(rewards)
    for row in range(rewards.shape[0]):
        following = last_value[row].item()
        for t in reversed(range(rewards.shape[1])):
            following = rewards[row, t].item() + gamma * (1.0 - dones[row, t].item()) * following
            returns[row, t] = following
    return returns - values, returns


def small_setup(seed=0, env_id="CartPole-v1", **overrides):
    config = A2CConfig.for_env(
        env_id, seed=seed, total_steps=400, num_envs=4, num_steps=6, batched_env=False, **overrides
    )
    torch.manual_seed(seed)
    envs = make_vector_env(config.env_id, config.num_envs)
    agent = make_agent(config, envs)
    return config, envs, agent, RolloutCollector(envs, agent, config.num_steps, config.gamma, seed)


def test_advantages_with_lam_1_are_n_step_returns_minus_values():
    config, _, _, collector = small_setup()
    for _ in range(30):  # until a rollout holds an episode end
        rollout = collector.collect()
        if rollout.dones.any():
            break
    assert rollout.dones.any()
    advantages, returns = advantages_and_returns(rollout, config.gamma, 1.0)
    expected_advantages, expected_returns = hand_n_step(
        rollout.rewards, rollout.values, rollout.dones, rollout.last_value, config.gamma
    )
    torch.testing.assert_close(returns, expected_returns)
    torch.testing.assert_close(advantages, expected_advantages)


def test_a2c_loss_against_a_hand_computation():
    torch.manual_seed(0)
    logits, actions = torch.randn(10, 3, requires_grad=True), torch.randint(0, 3, (10,))
    values, returns = torch.randn(10, requires_grad=True), torch.randn(10)
    # computed from the critic, as in training: it must enter only as a constant
    advantages = returns - values
    logp = torch.log_softmax(logits, -1)
    logprobs = logp.gather(1, actions[:, None]).squeeze(1)
    entropies = -(logp.exp() * logp).sum(-1)
    loss, parts = a2c_loss(
        logprobs, entropies, values, advantages, returns, ent_coef=0.01, vf_coef=0.5
    )
    expected = 0.0
    for i in range(10):
        expected += (
            -advantages[i] * logprobs[i] + 0.5 * (values[i] - returns[i]) ** 2 - 0.01 * entropies[i]
        ) / 10
    torch.testing.assert_close(loss, expected)
    assert parts["value_loss"] == pytest.approx(((values - returns) ** 2).mean().item())
    loss.backward()  # the advantages are constants: the policy term sends no gradient to the values
    value_gradient_from_value_loss = (values - returns).detach() / 10
    torch.testing.assert_close(values.grad, value_gradient_from_value_loss)


@pytest.mark.parametrize("max_norm", [0.5, 1e6, None])
def test_clip_grad_norm_matches_torch_clip_grad_norm(max_norm):
    """On one tensor, on a module's views of one flat buffer (the fast path) and on ordinary
    parameters."""
    torch.manual_seed(0)
    limit = float("inf") if max_norm is None else max_norm
    plain = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    plain(torch.randn(7, 3)).pow(2).sum().mul(30).backward()
    reference = copy.deepcopy(plain)  # deepcopy leaves the gradients behind: copy them
    for copied, original in zip(reference.parameters(), plain.parameters()):
        copied.grad = original.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), limit).item()
    assert expected > 1  # so that a max_norm of 0.5 clips
    flattened = copy.deepcopy(plain)
    flat = flatten_parameters(flattened)
    flat.grad.copy_(torch.cat([p.grad.flatten() for p in plain.parameters()]))
    single = torch.nn.Parameter(flat.detach().clone())
    single.grad = flat.grad.clone()
    for parameters in (flattened.parameters(), [single], plain.parameters()):
        assert clip_grad_norm(parameters, max_norm) == pytest.approx(expected, rel=1e-6)
    for ours, theirs in zip(flattened.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
    for ours, theirs in zip(plain.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
    torch.testing.assert_close(single.grad, flat.grad)


def test_update_equals_the_recipe_written_out_on_separate_parameters():
    """One A2C step with the flat-parameter machinery equals RMSprop + clip_grad_norm_ on ordinary
    parameters."""
    config, _, agent, collector = small_setup(ent_coef=0.01)
    rollout = collector.collect()
    reference = copy.deepcopy(agent)
    reference_optimizer = torch.optim.RMSprop(
        reference.parameters(),
        lr=config.learning_rate,
        alpha=config.rmsprop_alpha,
        eps=config.optimizer_eps,
    )
    loss, _ = rollout_loss(reference, rollout, config)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), config.max_grad_norm)
    reference_optimizer.step()
    flat = flatten_parameters(agent)
    update(agent, make_optimizer([flat], config), rollout, config)
    for ours, theirs in zip(agent.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs)


def test_same_seed_same_numbers_and_history_columns():
    first = train(A2CConfig.for_env("CartPole-v1", seed=3, total_steps=2_000))
    second = train(A2CConfig.for_env("CartPole-v1", seed=3, total_steps=2_000))
    other = train(A2CConfig.for_env("CartPole-v1", seed=4, total_steps=2_000))
    for a, b in zip(first.agent.parameters(), second.agent.parameters()):
        assert torch.equal(a, b)
    assert not all(
        torch.equal(a, b) for a, b in zip(first.agent.parameters(), other.agent.parameters())
    )
    assert len(first.history) == 50 and first.history[-1]["step"] == 2_000
    assert {"policy_loss", "value_loss", "entropy", "explained_variance", "grad_norm"} <= set(
        first.history[0]
    )
    obs = torch.randn(3, 4)
    torch.testing.assert_close(first.critic(obs), first.agent.value(obs))


def test_linear_learning_rate_schedule_decays_to_zero():
    config = A2CConfig.for_env(
        "CartPole-v1",
        seed=0,
        total_steps=400,
        lr_schedule="linear",
        optimizer="adam",
        learning_rate=1e-3,
    )
    assert config.num_updates == 10
    rates = train(config).column("learning_rate")
    torch.testing.assert_close(
        torch.tensor(rates),
        torch.tensor([1e-3 * (1 - k / 10) for k in range(10)], dtype=torch.float64),
    )
    assert set(
        train(A2CConfig.for_env("CartPole-v1", seed=0, total_steps=400)).column("learning_rate")
    ) == {7e-4}


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("total_steps", 0, "total_steps must be an integer >= 1"),
        ("num_envs", 0, "num_envs must be an integer >= 1"),
        ("num_envs", -2, "num_envs must be an integer >= 1"),
        ("num_steps", 0, "num_steps must be an integer >= 1"),
        ("num_steps", 2.5, "num_steps must be an integer >= 1"),
        ("learning_rate", 0.0, r"learning_rate must be in \(0, 1\]"),
        ("learning_rate", 2.0, r"learning_rate must be in \(0, 1\]"),
        ("gamma", 1.5, "gamma must be in"),
        ("lam", -0.1, "lam must be in"),
        ("ent_coef", -0.01, "ent_coef must be >= 0"),
        ("vf_coef", -1.0, "vf_coef must be >= 0"),
        ("max_grad_norm", 0.0, "max_grad_norm must be > 0"),
        ("optimizer", "sgd", "optimizer must be one of"),
        ("lr_schedule", "cosine", "lr_schedule must be one of"),
        ("rmsprop_alpha", 1.0, "rmsprop_alpha must be in"),
        ("activation", "gelu", "activation must be one of"),
        ("hidden_sizes", (64, 0), "hidden_sizes must be positive layer sizes"),
        ("hidden_sizes", 64, "hidden_sizes must be a list or tuple"),
        ("num_envs", True, "num_envs must be an integer >= 1"),
        ("seed", 1.5, "seed must be an integer"),
        ("gamma", "0.99", "gamma must be a finite number"),
        ("device", "gpu", "device must be a torch device"),
        ("batched_env", "no", "batched_env must be True or False"),
        ("max_grad_norm", -1.0, r"max_grad_norm must be > 0 \(math.inf: never clip\)"),
    ],
)
def test_bad_configs_raise_naming_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        A2CConfig(**{field: value})


def test_continuous_or_unknown_envs_raise_naming_env_id():
    with pytest.raises(ValueError, match=r"env_id must be an environment with Discrete actions"):
        train(A2CConfig.for_env("Pendulum-v1", total_steps=100))
    with pytest.raises(ValueError, match="env_id must be a registered gymnasium environment"):
        train(A2CConfig.for_env("NoSuchEnv-v0", total_steps=100))
    with pytest.raises(ValueError, match="batched_env must be False for 'Acrobot-v1'"):
        train(A2CConfig.for_env("Acrobot-v1", total_steps=100, batched_env=True))


def test_for_env_applies_the_preset_then_the_overrides():
    config = A2CConfig.for_env("CartPole-v1", learning_rate=1e-3)
    assert config.learning_rate == 1e-3 and config.batched_env  # the override, the preset
    assert (config.num_envs, config.num_steps, config.optimizer) == (8, 5, "rmsprop")  # defaults
    assert A2CConfig().batched_env is False  # a plain config is exactly its fields
    assert A2CConfig.for_env("Acrobot-v1") == A2CConfig(env_id="Acrobot-v1")  # no preset
