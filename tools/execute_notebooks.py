"""Execute the book's notebooks, several at a time, into the execution cache that the book build
reads.

`jupyter-book build` (1.x) executes notebooks one after another. This script runs them first, each
in a fresh kernel in its own folder, `--jobs` at a time, and stores each result the way myst-nb does
(keyed by the notebook's code), so that the build that follows finds every notebook cached and
executes none. Notebooks named with `--alone` need every core for themselves (Chapter 6 measures
two-worker scaling, Chapter 9 trains two seeds side by side): they run after the others, one at a
time. A notebook whose code is already cached is not run again.

jupyter-cache's own parallel executor was not used: it gives each process a fixed chunk of
notebooks, cannot run one alone, and exits 0 when a notebook fails. This script exits 1 and names
every failure.

Usage: python tools/execute_notebooks.py --cache _build/.jupyter_cache --alone ch06_actor_critic
    python tools/execute_notebooks.py --no-cache notebooks/ch02_planning.ipynb # run, store nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat
from jupyter_cache import get_cache
from jupyter_cache.cache.main import CacheBundleIn
from jupyter_cache.executors.utils import single_nb_execution
from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TIMINGS = ROOT / "_build" / "notebook-seconds.json"  # last run's durations: the longest start first


def kernel_config() -> Config:
    """A kernel on Unix sockets, not TCP ports: a TCP port is chosen free and bound by the kernel a
    moment later, and with notebooks and tests running side by side another process can take it in
    between ("Address already in use"). The sockets' files get an absolute name of this kernel's own
    (a relative one would be read from the notebook's folder by the kernel and from ours by the
    client). Windows keeps TCP, the transport Jupyter's kernels support there."""
    if os.name == "nt":
        return Config()
    prefix = os.path.join(tempfile.gettempdir(), f"rlkit-kernel-{uuid.uuid4().hex[:12]}")
    return Config({"KernelManager": {"transport": "ipc", "ip": prefix}})


def execute(path: Path, timeout: int) -> tuple[Path, nbformat.NotebookNode, float, str | None]:
    """Run one notebook top to bottom in a fresh kernel, in its own folder (as the book build
    does)."""
    notebook = nbformat.read(path, as_version=4)
    start = time.monotonic()
    try:  # a kernel that dies or cannot start is this notebook's failure, not the whole run's
        result = single_nb_execution(
            notebook,
            cwd=str(path.parent),
            timeout=timeout,
            allow_errors=False,
            config=kernel_config(),
        )
    except Exception:
        return path, notebook, time.monotonic() - start, traceback.format_exc()
    error = None if result.err is None else (result.exc_string or repr(result.err))
    return path, notebook, result.time, error


def longest_first(paths: list[Path]) -> list[Path]:
    seconds = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
    return sorted(paths, key=lambda path: (-seconds.get(path.stem, 0.0), path.name))


def run(paths: list[Path], jobs: int, timeout: int, cache) -> dict[str, str]:
    """Execute `paths` with `jobs` processes; cache each success; return {notebook: error} for
    failures."""
    failures = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(execute, path, timeout): path for path in longest_first(paths)}
        for future in as_completed(futures):
            if future.exception() is not None:  # the worker process itself died
                failures[futures[future].name] = repr(future.exception())
                continue
            path, notebook, seconds, error = future.result()
            status = "FAILED" if error else "ok"
            print(f"{path.name}: {seconds:6.1f} s  {status}", flush=True)
            record_seconds(path.stem, seconds)
            if error:
                failures[path.name] = error
            elif cache is not None:
                stage = cache.add_nb_to_project(str(path))
                bundle = CacheBundleIn(notebook, stage.uri, data={"execution_seconds": seconds})
                cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)
    return failures


def record_seconds(name: str, seconds: float) -> None:
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    timings = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
    timings[name] = round(seconds, 1)
    TIMINGS.write_text(json.dumps(timings, indent=1, sort_keys=True))


def is_cached(cache, path: Path) -> bool:
    try:
        cache.match_cache_notebook(nbformat.read(path, as_version=4))
    except KeyError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--cache", type=Path, help="the jupyter-cache folder the book build reads")
    where.add_argument(
        "--no-cache", action="store_true", help="execute every notebook, store nothing"
    )
    parser.add_argument(
        "--jobs", type=int, default=2, help="notebooks executed at once (default 2)"
    )
    parser.add_argument(
        "--alone", nargs="*", default=[], help="notebook names run afterwards, alone"
    )
    parser.add_argument("--timeout", type=int, default=180, help="seconds allowed per cell (180)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be an integer >= 1, got {args.jobs}")
    paths = [path.resolve() for path in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    unknown = set(args.alone) - {path.stem for path in paths}
    if unknown:
        parser.error(f"--alone names no notebook being run: {sorted(unknown)}")

    cache = None if args.no_cache else get_cache(str(args.cache))
    if cache is not None:
        paths = [path for path in paths if not is_cached(cache, path)]
    together = [path for path in paths if path.stem not in args.alone]
    alone = [path for path in paths if path.stem in args.alone]
    print(f"executing {len(together)} notebook(s), {args.jobs} at a time, then {len(alone)} alone")
    start = time.monotonic()
    failures = run(together, args.jobs, args.timeout, cache) if together else {}
    failures |= run(alone, 1, args.timeout, cache) if alone else {}
    print(f"notebooks executed in {time.monotonic() - start:.0f} s")
    for name, error in failures.items():
        print(f"\n===== {name} failed =====\n{error}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
