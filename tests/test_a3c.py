"""A3C: what lives in shared memory, Hogwild updates reaching the shared model, a dead worker, bad
input."""

import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlkit.a2c import make_agent
from rlkit.a3c import A3CConfig, SharedAdam, shared_run, train
from rlkit.rollouts import make_vector_env


def small_config(**overrides):
    settings = dict(seed=0, total_steps=4_000, num_workers=2, num_steps=10)
    settings.update(overrides)
    env_id = settings.pop("env_id", "CartPole-v1")
    return A3CConfig.for_env(env_id, **settings)


def test_model_and_every_optimizer_statistic_live_in_shared_memory():
    config = small_config()
    agent = make_agent(config, make_vector_env(config.env_id, 1))
    run = shared_run(config, agent)
    assert run.flat.is_shared()
    # the module's views follow the buffer
    assert all(parameter.is_shared() for parameter in agent.parameters())
    state = run.optimizer.state[run.flat]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
    for name in ("step", "exp_avg", "exp_avg_sq"):
        assert state[name].is_shared(), name
    assert (
        run.worker_steps.is_shared() and run.episodes.is_shared() and run.episode_counts.is_shared()
    )


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.0, 0.0), (0.5, 0.1)])
def test_shared_adam_steps_exactly_as_torch_adam_and_keeps_its_shared_state(betas):
    """torch's Adam is the reference, bit for bit; the state made up front stays (same tensors,
    updated in place)."""
    parameter = torch.nn.Parameter(torch.ones(3))
    parameter.data.share_memory_()
    optimizer = SharedAdam([parameter], lr=0.1, betas=betas, eps=1e-8)
    state = optimizer.state[parameter]
    before = {name: tensor.data_ptr() for name, tensor in state.items()}
    reference = torch.nn.Parameter(torch.ones(3))
    reference_optimizer = torch.optim.Adam([reference], lr=0.1, betas=betas, eps=1e-8)
    gradients = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    for gradient in gradients:
        parameter.grad, reference.grad = gradient.clone(), gradient.clone()
        optimizer.step()
        reference_optimizer.step()
    assert {
        name: tensor.data_ptr() for name, tensor in optimizer.state[parameter].items()
    } == before
    assert state["step"].item() == 5 and all(tensor.is_shared() for tensor in state.values())
    assert torch.equal(parameter.detach(), reference.detach())
    for name in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(state[name], reference_optimizer.state[reference][name]), name


class StateWrites(TorchDispatchMode):
    """Records each operation that writes into one of the ``watched`` tensors, as (name,
    operation)."""

    def __init__(self, watched: dict):
        super().__init__()
        self.watched, self.log = watched, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        given = list(args) + [
            kwargs.get(argument.name) for argument in func._schema.arguments[len(args) :]
        ]
        for argument, value in zip(func._schema.arguments, given):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            # foreach/fused ops take lists
            for written in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(written, torch.Tensor):  # the same storage: views at any offset count
                    self.log += [
                        (name, func.__name__)
                        for name, tensor in self.watched.items()
                        if written.untyped_storage().data_ptr()
                        == tensor.untyped_storage().data_ptr()
                    ]
        return func(*args, **kwargs)


def moment_writes(optimizer, parameter) -> list:
    state = optimizer.state[parameter]
    with StateWrites({"exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}) as writes:
        optimizer.step()
    return writes.log


def test_shared_adam_writes_each_moment_once_where_torch_adam_writes_the_second_twice():
    """The deterministic version of the test below: the operations that touch the shared moments
    during a step."""
    parameter = torch.nn.Parameter(torch.ones(3))
    parameter.grad = torch.tensor([1.0, -1.0, 0.5])
    shared = SharedAdam([parameter], lr=0.1, betas=(0.0, 0.0), eps=1e-8)
    assert moment_writes(shared, parameter) == [
        ("exp_avg", "copy_.default"),
        ("exp_avg_sq", "copy_.default"),
    ]
    reference = torch.optim.Adam([parameter], lr=0.1, betas=(0.0, 0.0), eps=1e-8, foreach=False)
    reference.step()  # torch makes its state on the first step
    assert [name for name, _ in moment_writes(reference, parameter)] == [
        "exp_avg",
        "exp_avg_sq",
        "exp_avg_sq",
    ]


def test_workers_never_read_a_half_updated_second_moment():
    """Found by fuzzing: with beta2 = 0, torch's in-place step zeroes the shared second moment
    before adding the new gradient's square; a worker stepping in between divided by eps and the
    weights became NaN (two workers, one step per update: every run diverged). SharedAdam writes
    each moment once."""
    config = small_config(
        total_steps=300,
        num_steps=1,
        gamma=0.0,
        lam=0.0,
        adam_betas=(0.0, 0.0),
        optimizer_eps=1e-8,
        learning_rate=2**-7,
        vf_coef=1.0,
        ent_coef=0.0,
        max_grad_norm=float("inf"),
        hidden_sizes=[],
    )
    for _ in range(3):
        result = train(config)  # raises TrainingDiverged when the weights are not finite
        assert all(torch.isfinite(parameter).all() for parameter in result.agent.parameters())


def test_workers_train_the_shared_model_and_log_their_episodes():
    config = small_config()
    torch.manual_seed(config.seed)
    initial = make_agent(config, make_vector_env(config.env_id, 1)).state_dict()
    result = train(config)
    assert any(
        not torch.equal(initial[name], tensor) for name, tensor in result.agent.state_dict().items()
    )
    # a private copy
    assert not any(parameter.is_shared() for parameter in result.agent.parameters())
    steps = result.column("step")
    assert (
        len(steps) > 20
        and (steps[1:] >= steps[:-1]).all()
        and steps[-1] <= config.total_steps + 2 * config.num_steps
    )
    assert (result.column("episode_return") >= 8).all()  # CartPole episodes last at least 8 steps


def test_a_killed_worker_stops_the_run_with_an_error_naming_it():
    outcome = {}

    def run():
        try:
            train(small_config(total_steps=10_000_000))
        except RuntimeError as error:
            outcome["error"] = str(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = [
            child for child in multiprocessing.active_children() if child.name == "a3c-worker-1"
        ]
        if workers:
            break
        time.sleep(0.05)
    assert workers, "worker 1 never started"
    time.sleep(1.0)  # let it get going
    os.kill(workers[0].pid, signal.SIGKILL)
    thread.join(timeout=60)
    assert not thread.is_alive(), "train() hung after a worker died"
    assert "A3C worker 1 (a3c-worker-1" in outcome["error"] and "SIGKILL" in outcome["error"]
    assert not [
        child for child in multiprocessing.active_children() if child.name.startswith("a3c-worker")
    ]


def test_a_worker_that_raises_stops_the_run_with_its_traceback():
    config = small_config(
        env_id="tests.crashing_env:rlkit-test/CrashingCartPole-v0", total_steps=100_000, timeout=120
    )
    with pytest.raises(
        RuntimeError, match=r"A3C worker [01] \(a3c-worker-[01], pid \d+\) exited with code 1"
    ) as error:
        train(config)
    assert "FloatingPointError: simulated failure inside the environment at step 30" in str(
        error.value
    )
    assert not [
        child for child in multiprocessing.active_children() if child.name.startswith("a3c-worker")
    ]


def test_timeout_stops_the_run_with_a_clear_error():
    with pytest.raises(RuntimeError, match=r"A3C did not finish within timeout=0.5 s"):
        train(small_config(total_steps=10_000_000, timeout=0.5))
    assert not [
        child for child in multiprocessing.active_children() if child.name.startswith("a3c-worker")
    ]


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("num_workers", 0, "num_workers must be an integer >= 1"),
        ("num_workers", -1, "num_workers must be an integer >= 1"),
        ("num_steps", 0, "num_steps must be an integer >= 1"),
        ("total_steps", 0, "total_steps must be an integer >= 1"),
        ("learning_rate", -1e-3, r"learning_rate must be in \(0, 1\]"),
        ("device", "cuda", 'device must be "cpu"'),
        ("adam_betas", (0.9, 1.0), "adam_betas must be two numbers"),
        (
            "adam_betas",
            (0.5, 0.0),
            r"adam_betas must be \(beta1, beta2\) with beta1 = 0 or beta1\*\*2 < beta2",
        ),
        (
            "adam_betas",
            (0.9, 0.81),
            r"adam_betas must be \(beta1, beta2\) with beta1 = 0 or beta1\*\*2 < beta2",
        ),
        ("timeout", 0, "timeout must be > 0 or None"),
        ("timeout", "5", "timeout must be > 0 or None"),
        ("adam_betas", 0.9, "adam_betas must be two numbers"),
        ("hidden_sizes", 64, "hidden_sizes must be a list or tuple"),
    ],
)
def test_bad_configs_raise_naming_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        A3CConfig(**{field: value})


def test_a_continuous_env_is_refused_before_any_worker_starts():
    with pytest.raises(ValueError, match="env_id must be an environment with Discrete actions"):
        train(A3CConfig.for_env("Pendulum-v1", total_steps=100))
    assert not multiprocessing.active_children()
