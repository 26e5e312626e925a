"""Checkpoints that survive a crash and resume a run exactly.

A checkpoint is one ``torch.save`` file of plain tensors, numbers, strings, lists and dicts, so that
``torch.load(path, weights_only=True)`` reads it without running any pickled code. It holds everything
the next update depends on: the networks and the optimizer, the counters and the history, every random
number generator (Python's, NumPy's, torch's, the shuffling generators, each environment's) and each
environment's own state (its physical state, its time-limit counter), so that a resumed run continues
with the very numbers an uninterrupted run would have drawn.

Writing is atomic: the file is written next to its destination, flushed to disk, and renamed over it
(``os.replace``, atomic on POSIX and Windows). A crash while writing leaves the previous checkpoint whole.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or does not match the run it is loaded into."""


def save_checkpoint(state: dict, path: str | Path) -> None:
    """Write ``state`` to ``path`` atomically: on any failure the file already at ``path`` is left as it was."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException as error:
        partial.unlink(missing_ok=True)
        if isinstance(error, Exception):
            raise CheckpointError(f"could not write the checkpoint {path} ({type(error).__name__}: {error}); "
                                  "the previous checkpoint is intact") from error
        raise


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by ``save_checkpoint``, with ``weights_only=True``."""
    return torch.load(path, map_location=device, weights_only=True)


# Random number generators ---------------------------------------------------------------------------

def global_rng_state() -> dict:
    """The states of Python's, NumPy's and torch's global generators (CUDA's too where used)."""
    numpy_state = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": {"keys": torch.from_numpy(numpy_state[1].astype(np.int64)), "position": int(numpy_state[2]),
                       "has_gauss": int(numpy_state[3]), "cached_gaussian": float(numpy_state[4])},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_rng_state(state: dict) -> None:
    random.setstate(_tuples(state["python"]))
    numpy_state = state["numpy"]
    np.random.set_state(("MT19937", numpy_state["keys"].numpy().astype(np.uint32), numpy_state["position"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _tuples(value):
    """Python's generator state is nested tuples; a checkpoint may hand them back as lists."""
    return tuple(_tuples(item) for item in value) if isinstance(value, (list, tuple)) else value


# Environment state ----------------------------------------------------------------------------------

PLAIN = (bool, int, float, str, type(None))


def env_state(env: gym.Env | gym.vector.VectorEnv) -> list[dict]:
    """The state of an environment (or vector env) as plain values: one dict per object of its layers.

    Every layer (the vector env, each copy's wrappers, each unwrapped env) contributes its attributes that
    are numbers, strings, None or NumPy arrays (as tensors), its NumPy generators (as their state dicts) and
    the generators of its spaces. That covers what Gymnasium's environments keep between steps: the
    physical state, the time-limit counter, the episode statistics, the random streams.
    """
    return [_object_state(layer) for layer in _layers(env)]


def load_env_state(env: gym.Env | gym.vector.VectorEnv, state: list[dict]) -> None:
    """Restore what ``env_state`` saved, into an environment built the same way."""
    layers = _layers(env)
    names = [type(layer).__name__ for layer in layers]
    saved = [entry["__class__"] for entry in state]
    if names != saved:
        raise CheckpointError(f"the environment does not match the checkpoint's: layers {names} here, {saved} saved")
    for layer, entry in zip(layers, state):
        _load_object_state(layer, entry)


def _layers(env) -> list:
    """The vector env (if any), then each copy's chain of wrappers down to the unwrapped env."""
    copies = env.envs if isinstance(getattr(env, "envs", None), list) else [env] if not isinstance(env, gym.vector.VectorEnv) else []
    layers = [env] if isinstance(env, gym.vector.VectorEnv) else []
    for copy in copies:
        layer = copy
        while True:
            layers.append(layer)
            if not isinstance(layer, gym.Wrapper):
                break
            layer = layer.env
    return layers


def _object_state(layer) -> dict:
    state: dict[str, Any] = {"__class__": type(layer).__name__}
    for name, value in vars(layer).items():
        if isinstance(value, PLAIN):
            state[name] = value
        elif isinstance(value, np.ndarray) and value.dtype != object:
            state[name] = torch.from_numpy(value.copy())
        elif isinstance(value, np.random.Generator):
            state[name] = {"__generator__": value.bit_generator.state}
        elif isinstance(value, gym.spaces.Space) and value._np_random is not None:
            state[name] = {"__space_generator__": value._np_random.bit_generator.state}
    return state


def _load_object_state(layer, state: dict) -> None:
    for name, value in state.items():
        if name == "__class__":
            continue
        if isinstance(value, torch.Tensor):
            setattr(layer, name, value.numpy().copy())
        elif isinstance(value, dict) and "__generator__" in value:
            setattr(layer, name, _generator(value["__generator__"]))
        elif isinstance(value, dict) and "__space_generator__" in value:
            getattr(layer, name)._np_random = _generator(value["__space_generator__"])
        else:
            setattr(layer, name, value)


def _generator(state: dict) -> np.random.Generator:
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    return np.random.Generator(bit_generator)
