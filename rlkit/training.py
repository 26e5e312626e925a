"""What every deep algorithm shares: the result type, seeding, config checks and greedy
evaluation."""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

import rlkit.envs  # noqa: F401  (registers the rlkit/ environments)
from rlkit.checkpoint import CheckpointError, global_rng_state, set_global_rng_state


@dataclass
class TrainResult:
    """``train(config)`` returns this: the config used, the trained agent, one history row per
    update."""

    config: Any
    agent: torch.nn.Module
    history: list[dict[str, float]] = field(default_factory=list)
    critic: torch.nn.Module | None = None  # a learned value function, for algorithms that have one

    def column(self, name: str) -> np.ndarray:
        """One metric over updates, as an array (NaN where a row lacks it)."""
        return np.array([row.get(name, np.nan) for row in self.history], dtype=float)


def random_state(rng: random.Random) -> list[int]:
    """A ``random.Random``'s state as plain integers, which a checkpoint loads with
    ``torch.load(..., weights_only=True)``."""
    return list(rng.getstate()[1])


def set_random_state(rng: random.Random, state: list[int]) -> None:
    """Put back a state that ``random_state`` took."""
    version, _, gauss = rng.getstate()
    rng.setstate((version, tuple(state), gauss))


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch, so that the same seed gives the same numbers on CPU."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def require(condition: bool, field_name: str, allowed: str, value: Any) -> None:
    """Raise ``ValueError`` naming the config field and what is allowed, unless ``condition``
    holds."""
    if not condition:
        raise ValueError(f"{field_name} must be {allowed}, got {value!r}")


def is_number(value: Any) -> bool:
    """A real number (not a bool, not a string) that torch takes as a scalar: an int must fit in 64
    bits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, float) or -(2**63) <= value < 2**63


def is_finite_number(value: Any) -> bool:
    """A real number that is neither infinite nor NaN."""
    return is_number(value) and math.isfinite(value)


def is_seed(value: Any) -> bool:
    """An integer Gymnasium and NumPy accept as a seed: 0 <= seed < 2**32."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def is_count(value: Any, minimum: int = 1) -> bool:
    """An integer >= ``minimum`` (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def require_sequence(value: Any, field_name: str, allowed: str) -> tuple:
    """``value`` as a tuple, or a ValueError naming the field when it is not a list or tuple."""
    require(isinstance(value, (list, tuple)), field_name, allowed, value)
    return tuple(value)


def require_device(device: Any) -> None:
    """A ValueError naming ``device`` unless it is "cpu", or a CUDA or MPS device this machine
    has."""
    try:
        parsed = torch.device(device)
    # ValueError: an index too large for C's long long
    except (
        RuntimeError,
        TypeError,
        ValueError,
    ):
        raise ValueError(
            f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}"
        ) from None
    kind = parsed.type
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available(),
    }
    require(
        available.get(kind, False),
        "device",
        f"'cpu' or an available device (CUDA: {available['cuda']}, MPS: {available['mps']})",
        device,
    )
    if kind == "cuda" and parsed.index is not None:
        require(
            parsed.index < torch.cuda.device_count(),
            "device",
            f"a CUDA device this machine has (indices 0 to {torch.cuda.device_count() - 1})",
            device,
        )


def require_discrete_actions_and_flat_obs(
    env_id: str, action_space, observation_space, algorithm: str
) -> None:
    """Raise ``ValueError`` naming ``env_id`` unless the env has Discrete actions and flat Box
    observations."""
    require(
        isinstance(action_space, gym.spaces.Discrete),
        "env_id",
        f"an environment with Discrete actions ({algorithm})",
        f"{env_id} with {action_space}",
    )
    require(
        isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1,
        "env_id",
        "an environment with flat Box observations",
        f"{env_id} with {observation_space}",
    )


def greedy_returns(
    env_id: str,
    act: Callable[[torch.Tensor], torch.Tensor],
    episodes: int = 100,
    seed: int = 10_000,
    num_envs: int = 10,
    env_kwargs: dict | None = None,
) -> np.ndarray:
    """Undiscounted returns of ``episodes`` full episodes, acting with
    ``act(obs_batch) -> actions``.

    Runs ``num_envs`` copies at once and counts only each copy's first ``episodes / num_envs``
    episodes, so the result does not favour short episodes. Seeds differ from training's by default.
    """
    require(episodes >= 1, "episodes", ">= 1", episodes)
    num_envs = min(num_envs, episodes)
    per_env = -(-episodes // num_envs)
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **(env_kwargs or {})) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs, _ = envs.reset(seed=seed)
    running, finished = np.zeros(num_envs), [[] for _ in range(num_envs)]
    with torch.inference_mode():
        while any(len(done) < per_env for done in finished):
            actions = act(torch.as_tensor(obs, dtype=torch.float32)).cpu().numpy()
            obs, rewards, terminated, truncated, _ = envs.step(actions)
            running += rewards
            for index in np.flatnonzero(terminated | truncated):
                finished[index].append(running[index])
                running[index] = 0.0
    envs.close()
    return np.concatenate([np.array(done[:per_env]) for done in finished])[:episodes]


@contextmanager
def eval_mode(*modules: torch.nn.Module) -> Iterator[None]:
    """Evaluation mode (no dropout, frozen batch statistics) for the block; afterwards every
    submodule is back in the mode it was in, also when the block raises."""
    modes = [(sub, sub.training) for module in modules for sub in module.modules()]
    try:
        for module in modules:
            module.eval()
        yield
    finally:
        for sub, training in modes:
            sub.training = training


def greedy_mean_return(
    result: TrainResult, act: Callable[[torch.Tensor], torch.Tensor], episodes: int, seed: int
) -> float:
    """The mean of ``greedy_returns`` with ``act`` on the result's environment, its agent in eval
    mode for the episodes (and in its own mode again after): every algorithm's ``evaluate``."""
    with eval_mode(result.agent):
        return float(greedy_returns(result.config.env_id, act, episodes, seed).mean())


SCHEDULES = ("constant", "linear")


def set_learning_rate(optimizer, learning_rate: float) -> None:
    """Set the step size of every parameter group (a torch optimizer's, or ``FlatAdam``'s)."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate


def scheduled(initial: float, schedule: str, progress: float) -> float:
    """A hyperparameter's value after ``progress`` (0 to 1) of training: constant, or linear from
    ``initial`` to 0."""
    require(schedule in SCHEDULES, "schedule", f"one of {SCHEDULES}", schedule)
    return initial if schedule == "constant" else initial * (1.0 - progress)


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, floor: float = 0.1) -> float:
    """The learning-rate multiplier of the language-model trainers: linear warm-up to 1, then cosine
    decay to ``floor`` (the RL trainers use ``scheduled``)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


class TrainingDiverged(RuntimeError):
    """A loss, a gradient norm or another logged quantity turned NaN or infinite."""


# NaN by definition when every return is the same (Var[R] = 0)
MAY_BE_UNDEFINED = frozenset({"explained_variance"})
# scheduled hyperparameters, not measurements (inf: never clip)
SETTINGS = frozenset({"learning_rate", "clip_eps", "epsilon"})


class Trainer:
    """An algorithm's training as a sequence of updates, with a state that can be saved between any
    two.

    A subclass builds everything in ``__init__`` (seeding first), does one update in ``_update``
    (returning its history row), and lists what the next update depends on in ``_state`` /
    ``_load_state``. ``train(config)`` is ``fit(Trainer(config))``; the command line
    (``rlkit.runs``) adds checkpoints.
    """

    algorithm = ""

    def __init__(self, config):
        self.config = config
        self.updates_done = 0
        self.history: list[dict[str, float]] = []

    @property
    def num_updates(self) -> int:
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        return self.updates_done >= self.num_updates

    @property
    def progress(self) -> tuple[int, int]:
        """``(done, total)`` in the progress bar's unit (``progress_unit``)."""
        return self.updates_done, self.num_updates

    progress_unit = "update"

    @property
    def subject(self) -> str:
        """What is being learned, for messages: the environment id (a task name for the
        language-model trainers)."""
        return self.config.env_id

    def run_update(self) -> dict[str, float] | None:
        """One update; its history row (None when training ended without one: DQN's last steps).
        A non-finite quantity stops training (``TrainingDiverged``)."""
        row = self._update()
        if row is None:
            return None
        bad = [
            name
            for name, value in row.items()
            if not math.isfinite(value)
            and name not in SETTINGS
            and not (name in MAY_BE_UNDEFINED and math.isnan(value))
        ]
        if bad:
            raise TrainingDiverged(
                f"update {self.updates_done + 1}: "
                f"{', '.join(f'{name} = {row[name]}' for name in bad)} ({self.algorithm}, "
                f"{self.subject}, seed {self.config.seed})"
            )
        self.updates_done += 1
        self.history.append(row)
        return row

    def _update(self) -> dict[str, float] | None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything the next update depends on, as plain tensors and numbers
        (``torch.load(weights_only=True)``)."""
        return {
            "algorithm": self.algorithm,
            "updates_done": self.updates_done,
            "history": self.history,
            "global_rng": global_rng_state(),
            **self._state(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("algorithm") != self.algorithm:
            raise CheckpointError(
                f"the checkpoint is of {state.get('algorithm')!r}, not {self.algorithm!r}"
            )
        self._load_state(state)
        self.updates_done, self.history = (
            state["updates_done"],
            [dict(row) for row in state["history"]],
        )
        set_global_rng_state(state["global_rng"])

    def _state(self) -> dict:
        raise NotImplementedError

    def _load_state(self, state: dict) -> None:
        raise NotImplementedError

    def result(self) -> TrainResult:
        raise NotImplementedError

    def modules(self) -> list[torch.nn.Module]:
        """The networks being trained (checked for finite weights before a checkpoint is
        written)."""
        result = self.result()
        return [module for module in (result.agent, result.critic) if module is not None]

    def close(self) -> None:
        """Release the environments."""


class StepBudgetTrainer(Trainer):
    """A trainer that runs until ``config.total_steps`` environment steps (``self.env_steps``),
    however many updates that takes (DQN's bursts, REINFORCE's batches of whole episodes)."""

    progress_unit = "step"
    env_steps = 0

    @property
    def num_updates(self) -> int:  # not known in advance
        return self.updates_done + (0 if self.finished else 1)

    @property
    def finished(self) -> bool:
        return self.env_steps >= self.config.total_steps

    @property
    def progress(self) -> tuple[int, int]:
        return min(self.env_steps, self.config.total_steps), self.config.total_steps


def require_finite_weights(module: torch.nn.Module, when: str) -> None:
    """``TrainingDiverged`` naming the first parameter of ``module`` that holds a NaN or an
    infinity."""
    for name, parameter in module.named_parameters():
        if not torch.isfinite(parameter).all():
            raise TrainingDiverged(f"{when}: the weights {name} are not finite")


def fit(
    trainer: Trainer, progress: bool = False, after_update: Callable[[Trainer], None] | None = None
) -> TrainResult:
    """Run ``trainer``'s remaining updates (with a progress bar); ``after_update(trainer)`` after
    each. Closes it."""
    config = trainer.config
    try:
        done, total = trainer.progress
        with tqdm(
            total=total,
            initial=done,
            disable=not progress,
            unit=trainer.progress_unit,
            desc=f"{trainer.algorithm} {trainer.subject}",
        ) as bar:
            while not trainer.finished:
                trainer.run_update()
                bar.update(trainer.progress[0] - bar.n)
                if after_update is not None:
                    after_update(trainer)
        result = trainer.result()
        require_finite_weights(
            result.agent,
            f"after update {trainer.updates_done} ({trainer.algorithm}, {trainer.subject}, "
            f"seed {config.seed})",
        )
        return result
    finally:
        trainer.close()


def fit_side_by_side(
    make_trainer: Callable[[Any], Trainer], configs: list, processes: int | None = None
) -> list[TrainResult]:
    """``fit(make_trainer(config))`` for each config, each in a fresh (spawned) process, at most
    ``processes`` at a time (default: one per config, up to the machine's cores); the results in
    the order of ``configs``.

    Runs that differ only in their seed are independent, and a small model keeps one core busy:
    two of them on two cores take the time of one. Each process uses this process's number of torch
    threads, so a run computes exactly what ``fit`` computes here. ``make_trainer`` (a trainer
    class, say) and the configs must be importable and picklable, and a script that calls this
    must do so under ``if __name__ == "__main__":`` (spawned processes import it again).
    """
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    require(
        isinstance(configs, (list, tuple)) and len(configs) > 0,
        "configs",
        "a non-empty list of configs",
        configs,
    )
    cores = os.cpu_count() or 1
    processes = min(len(configs), cores) if processes is None else processes
    require(is_count(processes), "processes", "an integer >= 1", processes)
    with ProcessPoolExecutor(
        processes,
        mp_context=get_context("spawn"),
        initializer=torch.set_num_threads,
        initargs=(torch.get_num_threads(),),
    ) as pool:
        return list(pool.map(_fit_one, [make_trainer] * len(configs), configs))


def _fit_one(make_trainer: Callable[[Any], Trainer], config: Any) -> TrainResult:
    return fit(make_trainer(config))


def require_rank(rank: int, world_size: int) -> None:
    """A ValueError naming the field unless ``rank`` is one of ``world_size >= 1`` ranks."""
    require(is_count(world_size), "world_size", "an integer >= 1", world_size)
    require(
        isinstance(rank, int) and 0 <= rank < world_size,
        "rank",
        f"an integer in [0, {world_size})",
        rank,
    )
