"""Training runs on disk: a folder per run with its config, its metrics and its latest checkpoint.

- ``runs/NAME/config.json``: the algorithm and every field of its config (what ``--resume``
  rebuilds);
- ``runs/NAME/metrics.csv``: one row per update (the ``history``), rewritten atomically with each
  checkpoint;
- ``runs/NAME/checkpoint.pt``: the latest checkpoint (``rlkit.checkpoint``); resuming from it is
  exact on CPU;
- ``runs/NAME/model/``: a language-model run's model and tokenizer at the end (``save_pretrained``),
  what ``--model runs/NAME`` starts another run from;
- ``runs/NAME/events.*``: TensorBoard's, when ``tensorboard`` is installed.

This is what the ``rlkit`` command line drives; notebooks can call it too. Algorithms are
imported when first used: the deep-RL commands never load transformers.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import importlib
import io
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlkit.checkpoint import (
    CheckpointError,
    global_rng_state,
    load_checkpoint,
    save_checkpoint,
    set_global_rng_state,
    write_atomically,
)
from rlkit.rollouts import make_vector_env
from rlkit.training import Trainer, TrainResult, fit, require_finite_weights

CONFIG_FILE, METRICS_FILE, CHECKPOINT_FILE = "config.json", "metrics.csv", "checkpoint.pt"
MODEL_FOLDER = "model"


@dataclass(frozen=True)
class Algorithm:
    """What the command line needs to know about one algorithm. Its module is imported when first
    used, so that CartPole commands never load transformers."""

    name: str
    module_name: str
    config_name: str
    trainer_name: str | None  # None: cannot be checkpointed mid-run (A3C)
    # language-model runs: the config fields that --model and --reward-model set (None: an
    # environment algorithm, whose runs are measured by their returns)
    model_field: str | None = None
    reward_model_field: str | None = None
    model_required: bool = False  # RL from a model: --model names the start (no tiny default)

    @property
    def module(self) -> Any:
        try:
            return importlib.import_module(self.module_name)
        except ImportError as error:
            if not self.language_model:
                raise
            raise ImportError(
                f"{self.name} needs {error.name or 'a package'}, which is not installed: install "
                'rlkit with its llm extra (pip install -e ".[llm]")'
            ) from error

    @property
    def config(self) -> type:
        return getattr(self.module, self.config_name)

    @property
    def trainer(self) -> type[Trainer] | None:
        return None if self.trainer_name is None else getattr(self.module, self.trainer_name)

    @property
    def language_model(self) -> bool:
        return self.model_field is not None

    def greedy_policy(
        self, result: TrainResult, action_space
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """``obs -> actions`` of the trained agent's greedy policy."""
        if self.name == "dqn":
            return lambda obs: result.agent(obs).argmax(dim=-1)
        if self.name == "ppo":
            return self.module.greedy_actions(result.agent, action_space)
        return result.agent.greedy


ALGORITHMS = {
    algorithm.name: algorithm
    for algorithm in (
        Algorithm("dqn", "rlkit.dqn", "DQNConfig", "DQNTrainer"),
        Algorithm("reinforce", "rlkit.reinforce", "ReinforceConfig", "ReinforceTrainer"),
        Algorithm("a2c", "rlkit.a2c", "A2CConfig", "A2CTrainer"),
        Algorithm("a3c", "rlkit.a3c", "A3CConfig", None),
        Algorithm("ppo", "rlkit.ppo", "PPOConfig", "PPOTrainer"),
        Algorithm("sft", "rlkit.llm.sft", "SFTConfig", "SFTTrainer", "model_name_or_path"),
        Algorithm(
            "reward-model",
            "rlkit.llm.reward_model",
            "RewardModelConfig",
            "RewardModelTrainer",
            "sft_model_path",
        ),
        Algorithm(
            "rlhf-ppo",
            "rlkit.llm.rlhf_ppo",
            "RLHFPPOConfig",
            "RLHFPPOTrainer",
            "sft_folder",
            "reward_model_folder",
            model_required=True,
        ),
        Algorithm(
            "grpo", "rlkit.llm.grpo", "GRPOConfig", "GRPOTrainer", "sft_folder", model_required=True
        ),
        Algorithm(
            "dpo", "rlkit.llm.dpo", "DPOConfig", "DPOTrainer", "sft_folder", model_required=True
        ),
    )
}


class RunError(RuntimeError):
    """A run folder that cannot be used as asked (it exists already, it is not writable, it holds no
    run)."""


def algorithm_named(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]


# The run folder -----------------------------------------------------------------------------------


def prepare_folder(out: str | Path, resume: bool) -> Path:
    """Check that ``out`` can hold the run before any training: a new run needs an empty or new
    folder (nothing already saved is overwritten), a resumed one a folder with a run; both must be
    writable."""
    out = Path(out)
    if resume:
        if not (out / CONFIG_FILE).is_file():
            raise RunError(f"--resume {out}: no run there (no {CONFIG_FILE})")
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunError(
            f"--out {out} already exists and is not an empty folder: choose another name, or "
            f"continue that run with --resume {out}"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise RunError(
            f"--out {out} is not a writable folder ({error.strerror or error})"
        ) from None
    return out


def save_config(out: Path, algorithm: str, config, checkpoint_every: int = 10) -> None:
    saved = {
        "algorithm": algorithm,
        "checkpoint_every": checkpoint_every,
        "config": dataclasses.asdict(config),
    }
    _write_atomically(out / CONFIG_FILE, json.dumps(saved, indent=2, default=_json_number))


def read_saved_config(out: str | Path) -> dict:
    """``config.json`` of the run in ``out``, checked for its keys (a RunError naming the file
    otherwise)."""
    path = Path(out) / CONFIG_FILE
    if not path.is_file():
        raise RunError(f"{out}: no run there (no {CONFIG_FILE})")
    try:
        saved = json.loads(path.read_text())
        if not (
            isinstance(saved, dict)
            and saved.get("algorithm") in ALGORITHMS
            and isinstance(saved.get("config"), dict)
        ):
            raise ValueError(
                f"it needs an 'algorithm' (one of {sorted(ALGORITHMS)}) and a 'config' object"
            )
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        raise RunError(f"{path} is not a run's config: {error}") from None
    return saved


def load_config(out: str | Path, device: str | None = None):
    """``(Algorithm, config)`` of the run in ``out`` (on ``device`` instead of the saved one, when
    given)."""
    saved = read_saved_config(out)
    algorithm = ALGORITHMS[saved["algorithm"]]
    fields = dict(saved["config"], **({} if device is None else {"device": device}))
    if device is not None and "bf16" in fields:
        fields["bf16"] = None  # bf16 autocast where the new device supports it
    known = {field.name for field in dataclasses.fields(algorithm.config)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise RunError(
            f"{Path(out) / CONFIG_FILE}: {', '.join(unknown)} not fields of "
            f"{algorithm.config.__name__}"
        )
    return algorithm, algorithm.config(**fields)


def _json_number(value):
    raise TypeError(f"cannot save {value!r} in {CONFIG_FILE}")


def write_metrics(out: Path, history: list[dict[str, float]]) -> None:
    """The history as CSV (columns in order of first appearance; empty where a row lacks a
    metric)."""
    columns = list(dict.fromkeys(name for row in history for name in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    _write_atomically(out / METRICS_FILE, text.getvalue())


def read_metrics(out: str | Path) -> dict[str, np.ndarray]:
    """``metrics.csv`` as one array per column (NaN where a row lacks it)."""
    path = Path(out) / METRICS_FILE
    if not path.is_file():
        raise RunError(f"{out}: no {METRICS_FILE}")
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    columns = rows[0].keys() if rows else []
    return {
        name: np.array([float(row[name]) if row[name] != "" else np.nan for row in rows])
        for name in columns
    }


def _write_atomically(path: Path, text: str) -> None:
    write_atomically(path, lambda file: file.write(text.encode()))


# Training -----------------------------------------------------------------------------------------


def train_run(
    algorithm: str,
    config,
    out: str | Path,
    checkpoint_every: int | None = None,
    resume: bool = False,
    progress: bool | None = None,
) -> TrainResult:
    """Train ``config`` into the run folder ``out`` (or continue the run there with ``resume``),
    writing a checkpoint and the metrics every ``checkpoint_every`` updates (default 10; on resume,
    the run's own) and at the end. A checkpoint is written only from finite weights. A
    language-model run also saves its model in ``out/model`` at the end (``save_pretrained``), the
    folder that ``--model RUN`` starts a later run from. ``progress``: show a progress bar (None:
    the config's ``progress`` field, where it has one)."""
    if checkpoint_every is None:
        checkpoint_every = read_saved_config(out).get("checkpoint_every", 10) if resume else 10
    if not (
        isinstance(checkpoint_every, int)
        and not isinstance(checkpoint_every, bool)
        and checkpoint_every >= 1
    ):
        raise ValueError(f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    spec = algorithm_named(algorithm)
    out = prepare_folder(out, resume)
    if resume and spec.trainer is None:
        raise RunError(
            f"{spec.name} runs cannot be resumed: its workers update the model asynchronously, "
            "so no state between two updates describes the whole run"
        )
    if spec.trainer is None:
        save_config(out, spec.name, config, checkpoint_every)
        result = spec.module.train(config)
        save_checkpoint(_final_state(spec, result), out / CHECKPOINT_FILE)
        write_metrics(out, result.history)
        return result
    # builds the envs and the agent: a config they refuse leaves no run behind
    trainer = spec.trainer(config)
    try:
        if not resume:
            save_config(out, spec.name, config, checkpoint_every)
        elif (out / CHECKPOINT_FILE).is_file():
            trainer.load_state_dict(load_checkpoint(out / CHECKPOINT_FILE))
            # a crash may have come between the checkpoint and the metrics
            write_metrics(out, trainer.history)
        logger = _tensorboard(out, _x(trainer.history[-1]) + 1 if trainer.history else None)
    except BaseException:
        trainer.close()
        raise
    logged = len(trainer.history)

    def after_update(trainer: Trainer) -> None:
        nonlocal logged
        if logger is not None:
            for row in trainer.history[logged:]:  # DQN's last call may add no row
                for name, value in row.items():
                    if name not in X_COLUMNS:
                        logger.add_scalar(name, value, _x(row))
        logged = len(trainer.history)
        if trainer.updates_done % checkpoint_every == 0 or trainer.finished:
            for module in trainer.modules():
                require_finite_weights(
                    module,
                    f"after update {trainer.updates_done} ({spec.name}, {trainer.subject}, "
                    f"seed {config.seed}); the last checkpoint holds update "
                    f"{_saved_updates(out)}",
                )
            save_checkpoint(trainer.state_dict(), out / CHECKPOINT_FILE)
            write_metrics(out, trainer.history)

    if progress is None:
        progress = getattr(config, "progress", False)
    try:
        result = fit(trainer, progress, after_update)
    finally:
        if logger is not None:
            logger.close()
    if spec.language_model:
        save_model(result, out / MODEL_FOLDER)
    return result


# the x-axis of a run's metrics: environment steps (deep RL), optimizer steps (SFT, reward models)
# or iterations (RLHF)
X_COLUMNS = ("step", "iteration")


def _x(row: dict) -> int:
    return next(row[name] for name in X_COLUMNS if name in row)


def save_model(result: TrainResult, folder: Path) -> Path:
    """A language-model run's model and tokenizer, with ``save_pretrained``, written into a folder
    of its own and renamed into place (LoRA adapters merged into a copy first, so that the folder
    loads as a plain model)."""
    model = result.model
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    result.tokenizer.save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)
    return folder


def model_path(name_or_path: str) -> str:
    """What ``--model`` names: a run folder's saved model (``RUN/model``), else a saved model's
    folder, else a hub name. Folders become absolute paths, so that the run they are stored in can
    be resumed or evaluated from any directory."""
    path = Path(name_or_path)
    if is_run_folder(path):
        if not (path / MODEL_FOLDER / "config.json").is_file():
            raise RunError(
                f"{name_or_path} is a run without a saved model yet (no {MODEL_FOLDER}/): "
                "a language-model run saves it when it finishes"
            )
        return str((path / MODEL_FOLDER).resolve())
    return str(path.resolve()) if path.is_dir() else name_or_path


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` holds a run (its config.json names an algorithm), not a saved model, whose
    config.json is Hugging Face's."""
    try:
        saved = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and "algorithm" in saved and "config" in saved


def _saved_updates(out: Path):
    path = out / CHECKPOINT_FILE
    return load_checkpoint(path)["updates_done"] if path.is_file() else "none (no checkpoint yet)"


def _final_state(spec: Algorithm, result: TrainResult) -> dict:
    """The end of a run that has no resumable state (A3C): the weights and the history."""
    return {
        "algorithm": spec.name,
        "resumable": False,
        "agent": result.agent.state_dict(),
        "history": result.history,
    }


def _tensorboard(out: Path, purge_step: int | None):
    """A TensorBoard writer when tensorboard is installed; on resume, events from ``purge_step`` on
    (written after the checkpoint, before the crash) are dropped, so that they are not shown
    twice."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(out), purge_step=purge_step)


# Using a finished (or interrupted) run ------------------------------------------------------------


def load_run(out: str | Path, device: str | None = None) -> tuple[Algorithm, TrainResult]:
    """The run in ``out`` as a ``TrainResult`` with the agent of its latest checkpoint, on
    ``device`` (None: the run's own). The caller's random generators are left as they were."""
    spec, config = load_config(out, device)
    path = Path(out) / CHECKPOINT_FILE
    if not path.is_file():
        raise RunError(
            f"{out}: no {CHECKPOINT_FILE} yet (the run stopped before its first checkpoint)"
        )
    state = load_checkpoint(path)
    generators = global_rng_state()
    try:
        if spec.trainer is None:
            envs = make_vector_env(config.env_id, 1)
            agent = spec.module.make_agent(config, envs)
            envs.close()
            agent.load_state_dict(state["agent"])
            return spec, TrainResult(config, agent, list(state["history"]))
        trainer = spec.trainer(config)
        try:
            trainer.load_state_dict(state)
            return spec, trainer.result()
        finally:
            trainer.close()
    finally:
        set_global_rng_state(generators)


def evaluate_run(
    out: str | Path, episodes: int = 100, seed: int = 10_000, device: str | None = None
) -> np.ndarray:
    """The greedy policy's undiscounted return in each of ``episodes`` episodes (seeds unlike
    training's)."""
    import gymnasium as gym

    from rlkit.training import greedy_returns

    spec, result = load_run(out, device)
    env = gym.make(result.config.env_id)
    act = spec.greedy_policy(result, env.action_space)
    env.close()
    device = result.config.device
    return greedy_returns(
        result.config.env_id, lambda obs: act(obs.to(device)).cpu(), episodes, seed
    )


def evaluate_language_model_run(
    out: str | Path, num_prompts: int = 500, seed: int = 0, device: str | None = None
) -> dict[str, float]:
    """A language-model run's held-out scores at its latest checkpoint: its trainer's
    ``evaluate`` (exact match, the oracle's score and, for RLHF, the proxy score and the KL to the
    reference; a reward model's pairwise accuracy). The caller's random generators are left as
    they were."""
    spec, config = load_config(out, device)
    if not spec.language_model:
        raise RunError(f"{out} is a {spec.name} run, not a language-model run")
    path = Path(out) / CHECKPOINT_FILE
    if not path.is_file():
        raise RunError(f"{out}: no {CHECKPOINT_FILE} yet")
    generators = global_rng_state()
    try:
        trainer = spec.trainer(config)
        try:
            trainer.load_state_dict(load_checkpoint(path))
            return trainer.evaluate(num_prompts, seed)
        finally:
            trainer.close()
    finally:
        set_global_rng_state(generators)


# Learning curves over seeds -----------------------------------------------------------------------


def run_groups(paths: list[str | Path]) -> dict[str, list[Path]]:
    """Each path is a run folder (a curve of its own) or a folder of run folders (the seeds of one
    curve)."""
    groups = {}
    for path in map(Path, paths):
        runs = (
            [path]
            if (path / METRICS_FILE).is_file()
            else sorted(p for p in path.glob("*") if (p / METRICS_FILE).is_file())
        )
        if not runs:
            raise RunError(
                f"{path}: neither a run folder nor a folder of runs (no {METRICS_FILE} found)"
            )
        label = path.name or str(path)
        groups[label if label not in groups else str(path)] = (
            runs  # two folders of one name: their full paths
        )
    return groups


def plot_runs(
    paths: list[str | Path],
    metric: str = "episode_return",
    statistic: str = "mean",
    out: str | Path = "curves.png",
    points: int = 100,
) -> None:
    """Learning curves of ``metric`` against environment steps (updates for language-model runs),
    one per group (``run_groups``): the
    ``statistic`` over its seeds with a 95% stratified-bootstrap band
    (``rlkit.statistics.curve_band``). Runs are interpolated onto the steps that all runs of a group
    reached."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlkit.plotting import plot_mean_and_band

    figure, ax = plt.subplots(figsize=(7, 4))
    for label, runs in run_groups(paths).items():
        curves = [_curve(run, metric) for run in runs]
        grid = np.linspace(max(c[0][0] for c in curves), min(c[0][-1] for c in curves), points)
        values = np.array([np.interp(grid, steps, ys) for steps, ys in curves])
        plot_mean_and_band(
            grid,
            values,
            ax,
            label=f"{label} ({len(runs)} run{'s' * (len(runs) > 1)})",
            band="bootstrap",
            statistic=statistic,
        )
    language_model = any(
        ALGORITHMS[read_saved_config(run)["algorithm"]].language_model
        for runs in run_groups(paths).values()
        for run in runs
        if (run / CONFIG_FILE).is_file()
    )
    ax.set_xlabel("updates" if language_model else "environment steps")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(f"{statistic} over runs, with a 95% stratified-bootstrap band", fontsize=10)
    ax.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    plt.close(figure)


def _curve(run: Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of one run's metric, rows without the metric dropped."""
    metrics = read_metrics(run)
    if metric not in metrics:
        raise RunError(
            f"{run}: no metric {metric!r} in {METRICS_FILE}; it has {', '.join(metrics)}"
        )
    keep = ~np.isnan(metrics[metric])
    if keep.sum() == 0:
        raise RunError(f"{run}: the metric {metric!r} has no values yet")
    x = next(name for name in X_COLUMNS if name in metrics)
    return metrics[x][keep], metrics[metric][keep]


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "CheckpointError",
    "RunError",
    "evaluate_language_model_run",
    "evaluate_run",
    "load_run",
    "plot_runs",
    "read_metrics",
    "train_run",
    "write_metrics",
]
