"""Language-model runs on the command line: ``rlkit train sft | reward-model | rlhf-ppo | grpo |
dpo``, run folders with a saved model that ``--model`` starts the next run from, exact resume, and
``rlkit eval`` of a language-model run."""

import csv
import json
import subprocess
import sys

import pytest

from rlkit.cli import main
from rlkit.llm import rlhf_ppo
from rlkit.runs import CHECKPOINT_FILE, MODEL_FOLDER, evaluate_language_model_run, train_run

SFT = ["--set", "max_steps=20", "--set", "eval_every=10", "--set", "num_heldout=50"]
REWARD_MODEL = [
    "--set",
    "num_train_pairs=64",
    "--set",
    "num_heldout_pairs=50",
    "--set",
    "epochs=1",
    "--set",
    "eval_every=1",
]
PPO = ["--set", "batch_size=8", "--set", "minibatch_size=4", "--set", "num_iterations=4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An SFT run, a reward model trained from it, and RLHF-PPO from both, all made by the
    command line."""
    runs = tmp_path_factory.mktemp("runs")
    assert main(["train", "sft", "--seed", "1", "--out", str(runs / "sft"), *SFT]) == 0
    assert (
        main(
            [
                "train",
                "reward-model",
                "--model",
                str(runs / "sft"),
                "--out",
                str(runs / "rm"),
                *REWARD_MODEL,
            ]
        )
        == 0
    )
    ppo = ["train", "rlhf-ppo", "--model", str(runs / "sft"), "--reward-model", str(runs / "rm")]
    assert main([*ppo, "--out", str(runs / "ppo"), "--checkpoint-every", "2", *PPO]) == 0
    return runs


def test_each_run_saves_its_model_and_the_next_run_starts_from_it(runs):
    for name in ("sft", "rm", "ppo"):
        assert (runs / name / MODEL_FOLDER / "config.json").is_file(), name
        assert (runs / name / CHECKPOINT_FILE).is_file(), name
    # --model RUN is stored as the folder of the run's saved model, so that a resume rebuilds it
    config = json.loads((runs / "ppo" / "config.json").read_text())
    assert config["algorithm"] == "rlhf-ppo"
    assert config["config"]["sft_folder"] == str(runs / "sft" / MODEL_FOLDER)
    assert config["config"]["reward_model_folder"] == str(runs / "rm" / MODEL_FOLDER)
    reward_model = json.loads((runs / "rm" / "config.json").read_text())["config"]
    assert reward_model["sft_model_path"] == str(runs / "sft" / MODEL_FOLDER)
    with open(runs / "ppo" / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    assert [row["iteration"] for row in rows] == ["1", "2", "3", "4"]
    assert {f"seconds_{phase}" for phase in rlhf_ppo.PHASES} <= set(rows[0])


def test_eval_reports_a_language_model_runs_held_out_scores(runs, capsys):
    assert main(["eval", str(runs / "ppo"), "--prompts", "20"]) == 0
    out = capsys.readouterr().out
    for name in ("exact_match", "gold", "proxy", "exact_match_sampled", "gold_sampled", "kl"):
        assert f"  {name} = " in out
    assert main(["eval", str(runs / "sft")]) == 0  # all its 50 held-out prompts
    out = capsys.readouterr().out
    assert "  exact_match = " in out and "  gold = " in out and "kl" not in out
    assert main(["eval", str(runs / "rm")]) == 0
    assert "  heldout_accuracy = " in capsys.readouterr().out
    # the same seed gives the same scores; the caller's generators are untouched
    first = evaluate_language_model_run(runs / "ppo", 20, seed=3)
    assert evaluate_language_model_run(runs / "ppo", 20, seed=3) == first
    assert 0 <= first["exact_match"] <= 1 and first["gold"] <= 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "{ppo}", "--prompts", "0"], "num_prompts must be an integer in [1, 500]"),
        (["render", "{ppo}", "--gif", "x.gif"], "is a rlhf-ppo run: it has no environment"),
        (["train", "rlhf-ppo", "--model", "{tmp}/nothing", "--out", "{tmp}/r"], "nothing"),
        (
            ["train", "reward-model", "--model", "{fresh}", "--out", "{tmp}/r2"],
            "a run without a saved model yet",
        ),
    ],
)
def test_language_model_commands_refuse_bad_input_with_a_clear_error(
    runs, tmp_path, argv, message, capsys
):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.json").write_text('{"algorithm": "sft", "config": {}}')
    argv = [a.format(ppo=runs / "ppo", tmp=tmp_path, fresh=fresh) for a in argv]
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_an_interrupted_rlhf_ppo_run_resumes_exactly(runs, tmp_path, monkeypatch):
    config = rlhf_ppo.RLHFPPOConfig(
        sft_folder=str(runs / "sft" / MODEL_FOLDER),
        reward_model_folder=str(runs / "rm" / MODEL_FOLDER),
        batch_size=8,
        minibatch_size=4,
        num_iterations=4,
        target_kl=0.5,  # the adaptive coefficient is part of the state
    )
    whole = train_run("rlhf-ppo", config, tmp_path / "whole", checkpoint_every=2)
    update = rlhf_ppo.RLHFPPOTrainer._update

    def crash_after_two(trainer):
        if trainer.updates_done == 2:
            raise KeyboardInterrupt
        return update(trainer)

    monkeypatch.setattr(rlhf_ppo.RLHFPPOTrainer, "_update", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        train_run("rlhf-ppo", config, tmp_path / "cut", checkpoint_every=2)
    monkeypatch.setattr(rlhf_ppo.RLHFPPOTrainer, "_update", update)
    resumed = train_run("rlhf-ppo", config, tmp_path / "cut", resume=True)
    timing = {f"seconds_{phase}" for phase in rlhf_ppo.PHASES}
    assert [{k: v for k, v in row.items() if k not in timing} for row in resumed.history] == [
        {k: v for k, v in row.items() if k not in timing} for row in whole.history
    ]


def test_a_saved_models_folder_and_a_relative_path_are_models_too(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(runs)  # --model sft/model: relative, and a saved model's folder, not a run
    argv = ["train", "reward-model", "--model", "sft/model", "--out", str(tmp_path / "rm")]
    assert main([*argv, *REWARD_MODEL]) == 0
    saved = json.loads((tmp_path / "rm" / "config.json").read_text())["config"]
    assert saved["sft_model_path"] == str((runs / "sft" / MODEL_FOLDER).resolve())


def test_plot_draws_a_language_model_runs_metric_against_its_updates(runs, tmp_path):
    out = tmp_path / "curves.png"
    assert main(["plot", str(runs / "ppo"), "--metric", "score", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_deep_rl_commands_never_load_transformers():
    code = (
        "import sys; from rlkit.cli import build_parser, hyperparameter_help; "
        "build_parser().parse_args(['train', 'ppo']); hyperparameter_help('ppo'); "
        "print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_grpo_trains_from_an_sft_run_and_eval_reports_it(runs, capsys):
    grpo = ["train", "grpo", "--model", str(runs / "sft"), "--out", str(runs / "grpo")]
    small = ["--set", "prompts_per_iteration=2", "--set", "group_size=4"]
    assert main([*grpo, "--set", "num_iterations=3", "--set", "beta=0.05", *small]) == 0
    config = json.loads((runs / "grpo" / "config.json").read_text())
    assert config["algorithm"] == "grpo"
    assert config["config"]["sft_folder"] == str(runs / "sft" / MODEL_FOLDER)
    with open(runs / "grpo" / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    assert [row["iteration"] for row in rows] == ["1", "2", "3"]
    assert "zero_variance_groups" in rows[0]
    assert main(["eval", str(runs / "grpo"), "--prompts", "10"]) == 0
    out = capsys.readouterr().out
    assert "  exact_match = " in out and "  kl = " in out


def test_grpo_without_a_model_is_refused_by_name(tmp_path, capsys):
    assert main(["train", "grpo", "--out", str(tmp_path / "g")]) == 1
    assert "sft_folder" in capsys.readouterr().err


def test_dpo_trains_from_an_sft_run_and_eval_reports_its_win_rate(runs, capsys):
    dpo = ["train", "dpo", "--model", str(runs / "sft"), "--out", str(runs / "dpo")]
    small = ["--set", "num_train_pairs=24", "--set", "batch_size=8"]
    assert main([*dpo, "--checkpoint-every", "2", *small]) == 0
    config = json.loads((runs / "dpo" / "config.json").read_text())
    assert config["algorithm"] == "dpo"
    assert config["config"]["sft_folder"] == str(runs / "sft" / MODEL_FOLDER)
    with open(runs / "dpo" / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    assert [row["step"] for row in rows] == ["1", "2", "3"]
    assert "reward_accuracy" in rows[0] and "reward_margin" in rows[0]
    assert main(["eval", str(runs / "dpo"), "--prompts", "10"]) == 0
    out = capsys.readouterr().out
    assert "  win_rate = " in out and "  kl = " in out and "  gold = " in out
