"""Animated GIFs of an agent acting: one episode rendered with ``render_mode="rgb_array"``, saved by
Pillow.

Classic-control environments draw with pygame (``pip install "gymnasium[classic-control]"``, part of
the ``book`` extra). The notebooks show the file with ``IPython.display.Image(filename=path)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from PIL import Image

__all__ = ["record_gif"]

# rgb_array rendering draws off-screen: no display is needed, and without this SDL complains on
# machines without one.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def record_gif(
    env_id: str,
    act: Callable[[torch.Tensor], torch.Tensor],
    path: str | Path,
    seed: int = 0,
    max_steps: int = 500,
    fps: int = 30,
    every: int = 2,
    width: int = 300,
) -> float:
    """Play one episode of ``env_id`` with ``act(obs_batch) -> actions``, save it as a GIF, return
    its return.

    ``every`` keeps one frame in ``every`` (a 500-step CartPole episode stays a small file);
    ``width`` resizes the frames (aspect kept). Stops after ``max_steps`` environment steps. The
    last frame (the pole falling) is always kept.
    """
    for name, value in (("max_steps", max_steps), ("fps", fps), ("every", every), ("width", width)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    env = gym.make(env_id, render_mode="rgb_array")
    obs, _ = env.reset(seed=seed)
    frames, total = [env.render()], 0.0
    with torch.inference_mode():
        for step in range(max_steps):
            action = act(torch.as_tensor(obs, dtype=torch.float32)[None])[0].cpu().numpy()
            obs, reward, terminated, truncated, _ = env.step(
                action if action.ndim else action.item()
            )
            total += float(reward)
            if step % every == every - 1 or terminated or truncated:
                frames.append(env.render())
            if terminated or truncated:
                break
    env.close()
    images = [_resized(frame, width) for frame in frames]
    images[0].save(
        path,
        save_all=True,
        append_images=images[1:],
        duration=_gif_duration_ms(every / fps),
        loop=0,
    )
    return total


def _gif_duration_ms(seconds: float) -> int:
    """GIF stores frame durations in hundredths of a second: round to those (at least one)."""
    return 10 * max(1, round(100 * seconds))


def _resized(frame: np.ndarray, width: int) -> Image.Image:
    image = Image.fromarray(frame)
    return image.resize((width, max(1, round(image.height * width / image.width))))
