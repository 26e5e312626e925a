"""Checkpoints that survive a crash and resume a run exactly.

A checkpoint is one ``torch.save`` file of plain tensors, numbers, strings, lists and dicts, so that
``torch.load(path, weights_only=True)`` reads it without running any pickled code. It holds
everything the next update depends on: the networks and the optimizer, the counters and the history,
every random number generator (Python's, NumPy's, torch's, the shuffling generators, each
environment's) and each environment's own state (its physical state, its time-limit counter), so
that a resumed run continues with the very numbers an uninterrupted run would have drawn.

Writing is atomic: the file is written next to its destination, flushed to disk, and renamed over it
(``os.replace``, atomic on POSIX and Windows). A crash while writing leaves the previous checkpoint
whole.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import gymnasium as gym
import numpy as np
import torch


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or does not match the run it is loaded into."""


def write_atomically(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(file)`` on a fresh file next to ``path``, flush it to disk, and rename it over
    ``path``: on any failure the file already at ``path`` is left as it was, and no partial file
    remains."""
    path = Path(path)
    descriptor, partial = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".partial"
    )
    try:
        with os.fdopen(descriptor, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException as error:
        Path(partial).unlink(missing_ok=True)
        if isinstance(error, Exception):
            raise CheckpointError(
                f"could not write {path} ({type(error).__name__}: {error}); "
                "the previous version of the file is intact"
            ) from error
        raise


def folder_built_once(
    folder: str | Path, settings: dict, marker: str, build: Callable[[Path], None]
) -> Path:
    """``folder``, built by ``build(partial_folder)`` from ``settings`` unless a folder built from
    the same settings is already there (its ``marker`` file records them).

    Processes that ask for the same folder at once build it once: the first builds under a lock into
    a folder of its own and renames it into place, the others wait and reuse it; readers see the old
    folder, no folder, or the whole new one. A folder built with other settings is replaced; any
    other non-empty folder is refused, never deleted.
    """
    from filelock import FileLock

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)  # the lock file lives there
    wanted = json.loads(json.dumps(settings, default=str))
    saved = folder / marker
    with FileLock(f"{folder.resolve()}.lock"):
        if saved.exists() and json.loads(saved.read_text()) == wanted:
            return folder
        if folder.exists() and not saved.exists() and any(folder.iterdir()):
            # the message of rlkit.training.require, which this layer cannot import
            raise ValueError(
                f"folder must be a new or empty folder, or one built before (with its {marker}), "
                f"got {str(folder)!r}"
            )
        resolved = folder.resolve()
        partial = resolved.with_name(f"{resolved.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        build(partial)
        (partial / marker).write_text(json.dumps(wanted, indent=2))
        shutil.rmtree(resolved, ignore_errors=True)
        os.replace(partial, resolved)
    return folder


def save_checkpoint(state: dict, path: str | Path) -> None:
    """Write ``state`` to ``path`` atomically (``write_atomically``)."""
    write_atomically(path, lambda file: torch.save(state, file))


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint written by ``save_checkpoint``, with ``weights_only=True``, onto the CPU
    (loading copies each tensor to where its module or optimizer lives; generator states must stay
    on the CPU)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''})"
        ) from None


# Random number generators -------------------------------------------------------------------------


def global_rng_state() -> dict:
    """The states of Python's, NumPy's and torch's global generators (CUDA's too where used)."""
    numpy_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(numpy_state[1].astype(np.int64)),
            "position": int(numpy_state[2]),
            "has_gauss": int(numpy_state[3]),
            "cached_gaussian": float(numpy_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_rng_state(state: dict) -> None:
    random.setstate(_tuples(state["python"]))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _tuples(value):
    """Python's generator state is nested tuples; a checkpoint may hand them back as lists."""
    return tuple(_tuples(item) for item in value) if isinstance(value, (list, tuple)) else value


# Environment state --------------------------------------------------------------------------------

PLAIN = (bool, int, float, str, type(None))


def env_state(env: gym.Env | gym.vector.VectorEnv) -> list[dict]:
    """The state of an environment (or vector env) as plain values: one dict per object of its
    layers.

    Every layer (the vector env, each copy's wrappers, each unwrapped env) contributes its
    attributes that are numbers, strings, None or NumPy arrays (as tensors), its NumPy generators
    (as their state dicts) and the generators of its spaces. That covers what Gymnasium's
    environments keep between steps: the physical state, the time-limit counter, the episode
    statistics, the random streams.
    """
    return [_object_state(layer) for layer in _layers(env)]


def load_env_state(env: gym.Env | gym.vector.VectorEnv, state: list[dict]) -> None:
    """Restore what ``env_state`` saved, into an environment built the same way."""
    layers = _layers(env)
    names = [type(layer).__name__ for layer in layers]
    saved = [entry["__class__"] for entry in state]
    if names != saved:
        raise CheckpointError(
            f"the environment does not match the checkpoint's: layers {names} here, {saved} saved"
        )
    for layer, entry in zip(layers, state):
        _load_object_state(layer, entry)


def _layers(env) -> list:
    """The vector env (if any), then each copy's chain of wrappers down to the unwrapped env."""
    copies = (
        env.envs
        if isinstance(getattr(env, "envs", None), list)
        else [env]
        if not isinstance(env, gym.vector.VectorEnv)
        else []
    )
    layers = [env] if isinstance(env, gym.vector.VectorEnv) else []
    for copy in copies:
        layer = copy
        while True:
            layers.append(layer)
            if not isinstance(layer, gym.Wrapper):
                break
            layer = layer.env
    return layers


class _Unsupported(Exception):
    """A value ``_encode`` does not know how to save (left out of the env state)."""


def _encode(value):
    """A value as plain checkpoint data: NumPy arrays and scalars as tensors (their dtype kept),
    tuples and lists element by element, NumPy generators as their state. Anything else is
    ``_Unsupported``."""
    # before PLAIN: np.float64 is a float, but pickles as a NumPy object
    if isinstance(value, np.generic):
        return {"__numpy_scalar__": torch.from_numpy(np.array(value))}
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.from_numpy(value.copy())
    if isinstance(value, (tuple, list)):
        return {
            "__sequence__": [_encode(item) for item in value],
            "tuple": isinstance(value, tuple),
        }
    if isinstance(value, np.random.Generator):
        return {"__generator__": value.bit_generator.state}
    raise _Unsupported


def _decode(value):
    if isinstance(value, torch.Tensor):
        return value.numpy().copy()
    if isinstance(value, dict) and "__numpy_scalar__" in value:
        return value["__numpy_scalar__"].numpy()[()]
    if isinstance(value, dict) and "__sequence__" in value:
        items = [_decode(item) for item in value["__sequence__"]]
        return tuple(items) if value["tuple"] else items
    if isinstance(value, dict) and "__generator__" in value:
        return _generator(value["__generator__"])
    return value


def _object_state(layer) -> dict:
    state: dict[str, Any] = {"__class__": type(layer).__name__}
    for name, value in vars(layer).items():
        if isinstance(value, gym.spaces.Space):
            if value._np_random is not None:
                state[name] = {"__space_generator__": value._np_random.bit_generator.state}
            continue
        try:
            state[name] = _encode(value)
        # wrapped envs (saved as layers of their own), specs, render surfaces, dicts
        except _Unsupported:
            pass
    return state


def _load_object_state(layer, state: dict) -> None:
    for name, value in state.items():
        if name == "__class__":
            continue
        if isinstance(value, dict) and "__space_generator__" in value:
            getattr(layer, name)._np_random = _generator(value["__space_generator__"])
        else:
            setattr(layer, name, _decode(value))


def _generator(state: dict) -> np.random.Generator:
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    return np.random.Generator(bit_generator)
