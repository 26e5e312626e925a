"""The probe environments: exact rewards, observations, episode ends and references, and the check
that uses them."""

import io
import itertools
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import rlkit  # noqa: F401  (registers the rlkit/ environments)
from rlkit.checkpoint import env_state, load_env_state
from rlkit.envs.probes import (
    PROBES,
    ProbeActionObservationReward,
    ProbeActionReward,
    ProbeConstantReward,
    ProbeDelayedReward,
    ProbeObservationReward,
    probe_failures,
)

GAMMA = 0.5
IDS = list(PROBES)
# Written out by hand from the definitions (Jones, 2021): observations, exact Q(s, .) at each, best
# actions.
REFERENCES = {
    "rlkit/ProbeConstantReward-v0": ([0.0], [[1.0]], [0]),
    "rlkit/ProbeObservationReward-v0": ([-1.0, 1.0], [[-1.0], [1.0]], [0, 0]),
    "rlkit/ProbeDelayedReward-v0": ([0.0, 1.0], [[GAMMA], [1.0]], [0, 0]),
    "rlkit/ProbeActionReward-v0": ([0.0], [[-1.0, 1.0]], [1]),
    "rlkit/ProbeActionObservationReward-v0": ([-1.0, 1.0], [[1.0, -1.0], [-1.0, 1.0]], [0, 1]),
}


def episode(env, actions, seed=None):
    """``(observations, rewards, terminated flags, truncated flags)`` of one episode playing
    ``actions`` in turn."""
    obs, _ = env.reset(seed=seed)
    observations, rewards, terminated, truncated = [obs], [], [], []
    for action in actions:
        obs, reward, term, trunc, _ = env.step(action)
        (
            observations.append(obs),
            rewards.append(reward),
            terminated.append(term),
            truncated.append(trunc),
        )
        if term or trunc:
            break
    return observations, rewards, terminated, truncated


@pytest.mark.parametrize("env_id", IDS)
def test_every_probe_passes_gymnasiums_env_checker_without_a_warning(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make(env_id).unwrapped)


@pytest.mark.parametrize("env_id", IDS)
def test_probes_are_registered_without_a_time_limit_with_flat_float32_observations_and_discrete_actions(  # noqa: E501
    env_id,
):
    env = gym.make(env_id)
    assert env.spec.max_episode_steps is None
    assert isinstance(env.unwrapped, PROBES[env_id])
    assert env.observation_space == gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
    assert env.action_space == gym.spaces.Discrete(PROBES[env_id].n_actions, start=0)
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == (1,) and info == {}


def test_constant_reward_probe_is_one_step_of_reward_one_at_observation_zero():
    env = gym.make("rlkit/ProbeConstantReward-v0")
    for seed in range(5):
        observations, rewards, terminated, truncated = episode(env, [0, 0], seed)
        assert [o.tolist() for o in observations] == [[0.0], [0.0]]
        assert rewards == [1.0] and terminated == [True] and truncated == [False]
        assert all(isinstance(r, float) for r in rewards)


def test_observation_reward_probe_pays_its_observation_and_shows_both_signs():
    env = gym.make("rlkit/ProbeObservationReward-v0")
    seen = set()
    for seed in range(40):
        observations, rewards, terminated, truncated = episode(env, [0, 0], seed)
        first = float(observations[0][0])
        assert first in (-1.0, 1.0)
        assert rewards == [first] and terminated == [True] and truncated == [False]
        assert observations[1].tolist() == [first]  # the final observation repeats the last one
        seen.add(first)
    assert seen == {-1.0, 1.0}


def test_delayed_reward_probe_is_two_steps_observation_0_then_1_reward_0_then_1():
    env = gym.make("rlkit/ProbeDelayedReward-v0")
    for seed in range(5):
        observations, rewards, terminated, truncated = episode(env, [0, 0, 0], seed)
        assert [o.tolist() for o in observations] == [[0.0], [1.0], [1.0]]
        assert rewards == [0.0, 1.0] and terminated == [False, True] and truncated == [False, False]


def test_action_reward_probe_pays_minus_one_for_action_0_and_plus_one_for_action_1():
    env = gym.make("rlkit/ProbeActionReward-v0")
    for action, expected in ((0, -1.0), (1, 1.0)):
        observations, rewards, terminated, truncated = episode(env, [action, action], seed=action)
        assert [o.tolist() for o in observations] == [[0.0], [0.0]]
        assert rewards == [expected] and terminated == [True] and truncated == [False]


def test_action_observation_probe_pays_plus_one_exactly_when_the_action_matches_the_sign():
    env = gym.make("rlkit/ProbeActionObservationReward-v0")
    outcomes = set()
    for seed, action in itertools.product(range(20), (0, 1)):
        observations, rewards, terminated, truncated = episode(env, [action], seed)
        sign = float(observations[0][0])
        assert rewards == [1.0 if (action == 1) == (sign > 0) else -1.0]
        assert terminated == [True] and truncated == [False] and observations[1].tolist() == [sign]
        outcomes.add((sign, action, rewards[0]))
    assert outcomes == {(-1.0, 0, 1.0), (-1.0, 1, -1.0), (1.0, 0, -1.0), (1.0, 1, 1.0)}


@pytest.mark.parametrize("env_id", IDS)
def test_the_same_seed_gives_the_same_episodes_and_the_random_probes_vary_between_seeds(env_id):
    def first_observations(seed):
        env = gym.make(env_id)
        firsts = [float(env.reset(seed=seed)[0][0])]
        for _ in range(30):  # later episodes continue the seeded stream
            episode(env, [0, 0])
            firsts.append(float(env.reset()[0][0]))
        return firsts

    assert first_observations(3) == first_observations(3)
    if len(PROBES[env_id].OBSERVATIONS) > 1 and PROBES[env_id].horizon == 1:
        assert first_observations(3) != first_observations(4)


@pytest.mark.parametrize("env_id", IDS)
def test_stepping_a_finished_episode_or_with_an_invalid_action_raises(env_id):
    env = PROBES[env_id]()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)  # before the first reset
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(env.n_actions)
    episode(env, [0, 0, 0], seed=0)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(0)


@pytest.mark.parametrize("env_id", IDS)
def test_a_generic_checkpoint_of_a_vector_env_of_probes_resumes_it_exactly(env_id):
    """The episode state is plain attributes (numbers, arrays, the generator), which
    ``rlkit.checkpoint`` saves."""

    def make():
        return gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id) for _ in range(3)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )

    actions = np.random.default_rng(0).integers(PROBES[env_id].n_actions, size=(12, 3))
    envs, resumed = make(), make()
    envs.reset(seed=5)
    envs.step(actions[0])  # mid-episode for the two-step probe
    buffer = io.BytesIO()
    torch.save(env_state(envs), buffer)
    buffer.seek(0)
    resumed.reset(seed=6)  # another history, overwritten by the checkpoint
    load_env_state(resumed, torch.load(buffer, weights_only=True))
    assert {"t", "obs", "done"} <= set(vars(resumed.envs[0].unwrapped))
    for action in actions[1:]:
        for a, b in zip(envs.step(action)[:4], resumed.step(action)[:4]):
            np.testing.assert_array_equal(a, b)
    envs.close(), resumed.close()


@pytest.mark.parametrize("env_id", IDS)
def test_references_equal_the_hand_written_table(env_id):
    probe = PROBES[env_id]
    observations, q, best = REFERENCES[env_id]
    obs = probe.observations()
    assert (
        obs.dtype == np.float32
        and obs.shape == (len(observations), 1)
        and obs[:, 0].tolist() == observations
    )
    np.testing.assert_array_equal(probe.q_values(obs, GAMMA), q)
    np.testing.assert_array_equal(probe.expected_values(obs, GAMMA), np.max(q, axis=1))
    np.testing.assert_array_equal(probe.optimal_actions(obs), best)
    uniform = np.full((len(obs), probe.n_actions), 1.0 / probe.n_actions)
    np.testing.assert_array_equal(probe.policy_values(obs, uniform, GAMMA), np.mean(q, axis=1))


@pytest.mark.parametrize("env_id", IDS)
@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.99, 1.0])
def test_q_values_are_the_discounted_returns_the_environment_actually_pays(env_id, gamma):
    """Play episodes with the env itself, every action in turn, and discount the rewards by hand
    from each step."""
    probe = PROBES[env_id]
    returns = {}
    for seed, action in itertools.product(range(20), range(probe.n_actions)):
        env = probe()
        obs, _ = env.reset(seed=seed)
        visited, rewards = [], []
        while not env.done:
            visited.append(float(obs[0]))
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            assert not truncated
        for t, start in enumerate(visited):
            to_go = sum(gamma**k * reward for k, reward in enumerate(rewards[t:]))
            returns.setdefault((start, action), set()).add(to_go)
    obs = probe.observations()
    expected = {
        (float(o), a): q
        for o, row in zip(obs[:, 0], probe.q_values(obs, gamma))
        for a, q in enumerate(row)
    }
    assert set(returns) == set(expected)  # every observation is visited, with every action
    for key, paid in returns.items():
        assert sorted(paid) == pytest.approx([expected[key]] * len(paid)), key


def test_the_probes_are_listed_in_order_with_what_they_check_and_expect():
    assert list(PROBES.values()) == [
        ProbeConstantReward,
        ProbeObservationReward,
        ProbeDelayedReward,
        ProbeActionReward,
        ProbeActionObservationReward,
    ]
    for env_id, probe in PROBES.items():
        assert env_id == f"rlkit/{probe.__name__}-v0"
        assert probe.checks and probe.expected and probe.__doc__


@pytest.mark.parametrize("env_id", IDS)
def test_probe_failures_passes_the_exact_answers_and_names_every_wrong_one(env_id):
    probe = PROBES[env_id]
    obs = probe.observations()
    q = probe.q_values(obs, GAMMA)
    best = np.eye(probe.n_actions)[probe.optimal_actions(obs)]
    assert (
        probe_failures(
            env_id, GAMMA, values=probe.expected_values(obs, GAMMA), q_values=q, action_probs=best
        )
        == []
    )
    assert probe_failures(env_id, GAMMA, values=probe.expected_values(obs, GAMMA) + 0.099) == []
    wrong_values = probe_failures(env_id, GAMMA, values=probe.expected_values(obs, GAMMA) + 0.11)
    assert len(wrong_values) == len(obs) and all(probe.checks in line for line in wrong_values)
    # NaN never passes
    assert len(probe_failures(env_id, GAMMA, q_values=np.full_like(q, np.nan))) == q.size
    if probe.n_actions > 1:
        worst = 1.0 - best
        failures = probe_failures(
            env_id, GAMMA, values=probe.policy_values(obs, worst, GAMMA), action_probs=worst
        )
        assert len(failures) == len(obs) and all("pi(best action" in line for line in failures)
        # a critic is compared with its own policy's value: V* is wrong for a policy that is not
        # optimal
        failures = probe_failures(
            env_id, GAMMA, values=probe.expected_values(obs, GAMMA), action_probs=worst
        )
        assert sum(line.startswith(f"{env_id}: V at") for line in failures) == len(obs)


def test_probe_failures_catches_a_missing_discount_and_rejects_unknown_ids():
    obs = ProbeDelayedReward.observations()
    # V(0) = 1: the discount forgotten
    undiscounted = ProbeDelayedReward.expected_values(obs, gamma=1.0)
    assert len(probe_failures("rlkit/ProbeDelayedReward-v0", GAMMA, values=undiscounted)) == 1
    with pytest.raises(ValueError, match="env_id must be one of"):
        probe_failures("CartPole-v1", GAMMA, values=[0.0])


def test_probes_run_in_a_vector_env_that_resets_at_every_termination():
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("rlkit/ProbeDelayedReward-v0") for _ in range(3)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs, _ = envs.reset(seed=0)
    for step in range(6):
        assert obs[:, 0].tolist() == [float(step % 2)] * 3
        obs, rewards, terminated, truncated, _ = envs.step(np.zeros(3, dtype=np.int64))
        assert (
            rewards.tolist() == [float(step % 2)] * 3 and terminated.tolist() == [step % 2 == 1] * 3
        )
        assert not truncated.any()
    envs.close()
