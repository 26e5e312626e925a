"""The tested presets: each names fields of its algorithm's config and differs from their defaults,
``for_env`` applies it between the defaults and the caller's overrides, and a plain config never
reads it."""

import dataclasses

import pytest

from rlkit.presets import PRESETS, preset
from rlkit.runs import ALGORITHMS

CASES = [(algorithm, env_id) for algorithm, envs in PRESETS.items() for env_id in envs]


def defaults(config_class) -> dict:
    return {field.name: field.default for field in dataclasses.fields(config_class)}


def test_every_algorithm_with_presets_has_a_config_that_names_them():
    assert set(PRESETS) <= set(ALGORITHMS)
    for name in PRESETS:
        assert ALGORITHMS[name].config.algorithm == name


@pytest.mark.parametrize("algorithm, env_id", CASES)
def test_a_preset_holds_only_fields_that_differ_from_their_defaults(algorithm, env_id):
    declared = defaults(ALGORITHMS[algorithm].config)
    for name, value in PRESETS[algorithm][env_id].items():
        assert name in declared, f"{algorithm} {env_id}: {name} is not a config field"
        assert value != declared[name], f"{algorithm} {env_id}: {name} = {value!r} is the default"


@pytest.mark.parametrize("algorithm, env_id", CASES)
def test_for_env_gives_the_defaults_then_the_preset_then_the_overrides(algorithm, env_id):
    config_class = ALGORITHMS[algorithm].config
    tested = preset(algorithm, env_id)
    got = dataclasses.asdict(config_class.for_env(env_id, seed=7))
    expected = {**defaults(config_class), **tested, "env_id": env_id, "seed": 7}
    expected["hidden_sizes"] = tuple(expected["hidden_sizes"])
    assert got == expected


@pytest.mark.parametrize("algorithm, env_id", CASES)
def test_a_plain_config_is_exactly_its_fields(algorithm, env_id):
    config_class = ALGORITHMS[algorithm].config
    got = dataclasses.asdict(config_class(env_id=env_id))
    assert got == {**defaults(config_class), "env_id": env_id}


def test_an_override_wins_over_the_preset():
    config = ALGORITHMS["ppo"].config.for_env(
        "CartPole-v1", num_envs=4, minibatch_size=32, batched_env=False
    )
    assert (config.num_envs, config.batched_env, config.num_steps) == (4, False, 8)


def test_an_environment_without_a_preset_gets_the_defaults():
    for name, spec in ALGORITHMS.items():
        if spec.language_model:
            continue  # no environment
        assert spec.config.for_env("Acrobot-v1") == spec.config(env_id="Acrobot-v1"), name
