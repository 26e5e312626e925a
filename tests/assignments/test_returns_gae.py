"""The returns-and-GAE assignment end to end: nbgrader releases it, autogrades submissions, and the
marks tell a correct solution from stubs, subtly wrong solutions and calls into rlkit.

Everything runs in a temporary copy of notebooks/assignments, never in the repository. One module-scoped
release and one autograde run serve most tests (a kernel per submission, a few seconds each); the seed
test autogrades twice more.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.assignments import variants as v

pytestmark = pytest.mark.assignments

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbgrader")

REPO = Path(__file__).resolve().parents[2]
COURSE = REPO / "notebooks" / "assignments"
ASSIGNMENT = NOTEBOOK = "returns_gae"
SOURCE_NB = COURSE / "source" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
POINTS = {v.TEST_RETURNS: 3.0, v.TEST_GAE: 4.0, v.TEST_GAE_DONES: 3.0}
SEED_A, SEED_B = "1001", "2002"
DEFAULT_SEED = "2718281"  # the default in the hidden set-up; must not reach the students


def nbgrader(course: Path, *args: str, seed: str | None = None) -> subprocess.CompletedProcess:
    """Run nbgrader in the course folder the way an instructor would."""
    env = dict(os.environ)
    env.pop("RLKIT_GRADING_SEED", None)
    if seed is not None:
        env["RLKIT_GRADING_SEED"] = seed
    bin_dir = str(Path(sys.executable).parent)  # nbgrader shells out to `alembic` when it creates the db
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    # rlkit importable in the grading kernel, so the cheats really reach it and the guard must stop them
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def solution_sources(nb) -> dict[str, str]:
    """grade id -> source of each solution cell."""
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def reference_sources() -> dict[str, str]:
    """The instructor's solutions from the source notebook, without the solution markers."""
    nb = nbformat.read(SOURCE_NB, as_version=4)
    return {grade_id: "\n".join(line for line in source.splitlines() if "### BEGIN SOLUTION" not in line
                                and "### END SOLUTION" not in line)
            for grade_id, source in solution_sources(nb).items()}


def submit(course: Path, student: str, cells: dict[str, str]) -> None:
    """The released notebook with the given solution cells replaced, as a student would hand it in."""
    nb = nbformat.read(course / "release" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in cells:
            cell.source = cells[grade_id].strip("\n")
    out = course / "submitted" / student / ASSIGNMENT
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / f"{NOTEBOOK}.ipynb")


def scores(course: Path, students) -> dict[str, dict[str, float]]:
    """student -> {test cell grade id: score}, read from the gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return {s: {g.name: g.score for g in gb.find_submission_notebook(NOTEBOOK, ASSIGNMENT, s).grades}
                for s in students}


def failed(score: dict[str, float]) -> set[str]:
    return {cell for cell, got in score.items() if got < POINTS[cell]}


def errors(course: Path, student: str) -> dict[str, str]:
    """cell grade id -> 'Name: message' of its error output in the autograded notebook."""
    nb = nbformat.read(course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    out = {}
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                out[cell.metadata["nbgrader"]["grade_id"]] = f"{o.ename}: {o.evalue}"
    return out


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A copy of notebooks/assignments with the assignment released (the `make assignments` step)."""
    root = tmp_path_factory.mktemp("course") / "assignments"
    shutil.copytree(COURSE, root, ignore=shutil.ignore_patterns(
        "release", "submitted", "autograded", "feedback", "gradebook.db", ".ipynb_checkpoints"))
    nbgrader(root, "generate_assignment", ASSIGNMENT, "--force")
    return root


@pytest.fixture(scope="module")
def graded(course) -> dict[str, dict[str, float]]:
    """Every submission below, autograded in one nbgrader run with SEED_A."""
    reference = reference_sources()
    submissions = {"reference": reference, "stubs": {}}
    for name, variant in {**v.WRONG, **v.CHEATS}.items():
        submissions[name] = {**reference, **variant.cells}
    submissions["recorder"] = v.recorder(reference, str(course / "record.pt"))
    for student, cells in submissions.items():
        submit(course, student, cells)
    nbgrader(course, "autograde", ASSIGNMENT, "--create", "--force", seed=SEED_A)
    return scores(course, submissions)


def test_source_notebook_is_stored_clean():
    nb = nbformat.read(SOURCE_NB, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert set(solution_sources(nb)) == {v.RETURNS_CELL, v.GAE_CELL}
    points = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"] for c in code
              if c.metadata["nbgrader"].get("grade")}
    assert points == POINTS


def test_release_has_no_solutions_hidden_tests_or_seed(course):
    source = SOURCE_NB.read_text()
    release = (course / "release" / ASSIGNMENT / f"{NOTEBOOK}.ipynb").read_text()
    solution_lines = [line.strip() for src in solution_sources(nbformat.read(SOURCE_NB, as_version=4)).values()
                      for line in src.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0].splitlines()
                      if line.strip()]
    secrets = ["BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "RLKIT_GRADING_SEED", "GRADING_SEED", DEFAULT_SEED,
               "_hidden_", "rlkit is unavailable", *solution_lines]
    for secret in secrets:
        assert secret in source, f"test is stale: {secret!r} is not in the source notebook"
        assert secret not in release, f"the released notebook leaks {secret!r}"
    nb = nbformat.read(course / "release" / ASSIGNMENT / f"{NOTEBOOK}.ipynb", as_version=4)
    for grade_id, src in solution_sources(nb).items():
        assert "raise NotImplementedError()" in src, f"solution cell {grade_id} has no stub"
    assert all(c.get("outputs", []) == [] for c in nb.cells)


def test_reference_solution_gets_full_marks(graded):
    assert graded["reference"] == POINTS


def test_recorder_gets_full_marks(graded):
    assert graded["recorder"] == POINTS  # it is the reference plus a side effect, needed below


def test_unmodified_release_gets_zero(graded):
    assert graded["stubs"] == {cell: 0.0 for cell in POINTS}


@pytest.mark.parametrize("name", sorted(v.WRONG))
def test_wrong_solution_loses_exactly_the_cells_it_breaks(graded, name):
    variant = v.WRONG[name]
    assert failed(graded[name]) == variant.fails, f"{name} ({variant.why})"
    assert all(graded[name][cell] == 0.0 for cell in variant.fails)


@pytest.mark.parametrize("name", sorted(v.CHEATS))
def test_calling_rlkit_earns_nothing_on_the_cells_it_cheats_on(course, graded, name):
    variant = v.CHEATS[name]
    assert failed(graded[name]) == variant.fails, f"{name} ({variant.why})"
    # They fail because the guard stopped rlkit (which the kernel can import), not for another reason:
    # a test cell shows the guard's error, or a NameError because its solution cell did (an import of
    # rlkit that runs after the first test cell).
    def blocked(message):  # RuntimeError when called, ImportError when imported
        return message.endswith("Error: rlkit is unavailable while grading")

    errs = errors(course, name)
    solution_blocked = any(blocked(errs.get(cell, "")) for cell in (v.RETURNS_CELL, v.GAE_CELL))
    for cell in variant.fails:
        message = errs.get(cell, "")
        assert blocked(message) or (message.startswith("NameError") and solution_blocked), \
            f"{name}: {cell} failed with {message!r}"


def test_hidden_cases_change_with_the_grading_seed(course, graded):
    """A memoriser replays the outputs recorded under SEED_A: full marks under SEED_A, none under SEED_B."""
    assert (course / "record.pt").exists()
    for student, seed in (("memorizer_seed_a", SEED_A), ("memorizer_seed_b", SEED_B)):
        submit(course, student, v.memorizer(str(course / "record.pt")))
        nbgrader(course, "autograde", ASSIGNMENT, "--create", "--force", "--student", student, seed=seed)
    got = scores(course, ["memorizer_seed_a", "memorizer_seed_b"])
    assert got["memorizer_seed_a"] == POINTS, "replaying the seed's own cases must pass"
    assert got["memorizer_seed_b"] == {cell: 0.0 for cell in POINTS}, "another seed must draw other cases"
    # The visible checks did not change, so the memoriser fails only in the hidden part.
    for cell, message in errors(course, "memorizer_seed_b").items():
        assert "hidden case" in message, (cell, message)


def test_feedback_does_not_show_hidden_tests(course, graded):
    nbgrader(course, "generate_feedback", ASSIGNMENT, "--force", "--student", "b_ignores_dones")
    html = (course / "feedback" / "b_ignores_dones" / ASSIGNMENT / f"{NOTEBOOK}.html").read_text()
    assert "Visible checks passed." in html
    for secret in ("RLKIT_GRADING_SEED", DEFAULT_SEED, "def _hidden_gae", "_hidden_block_rlkit()"):
        assert secret not in html, f"feedback leaks {secret!r}"
