"""Multiple controllers under torchrun (gloo): one rank is the single process; two ranks take the
single process's step on the same completions (the gradients averaged over the ranks); a rank
killed mid-run stops the run with torchrun's report; settings whose step would differ across
ranks are refused by name. (Marked ``alone``: torchrun's ranks need the cores to themselves.)"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlkit.llm.generation import ResponseBatch, concatenate_responses
from rlkit.llm.grpo import GRPOTrainer, Rollout
from rlkit.llm.rlhf_ppo import Minibatch, RLHFPPOTrainer
from rlkit.systems.spmd import GradientAverager, launch, require_data_parallel_settings
from tests.systems.conftest import (
    adam_step_tolerance,
    assert_same_history,
    assert_same_weights,
    lora,
    single_process,
)

pytestmark = pytest.mark.alone


def test_one_rank_is_the_single_process(config, tmp_path):
    config = lora(config)  # LoRA's adapters draw from the random stream the rank samples from
    expected_history, expected_weights = single_process(config, 2)
    result = launch(config, tmp_path, nproc=1, num_iterations=2)
    assert result["world_size"] == 1
    assert_same_history(result["history"], expected_history)
    assert_same_weights(torch.load(tmp_path / "state.pt")["model"], expected_weights)


def stacked(rollouts: list[Rollout], pad_id: int) -> Rollout:
    """The ranks' rollouts as the one batch the single process would have trained on."""
    batch = concatenate_responses([rollout.batch for rollout in rollouts], pad_id)
    width = batch.response_ids.shape[1]

    def rows(field):
        return torch.cat(
            [F.pad(getattr(r, field), (0, width - getattr(r, field).shape[1])) for r in rollouts]
        )

    advantages = torch.cat([rollout.advantages for rollout in rollouts])
    return Rollout(batch, advantages, rows("loss_mask"), rows("ref_logprobs"))


@pytest.mark.parametrize(
    "loss_type, micro_batch_size", [("grpo", None), ("dapo", None), ("dapo", 3)]
)
def test_two_ranks_take_the_single_process_step_on_the_same_completions(
    config, loss_type, micro_batch_size, tmp_path
):
    """With "dapo" the loss divides by the whole batch's tokens: each rank's gradient is weighed
    by its own tokens (and, in micro-batches of 3 of a rank's 8 completions, each piece by its)."""
    config = dataclasses.replace(config, loss_type=loss_type, micro_batch_size=micro_batch_size)
    result = launch(config, tmp_path, nproc=2, num_iterations=1, save_rollout=True)
    assert result["world_size"] == 2
    rollouts = [
        torch.load(tmp_path / f"rollout-rank{rank}.pt", weights_only=False) for rank in (0, 1)
    ]
    # each rank sampled its own share of the prompts, from its own stream
    assert rollouts[0].batch.prompts.input_ids.shape[0] == config.batch_size // 2
    assert not torch.equal(rollouts[0].batch.prompts.input_ids, rollouts[1].batch.prompts.input_ids)
    assert (torch.cat([r.advantages for r in rollouts]) != 0).any()  # a real step
    # unequal token counts: a plain mean of the ranks' token means would not be dapo's step
    assert rollouts[0].loss_mask.sum() != rollouts[1].loss_mask.sum()
    trainer = GRPOTrainer(config)
    stats = trainer._policy_epochs(stacked(rollouts, trainer.tokenizer.pad_token_id))
    state = torch.load(tmp_path / "state.pt")
    tolerance = adam_step_tolerance(config.learning_rate)
    assert_same_weights(state["model"], trainer.model.state_dict(), tolerance)
    assert_same_first_moments(state["optimizer"], trainer.optimizer)
    assert result["history"][0]["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-5)


def full_batch(config):
    """RLHF-PPO with one step per epoch on the whole batch (what data parallelism allows)."""
    return dataclasses.replace(config, minibatch_size=config.batch_size)


def test_one_rank_is_rlhf_ppo_s_single_process(ppo_config, tmp_path):
    config = full_batch(ppo_config)  # whitening and the adaptive KL go through the collectives
    expected, expected_actor, expected_critic = single_process(config, 2, with_critic=True)
    result = launch(config, tmp_path, nproc=1, num_iterations=2)
    assert_same_history(result["history"], expected)
    state = torch.load(tmp_path / "state.pt")
    assert_same_weights(state["model"], expected_actor)
    assert_same_weights(state["critic_model"], expected_critic)


def stacked_ppo(rollouts: list[Minibatch], pad_id: int, temperature: float) -> Minibatch:
    """The ranks' RLHF-PPO rollouts as the one batch the single process would have trained on."""
    batches = [
        ResponseBatch(r.prompts, r.response_ids, r.mask, r.old_logprobs, temperature)
        for r in rollouts
    ]
    batch = concatenate_responses(batches, pad_id)
    width = batch.response_ids.shape[1]

    def rows(field):
        return torch.cat(
            [F.pad(getattr(r, field), (0, width - getattr(r, field).shape[1])) for r in rollouts]
        )

    return Minibatch.of(batch, rows("advantages"), rows("returns"), rows("old_values"))


def assert_same_first_moments(state: dict, optimizer: torch.optim.Optimizer) -> None:
    """Adam's first moment is (1 - beta1) times the gradient after one step: the ranks' averaged
    gradient is the single process's (the weights alone would hide it: Adam's first step is about
    lr * sign)."""
    expected = optimizer.state_dict()["state"]
    for index, moments in state["state"].items():
        torch.testing.assert_close(
            moments["exp_avg"], expected[index]["exp_avg"], atol=1e-7, rtol=1e-5
        )


def test_two_ranks_take_rlhf_ppo_s_steps_on_the_same_completions(ppo_config, tmp_path):
    config = dataclasses.replace(full_batch(ppo_config), ppo_epochs=1)
    launch(config, tmp_path, nproc=2, num_iterations=1, save_rollout=True)
    rollouts = [
        torch.load(tmp_path / f"rollout-rank{rank}.pt", weights_only=False) for rank in (0, 1)
    ]
    assert rollouts[0].response_ids.shape[0] == config.batch_size // 2
    trainer = RLHFPPOTrainer(config)
    whole = stacked_ppo(rollouts, trainer.tokenizer.pad_token_id, config.temperature)
    # the advantages were whitened over both ranks' tokens, not each rank's own
    advantages = whole.advantages[whole.mask.bool()]
    assert advantages.mean().item() == pytest.approx(0, abs=1e-5)
    assert advantages.var().item() == pytest.approx(1, rel=1e-4)
    assert any(abs(r.advantages[r.mask.bool()].mean().item()) > 1e-3 for r in rollouts)
    trainer._ppo_epochs(whole)
    state = torch.load(tmp_path / "state.pt")
    assert_same_weights(
        state["model"], trainer.model.state_dict(), adam_step_tolerance(config.learning_rate)
    )
    assert_same_weights(
        state["critic_model"],
        trainer.critic.state_dict(),
        adam_step_tolerance(config.critic_learning_rate),
    )
    # the policy's and the value loss's gradients are token means: weighed by each rank's tokens
    assert_same_first_moments(state["optimizer"], trainer.optimizer)
    assert_same_first_moments(state["critic_optimizer"], trainer.critic_optimizer)


def test_a_killed_rank_stops_the_run_with_torchrun_s_report(config, tmp_path):
    outcome = {}

    def run():
        try:
            endless = dataclasses.replace(config, num_iterations=100_000)
            launch(endless, tmp_path, nproc=2, timeout=300)
        except RuntimeError as error:
            outcome["error"] = str(error)

    thread = threading.Thread(target=run)
    thread.start()
    second_rank = None
    while second_rank is None and thread.is_alive():
        time.sleep(0.5)
        for child in psutil.Process().children(recursive=True):
            try:
                if child.environ().get("LOCAL_RANK") == "1":
                    second_rank = child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    assert second_rank is not None, "torchrun ended before its second rank was seen"
    time.sleep(5)  # past the start, inside the iterations
    second_rank.kill()
    thread.join(timeout=300)
    assert not thread.is_alive()
    # the report leads with the first failure torchrun saw (rank 1's death, or rank 0's error on
    # the broken connection when both fall in one poll) and lists rank 1's signal
    assert outcome["error"].startswith("torchrun on 2 ranks: rank ")
    assert "Signal 9 (SIGKILL) received by PID" in outcome["error"]


def test_a_run_past_its_timeout_stops_torchrun_and_every_rank(config, tmp_path):
    endless = dataclasses.replace(config, num_iterations=100_000)
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match="did not finish within 20 s"):
        launch(endless, tmp_path, nproc=2, timeout=20)
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    assert left == []
    # the ranks run in sessions of their own, not below this process: none of them is left either
    ranks = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(tmp_path) in " ".join(process.info["cmdline"] or []):
                ranks.append(process)
    assert ranks == []


def test_ranks_with_no_weight_at_all_average_to_a_zero_gradient(monkeypatch):
    """GRPO's "dapo" with every completion of every rank truncated and masked: no division by
    zero."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().mul(0.0).backward()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        GradientAverager()(model, 0.0)
    finally:
        dist.destroy_process_group()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(loss_type="bnpo"), "loss_type"),
        (dict(scale="batch"), "scale"),
        (dict(prompts_per_iteration=3), "prompts_per_iteration"),
        (dict(minibatch_size=8), "minibatch_size"),
    ],
)
def test_settings_whose_step_differs_across_ranks_are_refused(config, change, field):
    with pytest.raises(ValueError, match=field):
        require_data_parallel_settings(dataclasses.replace(config, **change), world_size=2)
