"""The returns-and-GAE assignment end to end: nbgrader releases it, autogrades submissions, and the
marks tell a correct solution from stubs, subtly wrong solutions and calls into rlkit.

Everything runs in a temporary copy of notebooks/assignments, never in the repository (see
grading.py). One module-scoped release and one autograde run serve most tests (a kernel per
submission, a few seconds each); the seed test autogrades twice more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.assignments import grading
from tests.assignments import variants as v

pytestmark = pytest.mark.assignments

ASSIGNMENT = grading.Assignment("returns_gae")
POINTS = {v.TEST_RETURNS: 3.0, v.TEST_GAE: 4.0, v.TEST_GAE_DONES: 3.0}
SEED_A, SEED_B = "1001", "2002"
DEFAULT_SEED = "2718281"  # the default in the hidden set-up; must not reach the students


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
        {**v.WRONG, **v.CHEATS},
        lambda reference: v.recorder(reference, str(course / "record.pt")),
        SEED_A,
    )


def test_source_notebook_is_stored_clean():
    ASSIGNMENT.check_source_is_clean({v.RETURNS_CELL, v.GAE_CELL}, POINTS)


def test_release_has_no_solutions_hidden_tests_or_seed(course):
    ASSIGNMENT.check_release_is_clean(course, DEFAULT_SEED)


def test_reference_and_recorder_get_full_marks_and_the_stubs_none(graded):
    ASSIGNMENT.check_graded_marks(graded, POINTS)


@pytest.mark.parametrize("name", sorted(v.WRONG))
def test_wrong_solution_loses_exactly_the_cells_it_breaks(graded, name):
    ASSIGNMENT.check_variant_loses(graded, POINTS, name, v.WRONG[name])


@pytest.mark.parametrize("name", sorted(v.CHEATS))
def test_calling_rlkit_earns_nothing_on_the_cells_it_cheats_on(course, graded, name):
    ASSIGNMENT.check_cheat_is_blocked(
        course, graded, POINTS, name, v.CHEATS[name], {v.RETURNS_CELL, v.GAE_CELL}
    )


def test_hidden_cases_change_with_the_grading_seed(course, graded):
    """A memoriser replays the outputs recorded under SEED_A: full marks under SEED_A, none under
    SEED_B."""
    assert (course / "record.pt").exists()
    memorizer_cells = v.memorizer(str(course / "record.pt"))
    ASSIGNMENT.check_memorizer_needs_the_seed(course, memorizer_cells, POINTS, SEED_A, SEED_B)


def test_feedback_does_not_show_hidden_tests(course, graded):
    secrets = ("def _hidden_gae",)
    ASSIGNMENT.check_feedback_hides(course, "b_ignores_dones", DEFAULT_SEED, secrets)


def test_the_instructors_quick_start_ends_in_a_gradebook_csv(course, graded):
    """The quick start of book/instructors.md, after its autograde: `nbgrader export` writes
    grades.csv with the marks the gradebook holds (the reference 10, the stub 0)."""
    import csv

    page = (grading.REPO / "book" / "instructors.md").read_text()
    quick_start = page.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    for command in ("make setup", "make assignments", "nbgrader autograde returns_gae", "export"):
        assert command in quick_start, f"the quick start lost {command!r}"
    grading.nbgrader(course, "export")
    rows = {row["student_id"]: row for row in csv.DictReader((course / "grades.csv").open())}
    total = sum(POINTS.values())
    assert float(rows["reference"]["raw_score"]) == total == 10.0
    assert float(rows["stubs"]["raw_score"]) == 0.0
