"""REINFORCE's pieces against hand computations and Gymnasium's autoreset; the baseline's effect on
the gradient estimator; the config against bad input. (Learning:
tests/test_reinforce_learning.py.)"""

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlkit.reinforce as reinforce
from rlkit.nets import CategoricalPolicy, ValueNetwork
from rlkit.reinforce import (
    EpisodeBatch,
    ReinforceConfig,
    collect_episodes,
    fit_value,
    gradient_estimates,
    make_envs,
    reinforce_loss,
    returns_to_go,
    train,
)

GAMMA = 0.9


class ConstantValue(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, obs):
        return torch.full(obs.shape[:-1], float(self.value))


def two_episodes() -> EpisodeBatch:
    """Row 0 terminates after 2 steps (then the autoreset step and padding); row 1 is truncated
    after 3."""
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 0]])
    # the 7s sit on masked steps and must not count
    rewards = torch.tensor([[1.0, 2, 0, 7], [1, 1, 1, 7]])
    terminated = torch.tensor([[0.0, 1, 0, 0], [0, 0, 0, 0]])
    truncated = torch.tensor([[0.0, 0, 0, 0], [0, 0, 1, 0]])
    obs = torch.zeros(2, 4, 1)
    return EpisodeBatch(
        obs,
        torch.zeros(2, 4, dtype=torch.long),
        rewards,
        mask,
        terminated,
        truncated,
        torch.zeros(2, 1),
    )


def test_returns_stop_at_termination_and_bootstrap_only_a_truncation():
    batch = two_episodes()
    plain = returns_to_go(batch, GAMMA)
    bootstrapped = returns_to_go(batch, GAMMA, ConstantValue(10.0))
    expected_plain = torch.tensor(
        [[1 + GAMMA * 2, 2, 0, 0], [1 + GAMMA + GAMMA**2, 1 + GAMMA, 1, 0]]
    )
    tail = GAMMA * 10.0  # gamma * V(final observation), added to the truncated step's reward
    expected_boot = expected_plain + torch.tensor(
        [[0, 0, 0, 0], [GAMMA**2 * tail, GAMMA * tail, tail, 0]]
    )
    torch.testing.assert_close(plain, expected_plain)
    torch.testing.assert_close(bootstrapped, expected_boot)  # row 0 (terminated) is unchanged


def test_a_time_limit_on_the_terminal_step_does_not_bootstrap():
    """Gymnasium sets truncated and terminated together when the pole falls on the last allowed
    step."""
    batch = two_episodes()
    batch.terminated[1, 2] = 1.0
    expected = torch.tensor([[1 + GAMMA * 2, 2, 0, 0], [1 + GAMMA + GAMMA**2, 1 + GAMMA, 1, 0]])
    torch.testing.assert_close(returns_to_go(batch, GAMMA, ConstantValue(10.0)), expected)


def test_collect_refuses_a_same_step_vector_env():
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    with pytest.raises(ValueError, match="envs must be a vector env in NEXT_STEP autoreset mode"):
        collect_episodes(envs, CategoricalPolicy(4, 2, (8,)))


def test_gradient_estimates_are_reproducible_and_leave_the_global_generator_alone():
    torch.manual_seed(0)
    policy, value = CategoricalPolicy(4, 2, (8,)), ValueNetwork(4, (8,))
    state = torch.random.get_rng_state()
    first = gradient_estimates(
        policy, value, "CartPole-v1", batches=3, episodes_per_batch=2, seed=11
    )
    assert torch.equal(torch.random.get_rng_state(), state)
    second = gradient_estimates(
        policy, value, "CartPole-v1", batches=3, episodes_per_batch=2, seed=11
    )
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_loss_is_a_sum_over_steps_divided_by_the_number_of_episodes():
    torch.manual_seed(0)
    policy = CategoricalPolicy(1, 2, (8,))
    batch = two_episodes()
    batch.obs = torch.randn(2, 4, 1)
    batch.actions = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 1]])
    advantages = torch.tensor([[2.0, -1, 5, 5], [0.5, 1, -2, 5]])
    expected = 0.0
    for row in range(2):
        for t in range(4):
            if batch.mask[row, t]:
                logits = policy(batch.obs[row, t])
                expected -= (
                    torch.log_softmax(logits, -1)[batch.actions[row, t]] * advantages[row, t]
                )
    torch.testing.assert_close(reinforce_loss(policy, batch, advantages), expected / 2)


def vector_env_with_lengths(lengths):
    """CartPole copies whose time limits differ, so their episodes end at known, different steps."""
    return gym.vector.SyncVectorEnv(
        [lambda n=n: gym.make("CartPole-v1", max_episode_steps=n) for n in lengths],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )


def test_collect_masks_the_autoreset_step_and_keeps_the_true_final_observation():
    torch.manual_seed(0)
    envs = vector_env_with_lengths([3, 6])
    policy = CategoricalPolicy(4, 2, (8,))
    batch = collect_episodes(envs, policy, seed=5)
    assert batch.obs.shape == (2, 6, 4)
    torch.testing.assert_close(batch.mask, torch.tensor([[1.0, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]))
    torch.testing.assert_close(
        batch.truncated, torch.tensor([[0.0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1]])
    )
    assert batch.terminated.sum() == 0
    # Row 0's step 3 is the autoreset step: Gymnasium returned a reset observation with reward 0
    # there.
    assert batch.rewards[0, 3] == 0.0
    # Replaying row 0's actions in a single env from the same seed reaches the stored final
    # observation.
    env = gym.make("CartPole-v1", max_episode_steps=3)
    obs, _ = env.reset(seed=5)
    np.testing.assert_allclose(obs, batch.obs[0, 0].numpy())
    for t in range(3):
        obs, *_ = env.step(int(batch.actions[0, t]))
    np.testing.assert_allclose(obs, batch.final_obs[0].numpy())


def test_masked_steps_never_reach_the_gradient():
    torch.manual_seed(0)
    policy = CategoricalPolicy(4, 2, (8,))
    batch = collect_episodes(vector_env_with_lengths([3, 6]), policy, seed=5)

    def gradient(b):
        policy.zero_grad()
        # non-zero wherever the mask fails
        advantages = returns_to_go(b, GAMMA, ConstantValue(3.0)) - 1.0
        reinforce_loss(policy, b, advantages).backward()
        return torch.cat([p.grad.flatten() for p in policy.parameters()])

    clean = gradient(batch)
    batch.obs[0, 3:] = 1e6  # garbage on the autoreset step and after it
    batch.actions[0, 3:] = 1 - batch.actions[0, 3:]
    batch.rewards[0, 3:] = 50.0
    torch.testing.assert_close(gradient(batch), clean)


def test_a_terminated_episode_ends_with_termination_and_no_bootstrap():
    torch.manual_seed(0)
    batch = collect_episodes(make_envs("CartPole-v1", 4), CategoricalPolicy(4, 2, (8,)), seed=0)
    lengths = batch.mask.sum(dim=1)
    # a random policy falls
    assert torch.all(lengths < 500) and torch.all(batch.terminated.sum(dim=1) == 1)
    last = (lengths - 1).long()
    assert torch.all(batch.terminated[torch.arange(4), last] == 1)
    returns = returns_to_go(batch, GAMMA, ConstantValue(100.0))
    # V(final) is not added after a fall
    torch.testing.assert_close(returns, returns_to_go(batch, GAMMA))


@pytest.fixture(scope="module")
def policy_and_fitted_baseline():
    """A fixed (initial) policy and a baseline fitted on episodes *separate* from the ones
    tested."""
    torch.manual_seed(0)
    policy, value = CategoricalPolicy(4, 2), ValueNetwork(4)
    envs, optimizer = make_envs("CartPole-v1", 16), torch.optim.Adam(value.parameters(), lr=1e-3)
    for index in range(30):
        batch = collect_episodes(envs, policy, seed=123 if index == 0 else None)
        fit_value(value, optimizer, batch, returns_to_go(batch, 0.99), 20)
    return policy, value


def projected_z_scores(difference: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """z-scores of the mean of ``difference`` (rows: samples) along each row of ``directions``."""
    projected = difference @ directions.T
    return projected.mean(0) / (projected.std(0) / len(projected) ** 0.5)


def test_the_baseline_keeps_the_mean_gradient_and_cuts_its_variance(policy_and_fitted_baseline):
    policy, value = policy_and_fitted_baseline
    without, with_baseline = gradient_estimates(
        policy, value, "CartPole-v1", batches=200, episodes_per_batch=8, seed=7
    )
    variance_ratio = with_baseline.var(0).sum() / without.var(0).sum()
    print(f"total variance with / without the baseline: {variance_ratio:.3f}")
    assert variance_ratio <= 0.7
    directions = torch.cat(
        [
            without.mean(0, keepdim=True),
            torch.randn(8, without.shape[1], generator=torch.Generator().manual_seed(1)),
        ]
    )
    z = projected_z_scores(without - with_baseline, directions)
    assert torch.all(z.abs() < 4), z  # the mean is unchanged, within its standard error


def test_an_action_dependent_baseline_shifts_the_mean(policy_and_fitted_baseline):
    """The same check catches a "baseline" that looks at the action, b = 20 a: it is no longer
    unbiased."""
    policy, _ = policy_and_fitted_baseline
    envs, differences = make_envs("CartPole-v1", 8), []
    for index in range(100):
        batch = collect_episodes(envs, policy, seed=7 if index == 0 else None)
        policy.zero_grad()
        reinforce_loss(policy, batch, 20.0 * batch.actions * batch.mask).backward()
        differences.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    differences = torch.stack(differences)
    z = projected_z_scores(
        differences,
        torch.randn(9, differences.shape[1], generator=torch.Generator().manual_seed(1)),
    )
    assert z.abs().max() > 4


def test_the_cartpole_preset_fills_only_what_the_caller_leaves_out():
    config = ReinforceConfig.for_env("CartPole-v1", learning_rate=3e-4)
    assert (
        config.learning_rate == 3e-4 and config.total_steps == 200_000 and config.baseline is True
    )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"value_learning_rate": -1.0}, "value_learning_rate"),
        ({"total_steps": 0}, "total_steps"),
        ({"episodes_per_update": 0}, "episodes_per_update"),
        ({"gamma": -0.1}, "gamma"),
        ({"hidden_sizes": (64, 0)}, "hidden_sizes"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
    ],
)
def test_bad_config_raises_a_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ReinforceConfig(**kwargs)


def test_a_continuous_action_environment_is_refused():
    with pytest.raises(ValueError, match="env_id must be an environment with Discrete actions"):
        train(ReinforceConfig.for_env("Pendulum-v1", total_steps=10))


@pytest.mark.parametrize("baseline", [True, False])
def test_same_seed_same_numbers(baseline):
    config = dict(
        total_steps=400, episodes_per_update=4, hidden_sizes=(16,), seed=3, baseline=baseline
    )
    first, second = (
        train(ReinforceConfig.for_env("CartPole-v1", **config)),
        train(ReinforceConfig.for_env("CartPole-v1", **config)),
    )
    for a, b in zip(first.agent.parameters(), second.agent.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert first.history == second.history and (first.critic is None) == (not baseline)
    assert first.history[-1]["step"] >= 400


def test_normalized_advantages_are_whitened_over_valid_steps_only():
    batch = two_episodes()
    returns = returns_to_go(batch, GAMMA)
    advantages = reinforce.advantages_of(batch, returns, None, normalize=True)
    valid = advantages[batch.mask.bool()]
    assert abs(float(valid.mean())) < 1e-6 and float(valid.std()) == pytest.approx(1.0, abs=1e-4)
    assert torch.all(advantages[~batch.mask.bool()] == 0)
