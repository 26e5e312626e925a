"""The shared networks: shapes, the initialisation the implementation details prescribe,
distributions."""

import math

import pytest
import torch

from rlkit.nets import CategoricalPolicy, GaussianPolicy, QNetwork, ValueNetwork, mlp


def singular_values(layer):
    return torch.linalg.svdvals(layer.weight.detach())


def test_orthogonal_init_with_the_prescribed_gains():
    torch.manual_seed(0)
    policy = CategoricalPolicy(4, 2, (64, 64))
    hidden, head = policy.net[0], policy.net[-1]
    torch.testing.assert_close(
        singular_values(hidden), torch.full((4,), math.sqrt(2)), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(singular_values(head), torch.full((2,), 0.01), rtol=1e-4, atol=1e-6)
    assert torch.all(hidden.bias == 0)
    value_head = ValueNetwork(4).net[-1]
    torch.testing.assert_close(singular_values(value_head), torch.ones(1), rtol=1e-5, atol=1e-5)


def test_shapes_and_distributions():
    obs = torch.randn(5, 3)
    assert QNetwork(3, 4)(obs).shape == (5, 4)
    assert ValueNetwork(3)(obs).shape == (5,)
    categorical = CategoricalPolicy(3, 4).distribution(obs)
    assert categorical.sample().shape == (5,)
    torch.testing.assert_close(categorical.probs.sum(-1), torch.ones(5))
    gaussian = GaussianPolicy(3, 2, initial_log_std=-0.5)
    distribution = gaussian.distribution(obs)
    action = distribution.sample()
    assert action.shape == (5, 2) and distribution.log_prob(action).shape == (5,)
    expected = torch.distributions.Normal(gaussian(obs), math.exp(-0.5)).log_prob(action).sum(-1)
    torch.testing.assert_close(distribution.log_prob(action), expected)


def test_a_nearly_uniform_first_policy():
    torch.manual_seed(0)
    probs = CategoricalPolicy(4, 3).distribution(torch.randn(100, 4)).probs
    assert torch.all((probs - 1 / 3).abs() < 0.02)


def test_bad_sizes_raise_value_errors():
    with pytest.raises(ValueError, match="activation"):
        mlp(3, (8,), 2, activation="sigmoid")
    with pytest.raises(ValueError, match="layer sizes"):
        mlp(3, (0,), 2)


# ---- The actor-critic network, the fast samplers and flat parameters (Chapter 6) -----------------

from rlkit.nets import (  # noqa: E402 (this part of the file tests Chapter 6's network)
    ActorCritic,
    FlatAdam,
    categorical_log_prob_and_entropy,
    categorical_sample,  # noqa: E402
    flatten_parameters,
    gaussian_log_prob_and_entropy,
    gaussian_sample,
)


def separate_networks(agent: ActorCritic):
    """The actor and critic MLPs that ``agent`` computes as one, with its weights copied in."""
    sizes = [weight.shape for weight, _ in agent.layers]
    actor = mlp(sizes[0][1], [s[2] for s in sizes[:-1]], sizes[-1][2], "tanh")
    critic = mlp(sizes[0][1], [s[2] for s in sizes[:-1]], 1, "tanh")
    with torch.no_grad():
        for index, (weight, bias) in enumerate(agent.layers):
            actor[2 * index].weight.copy_(weight[0].T)
            actor[2 * index].bias.copy_(bias[0, 0])
            out = critic[2 * index].out_features
            critic[2 * index].weight.copy_(weight[1, :, :out].T)
            critic[2 * index].bias.copy_(bias[1, 0, :out])
    return actor, critic


def test_actor_critic_computes_two_separate_mlps():
    torch.manual_seed(0)
    agent = ActorCritic(5, 3, (32, 16))
    actor, critic = separate_networks(agent)
    obs = torch.randn(7, 5)
    logits, values = agent(obs)
    torch.testing.assert_close(logits, actor(obs))
    torch.testing.assert_close(values, critic(obs).squeeze(-1))
    logits_2d, values_2d = agent(obs.reshape(7, 1, 5))  # any batch shape
    assert logits_2d.shape == (7, 1, 3) and values_2d.shape == (7, 1)


def test_actor_critic_init_gains_and_no_shared_torso():
    torch.manual_seed(0)
    agent = ActorCritic(4, 2, (64, 64))
    (first, _), _, (head, head_bias) = agent.layers
    for member in (0, 1):  # each torso is its own orthogonal matrix with gain sqrt(2)
        torch.testing.assert_close(
            torch.linalg.svdvals(first[member]),
            torch.full((4,), math.sqrt(2)),
            rtol=1e-5,
            atol=1e-5,
        )
    assert not torch.allclose(first[0], first[1])
    torch.testing.assert_close(
        torch.linalg.svdvals(head[0]), torch.full((2,), 0.01), rtol=1e-4, atol=1e-6
    )
    torch.testing.assert_close(
        torch.linalg.svdvals(head[1, :, :1]), torch.ones(1), rtol=1e-5, atol=1e-5
    )
    assert torch.all(head[1, :, 1:] == 0) and torch.all(head_bias == 0)


def test_actor_loss_does_not_reach_the_critic_and_padding_gets_no_gradient():
    torch.manual_seed(0)
    agent = ActorCritic(4, 3)
    logits, values = agent(torch.randn(6, 4))
    logits.sum().backward()
    assert all(torch.all(weight.grad[1] == 0) for weight, _ in agent.layers)
    agent.zero_grad()
    logits, values = agent(torch.randn(6, 4))
    values.sum().backward()
    head = agent.layers[-1][0]
    assert torch.all(head.grad[1, :, 1:] == 0) and torch.all(head.grad[0] == 0)


def test_categorical_sample_follows_the_probabilities():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5]]).expand(40_000, -1)
    actions, logprobs = categorical_sample(logits)
    probs = torch.softmax(logits[0], -1)
    frequencies = torch.bincount(actions, minlength=4).float() / len(actions)
    standard_error = (probs * (1 - probs) / len(actions)).sqrt()
    assert torch.all((frequencies - probs).abs() < 4 * standard_error), (frequencies, probs)
    torch.testing.assert_close(
        logprobs, torch.distributions.Categorical(logits=logits).log_prob(actions)
    )


def test_categorical_sample_never_returns_a_zero_probability_action(monkeypatch):
    torch.manual_seed(0)
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).expand(10_000, -1)
    actions, _ = categorical_sample(logits)
    assert set(actions.tolist()) == {0, 2}
    # The extreme draws: 0, and the largest float32 below 1 on rows whose probabilities sum to just
    # below 1 in float32 (the last action impossible), where an unscaled draw would pass the last
    # possible action.
    torch.manual_seed(1)
    rows = torch.cat([torch.randn(2000, 3) * 3, torch.full((2000, 1), float("-inf"))], dim=1)
    short = torch.softmax(rows, -1).cumsum(-1)[:, -1] < 1
    assert short.any()
    for extreme in (0.0, 1.0 - 2.0**-24):
        monkeypatch.setattr(
            torch, "rand", lambda shape, device=None, value=extreme: torch.full(shape, value)
        )
        actions, logprobs = categorical_sample(rows[short])
        assert torch.all(actions < 3) and torch.isfinite(logprobs).all()
        first_impossible = torch.tensor([[float("-inf"), 0.0]])
        assert categorical_sample(first_impossible)[0].item() == 1


def test_log_prob_and_entropy_equal_torch_distributions():
    torch.manual_seed(0)
    logits, actions = torch.randn(9, 5), torch.randint(0, 5, (9,))
    logprobs, entropies = categorical_log_prob_and_entropy(logits, actions)
    reference = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logprobs, reference.log_prob(actions))
    torch.testing.assert_close(entropies, reference.entropy())
    mean, log_std = torch.randn(9, 2), torch.tensor([-0.3, 0.4])
    actions, sampled_logprobs = gaussian_sample(mean, log_std)
    logprobs, entropies = gaussian_log_prob_and_entropy(mean, log_std, actions)
    normal = torch.distributions.Independent(torch.distributions.Normal(mean, log_std.exp()), 1)
    torch.testing.assert_close(logprobs, normal.log_prob(actions))
    torch.testing.assert_close(sampled_logprobs, logprobs)
    torch.testing.assert_close(entropies, normal.entropy())


def test_continuous_actor_critic_acts_and_evaluates_consistently():
    torch.manual_seed(0)
    agent = ActorCritic(3, 2, continuous=True)
    obs = torch.randn(5, 3)
    actions, logprobs, values = agent.act(obs)
    again, _, values_again = agent.log_prob_entropy_and_value(obs, actions)
    torch.testing.assert_close(again, logprobs)
    torch.testing.assert_close(values_again, values)
    assert actions.shape == (5, 2) and agent.greedy(obs).shape == (5, 2)


def test_flat_parameters_share_memory_and_gradients_with_the_module():
    torch.manual_seed(0)
    agent = ActorCritic(4, 2)
    expected = torch.cat([p.detach().flatten() for p in agent.parameters()])
    flat = flatten_parameters(agent)
    torch.testing.assert_close(flat.detach(), expected)
    obs, actions = torch.randn(8, 4), torch.randint(0, 2, (8,))
    logprobs, entropies, values = agent.log_prob_entropy_and_value(obs, actions)
    (logprobs.sum() + values.sum()).backward()
    torch.testing.assert_close(flat.grad, torch.cat([p.grad.flatten() for p in agent.parameters()]))
    assert flat.grad.abs().sum() > 0
    with torch.no_grad():  # an optimizer step on the flat parameter is a step on the module
        flat.sub_(0.1 * flat.grad)
    torch.testing.assert_close(
        torch.cat([p.detach().flatten() for p in agent.parameters()]), flat.detach()
    )
    state = {name: tensor.clone() for name, tensor in agent.state_dict().items()}
    for assign in (False, True):
        fresh = ActorCritic(4, 2)
        fresh.load_state_dict(state, assign=assign)
        torch.testing.assert_close(fresh(obs)[0], agent(obs)[0])
    zeros = {name: torch.zeros_like(tensor) for name, tensor in agent.named_parameters()}
    logits, values = torch.func.functional_call(agent, zeros, (obs,))
    assert torch.all(logits == 0) and torch.all(values == 0)


def test_flat_adam_takes_the_same_steps_as_torch_adam():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Parameter(torch.randn(300)), torch.nn.Parameter(torch.zeros(300))
    theirs.data.copy_(ours.data)
    ours.grad = torch.zeros_like(ours)
    flat_adam = FlatAdam([ours], lr=1e-3, betas=(0.8, 0.99), eps=1e-5)
    torch_adam = torch.optim.Adam([theirs], lr=1e-3, betas=(0.8, 0.99), eps=1e-5)
    for step in range(60):
        gradient = torch.randn(300) * (1 + step)
        flat_adam.zero_grad()
        ours.grad.add_(gradient)
        theirs.grad = gradient.clone()
        if step == 30:  # a new learning rate, as a schedule sets it
            for optimizer in (flat_adam, torch_adam):  # a drop-in: the same way to set it
                optimizer.param_groups[0]["lr"] = 2e-4
        flat_adam.step()
        torch_adam.step()
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)
    assert flat_adam.steps == 60
    with pytest.raises(ValueError, match="params must be one flat parameter"):
        FlatAdam([ours, theirs], lr=1e-3)
    torch.testing.assert_close(
        flat_adam.exp_avg_sq, torch_adam.state[theirs]["exp_avg_sq"], rtol=0, atol=0
    )
