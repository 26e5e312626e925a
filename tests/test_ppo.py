"""PPO: the update against a plain PyTorch loop, each implementation detail where a test can see it,
bad input."""

import copy
import math

import pytest
import torch
from torch.distributions import Categorical, Normal

from rlkit import ppo
from rlkit.nets import FlatAdam, flatten_parameters
from rlkit.presets import PRESETS
from rlkit.rollouts import RolloutCollector, make_vector_env


def small_config(env_id="CartPole-v1", **overrides):
    fields = dict(
        seed=0,
        total_steps=512,
        num_envs=4,
        num_steps=16,
        minibatch_size=16,
        num_epochs=4,
        learning_rate=3e-4,
        batched_env=False,
    )
    return ppo.PPOConfig.for_env(env_id, **{**fields, **overrides})


def collect_one(config):
    torch.manual_seed(config.seed)
    envs = make_vector_env(config.env_id, config.num_envs)
    agent = ppo.make_agent(config, envs)
    collector = RolloutCollector(envs, agent, config.num_steps, config.gamma, config.seed)
    for _ in range(3):  # a few rollouts in, so that some episodes have ended
        rollout = collector.collect()
    return agent, rollout


def hand_gae(rewards, values, dones, last_value, gamma, lam):
    """A_t = delta_t + gamma lam (1 - done_t) A_{t+1}, one step at a time."""
    advantages = torch.zeros_like(rewards)
    for row in range(rewards.shape[0]):
        following_advantage, following_value = 0.0, last_value[row].item()
        for t in reversed(range(rewards.shape[1])):
            not_done = 1.0 - dones[row, t].item()
            delta = (
                rewards[row, t].item() + gamma * not_done * following_value - values[row, t].item()
            )
            following_advantage = delta + gamma * lam * not_done * following_advantage
            advantages[row, t], following_value = following_advantage, values[row, t].item()
    return advantages, advantages + values


def reference_update(agent, rollout, config, clip_eps):
    """PPO's update written the way CleanRL and SB3 write it: torch.distributions, torch.optim.Adam,
    clip_grad_norm_, per-minibatch advantage normalisation with the std, one permutation per
    epoch."""
    advantages, returns = hand_gae(
        rollout.rewards, rollout.values, rollout.dones, rollout.last_value, config.gamma, config.lam
    )
    obs, actions = rollout.obs.flatten(0, 1), rollout.actions.flatten(0, 1)
    old_logprobs, old_values = rollout.logprobs.flatten(), rollout.values.flatten()
    advantages, returns = advantages.flatten(), returns.flatten()
    optimizer = torch.optim.Adam(agent.parameters(), lr=config.learning_rate, eps=1e-5)
    generator, size = torch.Generator().manual_seed(config.seed), len(old_logprobs)
    for _ in range(config.num_epochs):
        order = (
            torch.arange(size)
            if config.minibatch_size == size
            else torch.randperm(size, generator=generator)
        )
        for start in range(0, size, config.minibatch_size):
            index = order[start : start + config.minibatch_size]
            head, values = agent(obs[index])
            if agent.continuous:
                normal = Normal(head, agent.log_std.exp())
                logprobs, entropy = (
                    normal.log_prob(actions[index]).sum(-1),
                    normal.entropy().sum(-1),
                )
            else:
                categorical = Categorical(logits=head)
                logprobs, entropy = categorical.log_prob(actions[index]), categorical.entropy()
            advantage = advantages[index]
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
            ratio = (logprobs - old_logprobs[index]).exp()
            policy_loss = torch.max(
                -advantage * ratio, -advantage * ratio.clamp(1 - clip_eps, 1 + clip_eps)
            ).mean()
            value_error = (values - returns[index]) ** 2
            if config.value_clip_eps is not None:
                clipped = old_values[index] + (values - old_values[index]).clamp(
                    -config.value_clip_eps, config.value_clip_eps
                )
                value_error = torch.max(value_error, (clipped - returns[index]) ** 2)
            loss = (
                policy_loss
                + config.vf_coef * 0.5 * value_error.mean()
                - config.ent_coef * entropy.mean()
            )
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(agent.parameters(), config.max_grad_norm)
            optimizer.step()


@pytest.mark.parametrize(
    "env_id, overrides",
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", dict(value_clip_eps=0.2, ent_coef=0.01)),
        # the minibatch is the whole rollout
        (
            "CartPole-v1",
            dict(minibatch_size=64, num_epochs=3),
        ),
        ("CartPole-v1", dict(max_grad_norm=0.05)),  # the clip is active at every step
        ("Pendulum-v1", dict(value_clip_eps=0.5, ent_coef=0.01)),
    ],
)
def test_update_equals_a_plain_pytorch_ppo_loop(env_id, overrides):
    config = small_config(env_id, **overrides)
    agent, rollout = collect_one(config)
    reference, initial = copy.deepcopy(agent), [p.detach().clone() for p in agent.parameters()]
    flat = flatten_parameters(agent)
    # the scheduled clip range (0.1) is not the config's (0.2): the update must use the one it is
    # given
    metrics = ppo.update(
        agent,
        FlatAdam([flat], config.learning_rate, eps=1e-5),
        rollout,
        config,
        0.1,
        torch.Generator().manual_seed(config.seed),
    )
    reference_update(reference, rollout, config, 0.1)
    for (name, ours), theirs in zip(agent.named_parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4, msg=name)
    assert all(not torch.equal(before, after) for before, after in zip(initial, agent.parameters()))
    assert metrics["epochs"] == config.num_epochs


def test_ppo_loss_against_a_hand_computation():
    config = small_config(value_clip_eps=0.1, ent_coef=0.05, vf_coef=0.7)
    agent, rollout = collect_one(config)
    batch = ppo.Batch.from_rollout(rollout, torch.randn(64), torch.randn(64))
    # ratios well away from 1, both sides of the clip
    batch.logprobs = batch.logprobs + 0.3 * torch.randn(64)
    assert config.normalize_advantages
    loss, parts = ppo.ppo_loss(agent, batch, config, clip_eps=0.2)
    head, values = agent(batch.obs)
    logp = torch.log_softmax(head, -1)
    advantages = (batch.advantages - batch.advantages.mean()) / batch.advantages.std()
    expected = 0.0
    for i in range(64):
        ratio = math.exp(logp[i, batch.actions[i]].item() - batch.logprobs[i].item())
        surrogate = min(
            ratio * advantages[i].item(), min(max(ratio, 0.8), 1.2) * advantages[i].item()
        )
        value, old, target = values[i].item(), batch.values[i].item(), batch.returns[i].item()
        clipped_value = old + min(max(value - old, -0.1), 0.1)
        value_loss = 0.5 * max((value - target) ** 2, (clipped_value - target) ** 2)
        entropy = -(logp[i].exp() * logp[i]).sum().item()
        expected += (-surrogate + 0.7 * value_loss - 0.05 * entropy) / 64
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert parts.shape == (3,) and not parts.requires_grad


def test_minibatches_are_a_fresh_permutation_each_epoch():
    batch = ppo.Batch(*(torch.arange(12.0) for _ in range(6)))
    generator = torch.Generator().manual_seed(0)
    epochs = [
        [minibatch.obs for minibatch in ppo.minibatches(batch, 4, generator)] for _ in range(2)
    ]
    for minibatches in epochs:
        assert [len(m) for m in minibatches] == [4, 4, 4]
        # each transition exactly once
        assert sorted(torch.cat(minibatches).tolist()) == list(range(12))
    assert not torch.equal(torch.cat(epochs[0]), torch.cat(epochs[1]))  # shuffled anew
    whole = list(ppo.minibatches(batch, 12, generator))
    assert len(whole) == 1 and whole[0] is batch


def test_training_is_reproducible_and_logs_the_diagnostics():
    config = small_config(total_steps=640, ent_coef=0.01, learning_rate=3e-3)
    first, second = ppo.train(config), ppo.train(config)
    assert first.history == second.history
    for a, b in zip(first.agent.parameters(), second.agent.parameters()):
        assert torch.equal(a, b)
    assert len(first.history) == config.num_updates == 10
    for row in first.history:
        assert row["approx_kl"] >= 0 and 0 <= row["clip_fraction"] <= 1 and row["epochs"] == 4
        assert all(
            math.isfinite(row[name])
            for name in ("policy_loss", "value_loss", "entropy", "grad_norm", "explained_variance")
        )
    assert any(row["clip_fraction"] > 0 for row in first.history)


def test_learning_rate_and_clip_range_anneal_linearly(monkeypatch):
    used_rates, adam_step = [], FlatAdam.step
    monkeypatch.setattr(
        FlatAdam,
        "step",
        lambda self: (used_rates.append(self.param_groups[0]["lr"]), adam_step(self))[1],
    )
    config = small_config(total_steps=640, clip_schedule="linear")
    history = ppo.train(config).history
    # 4 epochs x 4 minibatches
    assert used_rates == [row["learning_rate"] for row in history for _ in range(16)]
    fractions = [1 - index / 10 for index in range(10)]
    assert [row["learning_rate"] for row in history] == pytest.approx([3e-4 * f for f in fractions])
    assert [row["clip_eps"] for row in history] == pytest.approx([0.2 * f for f in fractions])
    constant = ppo.train(
        small_config(total_steps=640, lr_schedule="constant", clip_schedule="constant")
    ).history
    assert {row["learning_rate"] for row in constant} == {3e-4} and {
        row["clip_eps"] for row in constant
    } == {0.2}


def test_target_kl_stops_the_epochs_early():
    history = ppo.train(small_config(total_steps=256, learning_rate=1e-2, target_kl=1e-6)).history
    assert all(row["epochs"] == 1 for row in history)


def test_continuous_policy_starts_at_the_given_spread_and_evaluates_within_the_bounds():
    config = small_config("Pendulum-v1", total_steps=128, initial_log_std=-0.5)
    result = ppo.train(config)
    assert result.agent.continuous and result.agent.log_std.shape == (1,)
    assert result.history[-1]["action_std"] == pytest.approx(result.agent.log_std.exp().item())
    # one update from the start
    assert result.history[0]["action_std"] == pytest.approx(math.exp(-0.5), abs=0.02)
    act = ppo.greedy_actions(result.agent, __import__("gymnasium").make("Pendulum-v1").action_space)
    result.agent.weight2.data[0].fill_(10.0)  # a mean far outside [-2, 2]
    actions = act(torch.randn(50, 3))
    assert actions.abs().max() <= 2.0 and (actions.abs() == 2.0).any()
    assert -1700 < ppo.evaluate(result, episodes=2) <= 0


def test_for_env_applies_the_preset_then_the_overrides():
    config = ppo.PPOConfig.for_env("CartPole-v1", num_epochs=5)
    cartpole = PRESETS["ppo"]["CartPole-v1"]
    assert config.num_epochs == 5 and config.total_steps == cartpole["total_steps"] == 100_000
    assert (config.num_envs, config.num_steps, config.minibatch_size, config.gamma, config.lam) == (
        32,
        8,
        256,
        0.98,
        0.8,
    )
    assert config.value_clip_eps is None  # the presets leave value clipping off
    assert (
        ppo.PPOConfig.for_env("Pendulum-v1").num_steps == PRESETS["ppo"]["Pendulum-v1"]["num_steps"]
    )
    plain = ppo.PPOConfig()  # exactly its fields: CleanRL's defaults, on CartPole-v1 too
    assert (plain.num_steps, plain.minibatch_size, plain.lr_schedule, plain.optimizer_eps) == (
        128,
        128,
        "linear",
        1e-5,
    )
    assert (plain.value_clip_eps, plain.ent_coef) == (0.2, 0.01)
    assert ppo.PPOConfig.for_env("Acrobot-v1") == ppo.PPOConfig(env_id="Acrobot-v1")  # no preset


BAD_CONFIGS = [
    (dict(clip_eps=-0.1), "clip_eps"),
    (dict(clip_eps=0), "clip_eps"),
    (dict(num_epochs=0), "num_epochs"),
    (dict(minibatch_size=512), "minibatch_size"),  # larger than the rollout of 32 x 8
    (dict(minibatch_size=100), "minibatch_size"),  # does not divide it
    (dict(env_id="NoSuchEnv-v0"), "env_id"),
    (dict(env_id="Pendulum-v1", batched_env=True), "batched_env"),  # a CartPole-only option
    (dict(value_clip_eps=0.0), "value_clip_eps"),
    (dict(target_kl=-0.01), "target_kl"),
    (dict(lr_schedule="cosine"), "lr_schedule"),
    (dict(clip_schedule="exponential"), "clip_schedule"),
    (dict(gamma=1.5), "gamma"),
    (dict(lam=-0.1), "lam"),
    (dict(num_envs=0), "num_envs"),
    (dict(num_steps=0), "num_steps"),
    (dict(total_steps=0), "total_steps"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(max_grad_norm=0.0), "max_grad_norm"),
    (dict(ent_coef=-0.01), "ent_coef"),
    (dict(vf_coef="0.5"), "vf_coef"),
    (dict(normalize_advantages="yes"), "normalize_advantages"),
    # whitening one advantage
    (
        dict(minibatch_size=1, num_envs=1, num_steps=4),
        "normalize_advantages",
    ),
    (dict(hidden_sizes=64), "hidden_sizes"),
    (dict(activation="gelu"), "activation"),
    (dict(num_epochs=True), "num_epochs"),
    (dict(seed=1.5), "seed"),
    (dict(device="gpu"), "device"),
    (dict(initial_log_std="wide"), "initial_log_std"),
    (dict(env_id="Pendulum-v1", initial_log_std=float("nan")), "initial_log_std"),
    (dict(seed=-1), "seed"),
    (dict(seed=2**32), "seed"),
    (dict(hidden_sizes=(True,)), "hidden_sizes"),
    (dict(learning_rate=float("inf")), "learning_rate"),
    (dict(ent_coef=float("nan")), "ent_coef"),
    (dict(total_steps=100), "total_steps"),  # less than one rollout
    (dict(env_id=":CartPole-v1"), "env_id"),
]


@pytest.mark.parametrize(
    "overrides, field",
    BAD_CONFIGS,
    ids=[f"{field}={list(o.values())[-1]!r}" for o, field in BAD_CONFIGS],
)
def test_bad_configs_raise_a_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        ppo.PPOConfig.for_env(**{"env_id": "CartPole-v1", **overrides})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_device_this_machine_lacks_is_refused():
    with pytest.raises(ValueError, match="^device must be 'cpu' or an available device"):
        ppo.PPOConfig.for_env("CartPole-v1", device="cuda")


def test_options_that_do_not_fit_the_environment_are_refused_before_training():
    # continuous-only option
    with pytest.raises(ValueError, match="^initial_log_std must be None for CartPole-v1"):
        ppo.train(small_config(initial_log_std=-0.5))
    with pytest.raises(
        ValueError, match="^env_id must be an environment with flat Box observations"
    ):
        ppo.train(small_config("rlkit/GridWorld-v0"))
