"""Stopping the processes a run started (Chapter 13): Ray's servers and workers, torchrun and its
ranks. Whatever is still running after a grace period is killed, so that no test or notebook
leaves a process behind."""

from __future__ import annotations

import contextlib

__all__ = ["stop_processes"]


def stop_processes(processes: list, grace: float = 10.0, terminate: bool = True) -> None:
    """Ends ``processes`` (``psutil.Process`` objects): asks each to stop (SIGTERM, unless
    ``terminate`` is False because they were asked already), waits up to ``grace`` seconds, and
    kills those still running."""
    import psutil

    if terminate:
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=grace)
