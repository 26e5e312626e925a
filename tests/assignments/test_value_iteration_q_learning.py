"""The value-iteration and Q-learning assignment end to end: nbgrader releases it, autogrades
submissions, and the marks tell a correct solution from stubs, subtly wrong solutions and calls into
rlkit.

Everything runs in a temporary copy of notebooks/assignments, never in the repository (see
grading.py). One module-scoped release and one autograde run serve most tests (a kernel per
submission, a few seconds each, most of it two short Q-learning runs on CliffWalking); the seed test
autogrades twice more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant

pytestmark = pytest.mark.assignments

ASSIGNMENT = grading.Assignment("value_iteration_q_learning")
BACKUP, VI, UPDATE, EPSILON_GREEDY, QL = (
    "bellman_optimality_backup",
    "value_iteration",
    "q_learning_update",
    "epsilon_greedy",
    "q_learning",
)
TEST_BACKUP, TEST_VI, TEST_UPDATE, TEST_QL = (
    "test_bellman_backup",
    "test_value_iteration",
    "test_q_learning_update",
    "test_q_learning",
)
POINTS = {TEST_BACKUP: 2.0, TEST_VI: 3.0, TEST_UPDATE: 2.0, TEST_QL: 3.0}
SEED_A, SEED_B = "1001", "2002"
DEFAULT_SEED = "16180339"  # the default in the hidden set-up; must not reach the students


# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------

# (a) The mean over actions instead of the max: policy evaluation of the uniform random policy.
MEAN_OVER_ACTIONS = """
def value_iteration(P, R, terminal, gamma, tol=1e-8):
    V = np.zeros(R.shape[0])
    while True:
        V_next = bellman_optimality_backup(V, P, R, terminal, gamma).mean(axis=1)  # BUG: max
        converged = np.max(np.abs(V_next - V)) < tol
        V = V_next
        if converged:
            break
    return V, np.argmax(bellman_optimality_backup(V, P, R, terminal, gamma), axis=1)
"""

# (b) Bootstrapping from terminal states: `terminated` ignored.
IGNORES_TERMINATED = """
def q_learning_update(Q, s, a, r, s_next, terminated, alpha, gamma):
    target = r + gamma * np.max(Q[s_next])  # BUG: no (1 - terminated)
    Q[s, a] += alpha * (target - Q[s, a])
    return Q
"""

# (c) SARSA's target: the value of the next action an epsilon-greedy policy would take, not the
# best.
SARSA_TARGET = """
_explore = np.random.default_rng(0)


def q_learning_update(Q, s, a, r, s_next, terminated, alpha, gamma, epsilon=0.1):
    # BUG: an epsilon-greedy next action, where Q-learning takes the max
    if _explore.random() < epsilon:
        a_next = int(_explore.integers(Q.shape[1]))
    else:
        a_next = int(np.argmax(Q[s_next]))
    target = r + gamma * (1.0 - float(terminated)) * Q[s_next, a_next]
    Q[s, a] += alpha * (target - Q[s, a])
    return Q
"""

# (d) Terminal values never zeroed: value iteration with its own backup, which forgets terminal
# states. FrozenLake's terminal states loop to themselves with reward 0, so there it changes
# nothing.
VI_KEEPS_TERMINAL_VALUES = """
def value_iteration(P, R, terminal, gamma, tol=1e-8):
    V = np.zeros(R.shape[0])
    while True:
        V_next = (R + gamma * (P @ V)).max(axis=1)  # BUG: terminal states keep what P and R give them
        converged = np.max(np.abs(V_next - V)) < tol
        V = V_next
        if converged:
            break
    return V, np.argmax(R + gamma * (P @ V), axis=1)
"""

# (d') The same mistake in the backup, which value iteration then inherits.
BACKUP_KEEPS_TERMINAL_VALUES = """
def bellman_optimality_backup(V, P, R, terminal, gamma):
    return R + gamma * (P @ V)  # BUG: V = 0 and Q = 0 on terminal states
"""

# (e) Truncation treated as termination: no bootstrap when a time limit cuts the episode.
TRUNCATION_AS_TERMINATION = """
def q_learning(env, episodes, alpha, gamma, epsilon, seed):
    rng = np.random.default_rng(seed)
    Q = np.zeros((env.observation_space.n, env.action_space.n))
    for episode in range(episodes):
        state, _ = env.reset(seed=seed if episode == 0 else None)
        while True:
            action = epsilon_greedy(Q[state], epsilon, rng)
            next_state, reward, terminated, truncated, _ = env.step(action)
            ended = terminated or truncated
            q_learning_update(Q, state, action, reward, next_state, ended, alpha, gamma)  # BUG: terminated
            if ended:
                break
            state = next_state
    return Q
"""

WRONG = {
    "a_mean_over_actions": Variant(
        {VI: MEAN_OVER_ACTIONS},
        frozenset({TEST_VI}),
        "V <- mean_a Q: evaluates the uniform random policy",
    ),
    "b_bootstraps_from_terminal": Variant(
        {UPDATE: IGNORES_TERMINATED},
        frozenset({TEST_UPDATE}),
        "ignores terminated; harmless on CliffWalking, whose goal row stays 0",
    ),
    "c_sarsa_target": Variant(
        {UPDATE: SARSA_TARGET},
        frozenset({TEST_UPDATE, TEST_QL}),
        "bootstraps from an epsilon-greedy next action: on the cliff it learns SARSA's "
        "safe, longer path",
    ),
    "d_vi_keeps_terminal_values": Variant(
        {VI: VI_KEEPS_TERMINAL_VALUES},
        frozenset({TEST_VI}),
        "terminal states valued by their rows of P and R",
    ),
    "d_backup_keeps_terminal_values": Variant(
        {BACKUP: BACKUP_KEEPS_TERMINAL_VALUES},
        frozenset({TEST_BACKUP, TEST_VI}),
        "the backup forgets terminal states; value iteration uses it",
    ),
    "e_truncation_as_termination": Variant(
        {QL: TRUNCATION_AS_TERMINATION}, frozenset({TEST_QL}), "no bootstrap at a time limit"
    ),
}
# Mistakes that pass every visible check: only the hidden cases catch them.
HIDDEN_ONLY = ("d_vi_keeps_terminal_values", "e_truncation_as_termination")

# ---- A cheat: rlkit's own functions, reached three ways. -----------------------------------------

CHEATS = {
    "cheat_calls_rlkit": Variant(
        {
            # imported before the guard runs (the first test cell): the guard makes these functions
            # raise
            BACKUP: """
from rlkit.tabular import TabularMDP, q_from_v


def bellman_optimality_backup(V, P, R, terminal, gamma):
    return q_from_v(TabularMDP(P, R, terminal), V, gamma)
""",
            # imported after the guard: the import fails, so value_iteration is never defined
            VI: """
from rlkit.tabular import value_iteration as rlkit_value_iteration


def value_iteration(P, R, terminal, gamma, tol=1e-8):
    V, policy = rlkit_value_iteration(TabularMDP(P, R, terminal), gamma, tol=tol)
    return V, policy.argmax(axis=1)
""",
            # imported when called
            QL: """
def q_learning(env, episodes, alpha, gamma, epsilon, seed):
    from rlkit.tabular import q_learning as rlkit_q_learning

    return rlkit_q_learning(env, episodes, alpha, gamma, epsilon, seed)[0]
""",
        },
        frozenset({TEST_BACKUP, TEST_VI, TEST_QL}),
        "backup, value iteration and Q-learning from rlkit",
    ),
}


# ---- Seed check: a recorder (correct, saves every call) and a memoriser that replays the record.

_KEY = '''
def _key(value):
    """What identifies an input: a copy of an array, the id of an environment, or the value itself."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if hasattr(value, "step") and hasattr(value, "reset"):
        return "env:" + (getattr(value.spec, "id", None) or type(value.unwrapped).__name__)
    return value
'''

RECORDED = ("bellman_optimality_backup", "value_iteration", "q_learning_update", "q_learning")


def recorder(reference: dict[str, str], path: str) -> dict[str, str]:
    """The reference solution, appending every outermost call's inputs and outputs to ``path``
    (pickle)."""
    preamble = (
        f"""
import inspect
import pickle

import numpy as np

_record_path = {path!r}
_busy = [False]  # calls made inside a recorded call (value iteration's backups) are not recorded
"""
        + _KEY
        + """

def _recorded(function):
    signature = inspect.signature(function)

    def wrapper(*args, **kwargs):
        if _busy[0]:
            return function(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        inputs = [_key(x) for x in bound.arguments.values()]
        _busy[0] = True
        try:
            out = function(*args, **kwargs)
        finally:
            _busy[0] = False
        outputs = [np.array(x, copy=True) for x in (out if isinstance(out, tuple) else (out,))]
        with open(_record_path, "ab") as f:
            pickle.dump((function.__name__, inputs, outputs), f)
        return out

    return wrapper
"""
    )
    cells = {
        **reference,
        **{cell: reference[cell] + f"\n\n{cell} = _recorded({cell})\n" for cell in RECORDED},
    }
    cells[BACKUP] = preamble + cells[BACKUP]
    return cells


def memorizer(path: str, reference: dict[str, str]) -> dict[str, str]:
    """Correct only on the calls in the record at ``path`` (zeros, or Q unchanged, for anything
    else); its epsilon_greedy is the reference."""
    backup = (
        f"""
import pickle

import numpy as np

_table = []
with open({path!r}, "rb") as _f:
    while True:
        try:
            _table.append(pickle.load(_f))
        except EOFError:
            break
"""
        + _KEY
        + """

def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and a.dtype == b.dtype and np.array_equal(a, b))
    return bool(a == b)


def _lookup(name, *inputs):
    for seen_name, seen_inputs, outputs in _table:
        if seen_name == name and all(_same(a, _key(b)) for a, b in zip(seen_inputs, inputs)):
            return [x.copy() for x in outputs]
    return None


def bellman_optimality_backup(V, P, R, terminal, gamma):
    hit = _lookup("bellman_optimality_backup", V, P, R, terminal, gamma)
    return hit[0] if hit is not None else np.zeros(R.shape)
"""
    )
    vi = """
def value_iteration(P, R, terminal, gamma, tol=1e-8):
    hit = _lookup("value_iteration", P, R, terminal, gamma, tol)
    return tuple(hit) if hit is not None else (np.zeros(R.shape[0]), np.zeros(R.shape[0], dtype=int))
"""
    update = """
def q_learning_update(Q, s, a, r, s_next, terminated, alpha, gamma):
    hit = _lookup("q_learning_update", Q, s, a, r, s_next, terminated, alpha, gamma)
    return hit[0] if hit is not None else Q
"""
    ql = """
def q_learning(env, episodes, alpha, gamma, epsilon, seed):
    hit = _lookup("q_learning", env, episodes, alpha, gamma, epsilon, seed)
    return hit[0] if hit is not None else np.zeros((env.observation_space.n, env.action_space.n))
"""
    return {
        BACKUP: backup,
        VI: vi,
        UPDATE: update,
        EPSILON_GREEDY: reference[EPSILON_GREEDY],
        QL: ql,
    }


# ---- The tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A copy of notebooks/assignments with the assignment released (the `make assignments`
    step)."""
    return ASSIGNMENT.release(tmp_path_factory.mktemp("course") / "assignments")


@pytest.fixture(scope="module")
def graded(course) -> dict[str, dict[str, float]]:
    """Every submission below, autograded in one nbgrader run with SEED_A."""
    return ASSIGNMENT.grade_submissions(
        course,
        {**WRONG, **CHEATS},
        lambda reference: recorder(reference, str(course / "record.pkl")),
        SEED_A,
    )


def test_source_notebook_is_stored_clean():
    ASSIGNMENT.check_source_is_clean({BACKUP, VI, UPDATE, EPSILON_GREEDY, QL}, POINTS)


def test_release_has_no_solutions_hidden_tests_or_seed(course):
    ASSIGNMENT.check_release_is_clean(course, DEFAULT_SEED)


def test_reference_and_recorder_get_full_marks_and_the_stubs_none(graded):
    ASSIGNMENT.check_graded_marks(graded, POINTS)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_solution_loses_exactly_the_cells_it_breaks(graded, name):
    ASSIGNMENT.check_variant_loses(graded, POINTS, name, WRONG[name])


@pytest.mark.parametrize("name", HIDDEN_ONLY)
def test_some_mistakes_are_caught_only_by_the_hidden_cases(course, graded, name):
    ASSIGNMENT.check_caught_only_by_hidden_cases(course, name, WRONG[name].fails)


def test_sarsa_target_learns_the_safe_path(course, graded):
    """The SARSA-style target values the exploring policy, which keeps away from the cliff's edge:
    its greedy path climbs from the start (36) to the row above the edge (24) and on (12), away from
    the cliff."""
    message = ASSIGNMENT.errors(course, "c_sarsa_target")[TEST_QL]
    expected = "AssertionError: the greedy path should reach the goal in 13 steps: [36, 24, 12,"
    assert message.startswith(expected), message


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_calling_rlkit_earns_nothing_on_the_cells_it_cheats_on(course, graded, name):
    variant = CHEATS[name]
    assert grading.failed(graded[name], POINTS) == variant.fails, f"{name} ({variant.why})"
    # They fail because the guard stopped rlkit (which the kernel can import), not for another
    # reason: the guard's RuntimeError (bound before it ran) or ImportError (imported after), or a
    # NameError because the solution cell that should have defined the function stopped at the
    # guard's ImportError.
    errors = ASSIGNMENT.errors(course, name)
    assert grading.blocked(errors.get(VI, "")), "the import after the guard must fail"
    for cell in variant.fails:
        message = errors.get(cell, "")
        assert grading.blocked(message) or message.startswith("NameError"), (
            f"{name}: {cell} failed with {message!r}"
        )
    assert grading.blocked(errors[TEST_BACKUP]) and grading.blocked(errors[TEST_QL])


def test_hidden_cases_change_with_the_grading_seed(course, graded):
    """A memoriser replays the outputs recorded under SEED_A: full marks under SEED_A, none under
    SEED_B."""
    assert (course / "record.pkl").exists()
    memorizer_cells = memorizer(str(course / "record.pkl"), ASSIGNMENT.reference_sources())
    ASSIGNMENT.check_memorizer_needs_the_seed(course, memorizer_cells, POINTS, SEED_A, SEED_B)


def test_feedback_does_not_show_hidden_tests(course, graded):
    secrets = ("def _hidden_optimal", "class _HiddenLoop")
    ASSIGNMENT.check_feedback_hides(course, "d_vi_keeps_terminal_values", DEFAULT_SEED, secrets)
