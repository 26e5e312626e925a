"""The single controller on Ray (Chapter 13): the roles of ``rlkit.systems.roles`` in Ray actors,
the dataflow in the driver (``GRPODataflow`` or ``PPODataflow``), placement as configuration.

``placement`` groups the roles into worker processes: ``"split"`` gives each role a process of its
own, ``"colocated"`` puts them all in one (verl colocates its actor, rollout and reference in one
worker group, so that the weights live once), or any list of groups such as ``[["actor",
"reference"], ["reward"]]``. Nothing leaves the machine: Ray starts without its dashboard, with its
usage statistics off, on the loopback address.

When a worker dies, the driver never waits for it: a worker whose roles keep no state of their own
(the reference and the reward are rebuilt from the config) is restarted once and the call retried;
a worker that holds the actor (the policy and its optimizer) stops the run with an error that
names the role. A call that does not answer within ``call_timeout`` seconds stops the run too,
and its worker with it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from rlkit.llm.grpo import GRPOConfig
from rlkit.llm.rlhf_ppo import RLHFPPOConfig
from rlkit.systems.dataflow import (
    AsyncGRPODataflow,
    Dataflow,
    dataflow_for,
    require_async_settings,
    require_dataflow_settings,
    roles_needed,
)
from rlkit.systems.processes import stop_processes
from rlkit.systems.roles import LocalHost
from rlkit.training import require

__all__ = [
    "PLACEMENTS",
    "RayHost",
    "WorkerFailed",
    "ray_dataflow",
    "start_ray",
    "stop_ray",
]

PLACEMENTS = ("split", "colocated")
STATELESS_ROLES = ("reference", "reward")  # rebuilt from the config: a restart loses nothing
# (the actor and RLHF-PPO's critic hold trained weights and their optimizers)


class WorkerFailed(RuntimeError):
    """A worker died or did not answer; the message names its roles."""


def start_ray(num_cpus: int | None = None) -> None:
    """Start a local Ray instance that stays on this machine (no dashboard, no usage statistics,
    loopback only), unless one is running already."""
    import ray

    if ray.is_initialized():
        return
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # no metrics agent either (it comes with the dashboard): without it, the workers would log
    # that they cannot reach it
    os.environ["RAY_enable_metrics_collection"] = "0"
    # and yet a process that starts slowly on a busy machine logs, at error level, that it gave
    # up reaching that agent: Ray's C++ side logs only what is fatal (a failure still reaches the
    # driver as a Python exception, which names the worker)
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    # Ray overrides CUDA_VISIBLE_DEVICES for actors without GPUs; keep its future behaviour (and
    # no warning about the change)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    ray.init(
        address="local",  # a Ray of its own, never another process's that happens to run
        num_cpus=num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )


def stop_ray(grace: float = 10.0) -> None:
    """Shut Ray and every process it started down: what is still running ``grace`` seconds after
    Ray's own shutdown (a worker that was starting, a helper slow to notice) is killed."""
    import psutil
    import ray

    started = [process for process in psutil.Process().children(recursive=True) if is_ray(process)]
    ray.shutdown()
    stop_processes(started, grace, terminate=False)  # ray.shutdown asked them to stop


def is_ray(process) -> bool:
    """Whether ``process`` is one of Ray's (its servers, its agents, its workers)."""
    import psutil

    try:
        return "ray" in process.name() or "/ray/" in " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def placement_groups(placement: str | Sequence[Sequence[str]], roles: list[str]) -> list[list[str]]:
    """The worker processes' role lists for ``placement`` (a name of ``PLACEMENTS`` or groups)."""
    if placement == "split":
        return [[role] for role in roles]
    if placement == "colocated":
        return [list(roles)]
    require(
        not isinstance(placement, str),
        "placement",
        f"one of {PLACEMENTS}, or a list of role groups",
        placement,
    )
    groups = [[role for role in group if role in roles] for group in placement]
    placed = [role for group in groups for role in group]
    require(
        sorted(placed) == sorted(roles),
        "placement",
        f"groups that place each of the roles {roles} exactly once",
        placement,
    )
    return [group for group in groups if group]


def require_cpus_for(num_workers: int) -> None:
    """Each worker takes one of Ray's (logical) CPUs: a worker that can never have one would wait
    for it until the call timeout, so a Ray with too few is an error now. (Workers of another
    run still alive hold theirs: this run's wait for them for at most the call timeout.)"""
    import ray

    total = int(ray.cluster_resources().get("CPU", 0))
    require(
        total >= num_workers,
        "placement",
        f"at most as many worker processes as Ray has CPUs ({total}; start Ray with "
        f"num_cpus >= {num_workers}, or colocate roles)",
        num_workers,
    )


@dataclass
class RaySubmitted:
    """A call submitted to a Ray worker: its role, method and Ray's reference to its result."""

    role: str
    method: str
    reference: object


class RayHost:
    """The driver's handle on one Ray actor that hosts ``roles`` (a ``LocalHost`` in another
    process)."""

    def __init__(
        self,
        config: GRPOConfig | RLHFPPOConfig,
        roles: list[str],
        call_timeout: float,
        num_gpus: float = 0.0,
    ):
        import ray

        stateless = all(role in STATELESS_ROLES for role in roles)
        retries = 1 if stateless else 0
        remote_host = ray.remote(LocalHost).options(
            num_cpus=1, num_gpus=num_gpus, max_restarts=retries, max_task_retries=retries
        )
        self.roles, self.call_timeout = roles, call_timeout
        self.handle = remote_host.remote(config, roles)

    def call(self, role: str, method: str, *args):
        return self.wait(self.submit(role, method, *args))

    def submit(self, role: str, method: str, *args):
        """Start ``role.method(*args)`` in the worker and return at once (Ray runs one worker's
        calls in the order they were submitted). An argument may be another call submitted to a
        Ray worker: Ray hands its result over when it is ready, with no trip through the driver."""
        results_at = tuple(i for i, arg in enumerate(args) if isinstance(arg, RaySubmitted))
        args = [arg.reference if isinstance(arg, RaySubmitted) else arg for arg in args]
        reference = self.handle.call_on_results.remote(role, method, results_at, *args)
        return RaySubmitted(role, method, reference)

    def wait(self, submitted):
        """The result of a submitted call (a role's: its result and the seconds it computed)."""
        import ray

        role, method, reference = submitted.role, submitted.method, submitted.reference
        try:
            return ray.get(reference, timeout=self.call_timeout)
        except ray.exceptions.GetTimeoutError as error:
            self.kill()  # or it goes on computing for nobody, and later calls queue behind it
            raise WorkerFailed(
                f"the worker of {self.roles} did not answer {role}.{method} within "
                f"{self.call_timeout} s (it was stopped)"
            ) from error
        except ray.exceptions.RayActorError as error:
            holds_state = not set(self.roles) <= set(STATELESS_ROLES)
            raise WorkerFailed(
                f"the worker of {self.roles} died during {role}.{method}"
                + (" (it holds state)" if holds_state else "")
                + f": {type(error).__name__}"
            ) from error

    def pid(self) -> int:
        """The worker's process id; a dead or silent worker is a ``WorkerFailed``, as in a call."""
        return self.wait(RaySubmitted("host", "pid", self.handle.pid.remote()))

    def kill(self) -> None:
        import ray

        ray.kill(self.handle, no_restart=True)


def ray_dataflow(
    config: GRPOConfig | RLHFPPOConfig,
    placement: str | Sequence[Sequence[str]] = "split",
    call_timeout: float = 600.0,
    staleness: int | None = None,
    measure_mismatch: bool = True,
    gpus_per_worker: float | None = None,
) -> Dataflow:
    """Chapter 11's GRPO (a ``GRPOConfig``) or Chapter 10's RLHF-PPO (an ``RLHFPPOConfig``) run by
    a single controller over Ray actors placed as ``placement`` (starts Ray when it is not running;
    ``stop_ray`` ends it). With ``staleness`` (an integer; GRPO only), a rollout worker generates up
    to that many batches ahead of the actor's training (``AsyncGRPODataflow``, with its
    ``measure_mismatch``); None: the actor samples itself, synchronously. ``gpus_per_worker`` (Ray's
    ``num_gpus`` of each worker process; None: none on the CPU, and on CUDA an equal share of one
    GPU, so that every worker sees it)."""
    require(
        staleness is None or isinstance(config, GRPOConfig),
        "staleness",
        "None for RLHF-PPO (asynchronous rollouts are GRPO's here)",
        staleness,
    )
    if staleness is None:
        require_dataflow_settings(config)
    else:
        require_async_settings(config, staleness, measure_mismatch)
    roles = roles_needed(config, asynchronous=staleness is not None)
    groups = placement_groups(placement, roles)
    start_ray(num_cpus=max(2, len(groups)))
    require_cpus_for(len(groups))
    if gpus_per_worker is None:
        gpus_per_worker = 1 / len(groups) if config.device.startswith("cuda") else 0.0
    hosts = {}
    try:
        for group in groups:
            host = RayHost(config, group, call_timeout, gpus_per_worker)
            hosts |= dict.fromkeys(group, host)
        if staleness is None:
            return dataflow_for(config, hosts)
        return AsyncGRPODataflow(config, hosts, staleness, measure_mismatch)
    except BaseException:
        for host in {id(host): host for host in hosts.values()}.values():
            host.kill()
        raise
