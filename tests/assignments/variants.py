"""Submissions the returns-and-GAE autograder must tell apart, as source code of the solution cells.

The assignment has two solution cells, named by their nbgrader grade ids: ``discounted_returns`` and
``gae``. A variant gives the source of the cells it changes; a cell it does not give keeps the
instructor's reference solution, read from the source notebook (so the reference here is exactly the
one the hidden tests were written against). ``fails`` names the graded test cells the variant must
fail: it loses their points and keeps all the others.
"""

from __future__ import annotations

from tests.assignments.grading import Variant

RETURNS_CELL, GAE_CELL = "discounted_returns", "gae"
TEST_RETURNS = "test_discounted_returns"  # 3 points
TEST_GAE = "test_gae_no_dones"  # 4 points
TEST_GAE_DONES = "test_gae_dones_last_value"  # 3 points
ALL_TESTS = frozenset({TEST_RETURNS, TEST_GAE, TEST_GAE_DONES})


# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ---------------

# (a) The lambda term without gamma: A_t = delta_t + lam * A_{t+1}.
NO_GAMMA_IN_LAMBDA_TERM = """
def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    num_steps = rewards.shape[1]
    not_done = torch.ones_like(rewards) if dones is None else 1.0 - dones.to(rewards.dtype)
    next_value = torch.zeros_like(rewards[:, 0]) if last_value is None else last_value.to(rewards.dtype)
    next_advantage = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(num_steps)):
        delta = rewards[:, t] + gamma * not_done[:, t] * next_value - values[:, t]
        next_advantage = delta + lam * not_done[:, t] * next_advantage  # BUG: gamma * lam
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, advantages + values
"""

# (b) Bootstrapping across an episode end: dones ignored in both the V_{t+1} term and the recursion.
IGNORES_DONES = """
def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    num_steps = rewards.shape[1]
    next_value = torch.zeros_like(rewards[:, 0]) if last_value is None else last_value.to(rewards.dtype)
    next_advantage = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(num_steps)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # BUG: no (1 - d_t)
        next_advantage = delta + gamma * lam * next_advantage  # BUG: no (1 - d_t)
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, advantages + values
"""

# (b') The TD error stops at the episode end, but the recursion still carries A_{t+1} across it.
RECURSION_ACROSS_DONES = """
def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    num_steps = rewards.shape[1]
    not_done = torch.ones_like(rewards) if dones is None else 1.0 - dones.to(rewards.dtype)
    next_value = torch.zeros_like(rewards[:, 0]) if last_value is None else last_value.to(rewards.dtype)
    next_advantage = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(num_steps)):
        delta = rewards[:, t] + gamma * not_done[:, t] * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage  # BUG: no (1 - d_t)
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, advantages + values
"""

# (c) Off by one in the reversed loop: range(T - 1, 0, -1) never computes step 0.
SKIPS_FIRST_STEP = """
def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    num_steps = rewards.shape[1]
    not_done = torch.ones_like(rewards) if dones is None else 1.0 - dones.to(rewards.dtype)
    next_value = torch.zeros_like(rewards[:, 0]) if last_value is None else last_value.to(rewards.dtype)
    next_advantage = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in range(num_steps - 1, 0, -1):  # BUG: stops before t = 0
        delta = rewards[:, t] + gamma * not_done[:, t] * next_value - values[:, t]
        next_advantage = delta + gamma * lam * not_done[:, t] * next_advantage
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, advantages + values
"""

# (c') Off by one in the value index: values[:, t] where V_{t+1} = values[:, t + 1] belongs.
CURRENT_VALUE_AS_NEXT = """
def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    num_steps = rewards.shape[1]
    not_done = torch.ones_like(rewards) if dones is None else 1.0 - dones.to(rewards.dtype)
    next_advantage = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(num_steps)):
        delta = rewards[:, t] + gamma * not_done[:, t] * values[:, t] - values[:, t]  # BUG: V_t, not V_{t+1}
        next_advantage = delta + gamma * lam * not_done[:, t] * next_advantage
        advantages[:, t] = next_advantage
    return advantages, advantages + values
"""

# (c'') Off by one in the done index: d_{t+1} where d_t belongs. This is CleanRL's convention, where
# dones[t] flags that observation t starts a new episode; copied here, it ends episodes a step late.
DONE_ONE_STEP_LATE = """
def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    num_steps = rewards.shape[1]
    dones = torch.zeros_like(rewards) if dones is None else dones.to(rewards.dtype)
    not_done = 1.0 - torch.cat([dones[:, 1:], torch.zeros_like(dones[:, :1])], dim=1)  # BUG: d_{t+1}
    next_value = torch.zeros_like(rewards[:, 0]) if last_value is None else last_value.to(rewards.dtype)
    next_advantage = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(num_steps)):
        delta = rewards[:, t] + gamma * not_done[:, t] * next_value - values[:, t]
        next_advantage = delta + gamma * lam * not_done[:, t] * next_advantage
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, advantages + values
"""

# A wrong discounted_returns (dones ignored) with a correct gae: only the returns cell is lost.
RETURNS_IGNORE_DONES = """
def discounted_returns(rewards, gamma, dones=None):
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running  # BUG: no (1 - d_t)
        returns[:, t] = running
    return returns
"""

# ---- Cheats: rlkit's own functions. The grader must make them fail. ------------------------------

IMPORT_RLKIT_BOTH = """
from rlkit import discounted_returns, gae
"""

GAE_IMPORTED_ABOVE = """
# gae was imported from rlkit in the cell above
"""

IMPORT_RLKIT_RETURNS = """
from rlkit import discounted_returns
"""

IMPORT_RLKIT_GAE = """
from rlkit import gae
"""

WRAP_RLKIT_GAE = """
import rlkit.advantages as library


def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    return library.gae(rewards, values, gamma, lam, dones=dones, last_value=last_value)
"""

IMPORT_RLKIT_AT_CALL_TIME = """
def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    from rlkit.advantages import gae as library_gae

    return library_gae(rewards, values, gamma, lam, dones=dones, last_value=last_value)
"""

GAE_TESTS = frozenset({TEST_GAE, TEST_GAE_DONES})

WRONG = {
    "a_no_gamma_in_lambda_term": Variant(
        {GAE_CELL: NO_GAMMA_IN_LAMBDA_TERM},
        GAE_TESTS,
        "A_t = delta_t + lam * A_{t+1}: wrong whenever gamma < 1",
    ),
    "b_ignores_dones": Variant(
        {GAE_CELL: IGNORES_DONES},
        frozenset({TEST_GAE_DONES}),
        "bootstraps V_{t+1} and carries A_{t+1} across episode ends",
    ),
    "b_recursion_across_dones": Variant(
        {GAE_CELL: RECURSION_ACROSS_DONES},
        frozenset({TEST_GAE_DONES}),
        "carries A_{t+1} across episode ends",
    ),
    "c_skips_first_step": Variant(
        {GAE_CELL: SKIPS_FIRST_STEP}, GAE_TESTS, "range(T - 1, 0, -1) leaves A_0 = 0"
    ),
    "c_current_value_as_next": Variant(
        {GAE_CELL: CURRENT_VALUE_AS_NEXT}, GAE_TESTS, "values[:, t] where values[:, t + 1] belongs"
    ),
    "c_done_one_step_late": Variant(
        {GAE_CELL: DONE_ONE_STEP_LATE},
        frozenset({TEST_GAE_DONES}),
        "dones[:, t + 1] where dones[:, t] belongs",
    ),
    "returns_ignore_dones": Variant(
        {RETURNS_CELL: RETURNS_IGNORE_DONES},
        frozenset({TEST_RETURNS}),
        "discounted returns across episode ends; gae is correct",
    ),
}

CHEATS = {
    "d_imports_rlkit": Variant(
        {RETURNS_CELL: IMPORT_RLKIT_BOTH, GAE_CELL: GAE_IMPORTED_ABOVE},
        ALL_TESTS,
        "both functions imported from rlkit before any test runs",
    ),
    "d_imports_rlkit_in_each_cell": Variant(
        {RETURNS_CELL: IMPORT_RLKIT_RETURNS, GAE_CELL: IMPORT_RLKIT_GAE},
        ALL_TESTS,
        "each function imported from rlkit in its own cell",
    ),
    "d_wraps_rlkit_gae": Variant(
        {GAE_CELL: WRAP_RLKIT_GAE},
        GAE_TESTS,
        "own discounted_returns, gae delegating to rlkit.advantages.gae",
    ),
    "d_imports_rlkit_at_call_time": Variant(
        {GAE_CELL: IMPORT_RLKIT_AT_CALL_TIME},
        GAE_TESTS,
        "imports rlkit inside gae, after the guard has run",
    ),
}


# ---- Seed check: a recorder (correct, saves every call) and a memoriser that replays the record.


def recorder(reference: dict[str, str], path: str) -> dict[str, str]:
    """The reference solution, saving every call's inputs and outputs to ``path`` (torch.save)."""
    preamble = f"""
import torch

_recorded = []  # (function name, inputs, outputs) of every call so far


def _record(name, inputs, outputs):
    copy = lambda xs: [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]
    _recorded.append((name, copy(inputs), copy(outputs)))
    torch.save(_recorded, {path!r})
"""
    returns = (
        reference[RETURNS_CELL]
        + preamble
        + """
_correct_discounted_returns = discounted_returns


def discounted_returns(rewards, gamma, dones=None):
    inputs = [rewards, gamma, dones]
    out = _correct_discounted_returns(*inputs)
    _record("discounted_returns", inputs, [out])
    return out
"""
    )
    gae = (
        reference[GAE_CELL]
        + """
_correct_gae = gae


def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    inputs = [rewards, values, gamma, lam, dones, last_value]
    advantages, returns = _correct_gae(*inputs)
    _record("gae", inputs, [advantages, returns])
    return advantages, returns
"""
    )
    return {RETURNS_CELL: returns, GAE_CELL: gae}


def memorizer(path: str) -> dict[str, str]:
    """Correct only on the calls in the record at ``path``; zeros for anything else."""
    returns = f"""
import torch

_table = torch.load({path!r}, weights_only=True)


def _same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


def _lookup(name, inputs):
    for seen_name, seen_inputs, outputs in _table:
        if seen_name == name and all(_same(a, b) for a, b in zip(seen_inputs, inputs)):
            return [x.clone() for x in outputs]
    return None


def discounted_returns(rewards, gamma, dones=None):
    hit = _lookup("discounted_returns", [rewards, gamma, dones])
    return hit[0] if hit is not None else torch.zeros_like(rewards)
"""
    gae = """
def gae(rewards, values, gamma, lam, dones=None, last_value=None):
    hit = _lookup("gae", [rewards, values, gamma, lam, dones, last_value])
    return tuple(hit) if hit is not None else (torch.zeros_like(rewards), torch.zeros_like(rewards))
"""
    return {RETURNS_CELL: returns, GAE_CELL: gae}
