"""The checks every assignment gets, as a test class: an assignment's module subclasses
``StandardAssignmentTests`` and names its notebook, points, solution cells, wrong submissions and
cheats (see test_dqn_targets.py).

One class-scoped release and one autograde run (a kernel per submission, a few seconds each) serve
every test of a class. Everything runs in a temporary copy of notebooks/assignments (grading.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.assignments import grading
from tests.assignments.grading import Variant

GRADING_SEED = "1001"


def hidden_setup(assignment: grading.Assignment) -> dict:
    """The namespace of the source notebook's imports and hidden grading set-up, run here without
    the guard (which would make rlkit unusable for the rest of the test session)."""
    nb = grading.nbformat.read(assignment.source, as_version=4)
    namespace: dict = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.metadata["nbgrader"]["grade_id"] == "install":
            continue
        source = cell.source
        if "### BEGIN HIDDEN TESTS" in source:
            source = source.split("### BEGIN HIDDEN TESTS", 1)[1].split("### END HIDDEN TESTS")[0]
            exec(re.sub(r"^_hidden_block_rlkit\(\)$", "", source, flags=re.M), namespace)
            return namespace
        exec(source, namespace)
    raise AssertionError(f"{assignment.name} has no hidden set-up")


def same_values(first: list, second: list) -> bool:
    """Two lists of tensors and numbers are equal, element by element."""
    import torch

    return len(first) == len(second) and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(first, second)
    )


class StandardAssignmentTests:
    assignment: grading.Assignment
    points: dict[str, float]  # test cell grade id -> points
    solution_cells: frozenset[str]
    wrong: dict[str, Variant]  # subtly wrong solutions, each losing exactly the cells it names
    cheats: dict[str, Variant]  # calls into rlkit, which the grading guard must stop
    default_seed: str  # the default in the hidden set-up; must not reach the students
    feedback_student: str  # a wrong submission whose feedback must not show the hidden tests
    hidden_secrets: tuple[str, ...]  # names that only the hidden tests hold
    hidden_cases: str  # the hidden set-up's function that draws a test cell's cases: f(cell=1)

    def pytest_generate_tests(self, metafunc):
        if "wrong_name" in metafunc.fixturenames:
            metafunc.parametrize("wrong_name", sorted(self.wrong))
        if "cheat_name" in metafunc.fixturenames:
            metafunc.parametrize("cheat_name", sorted(self.cheats))

    @pytest.fixture(scope="class")
    @classmethod
    def course(cls, tmp_path_factory) -> Path:
        """A copy of notebooks/assignments with the assignment released (the `make assignments`
        step)."""
        return cls.assignment.release(tmp_path_factory.mktemp("course") / "assignments")

    @pytest.fixture(scope="class")
    @classmethod
    def graded(cls, course) -> dict[str, dict[str, float]]:
        """The reference, the stubs, every wrong submission and every cheat, autograded in one
        nbgrader run."""
        return cls.assignment.grade_submissions(
            course, {**cls.wrong, **cls.cheats}, None, GRADING_SEED
        )

    def test_source_notebook_is_stored_clean(self):
        self.assignment.check_source_is_clean(set(self.solution_cells), self.points)

    def test_release_has_no_solutions_hidden_tests_or_seed(self, course):
        self.assignment.check_release_is_clean(course, self.default_seed)

    def test_reference_gets_full_marks_and_the_stubs_none(self, graded):
        self.assignment.check_graded_marks(graded, self.points)

    def test_wrong_solution_loses_exactly_the_cells_it_breaks(self, graded, wrong_name):
        self.assignment.check_variant_loses(graded, self.points, wrong_name, self.wrong[wrong_name])

    def test_calling_rlkit_earns_nothing_on_the_cells_it_cheats_on(
        self, course, graded, cheat_name
    ):
        self.assignment.check_cheat_is_blocked(
            course, graded, self.points, cheat_name, self.cheats[cheat_name], self.solution_cells
        )

    def test_the_grading_seed_draws_the_hidden_cases(self, monkeypatch):
        """The hidden cases come from RLKIT_GRADING_SEED: the same seed draws the same cases, and
        another seed others (a memoriser of one term's cases fails the next)."""
        draws = []
        for seed in ("1001", "1001", "2002"):
            monkeypatch.setenv("RLKIT_GRADING_SEED", seed)
            cases = hidden_setup(self.assignment)[self.hidden_cases](cell=1)
            draws.append([value for case in cases for value in case.values()])
        assert same_values(draws[0], draws[1])
        assert not same_values(draws[0], draws[2])

    def test_feedback_does_not_show_hidden_tests(self, course, graded):
        self.assignment.check_feedback_hides(
            course, self.feedback_student, self.default_seed, self.hidden_secrets
        )
