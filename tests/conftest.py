"""Settings for every test: one torch thread, and a cache for results that several tests share.

The networks here are small: a second thread only adds synchronisation, and on a shared 2-core
machine two threads per process slowed some tests more than tenfold. The notebooks make the same
choice. The processes that tests start (the `rlkit` command killed and resumed, nbgrader's kernels)
inherit one thread through OMP_NUM_THREADS: beside two busy xdist workers, a two-thread subprocess
ran 6x slower.

`make test` runs the tests in two pytest-xdist workers. A trained seed that several tests read (a
learning test's per-seed run and the test that compares the seeds) is trained once per run, by
whichever test (and worker) asks first, and stored under a lock; the others wait for it and read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from rlkit.checkpoint import write_atomically

os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


class RunCache:
    """JSON results keyed by name, shared by every worker of one pytest run, each built once."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def get(self, key: str, build: Callable[[], object]) -> object:
        path = self.folder / f"{key}.json"
        with FileLock(f"{path}.lock"):
            if path.exists():
                return json.loads(path.read_text())
            text = json.dumps(build()).encode()
            write_atomically(path, lambda file: file.write(text))  # a reader sees all or nothing
        # the builder gets the same JSON round trip as the readers
        return json.loads(path.read_text())


@pytest.fixture(scope="session")
def run_cache(tmp_path_factory, worker_id) -> RunCache:
    """One folder per pytest run: the workers' common parent of their temporary folders under
    xdist, or RLKIT_TEST_RUN_CACHE where it is set (``make test`` sets it to a new folder, so that
    the benchmarks after the tests read the starting points the tests built)."""
    if os.environ.get("RLKIT_TEST_RUN_CACHE"):
        return RunCache(Path(os.environ["RLKIT_TEST_RUN_CACHE"]))
    base = tmp_path_factory.getbasetemp()
    return RunCache((base if worker_id == "master" else base.parent) / "shared-results")


def pytest_collection_modifyitems(items):
    """The long tests first (learning runs, nbgrader's grading), so that two workers finish
    together instead of one waiting out the last long run while the other has nothing left.
    (``make test`` keeps each module on one worker, so a module-scoped fixture is built once.)"""
    items.sort(key=lambda item: not is_long(item))


def is_long(item) -> bool:
    return item.get_closest_marker("learning") is not None or "assignments" in item.nodeid
