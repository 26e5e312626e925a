"""The shared networks: shapes, the initialisation the implementation details prescribe, distributions."""

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
    torch.testing.assert_close(singular_values(hidden), torch.full((4,), math.sqrt(2)), rtol=1e-5, atol=1e-5)
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
