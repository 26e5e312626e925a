"""Checkpoints, exact resume, failures and the command line (rlkit.checkpoint, rlkit.runs,
rlkit.cli)."""

import csv
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlkit.checkpoint as checkpoint
from rlkit import a2c, dqn, ppo, reinforce
from rlkit.checkpoint import CheckpointError, env_state, load_env_state, save_checkpoint
from rlkit.cli import field_meanings, main, parse_value
from rlkit.runs import ALGORITHMS, CHECKPOINT_FILE, RunError, load_run, read_metrics, train_run
from rlkit.training import TrainingDiverged, fit

REPO = Path(__file__).resolve().parents[1]

# Small configs of every resumable algorithm: a few seconds each, several updates.
SMALL = {
    "ppo": ppo.PPOConfig.for_env("CartPole-v1", total_steps=256 * 12, seed=3),
    "ppo-pendulum": ppo.PPOConfig.for_env(
        "Pendulum-v1", total_steps=512 * 6, num_envs=2, num_steps=256, seed=3
    ),
    "ppo-gym-envs": ppo.PPOConfig.for_env(
        "CartPole-v1",
        total_steps=128 * 10,
        num_envs=4,
        num_steps=32,
        minibatch_size=32,
        batched_env=False,
    ),
    "a2c": a2c.A2CConfig.for_env("CartPole-v1", total_steps=40 * 40, seed=3, lr_schedule="linear"),
    "a2c-adam": a2c.A2CConfig.for_env(
        "CartPole-v1", total_steps=40 * 40, optimizer="adam", batched_env=False
    ),
    # its state is a tuple
    "a2c-mountaincar": a2c.A2CConfig.for_env("MountainCar-v0", total_steps=40 * 12, seed=1),
    "reinforce": reinforce.ReinforceConfig.for_env("CartPole-v1", total_steps=3000, seed=3),
    "reinforce-no-baseline": reinforce.ReinforceConfig.for_env(
        "CartPole-v1", total_steps=3000, baseline=False
    ),
    "dqn": dqn.DQNConfig.for_env(
        "CartPole-v1",
        total_steps=3000,
        learning_starts=500,
        buffer_size=1000,
        target_update_interval=200,
        seed=3,
        gradient_steps=8,
    ),
}
SMALL["dqn-float32-reward"] = dqn.DQNConfig.for_env(
    "tests.crashing_env:rlkit-test/Float32RewardCartPole-v0",
    total_steps=3000,
    learning_starts=500,
    buffer_size=1000,
    gradient_steps=8,
)
TRAINERS = {
    "ppo": ppo.PPOTrainer,
    "a2c": a2c.A2CTrainer,
    "reinforce": reinforce.ReinforceTrainer,
    "dqn": dqn.DQNTrainer,
}


def trainer_of(name):
    return TRAINERS[name.split("-")[0]]


def weights(result):
    return {name: tensor.clone() for name, tensor in result.agent.state_dict().items()}


@pytest.mark.parametrize("name", SMALL)
def test_resuming_from_a_checkpoint_gives_the_uninterrupted_run(name, tmp_path):
    """Stop after 3 updates, save, rebuild from scratch, load, finish: the same history and weights,
    bit for bit."""
    config, make = SMALL[name], trainer_of(name)
    uninterrupted = fit(make(config))
    assert len(uninterrupted.history) > 4
    first = make(config)
    for _ in range(3):
        first.run_update()
    save_checkpoint(first.state_dict(), tmp_path / "checkpoint.pt")
    # the interrupted process went on a little: the checkpoint must not depend on that
    first.run_update()
    first.close()
    resumed = make(config)
    resumed.load_state_dict(torch.load(tmp_path / "checkpoint.pt", weights_only=True))
    assert resumed.updates_done == 3
    result = fit(resumed)
    assert result.history == uninterrupted.history
    assert all(
        torch.equal(a, b) for a, b in zip(weights(result).values(), weights(uninterrupted).values())
    )


def test_a_resumed_run_differs_without_the_environment_state(tmp_path):
    """The env state matters: restoring everything but the environments changes the curve (so the
    test above can fail)."""
    config = SMALL["ppo"]
    uninterrupted = fit(ppo.PPOTrainer(config))
    first = ppo.PPOTrainer(config)
    for _ in range(3):
        first.run_update()
    state = first.state_dict()
    first.close()
    # a fresh env's state instead
    state["collector"]["envs"] = env_state(ppo.PPOTrainer(config).envs)
    resumed = ppo.PPOTrainer(config)
    resumed.load_state_dict(state)
    assert fit(resumed).history != uninterrupted.history


def test_a_checkpoint_holds_only_plain_data_and_loads_with_weights_only(tmp_path):
    trainer = ppo.PPOTrainer(SMALL["ppo-pendulum"])
    trainer.run_update()
    save_checkpoint(trainer.state_dict(), tmp_path / "c.pt")
    trainer.close()
    state = torch.load(tmp_path / "c.pt", weights_only=True)
    assert state["algorithm"] == "ppo" and state["updates_done"] == 1
    assert isinstance(state["collector"]["envs"][0]["_observations"], torch.Tensor)


def test_env_state_round_trip_continues_the_same_episode():
    env = gym.make("CartPole-v1")
    env.reset(seed=5)
    for _ in range(7):
        env.step(env.action_space.sample())
    saved = env_state(env)
    expected = [env.step(action)[:4] for action in (0, 1, 1, 0)] + [env.action_space.sample()]
    copy = gym.make("CartPole-v1")
    copy.reset(seed=99)
    load_env_state(copy, saved)
    got = [copy.step(action)[:4] for action in (0, 1, 1, 0)] + [copy.action_space.sample()]
    assert all(np.array_equal(a[0], b[0]) and a[1:] == b[1:] for a, b in zip(expected[:4], got[:4]))
    assert expected[4] == got[4]  # the action space's own generator is restored too
    assert copy._elapsed_steps == 11  # the time limit counts on from the saved episode


def test_loading_an_env_state_into_a_different_env_is_refused():
    saved = env_state(gym.make("CartPole-v1"))
    with pytest.raises(CheckpointError, match="does not match"):
        load_env_state(gym.make("Pendulum-v1"), saved)


def test_a_checkpoint_of_another_algorithm_is_refused(tmp_path):
    trainer = a2c.A2CTrainer(SMALL["a2c"])
    state = trainer.state_dict()
    trainer.close()
    with pytest.raises(CheckpointError, match="'a2c', not 'ppo'"):
        ppo.PPOTrainer(SMALL["ppo"]).load_state_dict(state)


# Failures -----------------------------------------------------------------------------------------


def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint({"version": 1, "weights": torch.ones(3)}, path)
    before = path.read_bytes()

    def disk_full(obj, file):
        file.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(
        CheckpointError, match="No space left on device.*previous version of the file is intact"
    ):
        save_checkpoint({"version": 2}, path)
    assert path.read_bytes() == before
    # no partial file left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_a_run_whose_checkpoint_write_fails_stops_with_a_clear_error(tmp_path, monkeypatch):
    out = tmp_path / "run"
    calls = []
    real_save = torch.save

    def fail_on_the_second(obj, file):
        calls.append(obj["updates_done"])
        if len(calls) == 2:
            file.write(b"partial")
            raise OSError(5, "Input/output error")
        real_save(obj, file)

    monkeypatch.setattr(checkpoint.torch, "save", fail_on_the_second)
    with pytest.raises(CheckpointError, match="Input/output error"):
        train_run("ppo", SMALL["ppo"], out, checkpoint_every=2)
    assert calls == [2, 4]
    assert torch.load(out / CHECKPOINT_FILE, weights_only=True)["updates_done"] == 2
    assert len(read_metrics(out)["step"]) == 2


def test_a_loss_that_turns_nan_stops_the_run_naming_the_update_and_the_quantity(tmp_path):
    """The env's reward turns NaN at its 300th step: the value loss is NaN in the update that trains
    on it."""
    config = ppo.PPOConfig.for_env(
        "tests.crashing_env:rlkit-test/NaNRewardCartPole-v0",
        num_envs=1,
        num_steps=64,
        minibatch_size=32,
        total_steps=64 * 20,
    )
    with pytest.raises(TrainingDiverged, match=r"update 5: .*value_loss = nan"):
        train_run("ppo", config, tmp_path / "run", checkpoint_every=1)
    last_good = torch.load(tmp_path / "run" / CHECKPOINT_FILE, weights_only=True)
    assert last_good["updates_done"] == 4 and len(last_good["history"]) == 4
    assert all(torch.isfinite(t).all() for t in last_good["agent"].values())


@pytest.mark.parametrize("algorithm", ["dqn", "reinforce", "a2c"])
def test_nan_rewards_stop_every_algorithm(algorithm):
    spec = ALGORITHMS[algorithm]
    extra = {"dqn": dict(learning_starts=200, buffer_size=1000, train_frequency=64)}.get(
        algorithm, {}
    )
    config = spec.config(
        env_id="tests.crashing_env:rlkit-test/NaNRewardCartPole-v0", total_steps=3000, **extra
    )
    with pytest.raises(TrainingDiverged, match=r"update \d+: .*loss = nan"):
        spec.module.train(config)


def test_an_unwritable_out_folder_is_refused_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    started = time.perf_counter()
    with pytest.raises(RunError, match="not a writable folder"):
        train_run("ppo", ppo.PPOConfig.for_env("CartPole-v1"), blocker / "run")
    assert time.perf_counter() - started < 2.0  # refused up front, not after 500k steps


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into a read-only folder")
def test_a_read_only_out_folder_is_refused_before_training(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(RunError, match="not a writable folder"):
        train_run("ppo", ppo.PPOConfig.for_env("CartPole-v1"), tmp_path / "ro" / "run")


def test_an_existing_run_is_never_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(RunError, match="already exists.*--resume"):
        train_run("ppo", SMALL["ppo"], out)
    assert (out / "notes.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1


def test_resume_of_a_folder_without_a_run_is_refused(tmp_path):
    with pytest.raises(RunError, match="no run there"):
        train_run("ppo", SMALL["ppo"], tmp_path, resume=True)


# A real process, killed ---------------------------------------------------------------------------


def rlkit_command(*args):
    return [sys.executable, "-m", "rlkit", *args]


def run_until_first_checkpoint_then_kill(command, out: Path) -> int:
    """Start ``command``, SIGKILL it as soon as its first checkpoint exists; the updates that
    checkpoint holds."""
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not (out / CHECKPOINT_FILE).exists():
        assert process.poll() is None, "the run ended before writing a checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    return torch.load(out / CHECKPOINT_FILE, weights_only=True)["updates_done"]


@pytest.mark.parametrize(
    "algorithm, options, updates",
    [
        (
            "ppo",
            [
                "--total-steps",
                "25600",
                "--set",
                "num_envs=4",
                "--set",
                "num_steps=64",
                "--set",
                "minibatch_size=64",
            ],
            100,
        ),
        (
            "dqn",
            [
                "--total-steps",
                "20000",
                "--set",
                "learning_starts=500",
                "--set",
                "train_frequency=64",
                "--set",
                "buffer_size=20000",
                "--set",
                "gradient_steps=4",
                "--set",
                "hidden_sizes=[32,32]",
            ],
            305,
        ),
    ],
)
def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_result(
    algorithm, options, updates, tmp_path
):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    common = ["train", algorithm, "--seed", "1", "--checkpoint-every", "5", *options]
    reached = run_until_first_checkpoint_then_kill(
        rlkit_command(*common, "--out", str(killed)), killed
    )
    assert 0 < reached < updates  # killed mid-run
    subprocess.run(
        rlkit_command("train", "--resume", str(killed)), cwd=REPO, check=True, capture_output=True
    )
    subprocess.run(
        rlkit_command(*common, "--out", str(whole)), cwd=REPO, check=True, capture_output=True
    )
    assert (killed / "metrics.csv").read_text() == (whole / "metrics.csv").read_text()
    resumed, uninterrupted = (
        torch.load(run / CHECKPOINT_FILE, weights_only=True) for run in (killed, whole)
    )
    assert resumed["updates_done"] == uninterrupted["updates_done"] == updates
    agent = "agent" if algorithm == "ppo" else "q_online"
    assert all(
        torch.equal(resumed[agent][name], uninterrupted[agent][name])
        for name in uninterrupted[agent]
    )


# The command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_help_lists_every_hyperparameter_with_its_default_and_meaning(algorithm, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", algorithm, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    spec = ALGORITHMS[algorithm]
    defaults = {field.name: field.default for field in dataclasses.fields(spec.config)}
    for name, meaning in field_meanings(spec.config).items():
        assert meaning, f"{spec.config.__name__}.{name} has no comment and no common meaning"
        assert f"  {name} = {defaults[name]!r}" in text
        assert meaning in text


def test_help_shows_the_presets_that_differ_from_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--help"])
    assert "ent_coef = 0.01 (preset CartPole-v1: 0.0; Pendulum-v1: 0.0)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, value",
    [
        ("1e-3", 1e-3),
        ("64", 64),
        ("[32,32]", [32, 32]),
        ("True", True),
        ("None", None),
        ("inf", float("inf")),
        ("linear", "linear"),
    ],
)
def test_set_values_are_parsed_as_python_literals(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "ppo", "--out", "{tmp}/r", "--set", "clip_eps=-1"],
            "clip_eps must be a number > 0 (math.inf: never clip), got -1",
        ),
        (
            ["train", "ppo", "--out", "{tmp}/r", "--set", "nonsense=1"],
            "'nonsense' is not a field of PPOConfig",
        ),
        (["train", "ppo", "--out", "{tmp}/r", "--set", "clip_eps"], "--set takes FIELD=VALUE"),
        (["train", "dqn", "--out", "{tmp}/r", "--env", "Pendulum-v1"], "env_id"),
        (
            ["train", "ppo", "--out", "{tmp}/r", "--env", "NoSuchEnv-v0"],
            "env_id must be a registered",
        ),
        (["train", "ppo"], "--out RUN is required"),
        (["train"], "train needs an ALGO"),
        (["train", "--resume", "{tmp}/nothing"], "no run there"),
        (["eval", "{tmp}"], "no run there"),
        (["plot", "{tmp}"], "neither a run folder nor a folder of runs"),
    ],
)
def test_bad_command_lines_exit_with_a_message_naming_the_problem(args, message, tmp_path, capsys):
    code = main([arg.replace("{tmp}", str(tmp_path)) for arg in args])
    assert code == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r" / CHECKPOINT_FILE).exists()


def test_train_eval_render_plot_and_resume_from_the_command_line(tmp_path, capsys):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        assert (
            main(
                [
                    "train",
                    "ppo",
                    "--seed",
                    str(seed),
                    "--total-steps",
                    "2560",
                    "--out",
                    str(runs / "ppo" / f"s{seed}"),
                    "--checkpoint-every",
                    "3",
                ]
            )
            == 0
        )
    assert main(["train", "a2c", "--total-steps", "2000", "--out", str(runs / "a2c")]) == 0
    metrics = read_metrics(runs / "ppo" / "s0")
    assert len(metrics["step"]) == 10 and metrics["step"][-1] == 2560
    with open(runs / "ppo" / "s0" / "metrics.csv") as file:
        assert next(csv.reader(file))[:3] == ["step", "learning_rate", "clip_eps"]
    assert main(["eval", str(runs / "ppo" / "s0"), "--episodes", "5"]) == 0
    assert "greedy return over 5 episodes: mean" in capsys.readouterr().out
    assert (
        main(["render", str(runs / "a2c"), "--gif", str(tmp_path / "a2c.gif"), "--max-steps", "20"])
        == 0
    )
    assert (tmp_path / "a2c.gif").read_bytes()[:6] == b"GIF89a"
    assert (
        main(
            [
                "plot",
                str(runs / "ppo"),
                str(runs / "a2c"),
                "--out",
                str(tmp_path / "curves.png"),
                "--statistic",
                "iqm",
            ]
        )
        == 0
    )
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # resuming a finished run changes nothing; the original options must match the saved config
    before = (runs / "a2c" / "metrics.csv").read_text()
    assert main(["train", "--resume", str(runs / "a2c")]) == 0
    assert (runs / "a2c" / "metrics.csv").read_text() == before
    assert main(["train", "a2c", "--total-steps", "4000", "--resume", str(runs / "a2c")]) == 1
    assert "total_steps (saved 2000, given 4000)" in capsys.readouterr().err


def test_load_run_gives_the_trained_agent_and_leaves_the_callers_generators_alone(tmp_path):
    result = train_run("a2c", SMALL["a2c"], tmp_path / "run")
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    spec, loaded = load_run(tmp_path / "run", device="cpu")
    assert torch.equal(torch.rand(3), expected)
    assert spec.name == "a2c" and loaded.history == result.history
    assert all(
        torch.equal(a, b) for a, b in zip(weights(loaded).values(), weights(result).values())
    )


def test_a_crash_between_checkpoint_and_metrics_is_repaired_on_resume(tmp_path):
    out = tmp_path / "run"
    train_run("a2c", SMALL["a2c"], out, checkpoint_every=7)
    complete = (out / "metrics.csv").read_text()
    # the last write never happened
    (out / "metrics.csv").write_text("\n".join(complete.splitlines()[:-3]) + "\n")
    train_run("a2c", SMALL["a2c"], out, resume=True)
    assert (out / "metrics.csv").read_text() == complete


def test_a_config_the_environment_refuses_leaves_no_run_behind(tmp_path):
    with pytest.raises(ValueError, match="env_id"):
        train_run("dqn", dqn.DQNConfig.for_env("Pendulum-v1"), tmp_path / "run")
    train_run("a2c", SMALL["a2c"], tmp_path / "run")  # the folder is still free


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"algorithm": "ppo", "config": {"seed": 0', "is not a run's config"),
        ('["ppo"]', "needs an 'algorithm'"),
        ('{"algorithm": "sac", "config": {}}', "needs an 'algorithm'"),
        (
            '{"algorithm": "a2c", "config": {"minibatch_size": 4}}',
            "minibatch_size not fields of A2CConfig",
        ),
    ],
)
def test_a_corrupt_config_json_is_named(content, message, tmp_path):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(RunError, match=message):
        load_run(tmp_path)


def test_a_corrupt_checkpoint_is_named(tmp_path):
    out = tmp_path / "run"
    train_run("a2c", SMALL["a2c"], out)
    (out / CHECKPOINT_FILE).write_bytes((out / CHECKPOINT_FILE).read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="checkpoint.pt is not a readable checkpoint"):
        load_run(out)


def test_resume_options(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert (
        main(
            [
                "train",
                "a2c",
                "--total-steps",
                "400",
                "--seed",
                "2",
                "--out",
                out,
                "--checkpoint-every",
                "3",
            ]
        )
        == 0
    )
    assert main(["train", "a2c", "--resume", out]) == 0  # ALGO alone: the run's options
    assert main(["train", "--resume", out, "--checkpoint-every", "4"]) == 0
    assert main(["train", "a2c", "--seed", "2", "--resume", out]) == 0
    capsys.readouterr()
    for args, message in (
        (["train", "ppo", "--resume", out], "the run is of a2c, not ppo"),
        (["train", "a2c", "--seed", "3", "--resume", out], "seed (saved 2, given 3)"),
        (
            ["train", "a2c", "--out", str(tmp_path / "other"), "--resume", out],
            "name different runs",
        ),
        (["train", "--resume", str(tmp_path / "x"), "a2c", "--resume", out], "two runs"),
    ):
        assert main(args) == 1
        assert message in capsys.readouterr().err


def test_plot_keeps_two_groups_of_the_same_name_apart(tmp_path):
    from rlkit.runs import run_groups

    for group in ("g1", "g2"):
        train_run("a2c", SMALL["a2c"], tmp_path / group / "ppo" / "s0", checkpoint_every=100)
    groups = run_groups([tmp_path / "g1" / "ppo", tmp_path / "g2" / "ppo"])
    assert len(groups) == 2 and sum(len(runs) for runs in groups.values()) == 2


def test_a3c_runs_end_with_a_checkpoint_but_cannot_be_resumed(tmp_path):
    from rlkit.a3c import A3CConfig

    result = train_run(
        "a3c", A3CConfig.for_env("CartPole-v1", total_steps=2000, num_workers=1), tmp_path / "run"
    )
    spec, loaded = load_run(tmp_path / "run")
    assert all(
        torch.equal(a, b) for a, b in zip(weights(loaded).values(), weights(result).values())
    )
    with pytest.raises(RunError, match="a3c runs cannot be resumed"):
        train_run("a3c", result.config, tmp_path / "run", resume=True)
