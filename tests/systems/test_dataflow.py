"""The dataflow's roles and drivers in one process (no Ray, no torchrun): the single controller's
iteration equals Chapter 11's GRPO trainer and Chapter 10's RLHF-PPO trainer; asynchronous rollouts
with staleness ``s`` equal the trainer whose sampler lags by ``s`` (0: the synchronous run); the
SPMD helpers split a run into ranks' shares and report a failed rank; bad settings name their
field."""

from __future__ import annotations

import dataclasses

import pytest

from rlkit.systems import (
    AsyncGRPODataflow,
    GRPODataflow,
    LocalHost,
    PPODataflow,
    dataflow_for,
    roles_needed,
)
from rlkit.systems.spmd import failure_report, rank_config, rank_seed
from tests.systems.conftest import (
    assert_same_history,
    assert_same_weights,
    lora,
    single_process,
    without_timings,
)


def local_flow(config, staleness=None):
    roles = roles_needed(config, asynchronous=staleness is not None)
    hosts = dict.fromkeys(roles, LocalHost(config, roles))
    if staleness is None:
        return GRPODataflow(config, hosts)
    return AsyncGRPODataflow(config, hosts, staleness)


@pytest.mark.parametrize("with_lora", [False, True], ids=["full", "lora"])
def test_the_driver_over_local_roles_is_the_single_process_trainer(config, with_lora):
    config = lora(config) if with_lora else config
    expected_history, expected_weights = single_process(config, config.num_iterations)
    flow = local_flow(config)
    assert_same_history(flow.run(), expected_history)
    weights = flow.hosts["actor"].call("actor", "state_dict")[0]["model"]
    assert_same_weights(weights, expected_weights)
    assert set(flow.history[0]) >= {f"seconds_{phase}" for phase in ("generate", "dispatch")}


@pytest.mark.parametrize(
    "change",
    [{}, {"lora_rank": 4, "lora_alpha": 8.0, "critic_from": "policy", "target_kl": None}],
    ids=["full-adaptive-kl", "lora-critic-from-policy"],
)
def test_the_ppo_driver_over_local_roles_is_the_single_process_trainer(ppo_config, change):
    config = dataclasses.replace(ppo_config, **change)
    expected, expected_actor, expected_critic = single_process(
        config, config.num_iterations, with_critic=True
    )
    roles = roles_needed(config)
    assert roles == ["actor", "reward", "critic"] + ([] if change else ["reference"])
    flow = dataflow_for(config, dict.fromkeys(roles, LocalHost(config, roles)))
    assert isinstance(flow, PPODataflow)
    history = flow.run()
    assert_same_history(history, expected)
    assert history[0]["first_ratio_error"] < 1e-6
    if config.target_kl is not None:  # the driver's controller moved the coefficient
        assert history[-1]["kl_coef"] != history[0]["kl_coef"]
    actor = flow.hosts["actor"].call("actor", "state_dict")[0]["model"]
    assert_same_weights(actor, expected_actor)
    assert_same_weights(
        flow.hosts["critic"].call("critic", "state_dict")[0]["critic"], expected_critic
    )
    assert {f"seconds_{phase}" for phase in ("values", "critic")} <= set(history[0])


def test_each_ppo_role_holds_only_its_own_model(ppo_config):
    host = LocalHost(ppo_config, roles_needed(ppo_config))
    actor, critic, reward = (host.roles[name].trainer for name in ("actor", "critic", "reward"))
    assert actor.critic is None and actor.reference is None and actor.reward_model is None
    assert critic.model is None and critic.reward_model is None and critic.critic is not None
    assert reward.model is None and reward.critic is None and reward.reward_model is not None


@pytest.mark.parametrize("staleness", [1, 2])
def test_asynchronous_rollouts_equal_a_sampler_that_lags_by_the_staleness(config, staleness):
    config = dataclasses.replace(config, num_iterations=4)
    expected, _ = single_process(dataclasses.replace(config, sampler_lag=staleness), 4)
    history = local_flow(config, staleness).run()
    assert [row.pop("staleness") for row in history] == [min(k, staleness) for k in range(4)]
    assert_same_history(history, expected)
    # the lag shows: the sampler's log-probs differ from the trainer's from the second update on
    assert history[0]["sampler_kl"] == pytest.approx(0, abs=1e-6)
    assert history[-1]["sampler_kl"] > 1e-6


def test_staleness_zero_is_the_synchronous_run(config):
    expected, _ = single_process(config, config.num_iterations)
    history = without_timings(local_flow(config, staleness=0).run())
    assert [row.pop("staleness") for row in history] == [0.0] * config.num_iterations
    # a generator apart from the trainer adds its mismatch to the row: none at staleness 0
    assert all(row.pop("sampler_kl") == pytest.approx(0, abs=1e-6) for row in history)
    for row in history:
        row.pop("sampler_ratio_over_cap")
    assert_same_history(history, expected)


def test_with_several_epochs_the_actor_gives_the_old_log_probs(config):
    config = dataclasses.replace(config, num_iterations=3, num_epochs=2)
    expected, _ = single_process(dataclasses.replace(config, sampler_lag=1), 3)
    history = local_flow(config, staleness=1).run()
    for row in history:
        row.pop("staleness")
    assert_same_history(history, expected)


def test_without_the_mismatch_measure_the_run_is_the_same_and_skips_the_sampler_pass(config):
    expected, _ = single_process(dataclasses.replace(config, sampler_lag=1), 3)
    roles = roles_needed(config, asynchronous=True)
    hosts = dict.fromkeys(roles, LocalHost(config, roles))
    history = AsyncGRPODataflow(config, hosts, 1, measure_mismatch=False).run()
    assert "sampler_kl" not in history[0]
    for row in (*history, *expected):
        for name in ("staleness", "sampler_kl", "sampler_ratio_over_cap"):
            row.pop(name, None)
    assert_same_history(history, expected)
    with pytest.raises(ValueError, match="measure_mismatch"):
        correcting = dataclasses.replace(config, sampler_correction="token_truncate")
        AsyncGRPODataflow(correcting, hosts, 1, measure_mismatch=False)


def test_a_run_cannot_go_past_its_iterations(config):
    flow = local_flow(dataclasses.replace(config, num_iterations=1), staleness=1)
    flow.run()
    with pytest.raises(ValueError, match="num_iterations"):
        flow.run_iteration()


@pytest.mark.parametrize(
    "change, staleness, field",
    [
        (dict(), -1, "staleness"),
        (dict(sampler_lag=1), 1, "sampler_lag"),
        (dict(sampler_dtype="bfloat16"), 1, "sampler_dtype"),
        (dict(dynamic_sampling_rounds=1), 1, "dynamic_sampling_rounds"),
        (dict(sft_folder=None), None, "sft_folder"),
    ],
)
def test_bad_settings_name_the_field(config, change, staleness, field):
    config = dataclasses.replace(config, **change)
    hosts = dict.fromkeys(["actor", "reward", "reference", "rollout"], None)
    with pytest.raises(ValueError, match=field):
        if staleness is None:
            GRPODataflow(config, hosts)
        else:
            AsyncGRPODataflow(config, hosts, staleness)


def test_a_driver_without_a_host_for_a_role_names_it(config):
    with pytest.raises(ValueError, match=r"hosts.*\['actor', 'reference', 'reward'\]"):
        GRPODataflow(config, {"actor": None, "reward": None})


def test_a_rank_s_share_and_stream():
    from rlkit.llm.grpo import GRPOConfig

    config = GRPOConfig(prompts_per_iteration=8, group_size=4, minibatch_size=32)
    share = rank_config(config, 4)
    assert (share.prompts_per_iteration, share.minibatch_size, share.batch_size) == (2, None, 8)
    assert rank_seed(7, 0) == 7  # one rank is the single process
    assert len({rank_seed(7, rank) for rank in range(4)}) == 4


def test_the_failure_report_leads_with_the_rank_that_failed_first():
    stderr = (
        "...\nRoot Cause (first observed failure):\n[0]:\n  time      : 2026-12-03\n"
        "  host      : localhost\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 42)\n"
    )
    report = failure_report(stderr, 2)
    assert report.startswith("torchrun on 2 ranks: rank 1 failed first (killed by signal 9)")
    assert failure_report("it broke", 2).startswith("torchrun on 2 ranks: a rank failed;")
