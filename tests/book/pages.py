"""The book as the table of contents lists it: page sources, built HTML paths, and formula
counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build"
HTML = BUILD / "html"
CACHE = BUILD / ".jupyter_cache"


def _files(entries) -> list[str]:
    found = []
    for entry in entries or []:
        if "file" in entry:
            found.append(entry["file"])
        for key in ("sections", "chapters", "parts"):
            found += _files(entry.get(key))
    return found


def toc_files() -> list[str]:
    """Every document in _toc.yml, root first, as paths without suffix relative to the repo root."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + _files(toc.get("parts")) + _files(toc.get("chapters"))


def source_path(doc: str) -> Path:
    for suffix in (".md", ".ipynb"):
        if (ROOT / f"{doc}{suffix}").exists():
            return ROOT / f"{doc}{suffix}"
    raise FileNotFoundError(f"{doc} in _toc.yml has no .md or .ipynb source")


def notebooks() -> list[Path]:
    return [path for path in map(source_path, toc_files()) if path.suffix == ".ipynb"]


def html_path(doc: str) -> Path:
    return HTML / f"{doc}.html"


def markdown_text(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return path.read_text()


DISPLAY = re.compile(r"\$\$.+?\$\$", re.S)
INLINE = re.compile(r"(?<![\\$])\$(?!\$)[^$\n]+?(?<![\\\s])\$")
MATH_ROLE = re.compile(r"\{math\}`[^`]+`")
MATH_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{math\}", re.M)


def count_formulas(text: str) -> int:
    """Formulas a reader sees: display $$...$$, inline $...$, {math} roles and directives (code
    excluded)."""
    # drop code fences (code, literalinclude, code-cell); keep directive fences that hold prose
    text = re.sub(
        r"^(```+)(?!\s*\{(math|exercise|solution|prf:\w+|note|warning|admonition|tip|important)\}).*?^\1\s*$",
        "",
        text,
        flags=re.M | re.S,
    )
    display = len(DISPLAY.findall(text))
    text = DISPLAY.sub(" ", text)
    return (
        display
        + len(INLINE.findall(text))
        + len(MATH_ROLE.findall(text))
        + len(MATH_DIRECTIVE.findall(text))
    )
