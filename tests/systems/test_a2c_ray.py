"""A2C with its rollout workers as Ray actors: one worker is the single-process trainer, update
by update; two workers play the same env copies (copy j seeded seed + j) and the learner steps on
their joined rollout; a resumed run equals the whole; workers that do not answer in time, or
outlive one that died, are stopped. (Marked ``alone``.)"""

from __future__ import annotations

import pytest
import torch

from rlkit.a2c import A2CConfig, A2CTrainer
from rlkit.rollouts import Rollout

ray = pytest.importorskip("ray")

from rlkit.systems.a2c_ray import RayA2CTrainer, join_rollouts  # noqa: E402
from rlkit.systems.ray_controller import WorkerFailed, start_ray, stop_ray  # noqa: E402

pytestmark = pytest.mark.alone
CONFIG = A2CConfig(num_envs=4, num_steps=5, total_steps=400, seed=3)


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    start_ray(num_cpus=2)
    yield
    stop_ray()


def history_of(trainer, updates=None):
    try:
        for _ in range(updates or trainer.num_updates):
            trainer.run_update()
        return [{k: v for k, v in row.items() if k != "time"} for row in trainer.history]
    finally:
        trainer.close()


def test_one_rollout_worker_is_the_single_process_trainer():
    expected = history_of(A2CTrainer(CONFIG))
    history = history_of(RayA2CTrainer(CONFIG, num_workers=1))
    assert len(history) == len(expected) == CONFIG.num_updates
    for row, expected_row in zip(history, expected):
        assert row == pytest.approx(expected_row, rel=1e-6, abs=1e-9)
    assert any("episode_return" in row for row in history)


def test_two_workers_play_the_same_env_copies_and_the_learner_steps_on_all_of_them():
    single = A2CTrainer(CONFIG)
    first_single = single.collector.collect()
    single.close()
    trainer = RayA2CTrainer(CONFIG, num_workers=2)
    try:
        rollout = trainer.collector.collect()
        assert rollout.obs.shape == first_single.obs.shape  # [4 copies, 5 steps, 4]
        # the same copies start from the same states (the actions, then, are each worker's own)
        torch.testing.assert_close(rollout.obs[:, 0], first_single.obs[:, 0])
        history = history_of(trainer, 3)
        assert [row["step"] for row in history] == [40, 60, 80]  # after the first 20 above
    finally:
        trainer.close()


def test_a_resumed_run_with_two_workers_equals_the_whole():
    whole = history_of(RayA2CTrainer(CONFIG, num_workers=2), 6)
    first = RayA2CTrainer(CONFIG, num_workers=2)
    history_of_first = history_of_without_close(first, 3)
    state = first.state_dict()
    first.close()
    resumed = RayA2CTrainer(CONFIG, num_workers=2)
    resumed.load_state_dict(state)
    assert history_of_first == whole[:3]
    assert history_of(resumed, 3) == whole


def test_workers_that_do_not_answer_in_time_stop_the_run_and_are_stopped():
    trainer = RayA2CTrainer(CONFIG, num_workers=2, timeout=0.01)  # the workers are still starting
    try:
        with pytest.raises(WorkerFailed, match=r"did not answer within 0.01 s"):
            trainer.run_update()
        for worker in trainer.collector.workers:  # not left sampling for nobody
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(worker.state_dict.remote(), timeout=120)
        with pytest.raises(WorkerFailed, match=r"stopped: one did not answer within 0.01 s"):
            trainer.collector.state_dict()  # a later call says why, not that a worker died
    finally:
        trainer.close()


def test_a_dead_worker_stops_the_run_and_the_others():
    trainer = RayA2CTrainer(CONFIG, num_workers=2)
    try:
        trainer.run_update()
        dead, survivor = trainer.collector.workers
        ray.kill(dead, no_restart=True)
        with pytest.raises(WorkerFailed, match=r"a rollout worker died: .*the others were stopped"):
            trainer.run_update()
        with pytest.raises(ray.exceptions.RayActorError):  # not left holding a core until close
            ray.get(survivor.state_dict.remote(), timeout=120)
    finally:
        trainer.close()


def history_of_without_close(trainer, updates):
    for _ in range(updates):
        trainer.run_update()
    return [{k: v for k, v in row.items() if k != "time"} for row in trainer.history]


def test_join_keeps_the_copies_side_by_side():
    def rollout(value, copies):
        full = torch.full((copies, 2), float(value))
        return Rollout(full, full, full, full, full, full, full[:, 0], [value], [1])

    joined = join_rollouts([rollout(1, 1), rollout(2, 3)])
    assert joined.obs[:, 0].tolist() == [1, 2, 2, 2] and joined.episode_returns == [1, 2]


def test_workers_must_divide_the_copies():
    with pytest.raises(ValueError, match="num_workers must be an integer >= 1 that divides"):
        RayA2CTrainer(CONFIG, num_workers=3)
