"""record_gif writes one episode as an animated GIF and returns that episode's return."""

import gymnasium as gym
import pytest
import torch
from PIL import Image

from rlkit.rendering import record_gif


def push_left(obs):
    return torch.zeros(len(obs), dtype=torch.long)


def test_the_gif_holds_the_episode_and_the_return_is_the_episodes(tmp_path):
    env = gym.make("CartPole-v1")
    env.reset(seed=4)
    length = 0
    while True:
        length += 1
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            break
    path = tmp_path / "left.gif"
    assert record_gif("CartPole-v1", push_left, path, seed=4, every=1, width=120) == float(length)
    image = Image.open(path)
    assert image.size == (120, 80)
    # the reset frame and one per step, 1/30 s each rounded to GIF's 10 ms (Pillow merges identical
    # frames, adding durations)
    assert total_duration(image) == (length + 1) * 30


def total_duration(image) -> int:
    total = 0
    for index in range(image.n_frames):
        image.seek(index)
        total += image.info["duration"]
    return total


def test_max_steps_stops_a_long_episode(tmp_path):
    assert (
        record_gif(
            "Pendulum-v1", lambda obs: torch.zeros(len(obs), 1), tmp_path / "p.gif", max_steps=7
        )
        < 0
    )
    assert total_duration(Image.open(tmp_path / "p.gif")) == (1 + 7 // 2) * 70


def test_the_last_frame_is_kept_when_every_skips_it(tmp_path):
    env = gym.make("CartPole-v1")
    env.reset(seed=4)
    length = 0
    while not any(env.step(0)[2:4]):
        length += 1
    length += 1
    record_gif("CartPole-v1", push_left, tmp_path / "e.gif", seed=4, every=length + 5, fps=100)
    # the reset frame and the last
    assert total_duration(Image.open(tmp_path / "e.gif")) == 2 * 10 * (length + 5)


@pytest.mark.parametrize("field", ["max_steps", "fps", "every", "width"])
def test_bad_numbers_name_the_field(tmp_path, field):
    with pytest.raises(ValueError, match=field):
        record_gif("CartPole-v1", push_left, tmp_path / "x.gif", **{field: 0})
