"""A second single controller (Chapter 13): Chapter 6's A2C with its rollout workers as Ray
actors, the way RLlib structures it (env runners that sample, one learner that steps).

The learner is A2C's own trainer; only its collector is replaced: ``RemoteCollector.collect``
sends the current weights to every ``RolloutWorker``, each plays its share of the vector env's
copies for ``num_steps`` steps, and the learner joins their rollouts along the copies and takes
A2C's gradient step on them, unchanged. It is synchronous A2C with the sampling spread over
processes, where A3C (Chapter 6) runs whole learners in parallel on shared memory.

Copy ``j`` of the envs is seeded ``seed + j`` whichever worker plays it, so one worker is exactly
the single-process trainer; the workers after the first sample their actions from random streams
of their own, derived from ``(seed, worker)``.
"""

from __future__ import annotations

import torch

from rlkit.a2c import A2CConfig, A2CTrainer, make_agent
from rlkit.checkpoint import global_rng_state, set_global_rng_state
from rlkit.rollouts import Rollout, RolloutCollector, make_vector_env
from rlkit.systems.ray_controller import WorkerFailed, require_cpus_for, start_ray
from rlkit.systems.spmd import rank_seed
from rlkit.training import is_count, require, seed_everything

__all__ = ["RayA2CTrainer", "RemoteCollector", "RolloutWorker", "join_rollouts"]


class RolloutWorker:
    """Plays ``num_envs / num_workers`` of the env copies with a copy of the agent (RLlib's env
    runner); a Ray actor in ``RemoteCollector``."""

    def __init__(self, config: A2CConfig, index: int, num_workers: int):
        share = config.num_envs // num_workers
        seed_everything(config.seed)  # as the single-process trainer does, before its agent
        self.envs = make_vector_env(config.env_id, share, config.batched_env)
        self.agent = make_agent(config, self.envs)
        self.collector = RolloutCollector(
            self.envs, self.agent, config.num_steps, config.gamma, config.seed + index * share
        )
        if index > 0:  # worker 0 is the single process; the others sample from streams of their own
            torch.manual_seed(rank_seed(config.seed, index))

    def sample(self, weights: dict[str, torch.Tensor]) -> Rollout:
        """``num_steps`` steps of this worker's copies with ``weights``."""
        self.agent.load_state_dict(weights)
        return self.collector.collect()

    def state_dict(self) -> dict:
        return {"collector": self.collector.state_dict(), "global_rng": global_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.collector.load_state_dict(state["collector"])
        set_global_rng_state(state["global_rng"])


def join_rollouts(rollouts: list[Rollout]) -> Rollout:
    """The workers' rollouts as one, their env copies side by side (``[num_envs, num_steps]``),
    the episodes that ended listed worker by worker."""
    fields = ("obs", "actions", "logprobs", "values", "rewards", "dones", "last_value")
    joined = {name: torch.cat([getattr(r, name) for r in rollouts]) for name in fields}
    returns = [value for r in rollouts for value in r.episode_returns]
    lengths = [value for r in rollouts for value in r.episode_lengths]
    return Rollout(**joined, episode_returns=returns, episode_lengths=lengths)


class RemoteCollector:
    """A ``RolloutCollector`` whose copies are played by ``num_workers`` Ray actors."""

    def __init__(self, config: A2CConfig, agent: torch.nn.Module, num_workers: int, timeout: float):
        import ray

        require_cpus_for(num_workers)
        remote_worker = ray.remote(RolloutWorker).options(num_cpus=1)
        self.agent, self.timeout = agent, timeout
        self.workers = [remote_worker.remote(config, i, num_workers) for i in range(num_workers)]
        self.env_steps = 0
        self.stopped_because: str | None = None

    def _get(self, references):
        import ray

        if self.stopped_because is not None:
            raise WorkerFailed(f"the rollout workers were stopped: {self.stopped_because}")
        try:
            return ray.get(references, timeout=self.timeout)
        except ray.exceptions.RayActorError as error:
            # the others cannot go on without its env copies: stop them now, not at the run's close
            self.close(f"a rollout worker died ({type(error).__name__})")
            raise WorkerFailed(
                f"a rollout worker died: {type(error).__name__} (the others were stopped)"
            ) from error
        except ray.exceptions.GetTimeoutError as error:
            # or the late ones go on sampling for nobody
            self.close(f"one did not answer within {self.timeout} s")
            raise WorkerFailed(
                f"a rollout worker did not answer within {self.timeout} s (the workers were "
                "stopped)"
            ) from error

    def collect(self) -> Rollout:
        import ray

        # one copy of the weights in Ray's object store, read by every worker
        weights = ray.put({name: value.cpu() for name, value in self.agent.state_dict().items()})
        rollout = join_rollouts(self._get([w.sample.remote(weights) for w in self.workers]))
        self.env_steps += rollout.num_transitions
        return rollout

    def state_dict(self) -> dict:
        states = self._get([worker.state_dict.remote() for worker in self.workers])
        return {"workers": states, "env_steps": self.env_steps}

    def load_state_dict(self, state: dict) -> None:
        require(
            len(state["workers"]) == len(self.workers),
            "num_workers",
            f"the saved run's number of workers ({len(state['workers'])})",
            len(self.workers),
        )
        self._get([w.load_state_dict.remote(s) for w, s in zip(self.workers, state["workers"])])
        self.env_steps = state["env_steps"]

    def close(self, reason: str = "the run was closed") -> None:
        """Stop the workers; a later call says why (the first reason given)."""
        import ray

        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        if self.stopped_because is None:
            self.stopped_because = reason


class RayA2CTrainer(A2CTrainer):
    """A2C whose rollouts come from ``num_workers`` Ray actors (RLlib's layout); the learner is
    A2C's trainer (its update, schedule and history) in this process. Starts Ray when it is not
    running."""

    def __init__(self, config: A2CConfig, num_workers: int = 2, timeout: float = 600.0):
        require(
            is_count(num_workers) and config.num_envs % num_workers == 0,
            "num_workers",
            f"an integer >= 1 that divides num_envs ({config.num_envs})",
            num_workers,
        )
        super().__init__(config)
        self.envs.close()  # the learner plays no env itself
        start_ray(num_cpus=max(2, num_workers))
        self.collector = RemoteCollector(config, self.agent, num_workers, timeout)
        self.num_workers = num_workers

    def close(self) -> None:
        self.collector.close()
