"""The DQN assignment (Chapter 4) end to end: nbgrader releases it, autogrades submissions, and the
marks tell a correct solution from stubs, subtly wrong solutions and calls into rlkit (the checks
are those of standard.py)."""

from __future__ import annotations

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant
from tests.assignments.standard import StandardAssignmentTests

pytestmark = pytest.mark.assignments

DQN, DOUBLE, BUFFER = "dqn_targets", "double_dqn_targets", "replay_buffer"
TEST_DQN, TEST_DOUBLE = "test_dqn_targets", "test_double_dqn_targets"
TEST_KEEPS, TEST_SAMPLES = "test_replay_keeps_the_last_capacity", "test_replay_samples_uniformly"
BUFFER_TESTS = frozenset({TEST_KEEPS, TEST_SAMPLES})

# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------

IGNORES_TERMINATED = """
def dqn_targets(rewards, next_q_target, terminated, gamma):
    with torch.no_grad():
        return rewards + gamma * next_q_target.max(dim=1).values  # BUG: no (1 - terminated)
"""

MEAN_NOT_MAX = """
def dqn_targets(rewards, next_q_target, terminated, gamma):
    with torch.no_grad():
        return rewards + gamma * (1.0 - terminated) * next_q_target.mean(dim=1)  # BUG: max
"""

TARGET_KEEPS_GRADIENT = """
def dqn_targets(rewards, next_q_target, terminated, gamma):
    # BUG: no torch.no_grad(): the regression would push the target network's outputs too
    return rewards + gamma * (1.0 - terminated) * next_q_target.max(dim=1).values
"""

DOUBLE_SELECTS_WITH_TARGET = """
def double_dqn_targets(rewards, next_q_online, next_q_target, terminated, gamma):
    with torch.no_grad():
        best_actions = next_q_target.argmax(dim=1, keepdim=True)  # BUG: next_q_online picks
        best_next_value = next_q_target.gather(1, best_actions).squeeze(1)
        return rewards + gamma * (1.0 - terminated) * best_next_value
"""

DOUBLE_VALUES_WITH_ONLINE = """
def double_dqn_targets(rewards, next_q_online, next_q_target, terminated, gamma):
    with torch.no_grad():
        best_actions = next_q_online.argmax(dim=1, keepdim=True)
        best_next_value = next_q_online.gather(1, best_actions).squeeze(1)  # BUG: next_q_target values
        return rewards + gamma * (1.0 - terminated) * best_next_value
"""

# The buffer keeps its first `capacity` transitions and drops every later one.
STOPS_WHEN_FULL = """
class ReplayBuffer:
    def __init__(self, capacity, obs_dim):
        self.obs = torch.zeros(capacity, obs_dim)
        self.next_obs = torch.zeros(capacity, obs_dim)
        self.actions = torch.zeros(capacity, dtype=torch.long)
        self.rewards = torch.zeros(capacity)
        self.terminated = torch.zeros(capacity)
        self.capacity, self.size = capacity, 0

    def add(self, obs, action, reward, next_obs, terminated):
        if self.size == self.capacity:  # BUG: overwrite the oldest
            return
        i = self.size
        self.obs[i] = torch.as_tensor(obs, dtype=torch.float32)
        self.next_obs[i] = torch.as_tensor(next_obs, dtype=torch.float32)
        self.actions[i], self.rewards[i], self.terminated[i] = int(action), float(reward), float(terminated)
        self.size += 1

    def __len__(self):
        return self.size

    def sample(self, batch_size, generator):
        index = torch.randint(self.size, (batch_size,), generator=generator)
        return self.obs[index], self.actions[index], self.rewards[index], self.next_obs[index], self.terminated[index]
"""

# Draws from every slot, written or not: until the buffer is full, some draws are rows of zeros.
SAMPLES_EMPTY_SLOTS = """
class ReplayBuffer:
    def __init__(self, capacity, obs_dim):
        self.obs = torch.zeros(capacity, obs_dim)
        self.next_obs = torch.zeros(capacity, obs_dim)
        self.actions = torch.zeros(capacity, dtype=torch.long)
        self.rewards = torch.zeros(capacity)
        self.terminated = torch.zeros(capacity)
        self.capacity, self.size, self.position = capacity, 0, 0

    def add(self, obs, action, reward, next_obs, terminated):
        i = self.position
        self.obs[i] = torch.as_tensor(obs, dtype=torch.float32)
        self.next_obs[i] = torch.as_tensor(next_obs, dtype=torch.float32)
        self.actions[i], self.rewards[i], self.terminated[i] = int(action), float(reward), float(terminated)
        self.position = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def __len__(self):
        return self.size

    def sample(self, batch_size, generator):
        index = torch.randint(self.capacity, (batch_size,), generator=generator)  # BUG: self.size
        return self.obs[index], self.actions[index], self.rewards[index], self.next_obs[index], self.terminated[index]
"""

# Samples with the global generator: right in distribution, but not reproducible from a seed.
IGNORES_THE_GENERATOR = """
class ReplayBuffer:
    def __init__(self, capacity, obs_dim):
        self.obs = torch.zeros(capacity, obs_dim)
        self.next_obs = torch.zeros(capacity, obs_dim)
        self.actions = torch.zeros(capacity, dtype=torch.long)
        self.rewards = torch.zeros(capacity)
        self.terminated = torch.zeros(capacity)
        self.capacity, self.size, self.position = capacity, 0, 0

    def add(self, obs, action, reward, next_obs, terminated):
        i = self.position
        self.obs[i] = torch.as_tensor(obs, dtype=torch.float32)
        self.next_obs[i] = torch.as_tensor(next_obs, dtype=torch.float32)
        self.actions[i], self.rewards[i], self.terminated[i] = int(action), float(reward), float(terminated)
        self.position = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def __len__(self):
        return self.size

    def sample(self, batch_size, generator):
        index = torch.randint(self.size, (batch_size,))  # BUG: generator=generator
        return self.obs[index], self.actions[index], self.rewards[index], self.next_obs[index], self.terminated[index]
"""

# ---- Cheats: rlkit's own code. The grader must make them fail. -----------------------------------

WRAPS_RLKIT_TD_TARGETS = """
from rlkit.dqn import td_targets


def dqn_targets(rewards, next_q_target, terminated, gamma):
    q_values = lambda next_obs: next_q_target
    return td_targets(q_values, q_values, rewards, None, terminated, gamma, double=False)
"""

RLKIT_BUFFER = """
from rlkit.dqn import ReplayBuffer as _LibraryBuffer


class ReplayBuffer(_LibraryBuffer):
    def __len__(self):
        return self.size
"""

IMPORTS_RLKIT_AT_CALL_TIME = """
def double_dqn_targets(rewards, next_q_online, next_q_target, terminated, gamma):
    from rlkit.dqn import td_targets

    online, target = (lambda s: next_q_online), (lambda s: next_q_target)
    return td_targets(target, online, rewards, None, terminated, gamma, double=True)
"""


class TestDQNTargets(StandardAssignmentTests):
    assignment = grading.Assignment("dqn_targets")
    points = {TEST_DQN: 3.0, TEST_DOUBLE: 3.0, TEST_KEEPS: 2.0, TEST_SAMPLES: 2.0}
    solution_cells = frozenset({DQN, DOUBLE, BUFFER})
    default_seed = "1414213"
    feedback_student = "b_mean_not_max"
    hidden_secrets = ("def _hidden_double_dqn",)
    hidden_cases = "_hidden_cases"
    wrong = {
        "a_ignores_terminated": Variant(
            {DQN: IGNORES_TERMINATED},
            frozenset({TEST_DQN}),
            "bootstraps from terminal states: falling costs nothing",
        ),
        "b_mean_not_max": Variant(
            {DQN: MEAN_NOT_MAX},
            frozenset({TEST_DQN}),
            "expected value under a uniform policy: the target of a random policy, not the greedy",
        ),
        "c_target_keeps_gradient": Variant(
            {DQN: TARGET_KEEPS_GRADIENT},
            frozenset({TEST_DQN}),
            "the regression's gradient reaches the network the target came from",
        ),
        "d_double_selects_with_target": Variant(
            {DOUBLE: DOUBLE_SELECTS_WITH_TARGET},
            frozenset({TEST_DOUBLE}),
            "plain DQN's target under double DQN's name: the max bias stays",
        ),
        "e_double_values_with_online": Variant(
            {DOUBLE: DOUBLE_VALUES_WITH_ONLINE},
            frozenset({TEST_DOUBLE}),
            "max over the online network: no target network at all",
        ),
        "f_buffer_stops_when_full": Variant(
            {BUFFER: STOPS_WHEN_FULL},
            BUFFER_TESTS,
            "keeps the first transitions forever: the agent trains on its earliest, worst play",
        ),
        "g_buffer_samples_empty_slots": Variant(
            {BUFFER: SAMPLES_EMPTY_SLOTS},
            BUFFER_TESTS,
            "draws unwritten rows of zeros until the buffer is full",
        ),
        "h_buffer_ignores_the_generator": Variant(
            {BUFFER: IGNORES_THE_GENERATOR},
            frozenset({TEST_SAMPLES}),
            "the global random state draws: a seeded run cannot be repeated",
        ),
    }
    cheats = {
        "i_wraps_rlkit_td_targets": Variant(
            {DQN: WRAPS_RLKIT_TD_TARGETS},
            frozenset({TEST_DQN}),
            "dqn_targets through rlkit.dqn.td_targets, imported before the guard runs",
        ),
        "i_subclasses_rlkit_buffer": Variant(
            {BUFFER: RLKIT_BUFFER},
            BUFFER_TESTS,
            "rlkit's ReplayBuffer with a __len__: its methods stop working under the guard",
        ),
        "i_imports_rlkit_at_call_time": Variant(
            {DOUBLE: IMPORTS_RLKIT_AT_CALL_TIME},
            frozenset({TEST_DOUBLE}),
            "imports rlkit inside the function, after the guard has run",
        ),
    }
