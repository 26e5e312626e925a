"""Config validation, fuzzed with Hypothesis: every algorithm's config either refuses a value with a
``ValueError`` that names the field (``"<field> must be ..."``, as ``rlkit.training.require`` writes
it), or accepts it and then trains. Nothing else: no ``TypeError`` from a comparison, no crash deep
inside torch or Gymnasium.

Each example is a small valid config (boundary values included: gamma 0 and 1, -0.0, the smallest
float, math.inf where a field documents it) with up to three fields replaced by garbage: negative,
zero and huge integers, bools where numbers go, NaN and infinities, strings, None, lists and tuples
(with negative, float and bool entries), unknown env ids, env ids with the wrong spaces, device
strings. An accepted config trains on CartPole-v1 (and Pendulum-v1 for PPO) with a budget of a few
dozen steps, returns a history and finite weights. A replaced value may be accepted and still make
training diverge (an entropy weight of 1e30, A2C's learning rate of 16): ``TrainingDiverged`` is
then the right answer, and the only one allowed, when some replaced value is that large (10 or more;
the weights may then be NaN too). The examples are derandomized, so CI runs the same ones every
time; ``RLKIT_FUZZ_SCALE=10`` runs ten times as many, for a longer search.

The last tests replay what the fuzzing found, one example per finding.
"""

import dataclasses
import math
import os
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlkit import a2c, a3c, dqn, ppo, reinforce
from rlkit.actor_critic import SMALLEST_OPTIMIZER_EPS
from rlkit.training import TrainingDiverged, TrainResult

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SCALE = float(os.environ.get("RLKIT_FUZZ_SCALE", "1"))  # more examples for a longer search, e.g. 10


def examples(count: int) -> int:
    return max(1, round(count * SCALE))


# --------------------------------------------------------------------------------------------------
# Garbage

SMALL_INTS = st.integers(-3, 16)  # accepted ones stay cheap to train with
HUGE_INTS = st.sampled_from([2**31, 2**32, 2**63, 2**64, -(2**63)]) | st.integers(2**32, 2**80)
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)
# 5e-324 and 1e-40 are 0 in float32, 3e38 is near its largest number, 1e39 beyond it
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [
        0.0,
        -0.0,
        math.nan,
        math.inf,
        -math.inf,
        5e-324,
        1e-45,
        1e-40,
        0.5,
        1.0,
        1.5,
        16.0,
        -1.0,
        3e38,
        1e39,
        1e308,
        -1e308,
    ]
)
STRINGS = st.text(max_size=4) | st.sampled_from(
    [
        "",
        "1",
        "0.5",
        "nan",
        "True",
        "None",
        "cpu",
        "cuda",
        "cuda:7",
        "meta",
        "mps",
        "tanh",
        "relu",
        "sigmoid",
        "constant",
        "linear",
        "adam",
        "rmsprop",
        "sgd",
        "CartPole-v1",
        "Pendulum-v1",
    ]
)
ENTRIES = SMALL_INTS | FLOATS | st.booleans() | st.none() | st.text(max_size=2)
SEQUENCES = st.lists(ENTRIES, max_size=3) | st.lists(ENTRIES, max_size=3).map(tuple)
OTHERS = st.sampled_from([b"cpu", 1 + 1j, {}, {"a": 1}, {8: 8}, frozenset({8}), range(2)])
ENV_IDS = st.sampled_from(
    [
        "CartPole-v1",
        "Pendulum-v1",  # Pendulum-v1: continuous actions, which only PPO takes
        "FrozenLake-v1",
        "rlkit/GridWorld-v0",  # discrete observations
        "NoSuchEnv-v0",
        "cartpole-v1",
        "CartPole",
        "CartPole-v1 ",
        "no_such_module:Env-v0",
        "rlkit.nope:Env-v0",
    ]
)
DEVICES = st.sampled_from(
    ["cpu", "cpu:0", "cuda", "cuda:0", "cuda:7", "mps", "meta", "CPU", "gpu", "", -1, 0, 7, 2**64]
)

GARBAGE = st.one_of(
    st.none(), st.booleans(), SMALL_INTS, FLOATS, STRINGS, SEQUENCES, OTHERS, ENV_IDS, DEVICES
)
# what a field of an annotated type is most likely to be given by mistake, first match wins
BY_TYPE = [
    ("tuple", SEQUENCES | st.lists(st.integers(-2, 8), max_size=3) | st.tuples(FLOATS, FLOATS)),
    ("float", FLOATS | SMALL_INTS | st.booleans() | st.sampled_from(["0.001", "1", "inf"])),
    ("int", SMALL_INTS | FLOATS | st.booleans() | st.sampled_from(["8", "1e3"])),
    ("bool", st.sampled_from([0, 1, 1.0, "yes", "no", "False", None, [], [True]])),
    ("str", STRINGS | ENV_IDS | DEVICES),
]
EXTRA_GARBAGE = {"seed": HUGE_INTS, "env_id": ENV_IDS, "device": DEVICES}
# Never replaced: ``progress`` takes any truth value, and A3C's ``timeout`` is a run-time limit (a
# tiny one is accepted and stops the run with an error, as it should); both are covered by the
# construction-only tests.
NOT_REPLACED_IN_RUNS = {"progress", "timeout"}


def garbage_for(name: str, annotation: str, huge: bool):
    """Garbage for field ``name`` of type ``annotation``; ``huge`` adds integers too large to train
    with (construction-only tests)."""
    typed = next((strategy for kind, strategy in BY_TYPE if kind in annotation), st.nothing())
    strategy = typed | GARBAGE | EXTRA_GARBAGE.get(name, st.nothing())
    if huge:
        strategy |= HUGE_INTS
    # None means the preset's budget: tens of thousands of steps
    if name == "total_steps" and not huge:
        strategy = strategy.filter(lambda value: value is not None)
    return strategy


def replacements(annotations: dict[str, str], huge: bool, skip: set[str] = frozenset()):
    """Up to three fields, each with a garbage value (none in about a quarter of the examples)."""
    candidates = [name for name in annotations if name not in skip]
    names = st.integers(0, 3).flatmap(
        lambda count: st.lists(
            st.sampled_from(candidates), unique=True, min_size=count, max_size=count
        )
    )
    return names.flatmap(
        lambda chosen: st.fixed_dictionaries(
            {name: garbage_for(name, annotations[name], huge) for name in chosen}
        )
    )


# --------------------------------------------------------------------------------------------------
# Small valid configs, boundaries included

UNIT = st.floats(0.0, 1.0) | st.sampled_from([0.0, -0.0, 1.0])  # [0, 1]
POSITIVE = st.floats(0.0, 1.0, exclude_min=True) | st.just(5e-324)  # (0, 1]
LEARNING_RATES = st.floats(1e-6, 1e-2) | st.sampled_from([5e-324, 1e-3, 1.0])
SEEDS = st.integers(0, 2**32 - 1)
HIDDEN = st.lists(st.integers(1, 8), max_size=2) | st.lists(st.integers(1, 8), max_size=2).map(
    tuple
)
GRAD_NORMS = st.floats(1e-6, 100.0) | st.sampled_from([5e-324, math.inf])


@st.composite
def valid_dqn(draw):
    batch_size = draw(st.integers(1, 8))
    return dict(
        env_id="CartPole-v1",
        seed=draw(SEEDS),
        total_steps=draw(st.integers(1, 48)),
        learning_rate=draw(LEARNING_RATES),
        batch_size=batch_size,
        buffer_size=batch_size + draw(st.integers(0, 24)),
        learning_starts=draw(st.integers(0, 8)),
        gamma=draw(UNIT),
        target_update_interval=draw(st.integers(1, 20)),
        train_frequency=draw(st.integers(1, 8)),
        gradient_steps=draw(st.integers(1, 3)),
        exploration_fraction=draw(POSITIVE),
        start_epsilon=draw(UNIT),
        end_epsilon=draw(UNIT),
        hidden_sizes=draw(HIDDEN),
        max_grad_norm=draw(GRAD_NORMS),
        double_dqn=draw(st.booleans()),
        device="cpu",
        progress=False,
    )


@st.composite
def valid_reinforce(draw):
    return dict(
        env_id="CartPole-v1",
        seed=draw(SEEDS),
        total_steps=draw(st.integers(1, 64)),
        episodes_per_update=draw(st.integers(1, 3)),
        learning_rate=draw(LEARNING_RATES),
        value_learning_rate=draw(LEARNING_RATES),
        value_epochs=draw(st.integers(1, 3)),
        gamma=draw(UNIT),
        baseline=draw(st.booleans()),
        normalize_advantages=draw(st.booleans()),
        hidden_sizes=draw(HIDDEN),
        max_grad_norm=draw(st.none() | GRAD_NORMS),
        device="cpu",
        progress=False,
    )


def actor_critic_fields(draw) -> dict:
    """The fields A2C and A3C share (``validate_actor_critic``)."""
    return dict(
        env_id="CartPole-v1",
        seed=draw(SEEDS),
        learning_rate=draw(LEARNING_RATES),
        lr_schedule=draw(st.sampled_from(["constant", "linear"])),
        gamma=draw(UNIT),
        lam=draw(UNIT),
        ent_coef=draw(st.floats(0.0, 0.1) | st.just(-0.0)),
        vf_coef=draw(st.floats(0.0, 2.0)),
        max_grad_norm=draw(st.none() | GRAD_NORMS),
        optimizer_eps=draw(st.floats(1e-8, 1e-3) | st.just(SMALLEST_OPTIMIZER_EPS)),
        hidden_sizes=draw(HIDDEN),
        activation=draw(st.sampled_from(["tanh", "relu"])),
        device="cpu",
        progress=False,
    )


@st.composite
def valid_a2c(draw):
    num_envs, num_steps = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    return dict(
        actor_critic_fields(draw),
        total_steps=draw(st.integers(1, 40)),
        num_envs=num_envs,
        num_steps=num_steps,
        optimizer=draw(st.sampled_from(["rmsprop", "adam"])),
        rmsprop_alpha=draw(st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)),
        normalize_advantages=num_envs * num_steps >= 2 and draw(st.booleans()),
        batched_env=draw(st.booleans()),
    )


@st.composite
def adam_betas(draw):
    """(beta1, beta2) in [0, 1) with beta1 = 0 or beta1**2 < beta2, where Adam's step m / sqrt(v) is
    bounded."""
    beta2 = draw(st.floats(0.0, 0.999))
    if beta2 == 0:
        return 0.0, beta2
    beta1 = draw(
        st.just(0.0)
        | st.floats(0.0, math.sqrt(beta2), exclude_max=True).filter(lambda b: b**2 < beta2)
    )
    return beta1, beta2


@st.composite
def valid_a3c(draw):
    num_steps = draw(st.integers(1, 20))
    return dict(
        actor_critic_fields(draw),
        total_steps=draw(st.integers(300, 400)),
        num_workers=draw(st.integers(1, 2)),
        num_steps=num_steps,
        adam_betas=draw(adam_betas()),
        normalize_advantages=num_steps >= 2 and draw(st.booleans()),
        timeout=60.0,
    )


@st.composite
def valid_ppo(draw):
    env_id = draw(st.sampled_from(["CartPole-v1", "Pendulum-v1"]))
    num_envs, num_steps = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    batch = num_envs * num_steps
    minibatch_size = draw(
        st.sampled_from([size for size in range(1, batch + 1) if batch % size == 0])
    )
    fields = actor_critic_fields(draw)
    return dict(
        fields,
        env_id=env_id,
        total_steps=batch * draw(st.integers(1, 2)),
        num_envs=num_envs,
        num_steps=num_steps,
        minibatch_size=minibatch_size,
        num_epochs=draw(st.integers(1, 2)),
        # math.inf: never clip clip_schedule=draw(st.sampled_from(["constant", "linear"])),
        clip_eps=draw(st.floats(1e-3, 10.0) | st.just(math.inf)),
        value_clip_eps=draw(st.none() | st.floats(1e-3, 10.0) | st.just(math.inf)),
        normalize_advantages=minibatch_size >= 2 and draw(st.booleans()),
        max_grad_norm=draw(GRAD_NORMS),  # PPO clips always (None is A2C's "never")
        target_kl=draw(st.none() | st.floats(1e-4, 1.0)),
        initial_log_std=None if env_id == "CartPole-v1" else draw(st.none() | st.floats(-5.0, 2.0)),
        batched_env=env_id == "CartPole-v1" and draw(st.booleans()),
    )


# --------------------------------------------------------------------------------------------------
# The property

# A value of one field may be refused in the name of another that it must agree with.
RELATED = {
    "dqn": {"batch_size": {"buffer_size"}},
    "reinforce": {},
    "a2c": {
        "num_envs": {"normalize_advantages"},
        "num_steps": {"normalize_advantages"},
        "env_id": {"batched_env"},
    },
    "a3c": {"num_steps": {"normalize_advantages"}},
    "ppo": {
        "num_envs": {"total_steps", "minibatch_size", "normalize_advantages"},
        "num_steps": {"total_steps", "minibatch_size", "normalize_advantages"},
        "minibatch_size": {"normalize_advantages"},
        "env_id": {"batched_env", "initial_log_std"},
    },
}
ALGORITHMS = {  # module, config class, valid strategy
    "dqn": (dqn, dqn.DQNConfig, valid_dqn()),
    "reinforce": (reinforce, reinforce.ReinforceConfig, valid_reinforce()),
    "a2c": (a2c, a2c.A2CConfig, valid_a2c()),
    "a3c": (a3c, a3c.A3CConfig, valid_a3c()),
    "ppo": (ppo, ppo.PPOConfig, valid_ppo()),
}


def field_named(error: ValueError) -> str:
    match = re.match(r"(\w+) must ", str(error))
    assert match, f"a ValueError that does not name a field: {error!r}"
    return match.group(1)


def is_extreme(value) -> bool:
    """A number large enough to make training diverge although the config allows it."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) < 10


def takes_an_extreme_first_step(fields: dict) -> bool:
    """RMSprop's first step moves each weight by about ``lr / sqrt(1 - alpha)`` (its running
    average starts at ``(1 - alpha) g^2``): with ``rmsprop_alpha`` next to 1, valid values of both
    fields make a step of 10 or more, and training may diverge as with an extreme value."""
    if fields.get("optimizer") != "rmsprop":
        return False
    try:
        return is_extreme(fields["learning_rate"] / math.sqrt(1.0 - fields["rmsprop_alpha"]))
    except (TypeError, ValueError, ZeroDivisionError, KeyError):
        return False


def expected_dqn_bursts(config: dqn.DQNConfig) -> int:
    """Training bursts DQN does: steps s in [learning_starts, total_steps) with (s + 1) %
    train_frequency == 0."""
    first = (
        math.ceil((config.learning_starts + 1) / config.train_frequency) * config.train_frequency
    )
    return max(0, (config.total_steps - first) // config.train_frequency + 1)


def check(algorithm: str, fields: dict, replaced: dict, run: bool) -> None:
    """The property: refused naming a replaced (or related) field, or accepted and (with ``run``)
    trained."""
    module, config_class, _ = ALGORITHMS[algorithm]
    may_name = set(replaced) | {
        other for name in replaced for other in RELATED[algorithm].get(name, ())
    }
    try:
        config = config_class(**{**fields, **replaced})
    except ValueError as error:
        assert replaced, f"a valid config was refused: {error}"
        assert field_named(error) in may_name, f"{error} (replaced: {sorted(replaced)})"
        return
    if not run:
        return
    try:
        result = module.train(config)
    except ValueError as error:  # what needs the environment: its spaces, a batched version of it
        assert field_named(error) in may_name & {"env_id", "batched_env", "initial_log_std"}, str(
            error
        )
        return
    except TrainingDiverged:
        assert any(is_extreme(value) for value in replaced.values()) or (
            takes_an_extreme_first_step({**fields, **replaced})
        ), f"diverged with {replaced}"
        return
    assert isinstance(result, TrainResult) and isinstance(result.history, list)
    if not any(is_extreme(value) for value in replaced.values()) and not (
        takes_an_extreme_first_step({**fields, **replaced})
    ):
        assert all(torch.isfinite(parameter).all() for parameter in result.agent.parameters()), (
            "non-finite weights"
        )
    # a config may leave no step to train on (learning_starts >= total_steps): no rows
    if algorithm == "dqn":
        assert len(result.history) == expected_dqn_bursts(config)
    # A3C's rows are finished episodes; a few hundred steps end at least one
    elif algorithm == "a3c":
        assert result.history or config.total_steps < 300
    else:
        assert result.history, "no update"


def cases(algorithm: str, huge: bool, skip: set[str] = frozenset()):
    _, config_class, valid = ALGORITHMS[algorithm]
    annotations = {  # dataclasses.fields: not the ClassVar ``algorithm``
        field.name: str(field.type) for field in dataclasses.fields(config_class)
    }
    return st.tuples(valid, replacements(annotations, huge, skip))


@pytest.mark.parametrize(
    "algorithm, count", [("dqn", 300), ("reinforce", 300), ("a2c", 500), ("ppo", 500)]
)
def test_a_config_is_refused_naming_a_field_or_trains(algorithm, count):
    @settings(max_examples=examples(count), **SETTINGS)
    @given(case=cases(algorithm, huge=False, skip=NOT_REPLACED_IN_RUNS))
    def fuzz(case):
        check(algorithm, *case, run=True)

    fuzz()


def test_an_a3c_config_is_refused_naming_a_field_or_trains():
    """Fewer examples: each accepted one starts worker processes."""

    @settings(max_examples=examples(15), **SETTINGS)
    @given(case=cases("a3c", huge=False, skip=NOT_REPLACED_IN_RUNS))
    def fuzz(case):
        check("a3c", *case, run=True)

    fuzz()


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_a_config_is_refused_naming_a_field_or_accepted(algorithm):
    """Construction only, so huge budgets are fair game too, and many more examples."""

    @settings(max_examples=examples(800), **SETTINGS)
    @given(case=cases(algorithm, huge=True))
    def fuzz(case):
        check(algorithm, *case, run=False)

    fuzz()


def test_a_valid_rmsprop_config_with_alpha_next_to_1_may_diverge():
    """Found by the fuzzing: every field valid, but a learning rate of 1 with rmsprop_alpha one
    ulp below 1 makes a first step of about 6.7e7 (lr / sqrt(1 - alpha)); on some machines
    training then stops with a non-finite gradient norm, a right answer for such a step."""
    fields = dict(
        env_id="CartPole-v1", seed=0, learning_rate=1.0, lr_schedule="constant", gamma=0.0,
        lam=0.0, ent_coef=-0.0, vf_coef=1.0, max_grad_norm=None, optimizer_eps=1e-08,
        hidden_sizes=[2], activation="relu", device="cpu", progress=False, total_steps=2,
        num_envs=1, num_steps=1, optimizer="rmsprop", rmsprop_alpha=0.9999999999999998,
        normalize_advantages=False, batched_env=False,
    )  # fmt: skip
    assert takes_an_extreme_first_step(fields)
    assert not takes_an_extreme_first_step({**fields, "rmsprop_alpha": 0.99})
    check("a2c", fields, {}, run=True)


# --------------------------------------------------------------------------------------------------
# What the fuzzing found, one example per finding: each raised something other than a ValueError
# naming the field before (a TypeError, an error from NumPy, torch or Gymnasium, or training with a
# value that makes no sense)

FOUND = [
    # an env_id that is not a string: TypeError from the preset lookup (unhashable) or from gym.make
    (dqn.DQNConfig, dict(env_id=["CartPole-v1"]), "env_id"),
    (dqn.DQNConfig, dict(env_id=None), "env_id"),
    (reinforce.ReinforceConfig, dict(env_id={}), "env_id"),
    (reinforce.ReinforceConfig, dict(env_id=3), "env_id"),
    (a3c.A3CConfig, dict(env_id=["CartPole-v1"]), "env_id"),
    # an unknown env_id: Gymnasium's NameNotFound / Error / ModuleNotFoundError in train, not a
    # ValueError
    (dqn.DQNConfig, dict(env_id="NoSuchEnv-v0"), "env_id"),
    (dqn.DQNConfig, dict(env_id=""), "env_id"),
    (reinforce.ReinforceConfig, dict(env_id="no_such_module:Env-v0"), "env_id"),
    # a seed NumPy or torch cannot take: ValueError "Seed must be between 0 and 2**32 - 1" (not
    # naming the field), TypeError, or RuntimeError from torch.manual_seed, all in train
    (dqn.DQNConfig, dict(seed=-1), "seed"),
    (dqn.DQNConfig, dict(seed=2**32), "seed"),
    (dqn.DQNConfig, dict(seed=1.5), "seed"),
    (dqn.DQNConfig, dict(seed=None), "seed"),
    (dqn.DQNConfig, dict(seed=True), "seed"),
    (reinforce.ReinforceConfig, dict(seed="0"), "seed"),
    (reinforce.ReinforceConfig, dict(seed=2**64), "seed"),
    # a number field given a string, a list or a complex number: TypeError from the comparison
    (dqn.DQNConfig, dict(learning_rate="0.001"), "learning_rate"),
    (dqn.DQNConfig, dict(gamma=[0.99]), "gamma"),
    (dqn.DQNConfig, dict(learning_starts="10"), "learning_starts"),
    (dqn.DQNConfig, dict(exploration_fraction=1 + 1j), "exploration_fraction"),
    (dqn.DQNConfig, dict(end_epsilon="0.05"), "end_epsilon"),
    (dqn.DQNConfig, dict(max_grad_norm="10"), "max_grad_norm"),
    (reinforce.ReinforceConfig, dict(learning_rate="0.001"), "learning_rate"),
    (reinforce.ReinforceConfig, dict(value_learning_rate=(1e-3,)), "value_learning_rate"),
    (reinforce.ReinforceConfig, dict(gamma="0.99"), "gamma"),
    (reinforce.ReinforceConfig, dict(max_grad_norm="1"), "max_grad_norm"),
    # a non-integer count accepted: learning_starts=inf or 0.5 trained (inf: never), batch_size=True
    # crashed in torch.randint
    (dqn.DQNConfig, dict(learning_starts=math.inf), "learning_starts"),
    (dqn.DQNConfig, dict(learning_starts=0.5), "learning_starts"),
    (dqn.DQNConfig, dict(batch_size=True), "batch_size"),
    (dqn.DQNConfig, dict(total_steps=True), "total_steps"),
    (reinforce.ReinforceConfig, dict(episodes_per_update=True), "episodes_per_update"),
    # an infinite learning rate accepted: TrainingDiverged in the first update
    (dqn.DQNConfig, dict(learning_rate=math.inf), "learning_rate"),
    (reinforce.ReinforceConfig, dict(learning_rate=math.inf), "learning_rate"),
    # a learning rate near float32's largest number: RuntimeError "value cannot be converted to type
    # float without overflow" inside Adam's step (in A3C's worker, which stopped the run)
    (dqn.DQNConfig, dict(learning_rate=3e38), "learning_rate"),
    (reinforce.ReinforceConfig, dict(value_learning_rate=1e39), "value_learning_rate"),
    (a3c.A3CConfig, dict(learning_rate=3e38), "learning_rate"),
    # an int too large for 64 bits where a float goes: OverflowError "int too big to convert" inside
    # torch (the shared is_number, so A2C and PPO too)
    (a2c.A2CConfig, dict(optimizer_eps=2**64), "optimizer_eps"),
    (a2c.A2CConfig, dict(max_grad_norm=2**64), "max_grad_norm"),
    (ppo.PPOConfig, dict(vf_coef=2**64), "vf_coef"),
    (ppo.PPOConfig, dict(value_clip_eps=2**64), "value_clip_eps"),
    (a3c.A3CConfig, dict(max_grad_norm=2**64), "max_grad_norm"),
    # hidden_sizes that are not a list or tuple of integers: TypeError ('int' object is not
    # iterable, '>=' between str and int) or, for floats, a TypeError from nn.Linear in train
    (dqn.DQNConfig, dict(hidden_sizes=64), "hidden_sizes"),
    (dqn.DQNConfig, dict(hidden_sizes="64"), "hidden_sizes"),
    (dqn.DQNConfig, dict(hidden_sizes=(8.0,)), "hidden_sizes"),
    (dqn.DQNConfig, dict(hidden_sizes=[True]), "hidden_sizes"),
    (reinforce.ReinforceConfig, dict(hidden_sizes=64), "hidden_sizes"),
    (reinforce.ReinforceConfig, dict(hidden_sizes=1.5), "hidden_sizes"),
    # flags given something other than True or False: "no" meant yes
    (dqn.DQNConfig, dict(double_dqn="no"), "double_dqn"),
    (reinforce.ReinforceConfig, dict(baseline="no"), "baseline"),
    (reinforce.ReinforceConfig, dict(normalize_advantages=1), "normalize_advantages"),
    (a3c.A3CConfig, dict(normalize_advantages="no"), "normalize_advantages"),
    # a device torch does not have or cannot parse: RuntimeError, TypeError or AssertionError in
    # train
    (dqn.DQNConfig, dict(device="gpu"), "device"),
    (dqn.DQNConfig, dict(device="meta"), "device"),
    (dqn.DQNConfig, dict(device=None), "device"),
    (dqn.DQNConfig, dict(device=1.5), "device"),
    (reinforce.ReinforceConfig, dict(device=""), "device"),
    (reinforce.ReinforceConfig, dict(device=True), "device"),
    # a device index too large for C's long long: ValueError "Overflow when unpacking long long"
    # (all configs that call require_device)
    (a2c.A2CConfig, dict(device=2**64), "device"),
    (ppo.PPOConfig, dict(device=-(2**64)), "device"),
    (dqn.DQNConfig, dict(device=2**64), "device"),
    # an activation that is a list or a dict: TypeError (unhashable) from the lookup in ACTIVATIONS
    (a3c.A3CConfig, dict(activation=["tanh"]), "activation"),
    (a3c.A3CConfig, dict(activation={}), "activation"),
    # Adam with beta1**2 >= beta2: m / sqrt(v) unbounded; a zero gradient (a dead ReLU) after a
    # nonzero one moved the weights by lr * m / eps (eps 1.2e-38, betas (0.5, 0), one worker: NaN
    # weights)
    (a3c.A3CConfig, dict(adam_betas=(0.5, 0.0)), "adam_betas"),
    # an optimizer eps that is 0 in float32: Adam divides 0 by 0, and A3C returned an agent of NaN
    # weights
    (a3c.A3CConfig, dict(optimizer_eps=5e-324), "optimizer_eps"),
    (a3c.A3CConfig, dict(optimizer_eps=1e-40), "optimizer_eps"),
    # an eps below sqrt(float32's smallest normal): a gradient under 2.7e-23, whose square is 0 in
    # float32, moved a weight by |g| / eps, up to 2e15 times the learning rate (found while
    # reviewing the finding above)
    (a3c.A3CConfig, dict(optimizer_eps=FLOAT32_TINY), "optimizer_eps"),
    (a2c.A2CConfig, dict(optimizer_eps=1e-20), "optimizer_eps"),
    (ppo.PPOConfig, dict(optimizer_eps=1e-30), "optimizer_eps"),
]


@pytest.mark.parametrize(
    "config_class, fields, field",
    FOUND,
    ids=[f"{c.__name__}-{next(iter(f))}={next(iter(f.values()))!r}" for c, f, _ in FOUND],
)
def test_found_by_fuzzing_is_refused_naming_the_field(config_class, fields, field):
    with pytest.raises(ValueError, match=rf"^{field} must "):
        config_class(**fields)


def test_a_cuda_device_this_machine_lacks_is_refused_naming_device():
    """DQN and REINFORCE took any device and failed in train; the others took an index past the last
    GPU."""
    missing = f"cuda:{torch.cuda.device_count()}"
    for config_class in (dqn.DQNConfig, reinforce.ReinforceConfig, a2c.A2CConfig, ppo.PPOConfig):
        with pytest.raises(ValueError, match="^device must "):
            config_class(device=missing)


@pytest.mark.parametrize(
    "config_class, fields",
    [
        (dqn.DQNConfig, dict(learning_starts=0, learning_rate=1)),
        (dqn.DQNConfig, dict(max_grad_norm=math.inf)),
        (a2c.A2CConfig, dict(max_grad_norm=2**63 - 1, vf_coef=-0.0)),
        (reinforce.ReinforceConfig, dict(max_grad_norm=None, hidden_sizes=[])),
        (a3c.A3CConfig, dict(activation="relu", normalize_advantages=True)),
        (a3c.A3CConfig, dict(optimizer_eps=SMALLEST_OPTIMIZER_EPS)),
        (a3c.A3CConfig, dict(adam_betas=(0.0, 0.0))),
    ],
)
def test_the_stricter_checks_still_accept_the_boundaries(config_class, fields):
    config_class(**fields)


def tiny_a2c(env_id="CartPole-v1", **fields):
    return a2c.train(
        a2c.A2CConfig.for_env(
            env_id,
            **{
                **dict(total_steps=4, num_envs=1, num_steps=2, hidden_sizes=[4], batched_env=False),
                **fields,
            },
        )
    )


def tiny_ppo(env_id="CartPole-v1", **fields):
    return ppo.train(
        ppo.PPOConfig.for_env(
            env_id,
            **{
                **dict(
                    total_steps=8,
                    num_envs=1,
                    num_steps=4,
                    minibatch_size=4,
                    num_epochs=1,
                    hidden_sizes=[4],
                    batched_env=False,
                ),
                **fields,
            },
        )
    )


# Found in a2c.py and ppo.py: before the fix, a TypeError or RuntimeError deep inside (or silent NaN
# weights).
FIXED_IN_A2C_AND_PPO = [
    pytest.param(
        lambda: a2c.A2CConfig.for_env(["CartPole-v1"]), id="A2C-env_id-list-TypeError-in-presets"
    ),
    pytest.param(
        lambda: a2c.A2CConfig.for_env("CartPole-v1", activation=["tanh"]),
        id="A2C-activation-list-TypeError",
    ),
    pytest.param(
        lambda: ppo.PPOConfig.for_env("CartPole-v1", activation={}),
        id="PPO-activation-dict-TypeError",
    ),
    pytest.param(lambda: tiny_a2c(learning_rate=1e39), id="A2C-learning_rate-1e39-RuntimeError"),
    pytest.param(lambda: tiny_ppo(learning_rate=3e38), id="PPO-learning_rate-3e38-RuntimeError"),
    pytest.param(lambda: tiny_ppo(clip_eps=1e39), id="PPO-clip_eps-1e39-RuntimeError"),
    pytest.param(lambda: tiny_ppo(value_clip_eps=1e39), id="PPO-value_clip_eps-1e39-RuntimeError"),
    pytest.param(
        lambda: tiny_ppo(env_id="Pendulum-v1", initial_log_std=1e308),
        id="PPO-initial_log_std-1e308-RuntimeError",
    ),
    # an eps that is 0 in float32: 0 / 0 in the optimizer where a gradient is 0 (the critic's, with
    # vf_coef 0)
    pytest.param(
        lambda: tiny_a2c(optimizer_eps=5e-324, vf_coef=0.0, hidden_sizes=[]),
        id="A2C-optimizer_eps-5e-324-diverges",
    ),
    pytest.param(
        lambda: tiny_ppo(optimizer_eps=5e-324, vf_coef=0.0, hidden_sizes=[]),
        id="PPO-optimizer_eps-5e-324-diverges",
    ),
]


@pytest.mark.parametrize("build", FIXED_IN_A2C_AND_PPO)
def test_found_in_a2c_and_ppo_is_refused_naming_a_field(build):
    with pytest.raises(ValueError, match=r"^\w+ must "):
        build()


def test_ppo_with_clip_eps_inf_never_clips_and_trains():
    config = ppo.PPOConfig.for_env(
        "CartPole-v1",
        total_steps=8,
        num_envs=2,
        num_steps=4,
        minibatch_size=4,
        num_epochs=1,
        hidden_sizes=(8,),
        batched_env=False,
        clip_eps=math.inf,
    )
    assert ppo.train(config).history
