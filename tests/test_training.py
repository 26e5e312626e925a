"""``eval_mode``: evaluation mode for a block, every submodule's own mode restored after, also when
the block raises; and the algorithms and the language-model layer that switch modes through it.
``fit_side_by_side``: runs in processes of their own compute what ``fit`` computes here."""

import pytest
import torch

from rlkit import a2c
from rlkit.llm import generation
from rlkit.llm.models import build_causal_lm, tiny_config
from rlkit.llm.tokenizer import build_char_tokenizer
from rlkit.training import eval_mode


def mixed_modes() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5), torch.nn.Linear(2, 1))
    model.train()
    model[1].eval()  # a submodule left in eval mode on purpose (a frozen part)
    return model


def modes(model: torch.nn.Module) -> list[bool]:
    return [sub.training for sub in model.modules()]


def test_eval_mode_switches_every_submodule_and_restores_each_ones_own_mode():
    model = mixed_modes()
    before = modes(model)
    assert before == [True, True, False, True]
    with eval_mode(model):
        assert not any(modes(model))
    assert modes(model) == before


def test_eval_mode_restores_the_modes_when_the_block_raises():
    model, other = mixed_modes(), torch.nn.Linear(1, 1)
    with pytest.raises(RuntimeError, match="inside"), eval_mode(model, other):
        raise RuntimeError("inside")
    assert modes(model) == [True, True, False, True] and other.training


def test_an_algorithms_evaluate_leaves_its_agent_in_the_mode_it_found():
    result = a2c.train(
        a2c.A2CConfig.for_env("CartPole-v1", total_steps=80, num_envs=2, num_steps=5)
    )
    result.agent.train()
    a2c.evaluate(result, episodes=2)
    assert result.agent.training
    result.agent.eval()
    a2c.evaluate(result, episodes=2)
    assert not result.agent.training


def test_generation_restores_the_training_mode_when_generate_raises(monkeypatch):
    tokenizer = build_char_tokenizer()
    model = build_causal_lm(tiny_config(tokenizer), seed=0).train()
    seen = []

    def failing_generate(**kwargs):
        seen.append(model.training)
        raise RuntimeError("generate failed")

    monkeypatch.setattr(model, "generate", failing_generate)
    with pytest.raises(RuntimeError, match="generate failed"):
        generation.generate(model, tokenizer, ["S318402:"], max_new_tokens=4)
    assert seen == [False] and model.training


def test_runs_side_by_side_compute_what_fit_computes_here_in_the_order_given():
    from rlkit.reinforce import ReinforceConfig, ReinforceTrainer
    from rlkit.training import fit, fit_side_by_side

    configs = [
        ReinforceConfig.for_env("CartPole-v1", seed=seed, total_steps=3000) for seed in (1, 0)
    ]
    here = [fit(ReinforceTrainer(config)) for config in configs]
    apart = fit_side_by_side(ReinforceTrainer, configs)
    assert [result.config.seed for result in apart] == [1, 0]
    assert here[0].history != here[1].history  # two seeds: two runs, so the order is tested
    for mine, theirs in zip(here, apart):
        assert theirs.history == mine.history
        assert all(
            torch.equal(a, b) for a, b in zip(mine.agent.parameters(), theirs.agent.parameters())
        )


@pytest.mark.parametrize(
    "configs, processes, field",
    [([], None, "configs"), ("not a list", None, "configs"), ([object()], 0, "processes")],
)
def test_side_by_side_refuses_bad_input_by_name(configs, processes, field):
    from rlkit.training import fit_side_by_side

    with pytest.raises(ValueError, match=f"^{field} must be"):
        fit_side_by_side(object, configs, processes)
