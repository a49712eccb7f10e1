"""Reading course notebooks: their cells and tags, and the definitions their code makes.

Cell roles are cell tags (visible in JupyterLab's property inspector):
* `setup`    — imports and helpers the tasks use;
* `solution` — a task's code, with its task id as a second tag (`ex01.3`); the part between
               `### BEGIN SOLUTION` and `### END SOLUTION` becomes a stub in `exercises/`;
* `check`    — a `check("ex01.3")` cell;
* `demo`     — code that plugs the learner's functions into the live engine;
* `save`     — `save("ex01")`: the learner's passing functions go to their own `my_engine/`.
The grader runs every code cell except `check`, `demo` and `save` cells; untagged cells (a learner's own
helpers) run too.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SKIPPED_WHEN_GRADING = ("check", "demo", "save")


@dataclass(frozen=True)
class CodeCell:
    index: int          # position among all cells (what a learner counts in JupyterLab)
    source: str
    tags: tuple[str, ...]

    @property
    def task(self) -> str | None:
        return next((t for t in self.tags if t.startswith("ex") and "." in t), None)


def source_of(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def load(path: str | Path) -> dict:
    """The notebook as plain JSON (nbformat 4); raises ValueError with a clear reason."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not a text file ({e.reason})") from None
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("not a Jupyter notebook (no list of cells)")
    if nb.get("nbformat") != 4:
        raise ValueError(f"nbformat {nb.get('nbformat')!r}; expected 4")
    return nb


def code_cells(nb: dict) -> list[CodeCell]:
    out = []
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        tags = cell.get("metadata", {}).get("tags", []) if isinstance(cell.get("metadata"), dict) else []
        out.append(CodeCell(i, source_of(cell), tuple(t for t in tags if isinstance(t, str))))
    return out


def exercise_id_of(nb: dict) -> str | None:
    meta = nb.get("metadata", {})
    kstore = meta.get("kstore", {}) if isinstance(meta, dict) else {}
    ex = kstore.get("exercise") if isinstance(kstore, dict) else None
    return ex if isinstance(ex, str) else None


def exec_definitions(path: str | Path) -> dict[str, Any]:
    """Run a notebook's `setup` and `solution` cells (only) in a fresh namespace and return it.
    Used for the solutions: they define functions and have no other effects."""
    nb = load(path)
    ns: dict[str, Any] = {"__name__": f"kstore_solution_{Path(path).stem.replace('-', '_')}"}
    for cell in code_cells(nb):
        if "setup" in cell.tags or "solution" in cell.tags:
            code = compile(cell.source, f"{Path(path).name}[cell {cell.index}]", "exec")
            with contextlib.redirect_stdout(io.StringIO()):     # what a cell says to the learner
                exec(code, ns)
    return ns
