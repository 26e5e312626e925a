"""Every notebook as a reader meets it: executed once, in a fresh kernel, read from the book's
cache.

`make book` executes each notebook in a fresh kernel, two at a time (tools/execute_notebooks.py),
and stores the result in _build/.jupyter_cache, where the book build finds it; these tests read that
record instead of executing the notebook a second time. Its time was measured with another notebook
running beside it (but for the few that run alone: `NOTEBOOKS_ALONE` in the Makefile), so the
180-second limit holds on one core of two.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from jupyter_cache import get_cache

from tests.book.pages import CACHE, notebooks

pytestmark = pytest.mark.book
TIME_LIMIT_SECONDS = 180
WARNING = re.compile(r"warn", re.I)


@pytest.fixture(scope="module")
def cache():
    if not CACHE.exists():
        pytest.fail(f"no execution cache at {CACHE}: run `make book` first")
    return get_cache(str(CACHE))


def executed(cache, path):
    try:
        record = cache.match_cache_notebook(nbformat.read(path, as_version=4))
    except KeyError:
        pytest.fail(
            f"{path.name} has no up-to-date execution record: rebuild the book (`make book`)"
        )
    return record, cache.get_cache_bundle(record.pk).nb


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.stem)
def test_notebook_ran_without_errors_or_warnings_in_time(cache, path):
    record, notebook = executed(cache, path)
    seconds = record.data.get("execution_seconds")
    assert seconds is not None and seconds < TIME_LIMIT_SECONDS, f"{path.name} took {seconds} s"
    print(f"{path.name}: {seconds:.1f} s")
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            assert output["output_type"] != "error", f"cell {index} raised {output.get('ename')}"
            if output["output_type"] == "stream" and output["name"] == "stderr":
                assert not WARNING.search(output["text"]), (
                    f"cell {index} wrote a warning to stderr:\n{output['text']}"
                )
