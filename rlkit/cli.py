"""The ``rlkit`` command line: train, resume, evaluate, render and plot runs of the deep algorithms.

    rlkit train ppo --env CartPole-v1 --seed 0 --total-steps 100000 --out runs/ppo-s0
        [--set field=value ...]
    rlkit train --resume runs/ppo-s0
    rlkit eval runs/ppo-s0 --episodes 100
    rlkit render runs/ppo-s0 --gif ppo.gif
    rlkit plot runs/ppo-s0 runs/ppo-s1 runs/a2c --out curves.png

Language-model runs (Part III) take a model instead of an environment, and ``rlkit eval`` reports
their held-out exact match, oracle score and KL to the reference:

    rlkit train sft --seed 0 --out runs/sft [--model NAME_OR_PATH]
    rlkit train reward-model --model runs/sft --out runs/rm
    rlkit train rlhf-ppo --model runs/sft --reward-model runs/rm --out runs/ppo
    rlkit train grpo --model runs/sft --out runs/grpo
    rlkit train dpo --model runs/sft --out runs/dpo
    rlkit eval runs/ppo

``rlkit train ALGO --help`` lists every hyperparameter with its default and meaning, read from the
config dataclass (its field comments) and ``rlkit.presets``: the code is the one source of truth.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import re
import sys
from pathlib import Path

from rlkit.checkpoint import CheckpointError
from rlkit.presets import PRESETS
from rlkit.runs import (
    ALGORITHMS,
    RunError,
    algorithm_named,
    load_config,
    model_path,
    train_run,
)
from rlkit.training import TrainingDiverged

# Meanings of the fields whose dataclass line carries no comment (the same in every algorithm).
COMMON_MEANINGS = {
    "env_id": "Gymnasium environment id (rlkit train applies its tested preset, if it has one)",
    "seed": "seeds Python, NumPy, torch and the environments: same seed, same run on CPU",
    "total_steps": "environment steps to train for",
    "learning_rate": "the optimizer's step size",
    "gamma": "discount factor",
    "lam": "GAE's lambda",
    "ent_coef": "weight of the entropy bonus",
    "vf_coef": "weight of the value loss",
    "hidden_sizes": "hidden layer widths, e.g. [64,64]",
    "activation": "hidden activation: tanh or relu",
    "batch_size": "transitions per gradient step",
    "start_epsilon": "exploration rate at the start",
    "end_epsilon": "exploration rate after the decay",
    "max_grad_norm": "clip the global gradient norm to this",
    "adam_betas": "Adam's (beta1, beta2)",
    "optimizer_eps": "the optimizer's eps",
    "normalize_advantages": "whiten the advantages",
    "device": "cpu, cuda or mps",
    "progress": "show a progress bar (always on from the command line)",
}
IMPLIED = ("env_id", "seed", "total_steps", "progress")  # set by their own options


def field_meanings(config_class: type) -> dict[str, str]:
    """Each field's meaning: the comment on its line or the comment lines right above it (in the
    class or the dataclass it extends), else ``COMMON_MEANINGS``."""
    comments = {}
    for cls in reversed(config_class.__mro__):
        if not dataclasses.is_dataclass(cls):
            continue
        above = []
        for line in inspect.getsource(cls).splitlines():
            field = re.match(r"\s+(\w+): [^#]*?(?:#\s*(.+))?$", line)
            if field and (field.group(2) or above or field.group(1) not in comments):
                comments[field.group(1)] = (field.group(2) or " ".join(above)).strip()
            comment_line = re.match(r"\s+#\s*(.+)$", line)
            above = [*above, comment_line.group(1).strip()] if comment_line else []
    return {
        f.name: comments.get(f.name) or COMMON_MEANINGS.get(f.name, "")
        for f in dataclasses.fields(config_class)
    }


def hyperparameter_help(name: str) -> str:
    """The table ``rlkit train ALGO --help`` ends with."""
    spec = algorithm_named(name)
    presets = PRESETS.get(name, {})
    meanings = field_meanings(spec.config)
    lines = [
        f"hyperparameters of {name} (set any with --set FIELD=VALUE; a field you leave out comes "
        + (
            "from the default):"
            if spec.language_model
            else "from the env's preset where there is one, else from the default):"
        )
    ]
    for field in dataclasses.fields(spec.config):
        tested = [
            f"{env}: {values[field.name]!r}"
            for env, values in presets.items()
            if field.name in values
        ]
        lines.append(
            f"  {field.name} = {field.default!r}"
            + (f" (preset {'; '.join(tested)})" if tested else "")
        )
        meaning = meanings[field.name]
        if meaning:
            lines.append(f"      {meaning}")
    return "\n".join(lines)


def parse_value(text: str):
    """A ``--set`` value: a Python literal (1e-3, 64, [64,64], True, None), inf or nan, else the
    text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    if text.strip().lower() in ("inf", "+inf", "-inf", "nan"):
        return float(text)
    return text


def parse_settings(pairs: list[str], config_class: type) -> dict:
    names = {f.name for f in dataclasses.fields(config_class)}
    settings = {}
    for pair in pairs:
        name, equals, text = pair.partition("=")
        name = name.strip()
        if not equals or not name:
            raise ValueError(f"--set takes FIELD=VALUE, got {pair!r}")
        if name not in names:
            raise ValueError(
                f"--set: {name!r} is not a field of {config_class.__name__}; fields: "
                f"{', '.join(sorted(names))}"
            )
        settings[name] = parse_value(text.strip())
    return settings


class AlgorithmParser(argparse.ArgumentParser):
    """``rlkit train ALGO``'s parser: its epilog, the hyperparameter table, is read from the config
    only when help is shown, so that parsing imports no algorithm."""

    def format_help(self) -> str:
        self.epilog = hyperparameter_help(self.prog.split()[-1])
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlkit", description="Train, resume, evaluate, render and plot RL runs."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser(
        "train",
        help="train an algorithm (or resume a run)",
        description="Train ALGO, or continue a run with --resume RUN.",
    )
    train.add_argument(
        "--resume", metavar="RUN", help="continue the run in this folder from its last checkpoint"
    )
    train.add_argument(
        "--checkpoint-every",
        dest="resume_checkpoint_every",
        type=int,
        metavar="N",
        help="with --resume: write a checkpoint every N updates (default: the run's own)",
    )
    algorithms = train.add_subparsers(
        dest="algorithm", metavar="ALGO", required=False, parser_class=AlgorithmParser
    )
    for name, spec in ALGORITHMS.items():
        sub = algorithms.add_parser(
            name,
            help=f"train {name}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if spec.language_model:
            sub.add_argument(
                "--model",
                metavar="NAME_OR_PATH",
                help="start from this model: a run folder (its model/), a saved model's folder or "
                "a hub name (default: "
                + ("required)" if spec.model_required else "a tiny model built from the config)"),
            )
            if spec.reward_model_field is not None:
                sub.add_argument(
                    "--reward-model",
                    metavar="PATH",
                    help="the reward model: a reward-model run folder or a saved model's folder",
                )
        else:
            sub.add_argument(
                "--env", dest="env_id", help="Gymnasium environment id (default: CartPole-v1)"
            )
            sub.add_argument(
                "--total-steps",
                type=int,
                help="environment steps (default: the preset's or the algorithm's)",
            )
        sub.add_argument("--seed", type=int, help="random seed (default: 0)")
        sub.add_argument(
            "--out", metavar="RUN", help=f"the run folder to create, e.g. runs/{name}-s0"
        )
        sub.add_argument(
            "--set",
            dest="settings",
            action="append",
            default=[],
            metavar="FIELD=VALUE",
            help="any other hyperparameter (repeatable); see the list below",
        )
        sub.add_argument(
            "--checkpoint-every",
            type=int,
            metavar="N",
            help=(
                "write a checkpoint and the metrics every N updates (default: 10; on --resume "
                "the run's own)"
            ),
        )
        sub.add_argument(
            "--resume",
            dest="resume_here",
            metavar="RUN",
            help="continue this run (the options must match it)",
        )

    evaluate = commands.add_parser(
        "eval",
        help="evaluate a run: a deep-RL run's greedy returns, a language-model run's held-out "
        "scores",
    )
    evaluate.add_argument("run", metavar="RUN")
    evaluate.add_argument(
        "--episodes", type=int, default=100, help="episodes to play (default: %(default)s)"
    )
    evaluate.add_argument(
        "--prompts",
        type=int,
        help="a language-model run: the first N held-out prompts to answer (default: all)",
    )
    evaluate.add_argument(
        "--seed",
        type=int,
        default=10_000,
        help="environment seed, unlike training's (default: %(default)s); for a language-model "
        "run, the seed of the sampled answers",
    )
    evaluate.add_argument(
        "--device",
        help="evaluate on this device instead of the run's (e.g. cpu for a run trained on cuda)",
    )

    render = commands.add_parser(
        "render", help="record one episode of a run's greedy policy as a GIF"
    )
    render.add_argument("run", metavar="RUN")
    render.add_argument("--gif", required=True, help="the GIF file to write")
    render.add_argument(
        "--seed", type=int, default=0, help="environment seed (default: %(default)s)"
    )
    render.add_argument(
        "--max-steps",
        type=int,
        default=500,
        help="stop after this many steps (default: %(default)s)",
    )
    render.add_argument("--device", help="run the policy on this device instead of the run's")

    plot = commands.add_parser(
        "plot",
        help="learning curves of runs: mean or IQM over seeds with a bootstrap band",
        description="Each RUN is a run folder, or a folder whose sub-folders are runs "
        "(the seeds of one curve).",
    )
    plot.add_argument("runs", nargs="+", metavar="RUN")
    plot.add_argument(
        "--metric", default="episode_return", help="a column of metrics.csv (default: %(default)s)"
    )
    plot.add_argument(
        "--statistic",
        choices=("mean", "iqm"),
        default="mean",
        help="over seeds (default: %(default)s)",
    )
    plot.add_argument(
        "--out", default="curves.png", help="the image to write (default: %(default)s)"
    )
    return parser


def command_train(args) -> None:
    resumes = [run for run in (args.resume, getattr(args, "resume_here", None)) if run is not None]
    if len(set(resumes)) > 1:
        raise ValueError(f"--resume was given two runs: {' and '.join(resumes)}")
    resume = resumes[0] if resumes else None
    checkpoint_every = getattr(args, "checkpoint_every", None) or args.resume_checkpoint_every
    if args.algorithm is None and resume is None:
        raise ValueError(
            "train needs an ALGO (one of " + ", ".join(ALGORITHMS) + ") or --resume RUN"
        )
    if resume is not None:
        spec, config = load_config(resume)
        if args.algorithm is not None:
            _require_same(spec.name, config, args, resume)
        out = resume
    else:
        if args.out is None:
            raise ValueError("--out RUN is required: the folder that will hold the run")
        spec = algorithm_named(args.algorithm)
        config, out = _config_from(args, spec), args.out
    result = train_run(
        spec.name, config, out, checkpoint_every, resume=resume is not None, progress=True
    )
    if spec.language_model:
        print(f"trained {spec.name} (seed {config.seed}) into {out}: {len(result.history)} updates")
        return
    returns = [row["episode_return"] for row in result.history[-10:] if "episode_return" in row]
    print(
        f"trained {spec.name} on {config.env_id} (seed {config.seed}) into {out}: "
        f"{len(result.history)} updates"
        + (
            f", training return over the last updates {sum(returns) / len(returns):.1f}"
            if returns
            else ""
        )
    )


def _given_fields(args, spec) -> dict:
    """The config fields the command line gives explicitly."""
    fields = parse_settings(args.settings, spec.config)
    options = [("seed", args.seed)]
    if spec.language_model:
        options += [(spec.model_field, args.model)]
        if spec.reward_model_field is not None:
            options += [(spec.reward_model_field, args.reward_model)]
    else:
        options += [("env_id", args.env_id), ("total_steps", args.total_steps)]
    for name, value in options:
        if value is not None:
            fields[name] = model_path(value) if name.endswith(MODEL_FIELDS) else value
    return fields


MODEL_FIELDS = ("_path", "_folder")  # config fields that name a model: --model takes a run folder


def _config_from(args, spec):
    """The config the command line asks for: the environment's tested preset, then the options (a
    language-model algorithm: its defaults, then the options)."""
    if spec.language_model:
        return spec.config(**_given_fields(args, spec))
    given = {"env_id": "CartPole-v1", **_given_fields(args, spec), "progress": True}
    return spec.config.for_env(given.pop("env_id"), **given)


def _require_same(algorithm: str, saved, args, run: str) -> None:
    """``--resume`` with ALGO and options: they must describe the saved run (options left out are
    the run's)."""
    if args.algorithm != algorithm:
        raise ValueError(f"--resume {run}: the run is of {algorithm}, not {args.algorithm}")
    if args.out is not None and Path(args.out).resolve() != Path(run).resolve():
        raise ValueError(f"--out {args.out} and --resume {run} name different runs")
    given = _given_fields(args, ALGORITHMS[algorithm])
    given = dataclasses.asdict(dataclasses.replace(saved, **given)) if given else {}
    different = [name for name, value in given.items() if value != getattr(saved, name)]
    if different:
        raise ValueError(
            "--resume: these options differ from the saved run's config: "
            + ", ".join(
                f"{name} (saved {getattr(saved, name)!r}, given {given[name]!r})"
                for name in different
            )
        )


def command_eval(args) -> None:
    from rlkit.runs import evaluate_language_model_run, evaluate_run, load_config
    from rlkit.statistics import iqm, stratified_bootstrap_ci

    spec, _ = load_config(args.run)
    if spec.language_model:
        scores = evaluate_language_model_run(args.run, args.prompts, args.seed, args.device)
        print(f"{args.run} ({spec.name}), held-out:")
        for name, value in scores.items():
            print(f"  {name} = {value:.4f}")
        return
    returns = evaluate_run(args.run, args.episodes, args.seed, args.device)
    point, low, high = stratified_bootstrap_ci(returns, "mean", seed=0)
    print(
        f"{args.run}: greedy return over {len(returns)} episodes: mean {point:.2f} (95% bootstrap "
        f"CI {low:.2f} to {high:.2f}), std {returns.std():.2f}, IQM {iqm(returns):.2f}, min "
        f"{returns.min():.2f}, max {returns.max():.2f}"
    )


def command_render(args) -> None:
    import gymnasium as gym

    from rlkit.rendering import record_gif
    from rlkit.runs import load_run

    spec, _ = load_config(args.run)
    if spec.language_model:
        raise ValueError(f"{args.run} is a {spec.name} run: it has no environment to render")
    spec, result = load_run(args.run, args.device)
    env = gym.make(result.config.env_id)
    act = spec.greedy_policy(result, env.action_space)
    env.close()
    total = record_gif(
        result.config.env_id, act, args.gif, seed=args.seed, max_steps=args.max_steps
    )
    print(f"wrote {args.gif}: one episode of {result.config.env_id}, return {total:.1f}")


def command_plot(args) -> None:
    from rlkit.runs import plot_runs

    plot_runs(args.runs, args.metric, args.statistic, args.out)
    print(f"wrote {args.out}")


COMMANDS = {
    "train": command_train,
    "eval": command_eval,
    "render": command_render,
    "plot": command_plot,
}


def main(argv: list[str] | None = None) -> int:
    # as ``python -m rlkit`` does: "module:Env-v0" ids can name local modules
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except (ValueError, RunError, CheckpointError, TrainingDiverged, OSError, ImportError) as error:
        print(f"rlkit {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"rlkit {args.command}: interrupted"
            + (" (continue with rlkit train --resume RUN)" if args.command == "train" else ""),
            file=sys.stderr,
        )
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
