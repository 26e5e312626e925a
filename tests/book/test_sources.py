"""The book's sources: clean notebooks, one repository URL, included (never pasted) library code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.book.pages import ROOT, count_formulas, source_path, toc_files

# nbgrader's steps write copies of the assignments (with outputs) into these folders of a course;
# they are not the repository's notebooks (.gitignore leaves them out too)
NBGRADER_STEPS = {"release", "submitted", "autograded", "feedback"}
ALL_NOTEBOOKS = sorted(
    p
    for p in (ROOT / "notebooks").rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts
    and not NBGRADER_STEPS & set(p.relative_to(ROOT / "notebooks").parts)
)
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebooks_are_stored_without_outputs(path: Path):
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"cell {index} of {path.name} has stored outputs"
            assert cell["execution_count"] is None, (
                f"cell {index} of {path.name} has an execution count"
            )


@pytest.mark.parametrize(
    "path", [p for p in ALL_NOTEBOOKS if "assignments" not in p.parts], ids=lambda p: p.stem
)
def test_notebook_code_fits_the_book_column_of_100(path: Path):
    """The page shows 100 columns of code (the library's line length) without scrolling sideways."""
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            for line in "".join(cell["source"]).splitlines():
                assert len(line) <= 100, f"cell {index} of {path.name}: {len(line)} columns: {line}"


CHAPTER_NOTEBOOKS = [p for p in ALL_NOTEBOOKS if "assignments" not in p.parts]


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_hand_values_to_the_page_through_rlkit_book(path: Path):
    """Build plumbing stays out of a reader's way: values and figures go to the page through
    rlkit.book's one-line helpers, never a notebook's own fallback or myst-nb's display flags."""
    code = "\n".join(
        "".join(cell["source"])
        for cell in json.loads(path.read_text())["cells"]
        if cell["cell_type"] == "code"
    )
    assert "from rlkit.book import" in code, f"{path.name} does not use rlkit.book"
    for plumbing in ("myst_nb", "def glue", "display=False", "check_page_figure("):
        assert plumbing not in code, f"{path.name} holds book plumbing: {plumbing!r}"


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=lambda p: p.stem)
def test_a_solution_cell_is_folded_in_jupyter_and_in_the_book(path: Path):
    """A cell the book folds (tag hide-input) is folded in JupyterLab too (source_hidden), and the
    other way round: a reader meets the same toggle wherever the notebook opens."""
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        folded_in_book = "hide-input" in cell["metadata"].get("tags", [])
        folded_in_jupyter = cell["metadata"].get("jupyter", {}).get("source_hidden", False)
        assert folded_in_book == folded_in_jupyter, f"cell {index} of {path.name}"


def test_every_toc_entry_has_a_source():
    for doc in toc_files():
        assert source_path(doc).exists()


@pytest.mark.parametrize(
    "path", [p for p in ALL_NOTEBOOKS if "assignments" not in p.parts], ids=lambda p: p.stem
)
def test_first_code_cell_installs_rlkit_from_the_configured_repository(path: Path):
    code_cells = [
        cell for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"
    ]
    first = "".join(code_cells[0]["source"])
    assert 'find_spec("rlkit") is None' in first, (
        f"{path.name}: the first code cell must install rlkit when missing"
    )
    urls = re.findall(r"git\+(https://[^\"' ]+)", first)
    assert urls == [CONFIG["repository"]["url"]], (
        f"{path.name} installs from {urls}, _config.yml says {CONFIG['repository']['url']}"
    )


def test_book_pages_include_code_rather_than_paste_it():
    for doc in toc_files():
        path = source_path(doc)
        if path.suffix != ".md":
            continue
        text = path.read_text()
        for block in re.findall(
            r"^```+\s*(?:python|\{code-block\}\s*python)\s*$(.*?)^```+", text, re.M | re.S
        ):
            assert "def " not in block, (
                f"{path.name} pastes a function: include it with literalinclude + :pyobject:"
            )
        for target, name in re.findall(r"\{literalinclude\}\s*(\S+)\s*\n:pyobject:\s*(\S+)", text):
            source = (path.parent / target).resolve().read_text()
            owner, _, method = name.rpartition(".")  # Class.method names a method
            found = re.search(rf"^(def|class) {re.escape(owner or method)}\b", source, re.M)
            if found and owner:
                found = re.search(rf"^    def {re.escape(method)}\b", source[found.end() :], re.M)
            assert found, f"{path.name}: {target} has no {name}"


def test_formula_counter_counts_what_a_reader_sees():
    text = (
        "Inline $a_t$ and $b$, a price of 5 dollars.\n\n$$\nx = 1\n$$ (eq-x)\n\n```python\ny = "
        "'$not$'\n```\n{math}`c`"
    )
    assert count_formulas(text) == 4


INCLUDE = re.compile(r"^```\{literalinclude\} (\S+)\n:pyobject: (\S+)", re.M)
EQUATION_LABEL = re.compile(r"eq-[a-z0-9-]+")


def pyobject_source(path: Path, dotted: str) -> str:
    """The source of the function or class ``dotted`` (``Class.method`` allowed) in ``path``, as
    literalinclude's :pyobject: finds it."""
    import ast

    text = path.read_text()
    body, node = ast.parse(text).body, None
    for name in dotted.split("."):
        node = next(
            n
            for n in body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.name == name
        )
        body = getattr(node, "body", [])
    return ast.get_source_segment(text, node)


CHAPTERS = [
    source_path(doc)
    for doc in toc_files()
    if re.search(r"/ch\d\d_", "/" + doc) and source_path(doc).suffix == ".md"
]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_included_code_sits_under_the_equations_its_docstrings_cite(path: Path):
    """Each equation label that an included block's docstring cites is referenced ({eq}, with a
    hover preview) in the prose of the block's own section, and the page's code section says which
    number each cited label shows as, so that a reader can go from `eq-bt-loss` to (9.3)."""
    text = path.read_text()
    legend = set(re.findall(r"`(eq-[a-z0-9-]+)`\s+is\s+\{eq\}`\1`", text))
    for match in INCLUDE.finditer(text):
        labels = set(
            EQUATION_LABEL.findall(
                pyobject_source((path.parent / match.group(1)).resolve(), match.group(2))
            )
        )
        before = text[: match.start()]
        section = re.sub(r"^```+.*?^```+", "", before[before.rfind("\n#") :], flags=re.M | re.S)
        referenced = set(re.findall(r"\{eq\}`(eq-[a-z0-9-]+)`", section))
        assert labels <= referenced, (
            f"{path.name}: the section above {match.group(2)} does not cite "
            f"{sorted(labels - referenced)}"
        )
        assert labels <= legend, (
            f"{path.name}: the code section does not say which number {sorted(labels - legend)} is"
        )
