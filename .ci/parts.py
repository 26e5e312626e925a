#!/usr/bin/env python3
"""Run the parts of `make test` in order, time each, and print a timing table at the end.

Usage: parts.py "NAME=COMMAND" ...   A NAME ending in "!" is required: if it fails, the rest is skipped.
Exits 1 if any part failed. Standard library only (it runs before the venv exists).
"""

from __future__ import annotations

import subprocess
import sys
import time


def run_part(name: str, command: str) -> tuple[str, float, str]:
    print(f"\n===== {name} =====\n$ {command}", flush=True)
    start = time.monotonic()
    code = subprocess.call(command, shell=True)
    elapsed = time.monotonic() - start
    return name, elapsed, "ok" if code == 0 else f"FAILED (exit {code})"


def print_table(rows: list[tuple[str, float, str]]) -> None:
    width = max(len(name) for name, _, _ in rows)
    print(
        "\n===== timing of `make test` (CI stops at 90 min on 2 cores, and CI's machines ran parts of"
        " it up to 1.6x slower than a development machine: keep it under 55 min on one) ====="
    )
    for name, seconds, status in rows:
        print(f"{name:<{width}}  {seconds / 60:6.1f} min  {seconds:7.0f} s  {status}")
    total = sum(seconds for _, seconds, _ in rows)
    print(f"{'total':<{width}}  {total / 60:6.1f} min  {total:7.0f} s")


def main(specs: list[str]) -> int:
    rows = []
    for spec in specs:
        name, _, command = spec.partition("=")
        required = name.endswith("!")
        name = name.rstrip("!")
        rows.append(run_part(name, command))
        if required and rows[-1][2] != "ok":
            print(f"\n{name} failed: skipping the remaining parts")
            break
    print_table(rows)
    return 0 if all(status == "ok" for _, _, status in rows) and len(rows) == len(specs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
