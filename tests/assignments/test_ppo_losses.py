"""The PPO-losses assignment end to end: nbgrader releases it, autogrades submissions, and the marks
tell a correct solution from stubs, subtly wrong solutions and calls into rlkit.

Everything runs in a temporary copy of notebooks/assignments, never in the repository (see
grading.py). One module-scoped release and one autograde run serve most tests (a kernel per
submission; most of its time goes to starting the kernel and to six short PPO runs on a contextual
bandit, under a second each); the seed test autogrades twice more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant

pytestmark = pytest.mark.assignments

ASSIGNMENT = grading.Assignment("ppo_losses")
POLICY, VALUE, DIAG, LOSS = "clipped_policy_loss", "clipped_value_loss", "diagnostics", "ppo_loss"
TEST_POLICY, TEST_VALUE, TEST_DIAG, TEST_LOSS, TEST_TRAIN = (
    "test_clipped_policy_loss",
    "test_clipped_value_loss",
    "test_diagnostics",
    "test_ppo_loss",
    "test_train_ppo",
)
POINTS = {TEST_POLICY: 3.0, TEST_VALUE: 2.0, TEST_DIAG: 1.0, TEST_LOSS: 2.0, TEST_TRAIN: 2.0}
ALL_TESTS = frozenset(POINTS)
SEED_A, SEED_B = "1001", "2002"
DEFAULT_SEED = "22360679"  # the default in the hidden set-up; must not reach the students
# how far (KL) 40 epochs on one batch may move the policy, in the visible and the hidden
# training check
KL_LIMIT = 0.1

# ppo_loss is made of the functions of Parts 1 and 2, so a mistake in them costs test_ppo_loss as
# well, and the training cell where the training runs notice it: training uses clip_eps = 0.2, no
# mask, no value clipping and no entropy bonus, and never calls the diagnostics.


# ---- Subtly wrong solutions: each is the reference with one mistake (marked BUG). ----------------

# Part 1's cell holds three functions; the mistakes below are in clipped_policy_loss unless marked
# otherwise.
HELPERS = """
def masked_mean(x, mask=None):
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum()


def probability_ratio(logprobs, old_logprobs):
    return torch.exp(logprobs - old_logprobs.detach())
"""

# (a) The optimistic bound: min of the negated terms (max of the surrogates). Where the ratio has
# left the range on the side its advantage favours, the unclipped term wins and keeps pulling: no
# trust region.
MIN_INSTEAD_OF_MAX = (
    HELPERS
    + """

def clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, mask=None):
    advantages = advantages.detach()
    ratio = probability_ratio(logprobs, old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return masked_mean(torch.minimum(unclipped, clipped), mask)  # BUG: torch.maximum, the pessimistic bound
"""
)

# (b) The advantages clipped to [1 - eps, 1 + eps] instead of the ratio: nothing bounds the ratio.
CLIPS_THE_ADVANTAGES = (
    HELPERS
    + """

def clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, mask=None):
    advantages = advantages.detach()
    ratio = probability_ratio(logprobs, old_logprobs)
    unclipped = -advantages * ratio
    clipped = -torch.clamp(advantages, 1.0 - clip_eps, 1.0 + clip_eps) * ratio  # BUG: clip the ratio, not A
    return masked_mean(torch.maximum(unclipped, clipped), mask)
"""
)

# (c) The log-ratio used as the ratio: 0, not 1, at the start, so the clip range [1 - eps, 1 + eps]
# is reached only after the log-probability of an action has risen by 1 - eps (its probability x
# 2.2).
RATIO_NOT_EXPONENTIATED = (
    HELPERS
    + """

def clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, mask=None):
    advantages = advantages.detach()
    ratio = logprobs - old_logprobs.detach()  # BUG: torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return masked_mean(torch.maximum(unclipped, clipped), mask)
"""
)

# (d) old_logprobs not detached (in probability_ratio): right values, but a gradient flows into
# pi_old; and where the old log-probabilities are the new ones (one step per batch), the ratio is
# exp(0) for every parameter, and the policy's gradient is 0.
OLD_LOGPROBS_NOT_DETACHED = """
def masked_mean(x, mask=None):
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum()


def probability_ratio(logprobs, old_logprobs):
    return torch.exp(logprobs - old_logprobs)  # BUG: old_logprobs.detach()


def clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, mask=None):
    advantages = advantages.detach()
    ratio = probability_ratio(logprobs, old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return masked_mean(torch.maximum(unclipped, clipped), mask)
"""

# (e) The mask ignored: the mean over every entry, padding included.
MASK_IGNORED = (
    HELPERS
    + """

def clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, mask=None):
    advantages = advantages.detach()
    ratio = probability_ratio(logprobs, old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return torch.maximum(unclipped, clipped).mean()  # BUG: masked_mean(..., mask)
"""
)

# (f) The default clip range written in: right at clip_eps = 0.2, which is all the visible checks
# and the training runs use.
HARD_CODED_CLIP_RANGE = (
    HELPERS
    + """

def clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, mask=None):
    advantages = advantages.detach()
    ratio = probability_ratio(logprobs, old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 0.8, 1.2)  # BUG: 1 - clip_eps, 1 + clip_eps
    return masked_mean(torch.maximum(unclipped, clipped), mask)
"""
)

# (g) The surrogate itself, not its negative: gradient descent on it makes the worst arms more
# likely.
SURROGATE_NOT_NEGATED = (
    HELPERS
    + """

def clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, mask=None):
    advantages = advantages.detach()
    ratio = probability_ratio(logprobs, old_logprobs)
    surrogate = torch.minimum(advantages * ratio, advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps))
    return masked_mean(surrogate, mask)  # BUG: -masked_mean(...), a loss to minimise
"""
)

# (h) The value clipped around the new value: V_old pulled to within eps of V, instead of V kept
# within eps of V_old.
VALUE_CLIPPED_AROUND_NEW_VALUE = """
def clipped_value_loss(values, old_values, returns, clip_eps=0.2, mask=None):
    returns = returns.detach()
    squared_error = (values - returns) ** 2
    if clip_eps is not None:
        old_values = old_values.detach()
        clipped_values = torch.clamp(old_values, values - clip_eps, values + clip_eps)  # BUG: V_old + clip(V - V_old)
        squared_error = torch.maximum(squared_error, (clipped_values - returns) ** 2)
    return 0.5 * masked_mean(squared_error, mask)
"""

# (i) k3 with the log-ratio's sign flipped: (1/r - 1) + log r, k3 of KL(pi || pi_old), which needs
# samples of pi; the batch holds pi_old's.
KL_WRONG_DIRECTION = """
def clip_fraction(logprobs, old_logprobs, clip_eps=0.2, mask=None):
    with torch.no_grad():
        ratio = probability_ratio(logprobs, old_logprobs)
        outside = (ratio < 1.0 - clip_eps) | (ratio > 1.0 + clip_eps)
        return masked_mean(outside.to(logprobs.dtype), mask)


def approx_kl(logprobs, old_logprobs, mask=None):
    with torch.no_grad():
        log_ratio = old_logprobs - logprobs  # BUG: logprobs - old_logprobs
        return masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask)
"""

NORMALIZE = """
def normalize_advantages(advantages, mask=None, eps=1e-8):
    mean = masked_mean(advantages, mask)
    centred = advantages - mean
    count = advantages.numel() if mask is None else mask.sum()
    variance = masked_mean(centred**2, mask) * count / (count - 1)
    normalized = centred / torch.sqrt(variance + eps)
    return normalized if mask is None else normalized * mask.to(advantages.dtype)
"""


def _ppo_loss(total: str) -> str:
    """ppo_loss with the given return line."""
    return f"""

def ppo_loss(logits, actions, old_logprobs, values, old_values, advantages, returns, clip_eps=0.2,
             value_clip_eps=None, vf_coef=0.5, ent_coef=0.0, mask=None, normalize=True):
    policy = Categorical(logits=logits)
    if normalize:
        advantages = normalize_advantages(advantages.detach(), mask)
    policy_loss = clipped_policy_loss(policy.log_prob(actions), old_logprobs, advantages, clip_eps, mask)
    value_loss = clipped_value_loss(values, old_values, returns, value_clip_eps, mask)
    entropy_bonus = masked_mean(policy.entropy(), mask)
    {total}
"""


# (j) The entropy bonus with the wrong sign: a penalty that pushes the policy to be deterministic.
ENTROPY_SIGN_FLIPPED = NORMALIZE + _ppo_loss(
    "return policy_loss + vf_coef * value_loss + ent_coef * entropy_bonus  # BUG: - ent_coef"
)

# (k) The advantages normalised over every entry, padding included.
NORMALIZES_OVER_PADDING = """
def normalize_advantages(advantages, mask=None, eps=1e-8):
    normalized = (advantages - advantages.mean()) / torch.sqrt(advantages.var() + eps)  # BUG: padding counted
    return normalized if mask is None else normalized * mask.to(advantages.dtype)
""" + _ppo_loss("return policy_loss + vf_coef * value_loss - ent_coef * entropy_bonus")

POLICY_TESTS = frozenset({TEST_POLICY, TEST_LOSS})
BREAKS_TRAINING = POLICY_TESTS | {TEST_TRAIN}
WRONG = {
    "a_min_instead_of_max": Variant(
        {POLICY: MIN_INSTEAD_OF_MAX},
        BREAKS_TRAINING,
        "the optimistic bound: one batch's 40 epochs move the policy by a KL over 1",
    ),
    "b_clips_the_advantages": Variant(
        {POLICY: CLIPS_THE_ADVANTAGES},
        BREAKS_TRAINING,
        "nothing bounds the ratio: one batch's 40 epochs move the policy by a KL near 1",
    ),
    "c_ratio_not_exponentiated": Variant(
        {POLICY: RATIO_NOT_EXPONENTIATED},
        BREAKS_TRAINING,
        "the log-ratio as the ratio: one batch's 40 epochs move the policy by a KL over 0.2",
    ),
    "d_old_logprobs_not_detached": Variant(
        {POLICY: OLD_LOGPROBS_NOT_DETACHED},
        BREAKS_TRAINING,
        "a gradient flows into old_logprobs; with one step per batch nothing is learned",
    ),
    "e_mask_ignored": Variant(
        {POLICY: MASK_IGNORED},
        POLICY_TESTS,
        "the mean over the padding too; training has no padding",
    ),
    "f_hard_coded_clip_range": Variant(
        {POLICY: HARD_CODED_CLIP_RANGE},
        POLICY_TESTS,
        "clip range [0.8, 1.2] whatever clip_eps; right at the default",
    ),
    "g_surrogate_not_negated": Variant(
        {POLICY: SURROGATE_NOT_NEGATED},
        BREAKS_TRAINING,
        "gradient ascent on the loss: the policy learns the worst arms",
    ),
    "h_value_clipped_around_new_value": Variant(
        {VALUE: VALUE_CLIPPED_AROUND_NEW_VALUE},
        frozenset({TEST_VALUE, TEST_LOSS}),
        "V_old clipped to within eps of V; training does not clip the value",
    ),
    "i_kl_wrong_direction": Variant(
        {DIAG: KL_WRONG_DIRECTION},
        frozenset({TEST_DIAG}),
        "k3 of KL(pi || pi_old) on pi_old's samples; training does not use it",
    ),
    "j_entropy_sign_flipped": Variant(
        {LOSS: ENTROPY_SIGN_FLIPPED},
        frozenset({TEST_LOSS}),
        "an entropy penalty; training uses ent_coef = 0",
    ),
    "k_normalizes_over_padding": Variant(
        {LOSS: NORMALIZES_OVER_PADDING},
        frozenset({TEST_LOSS}),
        "the padding moves the mean and the variance; training has no padding",
    ),
}
# Mistakes that pass every visible check: only the hidden cases catch them.
HIDDEN_ONLY = ("f_hard_coded_clip_range",)
# Mistakes without a trust region: the visible training check's 40 epochs on one batch move the
# policy by a KL far over KL_LIMIT (visible run: 1.28, 1.08 and 0.30; the reference 0.044). Over 230
# other bandits and training seeds (bandit seeds 1000-1229, training seeds 0-229), the reference
# moved it by 0.050 at most, and the log-ratio as the ratio by 0.205 or more; over the first 30 of
# them, min instead of max by 1.17 or more and clipped advantages by 0.82 or more. The reference
# also passed the other two checks on all 230, closing at least 79% of the gap in 10 iterations
# (limit 60%) and 87% with one step per batch (limit 50%).
RUN_OFF = ("a_min_instead_of_max", "b_clips_the_advantages", "c_ratio_not_exponentiated")

# ---- Cheats: rlkit's own functions. Each computes the right numbers where rlkit can be imported
# (test_hidden_references_agree_with_rlkit checks rlkit against the hidden references), so only the
# guard makes them fail. ---------------------------------------------------------------------------

# masked_mean and the policy loss imported before the guard runs (the first test cell): the guard
# makes them raise, in every cell that uses them (normalize_advantages calls masked_mean). The value
# loss and the diagnostics imported after the guard: the imports fail, so those functions are never
# defined.
CHEAT_IMPORTS = {
    POLICY: """
from rlkit.losses import clipped_policy_loss, masked_mean


def probability_ratio(logprobs, old_logprobs):
    return torch.exp(logprobs - old_logprobs.detach())
""",
    VALUE: """
from rlkit.losses import clipped_value_loss
""",
    DIAG: """
from rlkit.losses import approx_kl, clip_fraction
""",
}

# rlkit imported when the functions are called, after the guard: ImportError.
CHEAT_AT_CALL_TIME = {
    POLICY: """
def masked_mean(x, mask=None):
    from rlkit.losses import masked_mean as library_masked_mean

    return library_masked_mean(x, mask)


def probability_ratio(logprobs, old_logprobs):
    return torch.exp(logprobs - old_logprobs.detach())


def clipped_policy_loss(logprobs, old_logprobs, advantages, clip_eps=0.2, mask=None):
    from rlkit.losses import clipped_policy_loss as library_loss

    return library_loss(logprobs, old_logprobs, advantages, clip_eps, mask)
""",
    VALUE: """
def clipped_value_loss(values, old_values, returns, clip_eps=0.2, mask=None):
    from rlkit.losses import clipped_value_loss as library_loss

    return library_loss(values, old_values, returns, clip_eps, mask)
""",
    DIAG: """
def clip_fraction(logprobs, old_logprobs, clip_eps=0.2, mask=None):
    from rlkit.losses import clip_fraction as library_clip_fraction

    return library_clip_fraction(logprobs, old_logprobs, clip_eps, mask)


def approx_kl(logprobs, old_logprobs, mask=None):
    from rlkit.losses import approx_kl as library_approx_kl

    return library_approx_kl(logprobs, old_logprobs, mask)
""",
    LOSS: """
def normalize_advantages(advantages, mask=None, eps=1e-8):
    from rlkit.losses import masked_whiten

    return masked_whiten(advantages, mask, eps)
"""
    + _ppo_loss("return policy_loss + vf_coef * value_loss - ent_coef * entropy_bonus"),
}

CHEATS = {
    "cheat_imports_rlkit": Variant(
        CHEAT_IMPORTS,
        ALL_TESTS,
        "masked_mean and the policy loss from rlkit.losses (bound before the guard), the value "
        "loss and the diagnostics from rlkit.losses (imported after it)",
    ),
    "cheat_imports_rlkit_at_call_time": Variant(
        CHEAT_AT_CALL_TIME, ALL_TESTS, "rlkit imported inside the functions, when they are called"
    ),
}


# ---- Seed check: a recorder (correct, saves every call) and a memoriser that replays the record.

# The functions each solution cell defines, in the order they are defined.
RECORDED = {
    POLICY: ("masked_mean", "probability_ratio", "clipped_policy_loss"),
    VALUE: ("clipped_value_loss",),
    DIAG: ("clip_fraction", "approx_kl"),
    LOSS: ("normalize_advantages", "ppo_loss"),
}


def recorder(reference: dict[str, str], folder: str) -> dict[str, str]:
    """The reference solution, saving every outermost call (one file per call, in ``folder``): its
    inputs, its output, and the gradient of the output's sum with respect to each input that
    requires one (the gradient of a loss; for the elementwise probability_ratio, the derivative of
    each entry). The training runs call ppo_loss a few hundred times each; a file per call keeps the
    saving linear."""
    preamble = f"""
import os

import torch

_record_folder = {folder!r}
os.makedirs(_record_folder, exist_ok=True)
_busy = [False]  # calls made inside a recorded call (ppo_loss's) are not recorded
_count = [0]


def _copy(x):
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _recorded_call(function):
    def wrapper(*args, **kwargs):
        if _busy[0]:
            return function(*args, **kwargs)
        _busy[0] = True
        try:
            out = function(*args, **kwargs)
        finally:
            _busy[0] = False
        names = list(range(len(args))) + sorted(kwargs)
        inputs = [args[n] if isinstance(n, int) else kwargs[n] for n in names]
        grads = [None] * len(inputs)
        seen = set()
        wanted = []
        for i, x in enumerate(inputs):  # a tensor passed twice (old_values = values) gets its gradient once
            if isinstance(x, torch.Tensor) and x.requires_grad and id(x) not in seen:
                seen.add(id(x))
                wanted.append(i)
        if isinstance(out, torch.Tensor) and out.requires_grad and wanted:
            found = torch.autograd.grad(out.sum(), [inputs[i] for i in wanted], retain_graph=True, allow_unused=True)
            for i, g in zip(wanted, found):
                grads[i] = g
        entry = (function.__name__, [_copy(a) for a in args], {{k: _copy(v) for k, v in kwargs.items()}},
                 _copy(out), dict(zip(names, grads)))
        torch.save(entry, os.path.join(_record_folder, f"{{_count[0]:07d}}.pt"))
        _count[0] += 1
        return out

    return wrapper
"""
    cells = dict(reference)
    for cell, functions in RECORDED.items():
        cells[cell] = (
            reference[cell]
            + "\n\n"
            + "\n".join(f"{f} = _recorded_call({f})" for f in functions)
            + "\n"
        )
    cells[POLICY] = preamble + cells[POLICY]
    return cells


def memorizer(folder: str) -> dict[str, str]:
    """Correct only on the calls in the record in ``folder``, gradients included; zeros (or ones)
    for anything else, and a loss with a zero gradient."""
    policy = f'''
import os

import torch


def _key(x):
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return ("tensor", tuple(x.shape), str(x.dtype), x.contiguous().numpy().tobytes())
    return ("value", repr(x))


def _call_key(name, args, kwargs):
    return (name, tuple(_key(a) for a in args), tuple((k, _key(kwargs[k])) for k in sorted(kwargs)))


_table = {{}}
for _file in sorted(os.listdir({folder!r})):
    _name, _args, _kwargs, _out, _grads = torch.load(os.path.join({folder!r}, _file), weights_only=False)
    _table.setdefault(_call_key(_name, _args, _kwargs), (_out, _grads))


def _replay(name, args, kwargs):
    """The recorded output, carrying the recorded gradients: out + g * (x - x.detach()) (summed for a scalar)."""
    hit = _table.get(_call_key(name, args, kwargs))
    if hit is None:
        return None
    out, grads = hit
    out = out.clone()
    for n, g in grads.items():
        x = args[n] if isinstance(n, int) else kwargs[n]
        if g is not None and isinstance(x, torch.Tensor) and x.requires_grad:
            change = g * (x - x.detach())
            out = out + (change.sum() if out.dim() == 0 else change)
    return out


def masked_mean(*args, **kwargs):
    hit = _replay("masked_mean", args, kwargs)
    return hit if hit is not None else (0.0 * args[0]).sum()


def probability_ratio(*args, **kwargs):
    hit = _replay("probability_ratio", args, kwargs)
    return hit if hit is not None else 1.0 + 0.0 * args[0]


def clipped_policy_loss(*args, **kwargs):
    hit = _replay("clipped_policy_loss", args, kwargs)
    return hit if hit is not None else (0.0 * args[0]).sum()
'''
    value = """
def clipped_value_loss(*args, **kwargs):
    hit = _replay("clipped_value_loss", args, kwargs)
    return hit if hit is not None else (0.0 * args[0]).sum()
"""
    diag = """
def clip_fraction(*args, **kwargs):
    hit = _replay("clip_fraction", args, kwargs)
    return hit if hit is not None else torch.zeros((), dtype=args[0].dtype)


def approx_kl(*args, **kwargs):
    hit = _replay("approx_kl", args, kwargs)
    return hit if hit is not None else torch.zeros((), dtype=args[0].dtype)
"""
    loss = """
def normalize_advantages(*args, **kwargs):
    hit = _replay("normalize_advantages", args, kwargs)
    return hit if hit is not None else torch.zeros_like(args[0])


def ppo_loss(*args, **kwargs):
    hit = _replay("ppo_loss", args, kwargs)
    if hit is not None:
        return hit
    logits, values = args[0], args[3]
    return (0.0 * logits).sum() + (0.0 * values).sum()
"""
    return {POLICY: policy, VALUE: value, DIAG: diag, LOSS: loss}


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
        lambda reference: recorder(reference, str(course / "record")),
        SEED_A,
    )


def test_source_notebook_is_stored_clean():
    ASSIGNMENT.check_source_is_clean({POLICY, VALUE, DIAG, LOSS}, POINTS)
    assert sum(POINTS.values()) == 10


def _hidden_setup() -> dict:
    """The namespace of the hidden set-up (the first test cell's hidden part), run here without the
    guard."""
    nb = grading.nbformat.read(ASSIGNMENT.source, as_version=4)
    setup = next(
        c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == TEST_POLICY
    )
    setup = setup.split("### BEGIN HIDDEN TESTS", 1)[1].split("### END HIDDEN TESTS", 1)[0]
    body, guard = setup.rsplit("\n_hidden_block_rlkit()\n", 1)
    assert guard.lstrip().startswith("# ---- End of the grading set-up."), (
        "the set-up should end with the guard"
    )
    namespace: dict = {"__name__": "hidden_setup"}
    exec(compile(body, "hidden_setup", "exec"), namespace)  # noqa: S102 - our own notebook's set-up, without the guard
    return namespace


def test_hidden_references_agree_with_rlkit():
    """The hidden tests' hand-written references (run here without the guard) agree with
    rlkit.losses (masked_mean, clipped_policy_loss, clipped_value_loss, clip_fraction, approx_kl,
    masked_whiten, and the PPO loss made of them) and, on the cases without a mask, with
    rlkit.ppo.ppo_loss itself: values and gradients, on the hidden cases of two seeds."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from torch.distributions import Categorical

    from rlkit import losses, ppo

    def close(got, want):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)

    namespace = _hidden_setup()
    for seed in (int(SEED_A), int(DEFAULT_SEED)):
        namespace["GRADING_SEED"] = seed
        for case in namespace["_hidden_ratio_cases"](1) + namespace["_hidden_ratio_cases"](3):
            close(
                losses.masked_mean(case["logprobs"], case["mask"]),
                namespace["_hidden_masked_mean"](case, "logprobs"),
            )
            logprobs = case["logprobs"].clone().requires_grad_(True)
            loss = losses.clipped_policy_loss(
                logprobs, case["old_logprobs"], case["advantages"], case["clip_eps"], case["mask"]
            )
            loss.backward()
            for got, want in zip(
                (loss.detach(), logprobs.grad), namespace["_hidden_policy_loss"](case)
            ):
                close(got, want)
            diagnostics = (
                losses.clip_fraction(
                    case["logprobs"], case["old_logprobs"], case["clip_eps"], case["mask"]
                ),
                losses.approx_kl(case["logprobs"], case["old_logprobs"], case["mask"]),
            )
            for got, want in zip(diagnostics, namespace["_hidden_diagnostics"](case)):
                close(got, want)
        for case in namespace["_hidden_value_cases"](2):
            values = case["values"].clone().requires_grad_(True)
            loss = losses.clipped_value_loss(
                values, case["old_values"], case["returns"], case["clip_eps"], case["mask"]
            )
            loss.backward()
            for got, want in zip(
                (loss.detach(), values.grad), namespace["_hidden_value_loss"](case)
            ):
                close(got, want)
        for case in namespace["_hidden_loss_cases"](4):
            close(
                losses.masked_whiten(case["advantages"], case["mask"]),
                namespace["_hidden_normalized"](case),
            )
            want = namespace["_hidden_ppo_loss"](case)
            logits = case["logits"].clone().requires_grad_(True)
            values = case["values"].clone().requires_grad_(True)
            policy, mask = Categorical(logits=logits), case["mask"]
            advantages = (
                losses.masked_whiten(case["advantages"], mask)
                if case["normalize"]
                else case["advantages"]
            )
            loss = (
                losses.clipped_policy_loss(
                    policy.log_prob(case["actions"]),
                    case["old_logprobs"],
                    advantages,
                    case["clip_eps"],
                    mask,
                )
                + case["vf_coef"]
                * losses.clipped_value_loss(
                    values, case["old_values"], case["returns"], case["value_clip_eps"], mask
                )
                - case["ent_coef"] * losses.masked_mean(losses.entropy(logits), mask)
            )
            loss.backward()
            for got, expected in zip((loss.detach(), logits.grad, values.grad), want):
                close(got, expected)
            if mask is None:  # rlkit's PPO update has no padding
                logits = case["logits"].clone().requires_grad_(True)
                values = case["values"].clone().requires_grad_(True)
                agent = SimpleNamespace(
                    log_prob_entropy_and_value=lambda obs, actions, logits=logits, values=values: (
                        Categorical(logits=logits).log_prob(actions),
                        Categorical(logits=logits).entropy(),
                        values,
                    )
                )
                minibatch = ppo.Batch(
                    obs=None,
                    actions=case["actions"],
                    logprobs=case["old_logprobs"],
                    values=case["old_values"],
                    advantages=case["advantages"],
                    returns=case["returns"],
                )
                config = SimpleNamespace(
                    value_clip_eps=case["value_clip_eps"],
                    vf_coef=case["vf_coef"],
                    ent_coef=case["ent_coef"],
                    normalize_advantages=case["normalize"],
                )
                loss, _ = ppo.ppo_loss(agent, minibatch, config, case["clip_eps"])
                loss.backward()
                for got, expected in zip((loss.detach(), logits.grad, values.grad), want):
                    close(got, expected)


def test_hidden_cases_cover_the_edges():
    """The hidden cases hold what the mistakes need: flat and padded batches (rows of different
    lengths, padding full of garbage), clip ranges other than 0.2, ratios clipped on both sides with
    advantages of both signs, no value clipping and value clipping, and each coefficient at 0."""
    torch = pytest.importorskip("torch")
    namespace = _hidden_setup()
    namespace["GRADING_SEED"] = int(SEED_A)
    ratio_cases = namespace["_hidden_ratio_cases"](1)
    assert any(c["mask"] is None for c in ratio_cases)
    assert any(
        c["mask"] is not None and len(set(c["mask"].sum(dim=1).tolist())) > 1 for c in ratio_cases
    )
    assert any(c["clip_eps"] != 0.2 for c in ratio_cases)
    sides = set()
    for c in ratio_cases:
        ratio = torch.exp(c["logprobs"] - c["old_logprobs"])
        valid = torch.ones_like(ratio, dtype=torch.bool) if c["mask"] is None else c["mask"].bool()
        for low, sign in ((True, 1), (True, -1), (False, 1), (False, -1)):
            outside = ratio < 1 - c["clip_eps"] if low else ratio > 1 + c["clip_eps"]
            if (outside & valid & (sign * c["advantages"] > 0)).any():
                sides.add((low, sign))
    assert len(sides) == 4, sides
    value_cases = namespace["_hidden_value_cases"](2)
    assert {c["clip_eps"] is None for c in value_cases} == {True, False}
    loss_cases = namespace["_hidden_loss_cases"](4)
    assert {c["vf_coef"] == 0 for c in loss_cases} == {True, False}
    assert {c["ent_coef"] == 0 for c in loss_cases} == {True, False}
    assert {c["normalize"] for c in loss_cases} == {True, False}
    assert {c["value_clip_eps"] is None for c in loss_cases} == {True, False}


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


@pytest.mark.parametrize("name", RUN_OFF)
def test_without_a_trust_region_one_batch_moves_the_policy_too_far(course, graded, name):
    """The visible training check already fails: 40 epochs on one batch move the policy by a KL more
    than twice the limit."""
    message = ASSIGNMENT.errors(course, name)[TEST_TRAIN]
    assert message.startswith(
        "AssertionError: after 40 epochs on one batch the policy moved by KL = "
    ), message
    moved = float(message.split("KL = ", 1)[1].split(":", 1)[0])
    assert moved > 2 * KL_LIMIT, message


def test_the_surrogate_with_the_wrong_sign_makes_the_policy_worse(course, graded):
    message = ASSIGNMENT.errors(course, "g_surrogate_not_negated")[TEST_TRAIN]
    assert message.startswith(
        "AssertionError: after 40 epochs on one batch the expected reward should go up"
    ), message
    assert float(message.rsplit("closed ", 1)[1].split("%", 1)[0]) < 0, message


def test_detaching_old_logprobs_is_checked_by_their_gradient_and_by_training(course, graded):
    """The visible checks catch the gradient into old_logprobs; with one step per batch, where the
    old log-probabilities are those of the same forward pass, the policy's gradient is 0 and nothing
    is learned."""
    errors = ASSIGNMENT.errors(course, "d_old_logprobs_not_detached")
    assert "a gradient flows into old_logprobs" in errors[TEST_POLICY], errors[TEST_POLICY]
    assert "a gradient flows into old_logprobs" in errors[TEST_LOSS], errors[TEST_LOSS]
    message = errors[TEST_TRAIN]
    assert message.startswith(
        "AssertionError: with one step per batch the policy should close 50% of the gap or "
        "more, not 0.0%"
    ), message


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
    for cell in (TEST_POLICY, TEST_LOSS, TEST_TRAIN):
        assert grading.blocked(errors[cell]), (cell, errors[cell])
    if name == "cheat_imports_rlkit":
        for cell in (VALUE, DIAG):
            assert grading.blocked(errors.get(cell, "")), (
                f"the import after the guard must fail in {cell}"
            )


def test_hidden_cases_change_with_the_grading_seed(course, graded):
    """A memoriser replays the outputs recorded under SEED_A: full marks under SEED_A, none under
    SEED_B."""
    assert any((course / "record").iterdir())
    memorizer_cells = memorizer(str(course / "record"))
    ASSIGNMENT.check_memorizer_needs_the_seed(course, memorizer_cells, POINTS, SEED_A, SEED_B)


def test_feedback_does_not_show_hidden_tests(course, graded):
    secrets = (
        "def _hidden_policy_loss",
        "def _hidden_ppo_loss",
        "def _hidden_normalized",
        "def _hidden_training_seeds",
    )
    ASSIGNMENT.check_feedback_hides(course, "f_hard_coded_clip_range", DEFAULT_SEED, secrets)
