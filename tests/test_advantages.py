"""rlkit.advantages against the plain reverse loops of tests/oracles.py and closed forms."""

import pytest
import torch

from rlkit.advantages import discounted_returns, gae
from tests.oracles import deepspeed_chat_gae, loop_discounted_returns


def random_case(seed, dtype, batch=6, length=17, with_mask=True, with_dones=True, with_last=True):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, length, generator=gen, dtype=dtype)
    values = torch.randn(batch, length, generator=gen, dtype=dtype)
    dones = (torch.rand(batch, length, generator=gen) < 0.15).to(dtype) if with_dones else None
    last_value = torch.randn(batch, generator=gen, dtype=dtype) if with_last else None
    mask = None
    if with_mask:  # right-padded rows of random length, at least one full row and one of length 1
        lengths = torch.randint(1, length + 1, (batch,), generator=gen)
        lengths[0], lengths[-1] = length, 1
        mask = (torch.arange(length)[None, :] < lengths[:, None]).to(dtype)
    gamma = float(torch.rand(1, generator=gen)) * 0.5 + 0.5
    lam = float(torch.rand(1, generator=gen))
    return rewards, values, gamma, lam, dones, last_value, mask


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("with_mask", [False, True])
def test_gae_equals_the_reverse_loop_in_float64(seed, with_mask):
    rewards, values, gamma, lam, dones, last_value, mask = random_case(
        seed, torch.float64, with_mask=with_mask
    )
    ours = gae(rewards, values, gamma, lam, dones=dones, last_value=last_value, mask=mask)
    reference = deepspeed_chat_gae(
        rewards, values, gamma, lam, dones=dones, last_value=last_value, mask=mask
    )
    for got, expected in zip(ours, reference):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_gae_equals_the_reverse_loop_in_float32_over_long_horizons(seed):
    rewards, values, gamma, lam, dones, last_value, mask = random_case(
        seed, torch.float32, batch=8, length=1024
    )
    ours = gae(rewards, values, gamma, lam, dones=dones, last_value=last_value, mask=mask)
    reference = deepspeed_chat_gae(
        rewards, values, gamma, lam, dones=dones, last_value=last_value, mask=mask
    )
    for got, expected in zip(ours, reference):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length", [1, 2, 3, 5, 8, 64, 65])
def test_gae_handles_every_length_including_non_powers_of_two(length):
    rewards, values, gamma, lam, dones, last_value, _ = random_case(
        length, torch.float64, length=length, with_mask=False
    )
    ours = gae(rewards, values, gamma, lam, dones=dones, last_value=last_value)
    reference = deepspeed_chat_gae(rewards, values, gamma, lam, dones=dones, last_value=last_value)
    torch.testing.assert_close(ours[0], reference[0], rtol=0, atol=1e-9)


def test_a_hand_computed_case():
    # gamma = 0.5, lam = 0.5, V = 0: A_2 = 1, A_1 = 1 + 0.25 * 1, A_0 = 1 + 0.25 * 1.25
    rewards = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    advantages, returns = gae(rewards, torch.zeros_like(rewards), gamma=0.5, lam=0.5)
    torch.testing.assert_close(advantages, torch.tensor([[1.3125, 1.25, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(returns, advantages)
    torch.testing.assert_close(
        discounted_returns(rewards, 0.5), torch.tensor([[1.75, 1.5, 1.0]], dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", range(5))
def test_lambda_one_gives_monte_carlo_returns_minus_values(seed):
    rewards, values, gamma, _, dones, last_value, _ = random_case(
        seed, torch.float64, with_mask=False
    )
    advantages, returns = gae(rewards, values, gamma, 1.0, dones=dones, last_value=last_value)
    mc_returns = discounted_returns(rewards, gamma, dones=dones, last_value=last_value)
    torch.testing.assert_close(advantages, mc_returns - values, rtol=0, atol=1e-9)
    torch.testing.assert_close(returns, mc_returns, rtol=0, atol=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_lambda_zero_gives_the_one_step_td_error(seed):
    rewards, values, gamma, _, dones, last_value, _ = random_case(
        seed, torch.float64, with_mask=False
    )
    advantages, _ = gae(rewards, values, gamma, 0.0, dones=dones, last_value=last_value)
    next_values = torch.cat([values[:, 1:], last_value[:, None]], dim=1)
    td_error = rewards + gamma * (1 - dones) * next_values - values
    torch.testing.assert_close(advantages, td_error, rtol=0, atol=1e-12)


def test_nothing_leaks_backwards_across_an_episode_end():
    rewards, values, gamma, lam, _, last_value, _ = random_case(
        0, torch.float64, batch=1, length=10, with_mask=False
    )
    dones = torch.zeros_like(rewards)
    dones[0, 4] = 1.0
    before = gae(rewards, values, gamma, lam, dones=dones, last_value=last_value)[0]
    rewards[0, 5:] += 100.0
    values[0, 5:] -= 50.0
    after = gae(rewards, values, gamma, lam, dones=dones, last_value=last_value)[0]
    torch.testing.assert_close(after[0, :5], before[0, :5], rtol=0, atol=0)
    assert not torch.allclose(after[0, 5:], before[0, 5:])


def test_padding_neither_leaks_nor_receives_values():
    rewards, values, gamma, lam, dones, _, _ = random_case(
        1, torch.float64, batch=3, length=9, with_mask=False
    )
    mask = torch.ones_like(rewards)
    mask[0, 5:] = 0.0
    mask[1, 1:] = 0.0
    before = gae(rewards, values, gamma, lam, dones=dones, mask=mask)
    rewards[mask == 0] = 1e6
    values[mask == 0] = -1e6
    after = gae(rewards, values, gamma, lam, dones=dones, mask=mask)
    for got, expected in zip(after, before):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        assert torch.all(got[mask == 0] == 0)
    # the last valid token is an episode end: its advantage is r - V, whatever follows
    assert after[0][0, 4] == pytest.approx(float(rewards[0, 4] - values[0, 4]))


def test_a_terminal_last_step_ignores_last_value():
    rewards = torch.ones(2, 3, dtype=torch.float64)
    values = torch.zeros_like(rewards)
    dones = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    last_value = torch.tensor([1000.0, 1000.0], dtype=torch.float64)
    returns = discounted_returns(rewards, 1.0, dones=dones, last_value=last_value)
    assert returns[0, 0] == 3.0 and returns[1, 0] == 1003.0
    advantages, _ = gae(rewards, values, 1.0, 1.0, dones=dones, last_value=last_value)
    assert advantages[0, 0] == 3.0 and advantages[1, 0] == 1003.0


@pytest.mark.parametrize("seed", range(3))
def test_discounted_returns_equal_a_python_loop(seed):
    rewards, _, gamma, _, dones, last_value, _ = random_case(seed, torch.float64, with_mask=False)
    expected = loop_discounted_returns(rewards, gamma, dones=dones, last_value=last_value)
    torch.testing.assert_close(
        discounted_returns(rewards, gamma, dones, last_value), expected, rtol=0, atol=1e-9
    )


def test_no_gradient_flows_through_advantages_or_returns():
    values = torch.randn(2, 5, requires_grad=True)
    advantages, returns = gae(torch.randn(2, 5), values, 0.99, 0.95)
    assert not advantages.requires_grad and not returns.requires_grad
    assert not discounted_returns(torch.randn(2, 5, requires_grad=True), 0.9).requires_grad


def test_boolean_dones_and_masks_are_accepted():
    rewards, values, gamma, lam, dones, last_value, mask = random_case(3, torch.float64)
    as_float = gae(rewards, values, gamma, lam, dones=dones, last_value=last_value, mask=mask)
    as_bool = gae(
        rewards, values, gamma, lam, dones=dones.bool(), last_value=last_value, mask=mask.bool()
    )
    torch.testing.assert_close(as_bool[0], as_float[0], rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"values": torch.zeros(2, 4)}, "values"),
        ({"dones": torch.zeros(3, 5)}, "dones"),
        ({"mask": torch.ones(2)}, "mask"),
        ({"last_value": torch.zeros(3)}, "last_value"),
        ({"gamma": 1.5}, "gamma"),
        ({"gamma": -0.1}, "gamma"),
        ({"lam": 1.01}, "lam"),
        ({"rewards": torch.zeros(5)}, "rewards"),
        ({"rewards": torch.zeros(2, 5, dtype=torch.long)}, "rewards"),
    ],
)
def test_bad_input_raises_a_value_error_naming_the_argument(kwargs, name):
    arguments = {
        "rewards": torch.zeros(2, 5),
        "values": torch.zeros(2, 5),
        "gamma": 0.9,
        "lam": 0.9,
        **kwargs,
    }
    if name == "rewards":
        arguments["values"] = torch.zeros_like(arguments["rewards"], dtype=torch.float32)
    with pytest.raises(ValueError, match=name):
        gae(**arguments)
    if name in ("gamma", "dones", "last_value", "rewards"):
        returns_args = {
            k: arguments[k] for k in ("rewards", "gamma", "dones", "last_value") if k in arguments
        }
        with pytest.raises(ValueError, match=name):
            discounted_returns(**returns_args)
