"""Asynchronous advantage actor-critic (A3C; Chapter 6), on ``torch.multiprocessing``.

Mnih et al. (2016): ``num_workers`` processes, each with one environment, one thread and a local
copy of the network, play ``num_steps`` steps, compute the same loss as A2C (eq-a2c-loss) on them,
and apply their gradient to one *shared* model through one *shared* Adam, without a lock
("Hogwild!", Recht et al., 2011): two workers may update the same weights at once, and a worker's
gradient may have been computed on weights that others have since changed. Then the worker copies
the shared weights and goes on.

What lives in shared memory (``tensor.is_shared()``): the model's parameters (one flat buffer),
Adam's step count and both moment estimates, each worker's environment-step count and its log of
finished episodes. Gradients stay private: each worker's shared-parameter view points at its own
gradient.

A3C is not reproducible bit for bit: the order in which the workers' updates land depends on the
operating system's scheduling, so two runs with the same seed differ (Chapter 6 shows the spread). A
worker that dies (an exception, or a signal) stops the run with a ``RuntimeError`` that names it
(and carries its traceback, when it raised one). Workers start from a fork server (or are spawned),
not forked from the caller, so an environment of your own must be registered in an importable module
(Gymnasium's ``"my_package.envs:MyEnv-v0"`` form of ``env_id`` imports it first).
"""

from __future__ import annotations

import copy
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import ClassVar

import torch
import torch.multiprocessing as mp
from tqdm.auto import tqdm

from rlkit.a2c import make_agent, rollout_loss
from rlkit.actor_critic import clip_grad_norm, validate_actor_critic
from rlkit.nets import ActorCritic, ValueView, adam_move, flatten_parameters
from rlkit.presets import AlgorithmConfig
from rlkit.rollouts import RolloutCollector, make_vector_env
from rlkit.training import (
    TrainResult,
    greedy_mean_return,
    is_count,
    is_number,
    require,
    require_finite_weights,
    require_sequence,
    scheduled,
    set_learning_rate,
)

MAX_LOGGED_EPISODES = 100_000  # per worker


@dataclass
class A3CConfig(AlgorithmConfig):
    """A3C's hyperparameters, each with its default (the first settings tried on CartPole-v1:
    untuned).

    ``A3CConfig.for_env(env_id, **overrides)`` applies the tested preset of ``env_id``
    (``rlkit/presets.py``)."""

    algorithm: ClassVar[str] = "a3c"

    env_id: str = "CartPole-v1"
    seed: int = 0
    total_steps: int = 500_000  # environment steps, all workers together
    num_workers: int = 2  # processes, each with one environment and one thread
    # steps a worker plays between two updates (the n of the n-step return)
    num_steps: int = 20
    learning_rate: float = 1e-3
    lr_schedule: str = "constant"  # "constant", or "linear" decay to 0 with the shared step count
    gamma: float = 0.99
    lam: float = 1.0  # GAE's lambda; 1.0 gives the n-step return
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    # clip each worker's gradient norm before it is applied (math.inf: never)
    max_grad_norm: float = 0.5
    adam_betas: tuple[float, float] = (0.9, 0.999)
    optimizer_eps: float = 1e-5
    normalize_advantages: bool = False
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    device: str = "cpu"  # shared memory between processes: CPU only
    progress: bool = False
    timeout: float | None = None  # seconds before the run is stopped with an error (None: never)

    def _validate(self) -> None:
        self.adam_betas = require_sequence(self.adam_betas, "adam_betas", "two numbers in [0, 1)")
        require(is_count(self.num_workers), "num_workers", "an integer >= 1", self.num_workers)
        require(
            self.device == "cpu",
            "device",
            '"cpu" (A3C shares its model through CPU shared memory)',
            self.device,
        )
        require(
            isinstance(self.normalize_advantages, bool),
            "normalize_advantages",
            "True or False",
            self.normalize_advantages,
        )
        validate_actor_critic(self)
        require(
            len(self.adam_betas) == 2 and all(is_number(b) and 0 <= b < 1 for b in self.adam_betas),
            "adam_betas",
            "two numbers in [0, 1)",
            self.adam_betas,
        )
        # Adam's step is bounded when beta1 = 0 or beta1**2 < beta2 (eq-adam-step-bound)
        beta1, beta2 = self.adam_betas
        require(
            beta1 == 0 or beta1**2 < beta2,
            "adam_betas",
            "(beta1, beta2) with beta1 = 0 or beta1**2 < beta2 (otherwise Adam's step m / sqrt(v) "
            "has no bound: a zero gradient after a nonzero one moves the weights by about lr * m "
            "/ eps)",
            self.adam_betas,
        )
        require(
            not self.normalize_advantages or self.num_steps >= 2,
            "normalize_advantages",
            "False when num_steps < 2 (whitening needs two advantages)",
            self.normalize_advantages,
        )
        require(
            self.timeout is None or (is_number(self.timeout) and self.timeout > 0),
            "timeout",
            "> 0 or None",
            self.timeout,
        )


class SharedAdam(torch.optim.Adam):
    """Adam whose state (step count, first and second moments) is created up front in shared memory,
    so that every worker process reads and updates the same statistics.

    Its step is torch's Adam step (the same numbers, tested; only lr, betas and eps: no weight
    decay, AMSGrad or maximize) with one change for lock-free workers: each moment is computed aside
    and written to shared memory in one copy, and the worker steps with the moments it computed.
    torch's in-place ``exp_avg_sq.mul_(beta2).addcmul_(grad, grad)`` leaves the second moment scaled
    by beta2 between its two operations; a worker reading it then (zero when beta2 = 0) divides by
    eps, and the weights blow up."""

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float):
        super().__init__(params, lr=lr, betas=betas, eps=eps, foreach=False)
        for group in self.param_groups:
            for parameter in group["params"]:
                state = self.state[parameter]
                state["step"] = torch.zeros((), dtype=torch.float32).share_memory_()
                state["exp_avg"] = torch.zeros_like(parameter.data).share_memory_()
                state["exp_avg_sq"] = torch.zeros_like(parameter.data).share_memory_()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                state, grad = self.state[parameter], parameter.grad
                state["step"] += 1
                exp_avg = torch.lerp(state["exp_avg"], grad, 1 - beta1)
                exp_avg_sq = torch.addcmul(state["exp_avg_sq"] * beta2, grad, grad, value=1 - beta2)
                # one write each: no half-updated moment for another worker to read
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
                adam_move(
                    parameter,
                    exp_avg,
                    exp_avg_sq,
                    float(state["step"]),
                    group["lr"],
                    group["betas"],
                    group["eps"],
                )
        return loss


@dataclass
class SharedRun:
    """Everything the workers share (all tensors in shared memory)."""

    flat: torch.nn.Parameter  # the shared model's parameters
    optimizer: SharedAdam
    worker_steps: torch.Tensor  # [num_workers], environment steps played by each worker
    # [num_workers, MAX_LOGGED_EPISODES, 3]: (total steps, return, time.time()) at its end
    episodes: torch.Tensor
    episode_counts: torch.Tensor  # [num_workers]


def shared_run(config: A3CConfig, agent: ActorCritic) -> SharedRun:
    """Flatten ``agent``'s parameters into one buffer, move it and the optimizer's state to shared
    memory."""
    flat = flatten_parameters(agent)
    flat.data.share_memory_()
    optimizer = SharedAdam([flat], config.learning_rate, config.adam_betas, config.optimizer_eps)
    workers = config.num_workers
    return SharedRun(
        flat,
        optimizer,
        torch.zeros(workers, dtype=torch.int64).share_memory_(),
        torch.zeros(workers, MAX_LOGGED_EPISODES, 3, dtype=torch.float64).share_memory_(),
        torch.zeros(workers, dtype=torch.int64).share_memory_(),
    )


def run_worker(rank: int, config: A3CConfig, run: SharedRun, errors) -> None:
    """A worker process: ``worker_loop``, with any exception's traceback sent to the main process
    first."""
    try:
        worker_loop(rank, config, run)
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        raise


def worker_loop(rank: int, config: A3CConfig, run: SharedRun) -> None:
    """One worker: play, compute the loss on a local copy, apply its gradient to the shared model,
    copy back."""
    torch.set_num_threads(1)
    seed = (
        config.seed * 1_000 + rank
    ) % 2**32  # a valid Gymnasium seed for every valid config.seed
    torch.manual_seed(seed)
    envs = make_vector_env(config.env_id, 1)
    local = make_agent(config, envs)
    local_flat = flatten_parameters(local)
    local_flat.data.copy_(run.flat.data)
    # this process's view of the shared model takes this worker's gradient
    run.flat.grad = local_flat.grad
    collector = RolloutCollector(envs, local, config.num_steps, config.gamma, seed)
    while int(run.worker_steps.sum()) < config.total_steps:
        progress = float(run.worker_steps.sum()) / config.total_steps
        set_learning_rate(
            run.optimizer, scheduled(config.learning_rate, config.lr_schedule, progress)
        )
        rollout = collector.collect()
        loss, _ = rollout_loss(local, rollout, config)
        local_flat.grad.zero_()
        loss.backward()
        clip_grad_norm(local.parameters(), config.max_grad_norm)
        run.optimizer.step()  # Hogwild: no lock around the shared update
        local_flat.data.copy_(run.flat.data)
        run.worker_steps[rank] += rollout.num_transitions
        _log_episodes(run, rank, rollout.episode_returns)
    envs.close()


def _log_episodes(run: SharedRun, rank: int, returns: list[float]) -> None:
    for episode_return in returns:
        count = int(run.episode_counts[rank])
        if count < MAX_LOGGED_EPISODES:
            run.episodes[rank, count] = torch.tensor(
                [float(run.worker_steps.sum()), episode_return, time.time()], dtype=torch.float64
            )
            run.episode_counts[rank] = count + 1


def train(config: A3CConfig) -> TrainResult:
    """Train A3C with ``config.num_workers`` processes; one history row per finished episode, in
    order of the total step count at which it ended (with the wall-clock ``time`` since the start,
    so throughput can be read without the processes' start-up). ``result.agent`` is a private copy
    of the shared model."""
    torch.manual_seed(config.seed)
    probe = make_vector_env(config.env_id, 1)
    agent = make_agent(config, probe)  # checks the action space before any process starts
    probe.close()
    run = shared_run(config, agent)
    started = time.time()
    context = worker_context()
    errors = context.SimpleQueue()
    workers = [
        context.Process(
            target=run_worker,
            args=(rank, config, run, errors),
            name=f"a3c-worker-{rank}",
            daemon=True,
        )
        for rank in range(config.num_workers)
    ]
    try:
        for worker in workers:
            worker.start()
        _supervise(workers, run, config, errors)
    finally:
        for worker in workers:
            if worker.pid is not None:  # started
                if worker.is_alive():
                    worker.kill()
                worker.join()
    private = copy.deepcopy(agent)
    require_finite_weights(private, f"after training (a3c, {config.env_id}, seed {config.seed})")
    return TrainResult(config, private, _history(run, started), critic=ValueView(private))


def worker_context():
    """Processes started from a fork server that has imported rlkit once (spawn where there is
    none).

    Never a plain fork of this process: its thread pools (torch's, a notebook's) do not survive one.
    A fresh ``spawn`` interpreter would import torch again for every worker of every run, seconds
    each.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    # torch.optim imports the latter lazily: once here
    context.set_forkserver_preload(["rlkit.a3c", "torch._dynamo"])
    return context


def _supervise(workers: list, run: SharedRun, config: A3CConfig, errors) -> None:
    """Wait for the workers to finish; raise as soon as one of them fails (or the timeout
    passes)."""
    started = time.monotonic()
    with tqdm(
        total=config.total_steps, disable=not config.progress, desc=f"A3C {config.env_id}"
    ) as bar:
        while any(worker.exitcode is None for worker in workers):
            wait([worker.sentinel for worker in workers if worker.exitcode is None], timeout=0.2)
            for rank, worker in enumerate(workers):
                if worker.exitcode not in (None, 0):
                    raise RuntimeError(
                        f"A3C worker {rank} ({worker.name}, pid {worker.pid}) "
                        f"{_describe(worker.exitcode)}; the other workers were "
                        f"stopped{_traceback_of(rank, errors)}"
                    )
            bar.n = min(int(run.worker_steps.sum()), config.total_steps)
            bar.refresh()
            if config.timeout is not None and time.monotonic() - started > config.timeout:
                raise RuntimeError(
                    f"A3C did not finish within timeout={config.timeout} s "
                    f"({int(run.worker_steps.sum())} of {config.total_steps} steps played)"
                )


def _describe(exitcode: int) -> str:
    if exitcode < 0:
        return f"was killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


def _traceback_of(rank: int, errors) -> str:
    """The failed worker's traceback, when it had the chance to send one (a killed worker has
    none)."""
    while not errors.empty():
        sender, text = errors.get()
        if sender == rank:
            return f". Its traceback:\n{text}"
    return ""


def _history(run: SharedRun, started: float) -> list[dict[str, float]]:
    """One row per logged episode, by total step count: step, return, and seconds since ``train``
    began."""
    rows = [
        row
        for rank in range(run.episodes.shape[0])
        for row in run.episodes[rank, : int(run.episode_counts[rank])].tolist()
    ]
    return [
        {"step": step, "episode_return": episode_return, "time": moment - started}
        for step, episode_return, moment in sorted(rows)
    ]


def evaluate(result: TrainResult, episodes: int = 100, seed: int = 10_000) -> float:
    """Mean undiscounted return of the greedy policy ``argmax_a pi(a|s)`` over ``episodes``
    episodes."""
    return greedy_mean_return(result, result.agent.greedy, episodes, seed)
