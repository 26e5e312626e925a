"""The single controller on Ray: the roles run in other processes and the run equals the single
process iteration by iteration, split or colocated, with LoRA's reference in the actor, for GRPO
and for RLHF-PPO's four models; a worker
without state is restarted and the run goes on unchanged, a dead actor or a call that does not
answer stops the run with an error naming the role; Ray stays on loopback and leaves no process
behind. (Marked ``alone``: Ray's processes need the cores to themselves, outside xdist.)"""

from __future__ import annotations

import dataclasses
import os
import signal

import psutil
import pytest

from tests.systems.conftest import (
    assert_same_history,
    assert_same_weights,
    lora,
    single_process,
)

ray = pytest.importorskip("ray")

from rlkit.systems.ray_controller import (  # noqa: E402
    WorkerFailed,
    placement_groups,
    ray_dataflow,
    require_cpus_for,
    start_ray,
    stop_ray,
)

pytestmark = pytest.mark.alone


@pytest.fixture(scope="module")
def ray_session():
    """Ray for the module; yields the pids of this process's children from before Ray started
    (an earlier test's, such as multiprocessing's resource tracker, which is not Ray's to stop)."""
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    start_ray(num_cpus=4)
    yield before
    stop_ray()


@pytest.fixture
def close_workers():
    """Kills the test's Ray actors after it (Ray itself stays up for the module)."""
    flows = []
    yield flows.append
    for flow in flows:
        flow.close()


def worker_pids(flow) -> dict[str, int]:
    return {role: host.pid() for role, host in flow.hosts.items()}


@pytest.mark.parametrize(
    "placement, with_lora",
    [("split", False), ("colocated", True)],
    ids=["split", "colocated-lora"],
)
def test_the_single_controller_equals_the_single_process(
    config, placement, with_lora, ray_session, close_workers
):
    config = lora(config) if with_lora else config
    expected_history, expected_weights = single_process(config, config.num_iterations)
    flow = ray_dataflow(config, placement)
    close_workers(flow)
    pids = worker_pids(flow)
    assert os.getpid() not in pids.values()
    assert len(set(pids.values())) == (3 if placement == "split" else 1)
    assert set(pids) == ({"actor", "reward"} if with_lora else {"actor", "reference", "reward"})
    history = flow.run()
    assert_same_history(history, expected_history)
    assert any(row["zero_variance_groups_trained"] < 1 for row in history)  # a real step
    assert all(row["seconds_dispatch"] > 0 for row in history)
    weights = flow.hosts["actor"].call("actor", "state_dict")[0]["model"]
    assert_same_weights(weights, expected_weights)


def test_rlhf_ppo_on_four_workers_equals_the_single_process_and_a_dead_critic_stops_it(
    ppo_config, ray_session, close_workers
):
    expected, expected_actor, expected_critic = single_process(
        ppo_config, ppo_config.num_iterations, with_critic=True
    )
    flow = ray_dataflow(ppo_config, "split")
    close_workers(flow)
    pids = worker_pids(flow)
    assert set(pids) == {"actor", "critic", "reference", "reward"}
    assert len(set(pids.values())) == 4 and os.getpid() not in pids.values()
    history = flow.run()
    assert_same_history(history, expected)
    assert_same_weights(flow.hosts["actor"].call("actor", "state_dict")[0]["model"], expected_actor)
    critic = flow.hosts["critic"].call("critic", "state_dict")[0]["critic"]
    assert_same_weights(critic, expected_critic)
    os.kill(pids["critic"], signal.SIGKILL)  # the critic's weights and optimizer die with it
    with pytest.raises(WorkerFailed, match=r"\['critic'\] died during critic.* \(it holds state\)"):
        flow.run_iteration()


def test_asynchronous_rollouts_on_ray_equal_a_sampler_that_lags_by_the_staleness(
    config, ray_session, close_workers
):
    config = dataclasses.replace(config, num_iterations=4)
    expected, _ = single_process(dataclasses.replace(config, sampler_lag=1), 4)
    flow = ray_dataflow(config, "split", staleness=1)
    close_workers(flow)
    pids = worker_pids(flow)
    assert pids["rollout"] != pids["actor"]  # generation and training in two processes
    history = flow.run()
    assert [row.pop("staleness") for row in history] == [0, 1, 1, 1]
    assert_same_history(history, expected)


def test_a_killed_reward_worker_is_restarted_and_the_run_goes_on_unchanged(
    config, ray_session, close_workers
):
    expected_history, _ = single_process(config, config.num_iterations)
    flow = ray_dataflow(config, "split")
    close_workers(flow)
    flow.run_iteration()
    reward_pid = flow.hosts["reward"].pid()
    os.kill(reward_pid, signal.SIGKILL)
    flow.run(config.num_iterations - 1)
    assert flow.hosts["reward"].pid() != reward_pid
    assert_same_history(flow.history, expected_history)


def test_a_killed_actor_stops_the_run_with_an_error_naming_it(config, ray_session, close_workers):
    flow = ray_dataflow(config, "split")
    close_workers(flow)
    flow.run_iteration()
    os.kill(flow.hosts["actor"].pid(), signal.SIGKILL)
    with pytest.raises(WorkerFailed, match=r"the worker of \['actor'\] died during actor"):
        flow.run_iteration()
    with pytest.raises(WorkerFailed, match=r"the worker of \['actor'\] died during host.pid"):
        flow.hosts["actor"].pid()  # a later call says so too, the driver's own as well


def test_a_call_that_does_not_answer_in_time_stops_the_run(config, ray_session, close_workers):
    flow = ray_dataflow(config, "colocated", call_timeout=0.01)  # the actor is still loading
    close_workers(flow)
    with pytest.raises(WorkerFailed, match=r"did not answer actor.generate within 0.01 s"):
        flow.run_iteration()
    with pytest.raises(ray.exceptions.RayActorError):  # stopped, not left computing for nobody
        ray.get(flow.hosts["actor"].handle.pid.remote(), timeout=120)


@pytest.mark.parametrize(
    "placement, message",
    [
        ("everywhere", "one of"),
        ([["actor"], ["reward"]], "exactly once"),
        ([["actor", "reward"], ["reward", "reference"]], "exactly once"),
    ],
)
def test_a_bad_placement_names_the_field(placement, message):
    with pytest.raises(ValueError, match=f"placement.*{message}"):
        placement_groups(placement, ["actor", "reference", "reward"])


def test_more_workers_than_ray_has_cpus_is_an_error_not_a_wait(config, ray_session):
    with pytest.raises(ValueError, match=r"placement.*has CPUs \(4; start Ray with num_cpus >= 5"):
        require_cpus_for(5)


def role_hosts() -> set[int]:
    """The live processes of Ray actors that host roles (Ray names them ``ray::LocalHost``)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if "LocalHost" in child.name() and child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def test_bad_settings_are_refused_before_any_worker_starts(config, ray_session):
    before = role_hosts()
    with pytest.raises(ValueError, match="dynamic_sampling_rounds"):
        ray_dataflow(dataclasses.replace(config, dynamic_sampling_rounds=2))
    with pytest.raises(ValueError, match="staleness"):
        ray_dataflow(config, staleness=-1)
    with pytest.raises(ValueError, match="sampler_lag"):
        ray_dataflow(dataclasses.replace(config, sampler_lag=1), staleness=1)
    assert role_hosts() <= before


def test_ray_listens_on_loopback_only_and_leaves_no_process_behind(ray_session):
    children = [c for c in psutil.Process().children(recursive=True) if c.pid not in ray_session]
    assert {"raylet", "gcs_server"} <= {child.name() for child in children}
    addresses = set()
    for child in children:
        try:
            connections = child.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        addresses |= {c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN}
    assert addresses and addresses <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
    stop_ray()
    assert [child for child in children if still_running(child)] == []


def still_running(process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
