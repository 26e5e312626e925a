"""The REINFORCE-with-a-baseline assignment end to end: nbgrader releases it, autogrades
submissions, and the marks tell a correct solution from stubs, subtly wrong solutions and calls into
rlkit.

Everything runs in a temporary copy of notebooks/assignments, never in the repository (see
grading.py). One module-scoped release and one autograde run serve most tests (a kernel per
submission; most of its time goes to two short REINFORCE runs on CartPole, a few seconds each); the
seed test autogrades twice more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant

pytestmark = pytest.mark.assignments

ASSIGNMENT = grading.Assignment("reinforce_baseline")
RTG, LOSS, VLOSS, TRAIN = "reward_to_go", "reinforce_loss", "value_loss", "train_reinforce"
TEST_RTG, TEST_TRUNC, TEST_LOSS, TEST_VLOSS, TEST_TRAIN = (
    "test_reward_to_go",
    "test_reward_to_go_truncation",
    "test_reinforce_loss",
    "test_value_loss",
    "test_train_reinforce",
)
POINTS = {TEST_RTG: 2.0, TEST_TRUNC: 2.0, TEST_LOSS: 3.0, TEST_VLOSS: 1.0, TEST_TRAIN: 2.0}
ALL_TESTS = frozenset(POINTS)
SEED_A, SEED_B = "1001", "2002"
DEFAULT_SEED = "14142135"  # the default in the hidden set-up; must not reach the students


# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------

# (a) The baseline left in the graph: the loss and its gradient with respect to logprobs are right,
# but a gradient flows into the value network through the policy loss.
BASELINE_NOT_DETACHED = """
def reinforce_loss(logprobs, returns, values, mask):
    advantages = returns - values  # BUG: not detached
    return -(mask * advantages * logprobs).sum() / mask.shape[0]
"""

# (b) The mean over valid steps (the token mean of the LLM chapters) where REINFORCE divides by
# episodes.
DIVIDES_BY_STEPS = """
def reinforce_loss(logprobs, returns, values, mask):
    advantages = (returns - values).detach()
    return -(mask * advantages * logprobs).sum() / mask.sum()  # BUG: / mask.shape[0]
"""

# (c) gamma * V(s_final) added at every episode end, terminated ones included.
BOOTSTRAPS_AFTER_TERMINATION = """
def reward_to_go(rewards, mask, terminated, truncated, final_values, gamma):
    episode_ends = torch.maximum(terminated, truncated)
    bootstrap = episode_ends * final_values[:, None]  # BUG: truncated * (1 - terminated)
    returns = torch.zeros_like(rewards)
    following = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        future = bootstrap[:, t] + (1.0 - episode_ends[:, t]) * following
        following = mask[:, t] * (rewards[:, t] + gamma * future)
        returns[:, t] = following
    return returns
"""

# (c') Truncation treated as termination: no bootstrap when the time limit cuts an episode.
NO_BOOTSTRAP_AT_TRUNCATION = """
def reward_to_go(rewards, mask, terminated, truncated, final_values, gamma):
    episode_ends = torch.maximum(terminated, truncated)
    returns = torch.zeros_like(rewards)
    following = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        following = mask[:, t] * (rewards[:, t] + gamma * (1.0 - episode_ends[:, t]) * following)  # BUG: no bootstrap
        returns[:, t] = following
    return returns
"""

# (c'') Right for either flag alone, but it bootstraps a step that is both terminated and truncated
# (the pole fell on the last step the time limit allowed). The visible checks have no such step.
BOOTSTRAPS_WHEN_BOTH = """
def reward_to_go(rewards, mask, terminated, truncated, final_values, gamma):
    bootstrap = truncated * final_values[:, None]  # BUG: truncated * (1 - terminated)
    episode_ends = torch.maximum(terminated, truncated)
    returns = torch.zeros_like(rewards)
    following = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        future = bootstrap[:, t] + (1.0 - episode_ends[:, t]) * following
        following = mask[:, t] * (rewards[:, t] + gamma * future)
        returns[:, t] = following
    return returns
"""

# (d) The masked (autoreset and padding) steps counted in the baseline's mean: zeroed, but in the
# count.
VALUE_LOSS_COUNTS_MASKED_STEPS = """
def value_loss(values, returns, mask):
    return (mask * (values - returns) ** 2).mean()  # BUG: / mask.sum()
"""

# (e) The sign of the surrogate flipped: gradient descent on it makes dropping the pole more likely.
LOSS_SIGN_FLIPPED = """
def reinforce_loss(logprobs, returns, values, mask):
    advantages = (returns - values).detach()
    return (mask * advantages * logprobs).sum() / mask.shape[0]  # BUG: no minus sign
"""

# (f) In the training loop, the log-probabilities of freshly sampled actions instead of the actions
# taken: the functions are right, the gradient is noise.
LOGPROBS_OF_RESAMPLED_ACTIONS = """
def train_reinforce(env_id="CartPole-v1", updates=30, episodes_per_update=16, gamma=0.99, learning_rate=0.02,
                    value_learning_rate=0.01, value_epochs=10, hidden_size=32, seed=0):
    torch.manual_seed(seed)
    envs = make_envs(env_id, episodes_per_update)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    policy = nn.Sequential(nn.Linear(obs_dim, hidden_size), nn.Tanh(), nn.Linear(hidden_size, n_actions))
    value = nn.Sequential(nn.Linear(obs_dim, hidden_size), nn.Tanh(), nn.Linear(hidden_size, 1))
    policy_optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    value_optimizer = torch.optim.Adam(value.parameters(), lr=value_learning_rate)
    history = []
    for update in range(updates):
        batch = collect_episodes(envs, policy, seed=seed if update == 0 else None)
        with torch.no_grad():
            final_values = value(batch.final_obs).squeeze(-1)
        G = reward_to_go(batch.rewards, batch.mask, batch.terminated, batch.truncated, final_values, gamma)
        distribution = Categorical(logits=policy(batch.obs))
        taken = distribution.log_prob(distribution.sample())  # BUG: batch.actions
        policy_loss = reinforce_loss(taken, G, value(batch.obs).squeeze(-1), batch.mask)
        policy_optimizer.zero_grad()
        policy_loss.backward()
        policy_optimizer.step()
        for _ in range(value_epochs):
            baseline_loss = value_loss(value(batch.obs).squeeze(-1), G, batch.mask)
            value_optimizer.zero_grad()
            baseline_loss.backward()
            value_optimizer.step()
        history.append(float((batch.rewards * batch.mask).sum(dim=1).mean()))
    envs.close()
    return policy, value, history
"""

WRONG = {
    "a_baseline_not_detached": Variant(
        {LOSS: BASELINE_NOT_DETACHED},
        frozenset({TEST_LOSS}),
        "a gradient flows into the value network through the policy loss; training "
        "is unchanged, as the baseline's optimizer clears it before its own steps",
    ),
    "b_divides_by_steps": Variant(
        {LOSS: DIVIDES_BY_STEPS},
        frozenset({TEST_LOSS}),
        "the mean over valid steps, not the sum over episodes; Adam still learns",
    ),
    "c_bootstraps_after_termination": Variant(
        {RTG: BOOTSTRAPS_AFTER_TERMINATION},
        frozenset({TEST_RTG, TEST_TRUNC}),
        "gamma * V(s_final) after a fall too; it also slows learning",
    ),
    "c_no_bootstrap_at_truncation": Variant(
        {RTG: NO_BOOTSTRAP_AT_TRUNCATION}, frozenset({TEST_TRUNC}), "a time limit treated as a fall"
    ),
    "c_bootstraps_when_both": Variant(
        {RTG: BOOTSTRAPS_WHEN_BOTH},
        frozenset({TEST_TRUNC}),
        "a step both terminated and truncated is bootstrapped",
    ),
    "d_value_loss_counts_masked_steps": Variant(
        {VLOSS: VALUE_LOSS_COUNTS_MASKED_STEPS},
        frozenset({TEST_VLOSS}),
        "the baseline's mean over all E * T entries",
    ),
    "e_loss_sign_flipped": Variant(
        {LOSS: LOSS_SIGN_FLIPPED},
        frozenset({TEST_LOSS, TEST_TRAIN}),
        "gradient ascent on the surrogate: the policy learns to drop the pole",
    ),
    "f_logprobs_of_resampled_actions": Variant(
        {TRAIN: LOGPROBS_OF_RESAMPLED_ACTIONS},
        frozenset({TEST_TRAIN}),
        "correct functions, but the gradient of other actions' log-probabilities",
    ),
}
# Mistakes that also hurt learning, but not on every seed: they may lose the training cell as well.
# Adding gamma * V(s_final) after a fall hides the cost of falling; in 18 training runs of 30
# updates the policy scored 60.9 once (under 100: the check fails) and 136 to 200 otherwise. Run on
# another machine, whose floating-point rounding may differ, the runs of a seed may go either way.
MAY_ALSO_FAIL = {"c_bootstraps_after_termination": frozenset({TEST_TRAIN})}
# Mistakes that pass every visible check: only the hidden cases catch them.
HIDDEN_ONLY = ("c_bootstraps_when_both",)
# Mistakes whose gradient does not learn: the visible training check already fails.
DO_NOT_LEARN = ("e_loss_sign_flipped", "f_logprobs_of_resampled_actions")

# ---- A cheat: rlkit's own functions, reached three ways. Each computes the right numbers where
# rlkit can be imported (checked against the hidden references by hand), so only the guard makes
# them fail. ---------------------------------------------------------------------------------------

CHEATS = {
    "cheat_calls_rlkit": Variant(
        {
            # imported before the guard runs (the first test cell): the guard makes it raise
            RTG: """
from rlkit.advantages import discounted_returns


def reward_to_go(rewards, mask, terminated, truncated, final_values, gamma):
    bootstrap = truncated * (1.0 - terminated) * final_values[:, None]
    ends = torch.maximum(torch.maximum(terminated, truncated), 1.0 - mask)
    return discounted_returns(rewards * mask + gamma * bootstrap, gamma, dones=ends) * mask
""",
            # imported after the guard: the import fails, so reinforce_loss is never defined
            LOSS: """
from rlkit.losses import policy_gradient_loss


def reinforce_loss(logprobs, returns, values, mask):
    return policy_gradient_loss(logprobs, returns - values, mask) * mask.sum() / mask.shape[0]
""",
            # imported when called
            VLOSS: """
def value_loss(values, returns, mask):
    from rlkit.losses import masked_mean

    return masked_mean((values - returns) ** 2, mask)
""",
        },
        ALL_TESTS,
        "reward-to-go, policy loss and value loss from rlkit; the training loop calls them",
    ),
}


# ---- Seed check: a recorder (correct, saves every call) and a memoriser that replays the record.

RECORDED = (RTG, LOSS, VLOSS, TRAIN)


def recorder(reference: dict[str, str], path: str) -> dict[str, str]:
    """The reference solution, saving every outermost call's inputs and outputs to ``path``
    (torch.save): for the functions, the output and its gradient with respect to each input that
    requires one; for train_reinforce, the networks and the history it returned."""
    preamble = f"""
import torch

_record_path = {path!r}
_recorded = []  # (function name, inputs, output, gradients) of every call so far
_busy = [False]  # calls made inside a recorded call (train_reinforce's) are not recorded


def _recorded_call(function):
    def wrapper(*args, **kwargs):
        if _busy[0]:
            return function(*args, **kwargs)
        _busy[0] = True
        try:
            out = function(*args, **kwargs)
        finally:
            _busy[0] = False
        if function.__name__ == "train_reinforce":
            _recorded.append((function.__name__, [args, sorted(kwargs.items())], out, None))
        else:
            inputs = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in args]
            leaves = [x if isinstance(x, torch.Tensor) and x.requires_grad else None for x in args]
            grads = [None] * len(args)
            if out.requires_grad and any(x is not None for x in leaves):
                used = [x for x in leaves if x is not None]
                found = iter(torch.autograd.grad(out, used, retain_graph=True, allow_unused=True))
                grads = [None if x is None else next(found) for x in leaves]
            _recorded.append((function.__name__, inputs, out.detach().clone(), grads))
        torch.save(_recorded, _record_path)
        return out

    return wrapper
"""
    cells = {
        **reference,
        **{cell: reference[cell] + f"\n\n{cell} = _recorded_call({cell})\n" for cell in RECORDED},
    }
    cells[RTG] = preamble + cells[RTG]
    return cells


def memorizer(path: str) -> dict[str, str]:
    """Correct only on the calls in the record at ``path``, gradients included; zeros (or untrained
    networks) for anything else."""
    rtg = f'''
import torch
from torch import nn

_table = torch.load({path!r}, weights_only=False)


def _same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and torch.equal(a, b.detach()))
    return a == b


def _replay(name, *args):
    """The recorded output, carrying the recorded gradients: out + sum g * (x - x.detach())."""
    for seen_name, seen_inputs, out, grads in _table:
        if seen_name == name and all(_same(a, b) for a, b in zip(seen_inputs, args)):
            out = out.clone()
            for x, g in zip(args, grads):
                if g is not None:
                    out = out + (g * (x - x.detach())).sum()
            return out
    return None


def reward_to_go(rewards, mask, terminated, truncated, final_values, gamma):
    hit = _replay("reward_to_go", rewards, mask, terminated, truncated, final_values, gamma)
    return hit if hit is not None else torch.zeros_like(rewards)
'''
    loss = """
def reinforce_loss(logprobs, returns, values, mask):
    hit = _replay("reinforce_loss", logprobs, returns, values, mask)
    return hit if hit is not None else (0.0 * logprobs).sum()
"""
    vloss = """
def value_loss(values, returns, mask):
    hit = _replay("value_loss", values, returns, mask)
    return hit if hit is not None else (0.0 * values).sum()
"""
    train = """
def train_reinforce(*args, **kwargs):
    for seen_name, seen_inputs, out, _ in _table:
        if seen_name == "train_reinforce" and seen_inputs == [args, sorted(kwargs.items())]:
            return out
    untrained = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    return untrained, nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1)), [0.0] * 30
"""
    return {RTG: rtg, LOSS: loss, VLOSS: vloss, TRAIN: train}


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
        lambda reference: recorder(reference, str(course / "record.pt")),
        SEED_A,
    )


def test_source_notebook_is_stored_clean():
    ASSIGNMENT.check_source_is_clean({RTG, LOSS, VLOSS, TRAIN}, POINTS)


def test_release_has_no_solutions_hidden_tests_or_seed(course):
    ASSIGNMENT.check_release_is_clean(course, DEFAULT_SEED)


def test_reference_and_recorder_get_full_marks_and_the_stubs_none(graded):
    ASSIGNMENT.check_graded_marks(graded, POINTS)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_solution_loses_exactly_the_cells_it_breaks(graded, name):
    ASSIGNMENT.check_variant_loses(
        graded, POINTS, name, WRONG[name], MAY_ALSO_FAIL.get(name, frozenset())
    )


@pytest.mark.parametrize("name", HIDDEN_ONLY)
def test_some_mistakes_are_caught_only_by_the_hidden_cases(course, graded, name):
    ASSIGNMENT.check_caught_only_by_hidden_cases(course, name, WRONG[name].fails)


@pytest.mark.parametrize("name", DO_NOT_LEARN)
def test_a_broken_gradient_does_not_learn(course, graded, name):
    """The visible training run (seed 0) already fails: the policy drops the pole within about 20
    steps."""
    message = ASSIGNMENT.errors(course, name)[TEST_TRAIN]
    assert message.startswith(
        "AssertionError: after 30 updates the policy should keep the pole up"
    ), message
    score = float(message.rsplit("not ", 1)[1])
    assert score < 50, message


def test_detaching_the_baseline_is_checked_by_its_gradient(course, graded):
    message = ASSIGNMENT.errors(course, "a_baseline_not_detached")[TEST_LOSS]
    assert "a gradient flows into values" in message, message


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_calling_rlkit_earns_nothing_on_the_cells_it_cheats_on(course, graded, name):
    variant = CHEATS[name]
    assert grading.failed(graded[name], POINTS) == variant.fails, f"{name} ({variant.why})"
    # They fail because the guard stopped rlkit (which the kernel can import), not for another
    # reason: the guard's RuntimeError (bound before it ran) or ImportError (imported after, or at
    # call time), or a NameError because the solution cell that should have defined the function
    # stopped at the ImportError.
    errors = ASSIGNMENT.errors(course, name)
    assert grading.blocked(errors.get(LOSS, "")), "the import after the guard must fail"
    for cell in variant.fails:
        message = errors.get(cell, "")
        assert grading.blocked(message) or message.startswith("NameError"), (
            f"{name}: {cell} failed with {message!r}"
        )
    for cell in (TEST_RTG, TEST_TRUNC, TEST_VLOSS, TEST_TRAIN):
        assert grading.blocked(errors[cell]), (cell, errors[cell])


def test_hidden_cases_change_with_the_grading_seed(course, graded):
    """A memoriser replays the outputs recorded under SEED_A: full marks under SEED_A, none under
    SEED_B."""
    assert (course / "record.pt").exists()
    memorizer_cells = memorizer(str(course / "record.pt"))
    ASSIGNMENT.check_memorizer_needs_the_seed(course, memorizer_cells, POINTS, SEED_A, SEED_B)


def test_feedback_does_not_show_hidden_tests(course, graded):
    secrets = ("def _hidden_reward_to_go", "def _hidden_average_return")
    ASSIGNMENT.check_feedback_hides(course, "c_bootstraps_when_both", DEFAULT_SEED, secrets)
