"""Data parallelism for the trainers of Chapters 8 to 12 (``rlkit.systems.data_parallel``), on two
CPU ranks over gloo: DDP and FSDP take the single process's steps on their global batch (Chapter
8's SFT, whose answers all have one length, so that the ranks' token means are the batch's); GRPO
runs under DDP; each rank's share of the data is its own; runs whose ranks could step apart are
refused by name. (Marked ``alone``: torchrun's ranks need the cores to themselves.)"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlkit.llm.dpo import DPOConfig
from rlkit.llm.grpo import GRPOConfig
from rlkit.llm.reward_model import RewardModelConfig, RewardModelTrainer
from rlkit.llm.sft import SFTConfig, SFTTrainer
from rlkit.llm.tasks import TaskData, make_task
from rlkit.runs import ALGORITHMS
from rlkit.systems import data_parallel
from rlkit.systems.data_parallel import launch, require_data_parallel_run
from rlkit.systems.spmd import free_port
from tests.systems.conftest import adam_step_tolerance, assert_same_weights

REPOSITORY = Path(__file__).resolve().parents[2]
SFT = dict(num_digits=4, batch_size=4, max_steps=3, warmup_steps=1, eval_every=1000)


def single_process_sft(fields: dict) -> SFTTrainer:
    trainer = SFTTrainer(SFTConfig(**fields))
    for _ in range(fields["max_steps"]):
        trainer.run_update()
    return trainer


def assert_the_single_process_s_steps(result: dict, folder: Path, fields: dict) -> None:
    """Rank 0's steps are the single process's on the two ranks' batch: the same gradient norm at
    every step (the averaged gradient), and weights within Adam's reach of its last bits."""
    expected = single_process_sft({**fields, "batch_size": 2 * fields["batch_size"]})
    norms = [row["grad_norm"] for row in result["history"]]
    assert norms == pytest.approx([row["grad_norm"] for row in expected.history], rel=1e-4)
    tolerance = adam_step_tolerance(SFTConfig(**fields).learning_rate, fields["max_steps"])
    weights = torch.load(folder / "state.pt")["model"]
    assert_same_weights(weights, expected.model.state_dict(), tolerance)


@pytest.mark.alone
def test_ddp_from_accelerate_s_config_file_takes_the_single_process_s_steps(tmp_path):
    """The command a reader with GPUs runs, as it is: on a machine without GPUs, Accelerate starts
    two processes and each takes the CPU, over gloo."""
    (tmp_path / "sft.json").write_text(json.dumps(SFT))
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPOSITORY / "configs" / "accelerate" / "ddp.yaml"),
        "--num_processes", "2", "--main_process_port", str(free_port()),
        "-m", "rlkit.systems.data_parallel", "sft",
        "--config", str(tmp_path / "sft.json"), "--out", str(tmp_path),
    ]  # fmt: skip
    environment = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    subprocess.run(command, env=environment, check=True, timeout=300, capture_output=True)
    result = json.loads((tmp_path / "history.json").read_text())
    assert result["world_size"] == 2 and result["mode"] == "ddp"
    assert len(result["history"]) == SFT["max_steps"]
    assert_the_single_process_s_steps(result, tmp_path, SFT)


@pytest.mark.alone
@pytest.mark.parametrize("lora", [{}, {"lora_rank": 4, "lora_alpha": 8.0}], ids=["full", "lora"])
def test_fsdp_on_two_ranks_takes_the_single_process_s_steps(lora, tmp_path):
    fields = {**SFT, **lora}
    result = launch("sft", fields, tmp_path, nproc=2, mode="fsdp")
    assert result["world_size"] == 2 and result["mode"] == "fsdp"
    assert_the_single_process_s_steps(result, tmp_path, fields)


@pytest.mark.alone
def test_offline_dpo_takes_the_same_steps_under_fsdp_and_ddp(policy_folder, tmp_path):
    """Each rank's share of the fixed pairs, with the reference's log-probabilities computed
    before the first step: the sharded model's steps are the replicated one's."""
    fields = dict(sft_folder=policy_folder, num_digits=4, num_train_pairs=64, batch_size=8)
    weights, norms = {}, {}
    for mode in ("ddp", "fsdp"):
        history = launch("dpo", fields, tmp_path / mode, nproc=2, mode=mode)["history"]
        assert len(history) == 64 // (2 * 8)  # an epoch of the global batch
        norms[mode] = [row["grad_norm"] for row in history]
        weights[mode] = torch.load(tmp_path / mode / "state.pt")["model"]
    assert norms["fsdp"] == pytest.approx(norms["ddp"], rel=1e-4)  # the same averaged gradients
    steps, learning_rate = len(norms["ddp"]), DPOConfig(**fields).learning_rate
    tolerance = adam_step_tolerance(learning_rate, steps)
    assert_same_weights(weights["fsdp"], weights["ddp"], tolerance)


@pytest.mark.alone
def test_the_sampling_trainers_run_under_ddp_on_two_ranks(config, ppo_config, tmp_path):
    grpo = dict(dataclasses.asdict(config), num_iterations=2)
    result = launch("grpo", grpo, tmp_path / "grpo", nproc=2, mode="ddp")
    assert [row["iteration"] for row in result["history"]] == [1, 2]
    ppo = dict(dataclasses.asdict(ppo_config), num_iterations=2)  # with the adaptive KL
    result = launch("rlhf-ppo", ppo, tmp_path / "ppo", nproc=2, mode="ddp")
    assert [row["iteration"] for row in result["history"]] == [1, 2]
    assert all(row["grad_norm_critic"] > 0 for row in result["history"])  # the critic stepped


def test_its_algorithms_are_the_command_line_s_language_model_algorithms():
    """The systems layer may not import ``rlkit.runs``, so it names the trainers itself: the same
    names, configs and trainers as the ``rlkit`` command's."""
    language_models = [name for name, spec in ALGORITHMS.items() if spec.language_model]
    assert list(data_parallel.ALGORITHMS) == language_models
    for name in language_models:
        spec = ALGORITHMS[name]
        assert data_parallel.config_and_trainer(name) == (spec.config, spec.trainer)


def test_the_ranks_split_every_global_batch_of_the_stream():
    whole = TaskData(make_task("sort", num_digits=4), seed=3)
    shares = [TaskData(make_task("sort", num_digits=4), seed=3) for _ in range(2)]
    for rank, data in enumerate(shares):
        data.shard(rank, 2)
    for _ in range(3):
        assert shares[0].train_batch(4) + shares[1].train_batch(4) == whole.train_batch(8)


def test_each_rank_trains_on_its_own_share_of_the_reward_model_s_pairs():
    config = RewardModelConfig(num_digits=4, num_train_pairs=101, num_heldout_pairs=20)
    trainers = [RewardModelTrainer(config) for _ in range(2)]
    pairs = list(trainers[0].train_pairs)
    for rank, trainer in enumerate(trainers):
        trainer.shard_data(rank, 2)
    first, second = (trainer.train_pairs for trainer in trainers)
    # every other pair, as many on each rank: the last of an uneven split is left out
    assert first == pairs[:100][0::2] and second == pairs[:100][1::2]
    with pytest.raises(ValueError, match="num_train_pairs"):  # fewer pairs than ranks
        RewardModelTrainer(dataclasses.replace(config, num_train_pairs=2)).shard_data(0, 3)


@pytest.mark.parametrize(
    "algorithm, config, mode, field",
    [
        ("grpo", GRPOConfig(), "fsdp", "mode"),
        ("grpo", GRPOConfig(dynamic_sampling_rounds=2), "ddp", "dynamic_sampling_rounds"),
        ("sft", SFTConfig(), "zero3", "mode"),
        ("ppo", SFTConfig(), "ddp", "algorithm"),
        ("dpo", DPOConfig(pairs="online"), "ddp", "pairs"),
        ("grpo", GRPOConfig(scale="batch"), "ddp", "scale"),
    ],
)
def test_runs_whose_ranks_could_step_apart_are_refused_by_name(algorithm, config, mode, field):
    with pytest.raises(ValueError, match=field):
        require_data_parallel_run(algorithm, config, mode)
