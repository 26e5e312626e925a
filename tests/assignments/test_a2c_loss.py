"""The A2C assignment end to end: nbgrader releases it, autogrades submissions, and the marks tell a
correct solution from stubs, subtly wrong solutions and calls into rlkit.

Everything runs in a temporary copy of notebooks/assignments, never in the repository (see
grading.py). One module-scoped release and one autograde run serve most tests (a kernel per
submission; most of its time goes to two short A2C runs on CartPole, a few seconds each); the seed
test autogrades twice more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant

pytestmark = pytest.mark.assignments

ASSIGNMENT = grading.Assignment("a2c_loss")
NSTEP, TRUNC, LOSS, TRAIN = "n_step_advantages", "truncation_bootstrap", "a2c_loss", "train_a2c"
TEST_NSTEP, TEST_DONES, TEST_TRUNC, TEST_LOSS, TEST_TRAIN = (
    "test_n_step_advantages",
    "test_n_step_advantages_dones",
    "test_truncation_bootstrap",
    "test_a2c_loss",
    "test_train_a2c",
)
POINTS = {TEST_NSTEP: 2.0, TEST_DONES: 2.0, TEST_TRUNC: 1.0, TEST_LOSS: 3.0, TEST_TRAIN: 2.0}
ALL_TESTS = frozenset(POINTS)
SEED_A, SEED_B = "1001", "2002"
DEFAULT_SEED = "17320508"  # the default in the hidden set-up; must not reach the students
# the mean return the trained policy must reach, in the visible and the hidden training check
THRESHOLD = 100


# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------

# (a) The advantages left in the graph: the loss is right, but through the policy loss a gradient
# reaches whatever the advantages were computed from (the critic, in a loop that computes them with
# gradients).
ADVANTAGES_NOT_DETACHED = """
def a2c_loss(logits, actions, values, advantages, returns, ent_coef, vf_coef):
    policy = Categorical(logits=logits)
    targets = returns.detach()
    policy_loss = -(advantages * policy.log_prob(actions)).mean()  # BUG: advantages.detach()
    value_loss = ((values - targets) ** 2).mean()
    entropy_bonus = policy.entropy().mean()
    return policy_loss + vf_coef * value_loss - ent_coef * entropy_bonus
"""

# (b) Bootstrapping across episode ends: dones ignored, so the return of an episode's last step runs
# on into the next episode (and V(s_n) of the next episode is added to the one that ended at the
# last step).
IGNORES_DONES = """
def n_step_advantages(rewards, values, dones, last_value, gamma):
    with torch.no_grad():
        num_steps = rewards.shape[1]
        n_step_returns = torch.zeros_like(rewards)
        following = last_value.to(rewards.dtype)
        for t in reversed(range(num_steps)):
            following = rewards[:, t] + gamma * following  # BUG: no (1 - d_t)
            n_step_returns[:, t] = following
        advantage_estimates = n_step_returns - values.to(rewards.dtype)
    return advantage_estimates, n_step_returns
"""

# (c) gamma * V(s_final) added at every episode end, terminated ones included.
BOOTSTRAPS_AFTER_TERMINATION = """
def truncation_bootstrap(rewards, terminated, truncated, final_values, gamma):
    episode_ends = torch.maximum(terminated, truncated).to(rewards.dtype)
    bootstrapped = rewards + gamma * torch.where(episode_ends.bool(), final_values, torch.zeros_like(final_values))  # BUG
    return bootstrapped, episode_ends
"""

# (c') Truncation treated as termination: no bootstrap when the time limit cuts an episode.
NO_TRUNCATION_BOOTSTRAP = """
def truncation_bootstrap(rewards, terminated, truncated, final_values, gamma):
    episode_ends = torch.maximum(terminated, truncated).to(rewards.dtype)
    return rewards.clone(), episode_ends  # BUG: no gamma * V(s_final) at truncated steps
"""

# (c'') Right for either flag alone, but it bootstraps a step that is both terminated and truncated
# (the pole fell on the last step the time limit allowed). The visible checks have no such step.
BOOTSTRAPS_WHEN_BOTH = """
def truncation_bootstrap(rewards, terminated, truncated, final_values, gamma):
    cut_short = truncated  # BUG: truncated * (1 - terminated)
    bootstrapped = rewards + gamma * torch.where(cut_short.bool(), final_values, torch.zeros_like(final_values))
    episode_ends = torch.maximum(terminated, truncated).to(rewards.dtype)
    return bootstrapped, episode_ends
"""

# (d) The entropy bonus with the wrong sign: a penalty that pushes the policy to be deterministic.
ENTROPY_SIGN_FLIPPED = """
def a2c_loss(logits, actions, values, advantages, returns, ent_coef, vf_coef):
    policy = Categorical(logits=logits)
    weights, targets = advantages.detach(), returns.detach()
    policy_loss = -(weights * policy.log_prob(actions)).mean()
    value_loss = ((values - targets) ** 2).mean()
    entropy_bonus = policy.entropy().mean()
    return policy_loss + vf_coef * value_loss + ent_coef * entropy_bonus  # BUG: - ent_coef
"""

# (e) The critic regressed on the advantages instead of the returns.
VALUE_LOSS_ON_ADVANTAGES = """
def a2c_loss(logits, actions, values, advantages, returns, ent_coef, vf_coef):
    policy = Categorical(logits=logits)
    weights = advantages.detach()
    policy_loss = -(weights * policy.log_prob(actions)).mean()
    value_loss = ((values - weights) ** 2).mean()  # BUG: the target is the returns
    entropy_bonus = policy.entropy().mean()
    return policy_loss + vf_coef * value_loss - ent_coef * entropy_bonus
"""

# (f) The policy loss with the wrong sign: gradient descent on it makes dropping the pole more
# likely.
POLICY_LOSS_SIGN_FLIPPED = """
def a2c_loss(logits, actions, values, advantages, returns, ent_coef, vf_coef):
    policy = Categorical(logits=logits)
    weights, targets = advantages.detach(), returns.detach()
    policy_loss = (weights * policy.log_prob(actions)).mean()  # BUG: no minus sign
    value_loss = ((values - targets) ** 2).mean()
    entropy_bonus = policy.entropy().mean()
    return policy_loss + vf_coef * value_loss - ent_coef * entropy_bonus
"""

WRONG = {
    "a_advantages_not_detached": Variant(
        {LOSS: ADVANTAGES_NOT_DETACHED},
        frozenset({TEST_LOSS}),
        "a gradient reaches the critic through the policy loss; training is unchanged, "
        "as the rollout's advantages carry no graph",
    ),
    "b_ignores_dones": Variant(
        {NSTEP: IGNORES_DONES},
        frozenset({TEST_DONES, TEST_TRAIN}),
        "returns run on across episode ends: falling costs nothing, and nothing is learned",
    ),
    "c_bootstraps_after_termination": Variant(
        {TRUNC: BOOTSTRAPS_AFTER_TERMINATION},
        frozenset({TEST_TRUNC, TEST_TRAIN}),
        "gamma * V(s_final) after a fall too: falling costs nothing",
    ),
    "c_no_truncation_bootstrap": Variant(
        {TRUNC: NO_TRUNCATION_BOOTSTRAP},
        frozenset({TEST_TRUNC}),
        "a time limit treated as a fall; short runs hardly reach the limit",
    ),
    "c_bootstraps_when_both": Variant(
        {TRUNC: BOOTSTRAPS_WHEN_BOTH},
        frozenset({TEST_TRUNC}),
        "a step both terminated and truncated is bootstrapped",
    ),
    "d_entropy_sign_flipped": Variant(
        {LOSS: ENTROPY_SIGN_FLIPPED},
        frozenset({TEST_LOSS}),
        "an entropy penalty; training uses ent_coef = 0, so it learns as before",
    ),
    "e_value_loss_on_advantages": Variant(
        {LOSS: VALUE_LOSS_ON_ADVANTAGES},
        frozenset({TEST_LOSS}),
        "the critic regressed on the advantages, not the returns",
    ),
    "f_policy_loss_sign_flipped": Variant(
        {LOSS: POLICY_LOSS_SIGN_FLIPPED},
        frozenset({TEST_LOSS, TEST_TRAIN}),
        "gradient ascent on the surrogate: the policy learns to drop the pole",
    ),
}
# Mistakes that also hurt learning, but not on every seed: they may lose the training cell as well.
# A critic fitted to the advantages chases a target that moves with it (A = R - V) and is a poor
# baseline: in 20 training runs (seeds 0-19) the policy scored 9 to 192, under 100 in 9 of them.
# Here the visible run (seed 0) scores 162 and SEED_A's hidden run 84, so it loses the training cell
# too; on another machine, whose floating-point rounding may differ, either run may go either way.
MAY_ALSO_FAIL = {"e_value_loss_on_advantages": frozenset({TEST_TRAIN})}
# Mistakes that pass every visible check: only the hidden cases catch them.
HIDDEN_ONLY = ("c_bootstraps_when_both",)
# Mistakes whose training does not learn: the visible training check already fails, far below the
# threshold. In 20 training runs each (seeds 0-19), ignoring dones scored at most 46 and
# bootstrapping after termination at most 66 (both: falling costs nothing); a flipped policy loss
# scores about 9; the reference, over 120 seeds, at least 132.
DO_NOT_LEARN = ("b_ignores_dones", "c_bootstraps_after_termination", "f_policy_loss_sign_flipped")

# ---- Cheats: rlkit's own functions. Each computes the right numbers where rlkit can be imported
# (test_hidden_references_agree_with_rlkit checks rlkit against the hidden references), so only the
# guard makes them fail. ---------------------------------------------------------------------------

# gae imported before the guard runs (the first test cell): the guard makes it raise. The A2C loss
# imported after the guard: the import fails, so a2c_loss is never defined. truncation_bootstrap is
# the student's own.
CHEAT_IMPORTS = {
    NSTEP: """
from rlkit.advantages import gae


def n_step_advantages(rewards, values, dones, last_value, gamma):
    return gae(rewards, values, gamma, 1.0, dones=dones, last_value=last_value)
""",
    LOSS: """
from rlkit.a2c import a2c_loss as library_a2c_loss


def a2c_loss(logits, actions, values, advantages, returns, ent_coef, vf_coef):
    policy = Categorical(logits=logits)
    loss, _ = library_a2c_loss(policy.log_prob(actions), policy.entropy(), values, advantages.detach(),
                               returns.detach(), ent_coef, vf_coef)
    return loss
""",
}

# rlkit imported when the functions are called, after the guard: ImportError.
CHEAT_AT_CALL_TIME = {
    NSTEP: """
def n_step_advantages(rewards, values, dones, last_value, gamma):
    from rlkit.advantages import gae

    return gae(rewards, values, gamma, 1.0, dones=dones, last_value=last_value)
""",
    LOSS: """
def a2c_loss(logits, actions, values, advantages, returns, ent_coef, vf_coef):
    from rlkit.a2c import a2c_loss as library_a2c_loss

    policy = Categorical(logits=logits)
    loss, _ = library_a2c_loss(policy.log_prob(actions), policy.entropy(), values, advantages.detach(),
                               returns.detach(), ent_coef, vf_coef)
    return loss
""",
}

CHEATS = {
    "cheat_imports_rlkit": Variant(
        CHEAT_IMPORTS,
        frozenset({TEST_NSTEP, TEST_DONES, TEST_LOSS, TEST_TRAIN}),
        "n-step advantages from rlkit's gae (bound before the guard), the loss from rlkit.a2c "
        "(imported after it); the training loop calls them",
    ),
    "cheat_imports_rlkit_at_call_time": Variant(
        CHEAT_AT_CALL_TIME,
        frozenset({TEST_NSTEP, TEST_DONES, TEST_LOSS, TEST_TRAIN}),
        "rlkit imported inside the functions, when they are called",
    ),
}


# ---- Seed check: a recorder (correct, saves every call) and a memoriser that replays the record.

RECORDED = (NSTEP, TRUNC, LOSS, TRAIN)


def recorder(reference: dict[str, str], path: str) -> dict[str, str]:
    """The reference solution, saving every outermost call's inputs and outputs to ``path``
    (torch.save): for the functions, the outputs, and the loss's gradient with respect to each input
    that requires one; for train_a2c, the trained agent's weights and the history it returned."""
    preamble = f"""
import torch

_record_path = {path!r}
_recorded = []  # (function name, inputs, outputs, gradients) of every call so far
_busy = [False]  # calls made inside a recorded call (train_a2c's) are not recorded


def _recorded_call(function):
    def wrapper(*args, **kwargs):
        if _busy[0]:
            return function(*args, **kwargs)
        _busy[0] = True
        try:
            out = function(*args, **kwargs)
        finally:
            _busy[0] = False
        name = function.__name__
        if name == "train_a2c":
            agent, history = out
            weights = {{key: value.detach().clone() for key, value in agent.state_dict().items()}}
            _recorded.append((name, [list(args), sorted(kwargs.items())], (weights, list(history)), None))
        else:
            inputs = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in args]
            if isinstance(out, tuple):
                _recorded.append((name, inputs, tuple(x.detach().clone() for x in out), None))
            else:
                leaves = [x if isinstance(x, torch.Tensor) and x.requires_grad else None for x in args]
                grads = [None] * len(args)
                if out.requires_grad and any(x is not None for x in leaves):
                    used = [x for x in leaves if x is not None]
                    found = iter(torch.autograd.grad(out, used, retain_graph=True, allow_unused=True))
                    grads = [None if x is None else next(found) for x in leaves]
                _recorded.append((name, inputs, out.detach().clone(), grads))
        torch.save(_recorded, _record_path)
        return out

    return wrapper
"""
    cells = {
        **reference,
        **{cell: reference[cell] + f"\n\n{cell} = _recorded_call({cell})\n" for cell in RECORDED},
    }
    cells[NSTEP] = preamble + cells[NSTEP]
    return cells


def memorizer(path: str) -> dict[str, str]:
    """Correct only on the calls in the record at ``path``, gradients included; zeros (or an
    untrained agent) for anything else."""
    nstep = f'''
import torch

_table = torch.load({path!r}, weights_only=False)


def _same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a, b.detach()))
    return a == b


def _replay(name, *args):
    """The recorded outputs; for the loss, carrying the recorded gradients: out + sum g * (x - x.detach())."""
    for seen_name, seen_inputs, out, grads in _table:
        if seen_name == name and len(seen_inputs) == len(args) and all(_same(a, b) for a, b in zip(seen_inputs, args)):
            if isinstance(out, tuple):
                return tuple(x.clone() for x in out)
            out = out.clone()
            for x, g in zip(args, grads):
                if g is not None:
                    out = out + (g * (x - x.detach())).sum()
            return out
    return None


def n_step_advantages(rewards, values, dones, last_value, gamma):
    hit = _replay("n_step_advantages", rewards, values, dones, last_value, gamma)
    return hit if hit is not None else (torch.zeros_like(rewards), torch.zeros_like(rewards))
'''
    trunc = """
def truncation_bootstrap(rewards, terminated, truncated, final_values, gamma):
    hit = _replay("truncation_bootstrap", rewards, terminated, truncated, final_values, gamma)
    return hit if hit is not None else (torch.zeros_like(rewards), torch.zeros_like(rewards))
"""
    loss = """
def a2c_loss(logits, actions, values, advantages, returns, ent_coef, vf_coef):
    hit = _replay("a2c_loss", logits, actions, values, advantages, returns, ent_coef, vf_coef)
    return hit if hit is not None else (0.0 * logits).sum() + (0.0 * values).sum()
"""
    train = """
def train_a2c(*args, **kwargs):
    for seen_name, seen_inputs, out, _ in _table:
        if seen_name == "train_a2c" and seen_inputs == [list(args), sorted(kwargs.items())]:
            weights, history = out
            agent = ActorCritic()
            agent.load_state_dict(weights)
            return agent, list(history)
    return ActorCritic(), [0.0]
"""
    return {NSTEP: nstep, TRUNC: trunc, LOSS: loss, TRAIN: train}


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
    ASSIGNMENT.check_source_is_clean({NSTEP, TRUNC, LOSS, TRAIN}, POINTS)
    assert sum(POINTS.values()) == 10


def test_hidden_references_agree_with_rlkit():
    """The hidden tests' hand-written references (run here without the guard) agree with rlkit's gae
    at lam = 1 and rlkit.a2c.a2c_loss, values and gradients, on the hidden cases of two seeds."""
    torch = pytest.importorskip("torch")
    from torch.distributions import Categorical

    from rlkit.a2c import a2c_loss
    from rlkit.advantages import gae

    nb = grading.nbformat.read(ASSIGNMENT.source, as_version=4)
    setup = next(
        c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == TEST_NSTEP
    )
    setup = setup.split("### BEGIN HIDDEN TESTS", 1)[1].split("### END HIDDEN TESTS", 1)[0]
    body, guard = setup.rsplit("\n_hidden_block_rlkit()\n", 1)
    assert guard.lstrip().startswith("# ---- End of the grading set-up."), (
        "the set-up should end with the guard"
    )
    namespace: dict = {"__name__": "hidden_setup"}
    exec(compile(body, "hidden_setup", "exec"), namespace)  # noqa: S102 - our own notebook's set-up, without the guard
    for seed in (int(SEED_A), int(DEFAULT_SEED)):
        namespace["GRADING_SEED"] = seed
        for case in namespace["_hidden_rollouts"](1, with_dones=False) + namespace[
            "_hidden_rollouts"
        ](2, with_dones=True):
            want = gae(
                case["rewards"],
                case["values"],
                case["gamma"],
                1.0,
                dones=case["dones"],
                last_value=case["last_value"],
            )
            for got, expected in zip(namespace["_hidden_n_step_advantages"](case), want):
                torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
        for case in namespace["_hidden_batches"](4):
            logits = case["logits"].clone().requires_grad_(True)
            values = case["values"].clone().requires_grad_(True)
            policy = Categorical(logits=logits)
            loss, _ = a2c_loss(
                policy.log_prob(case["actions"]),
                policy.entropy(),
                values,
                case["advantages"],
                case["returns"],
                case["ent_coef"],
                case["vf_coef"],
            )
            loss.backward()
            for got, expected in zip(
                namespace["_hidden_a2c_loss"](case), (loss.detach(), logits.grad, values.grad)
            ):
                torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


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
def test_a_broken_update_does_not_learn(course, graded, name):
    """The visible training run (seed 0) already fails: the policy drops the pole within about 20
    steps."""
    message = ASSIGNMENT.errors(course, name)[TEST_TRAIN]
    assert message.startswith(
        "AssertionError: after 500 updates the policy should keep the pole up"
    ), message
    score = float(message.rsplit("not ", 1)[1])
    assert score < THRESHOLD * 0.6, message


def test_detaching_the_advantages_is_checked_by_the_critics_gradient(course, graded):
    message = ASSIGNMENT.errors(course, "a_advantages_not_detached")[TEST_LOSS]
    assert "a gradient flows into values through the policy loss" in message, message


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_calling_rlkit_earns_nothing_on_the_cells_it_cheats_on(course, graded, name):
    variant = CHEATS[name]
    assert grading.failed(graded[name], POINTS) == variant.fails, f"{name} ({variant.why})"
    # They fail because the guard stopped rlkit (which the kernel can import), not for another
    # reason: the guard's RuntimeError (bound before it ran) or ImportError (imported after, or at
    # call time), or a NameError because the solution cell that should have defined the function
    # stopped at the ImportError.
    errors = ASSIGNMENT.errors(course, name)
    for cell in variant.fails:
        message = errors.get(cell, "")
        assert grading.blocked(message) or message.startswith("NameError"), (
            f"{name}: {cell} failed with {message!r}"
        )
    for cell in (TEST_NSTEP, TEST_DONES, TEST_TRAIN):
        assert grading.blocked(errors[cell]), (cell, errors[cell])
    if name == "cheat_imports_rlkit":
        assert grading.blocked(errors.get(LOSS, "")), "the import after the guard must fail"


def test_hidden_cases_change_with_the_grading_seed(course, graded):
    """A memoriser replays the outputs recorded under SEED_A: full marks under SEED_A, none under
    SEED_B."""
    assert (course / "record.pt").exists()
    memorizer_cells = memorizer(str(course / "record.pt"))
    ASSIGNMENT.check_memorizer_needs_the_seed(course, memorizer_cells, POINTS, SEED_A, SEED_B)


def test_feedback_does_not_show_hidden_tests(course, graded):
    secrets = (
        "def _hidden_truncation_bootstrap",
        "def _hidden_average_return",
        "def _hidden_a2c_loss",
    )
    ASSIGNMENT.check_feedback_hides(course, "c_bootstraps_when_both", DEFAULT_SEED, secrets)
