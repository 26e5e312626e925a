"""What the Ray and torchrun tests share: a tiny policy (and RLHF's reward model) saved as folders
(each worker loads them), runs small enough for seconds, and the single-process reference every
variant is compared to."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlkit.llm.grpo import GRPOConfig, GRPOTrainer
from rlkit.llm.models import build_causal_lm, build_reward_model, tiny_config
from rlkit.llm.rlhf_ppo import RLHFPPOConfig, RLHFPPOTrainer
from rlkit.llm.tokenizer import build_char_tokenizer

# partial credit per position: an untrained policy's groups already differ in reward
RUN = dict(num_iterations=3, prompts_per_iteration=4, group_size=4, num_digits=4, beta=0.04)
# RLHF-PPO: two minibatches per epoch, two epochs, and the adaptive KL coefficient in the driver
PPO_RUN = dict(
    num_iterations=3, batch_size=8, minibatch_size=4, ppo_epochs=2, num_digits=4, target_kl=0.5
)


@pytest.fixture(scope="package")
def policy_folder(tmp_path_factory):
    tokenizer = build_char_tokenizer()
    folder = tmp_path_factory.mktemp("policy")
    build_causal_lm(tiny_config(tokenizer), seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="package")
def config(policy_folder):
    return GRPOConfig(sft_folder=policy_folder, **RUN)


@pytest.fixture(scope="package")
def ppo_config(policy_folder, tmp_path_factory):
    tokenizer = build_char_tokenizer()
    folder = tmp_path_factory.mktemp("reward_model")
    build_reward_model(tiny_config(tokenizer), seed=1).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return RLHFPPOConfig(sft_folder=policy_folder, reward_model_folder=str(folder), **PPO_RUN)


def without_timings(rows):
    return [{k: v for k, v in row.items() if not k.startswith("seconds_")} for row in rows]


def single_process(config: GRPOConfig | RLHFPPOConfig, iterations: int, with_critic=False):
    """Chapter 11's (or 10's) trainer in this process: its history (without timings) and final
    weights (``with_critic``: the critic's too)."""
    trainer_class = RLHFPPOTrainer if isinstance(config, RLHFPPOConfig) else GRPOTrainer
    trainer = trainer_class(config)
    for _ in range(iterations):
        trainer.run_update()
    weights = trainer.model.state_dict()
    if with_critic:
        return without_timings(trainer.history), weights, trainer.critic.state_dict()
    return without_timings(trainer.history), weights


def assert_same_weights(state, expected, tolerance=1e-6):
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=tolerance, msg=name)


def lora(config: GRPOConfig) -> GRPOConfig:
    return dataclasses.replace(config, lora_rank=4, lora_alpha=8.0, learning_rate=1e-2)


def assert_same_history(rows, expected):
    """Row by row, every statistic to float tolerance (timings left out)."""
    rows = without_timings(rows)
    assert len(rows) == len(expected)
    for row, expected_row in zip(rows, expected):
        assert row == pytest.approx(expected_row, rel=1e-6, abs=1e-9)


def adam_step_tolerance(learning_rate: float, steps: int = 1) -> float:
    """How far one Adam step on the ranks' averaged gradient may land from the single process's:
    the step divides each gradient by its own size, so where a gradient is near 0 the last bits of
    the two sums (summed in other orders) move it by up to the step size, ``lr`` either way, at each
    of ``steps``. The gradients themselves (Adam's first moments) carry the close comparison."""
    return 2 * learning_rate * steps
