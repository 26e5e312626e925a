"""What every assignment test needs: a private copy of the course, nbgrader run as an instructor
would, submissions built from the student release, and the marks and errors read back.

Each assignment is one notebook, ``source/<name>/<name>.ipynb`` under notebooks/assignments.
Everything runs in a temporary copy of that folder, never in the repository. A submission is given
as the source of its solution cells, by nbgrader grade id; a cell it does not give keeps the stub of
the release.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbgrader")

REPO = Path(__file__).resolve().parents[2]
COURSE = REPO / "notebooks" / "assignments"
BLOCKED = (
    "Error: rlkit is unavailable while grading"  # the end of the guard's ImportError / RuntimeError
)


@dataclass(frozen=True)
class Variant:
    """A submission the autograder must tell apart from a correct one."""

    cells: dict[str, str]  # solution-cell grade id -> its source
    fails: frozenset[str]  # the test cells it must fail, and only those
    why: str


def nbgrader(course: Path, *args: str, seed: str | None = None) -> subprocess.CompletedProcess:
    """Run nbgrader in the course folder the way an instructor would."""
    env = dict(os.environ)
    env.pop("RLKIT_GRADING_SEED", None)
    if seed is not None:
        env["RLKIT_GRADING_SEED"] = seed
    # nbgrader shells out to `alembic` when it creates the db
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    # rlkit importable in the grading kernel, so the cheats really reach it and the guard must stop
    # them
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def copy_course(root: Path) -> Path:
    """A copy of notebooks/assignments at ``root``, without anything nbgrader wrote in the
    repository."""
    shutil.copytree(
        COURSE,
        root,
        ignore=shutil.ignore_patterns(
            "release", "submitted", "autograded", "feedback", "gradebook.db", ".ipynb_checkpoints"
        ),
    )
    return root


def solution_sources(nb) -> dict[str, str]:
    """grade id -> source of each solution cell."""
    return {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }


def failed(score: dict[str, float], points: dict[str, float]) -> set[str]:
    """The test cells that did not earn their points."""
    return {cell for cell, got in score.items() if got < points[cell]}


def blocked(message: str) -> bool:
    """An error raised by the grading guard: RuntimeError when rlkit is called, ImportError when
    imported."""
    return message.endswith(BLOCKED)


@dataclass(frozen=True)
class Assignment:
    """One assignment, named like its folder and its notebook."""

    name: str

    @property
    def source(self) -> Path:
        return COURSE / "source" / self.name / f"{self.name}.ipynb"

    def path(
        self, course: Path, step: str, student: str | None = None, suffix: str = ".ipynb"
    ) -> Path:
        """The notebook of a step (release, submitted, autograded, feedback), for a student where it
        has one."""
        folder = course / step if student is None else course / step / student
        return folder / self.name / f"{self.name}{suffix}"

    def reference_sources(self) -> dict[str, str]:
        """The instructor's solutions from the source notebook, without the solution markers."""
        nb = nbformat.read(self.source, as_version=4)
        return {
            grade_id: "\n".join(
                line
                for line in source.splitlines()
                if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line
            )
            for grade_id, source in solution_sources(nb).items()
        }

    def release(self, root: Path) -> Path:
        """A course copy at ``root`` with this assignment released (the `make assignments` step)."""
        course = copy_course(root)
        nbgrader(course, "generate_assignment", self.name, "--force")
        return course

    def submit(self, course: Path, student: str, cells: dict[str, str]) -> None:
        """The released notebook with the given solution cells replaced, as a student would hand it
        in."""
        nb = nbformat.read(self.path(course, "release"), as_version=4)
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id in cells:
                cell.source = cells[grade_id].strip("\n")
        out = self.path(course, "submitted", student)
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)

    def autograde(self, course: Path, seed: str, student: str | None = None) -> None:
        """Autograde every submission (or one student's) with the given grading seed. The course's
        config starts each kernel on Unix sockets: on TCP ports a kernel can lose its port to
        another process (a submission ungraded, a CI run failed)."""
        proc = nbgrader(
            course,
            "autograde",
            self.name,
            "--create",
            "--force",
            *(("--student", student) if student else ()),
            seed=seed,
        )
        assert "running over TCP" not in proc.stdout + proc.stderr, "a grading kernel used TCP"

    def grade_submissions(
        self,
        course: Path,
        variants: dict[str, Variant],
        make_recorder: Callable[[dict[str, str]], dict[str, str]] | None,
        seed: str,
    ) -> dict[str, dict[str, float]]:
        """Submit the reference, the unmodified release ("stubs"), each variant (the reference with
        its cells replaced) and the recorder built from the reference (where there is one);
        autograde them in one run; their scores."""
        reference = self.reference_sources()
        submissions = {"reference": reference, "stubs": {}}
        for name, variant in variants.items():
            submissions[name] = {**reference, **variant.cells}
        if make_recorder is not None:
            submissions["recorder"] = make_recorder(reference)
        for student, cells in submissions.items():
            self.submit(course, student, cells)
        self.autograde(course, seed)
        return self.scores(course, submissions)

    def scores(self, course: Path, students) -> dict[str, dict[str, float]]:
        """student -> {test cell grade id: score}, read from the gradebook."""
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            return {
                s: {
                    g.name: g.score
                    for g in gb.find_submission_notebook(self.name, self.name, s).grades
                }
                for s in students
            }

    def errors(self, course: Path, student: str) -> dict[str, str]:
        """cell grade id -> 'Name: message' of its error output in the autograded notebook."""
        nb = nbformat.read(self.path(course, "autograded", student), as_version=4)
        out = {}
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                if o.output_type == "error":
                    out[cell.metadata["nbgrader"]["grade_id"]] = f"{o.ename}: {o.evalue}"
        return out

    def feedback_html(self, course: Path, student: str) -> str:
        """The feedback page nbgrader makes for one autograded student."""
        nbgrader(course, "generate_feedback", self.name, "--force", "--student", student)
        return self.path(course, "feedback", student, ".html").read_text()

    # ---- Checks shared by every assignment -------------------------------------------------------

    def check_source_is_clean(self, solution_cells: set[str], points: dict[str, float]) -> None:
        """Stored without outputs, with exactly these solution cells and these points per test
        cell."""
        nb = nbformat.read(self.source, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.outputs == [] and c.execution_count is None for c in code)
        assert set(solution_sources(nb)) == solution_cells
        got = {
            c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"]
            for c in code
            if c.metadata["nbgrader"].get("grade")
        }
        assert got == points

    def check_release_is_clean(self, course: Path, default_seed: str) -> None:
        """The released notebook holds no solution, hidden test, seed or guard, and a stub in every
        solution cell; each secret is first checked to be in the source, so the check cannot go
        stale."""
        source = self.source.read_text()
        release = self.path(course, "release").read_text()
        solution_lines = [
            line.strip()
            for src in solution_sources(nbformat.read(self.source, as_version=4)).values()
            for line in src.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0].splitlines()
            if line.strip()
        ]
        secrets = [
            "BEGIN SOLUTION",
            "BEGIN HIDDEN TESTS",
            "RLKIT_GRADING_SEED",
            "GRADING_SEED",
            default_seed,
            "_hidden_",
            "rlkit is unavailable",
            *solution_lines,
        ]
        for secret in secrets:
            # as it reads in the notebook's JSON
            as_stored = json.dumps(secret, ensure_ascii=False)[1:-1]
            assert as_stored in source, f"test is stale: {secret!r} is not in the source notebook"
            assert as_stored not in release, f"the released notebook leaks {secret!r}"
        nb = nbformat.read(self.path(course, "release"), as_version=4)
        for grade_id, src in solution_sources(nb).items():
            assert "raise NotImplementedError()" in src, f"solution cell {grade_id} has no stub"
        assert all(c.get("outputs", []) == [] for c in nb.cells)

    def check_graded_marks(
        self, graded: dict[str, dict[str, float]], points: dict[str, float]
    ) -> None:
        """The reference and the recorder (the reference plus a side effect, where there is one)
        earn full marks, the stubs none."""
        assert graded["reference"] == points
        assert graded.get("recorder", points) == points
        assert graded["stubs"] == {cell: 0.0 for cell in points}

    def check_variant_loses(
        self,
        graded: dict[str, dict[str, float]],
        points: dict[str, float],
        name: str,
        variant: Variant,
        may_also_fail: frozenset = frozenset(),
    ) -> None:
        """A wrong submission loses every point of the cells it breaks, perhaps of
        ``may_also_fail``, no others."""
        lost = failed(graded[name], points)
        assert variant.fails <= lost <= variant.fails | may_also_fail, f"{name} ({variant.why})"
        assert all(graded[name][cell] == 0.0 for cell in lost)

    def check_cheat_is_blocked(
        self,
        course: Path,
        graded: dict[str, dict[str, float]],
        points: dict[str, float],
        name: str,
        variant: Variant,
        solution_cells: set[str],
    ) -> None:
        """A submission that calls rlkit loses exactly the cells it cheats on, and because the guard
        stopped rlkit (which the kernel can import), not for another reason: a test cell shows the
        guard's error, or a NameError because its solution cell did (an import of rlkit that runs
        after the first test cell)."""
        assert failed(graded[name], points) == variant.fails, f"{name} ({variant.why})"
        errors = self.errors(course, name)
        solution_blocked = any(blocked(errors.get(cell, "")) for cell in solution_cells)
        for cell in variant.fails:
            message = errors.get(cell, "")
            assert blocked(message) or (message.startswith("NameError") and solution_blocked), (
                f"{name}: {cell} failed with {message!r}"
            )

    def check_caught_only_by_hidden_cases(self, course: Path, name: str, fails: frozenset) -> None:
        """The mistake passes every visible check: each cell it loses fails on a hidden case."""
        errors = self.errors(course, name)
        assert set(errors) == fails
        for cell, message in errors.items():
            assert "hidden case" in message, (cell, message)

    def check_memorizer_needs_the_seed(
        self,
        course: Path,
        memorizer_cells: dict[str, str],
        points: dict[str, float],
        seed_a: str,
        seed_b: str,
    ) -> None:
        """A memoriser replaying the outputs recorded under ``seed_a`` earns full marks under
        ``seed_a`` and none under ``seed_b``, failing only on hidden cases (the visible checks do
        not change with the seed)."""
        for student, seed in (("memorizer_seed_a", seed_a), ("memorizer_seed_b", seed_b)):
            self.submit(course, student, memorizer_cells)
            self.autograde(course, seed, student)
        got = self.scores(course, ["memorizer_seed_a", "memorizer_seed_b"])
        assert got["memorizer_seed_a"] == points, "replaying the seed's own cases must pass"
        assert got["memorizer_seed_b"] == {cell: 0.0 for cell in points}, (
            "another seed must draw other cases"
        )
        for cell, message in self.errors(course, "memorizer_seed_b").items():
            assert "hidden case" in message, (cell, message)

    def check_feedback_hides(
        self, course: Path, student: str, default_seed: str, secrets: tuple[str, ...]
    ) -> None:
        """The feedback of a student who passed the visible checks shows none of the hidden
        set-up."""
        html = self.feedback_html(course, student)
        assert "Visible checks passed." in html
        for secret in ("RLKIT_GRADING_SEED", default_seed, "_hidden_block_rlkit()", *secrets):
            assert secret not in html, f"feedback leaks {secret!r}"
