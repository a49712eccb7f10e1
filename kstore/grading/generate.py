"""Generate `exercises/` from `solutions/`: every `### BEGIN SOLUTION` … `### END SOLUTION` block
becomes `raise NotImplementedError(...)` (nbgrader's convention), outputs are cleared.

    kstore exercises            # (re)write exercises/NN-*.ipynb
    kstore exercises --check    # exit 1 if exercises/ is out of date (what the tests run)
    python -m kstore.grading.generate [--check]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from . import notebooks
from .exercises import EXERCISES, EXERCISES_DIR, SOLUTIONS_DIR

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"


def stub_line(indent: str, task_id: str | None) -> str:
    what = f"{task_id}: " if task_id else ""
    return f'{indent}raise NotImplementedError("{what}replace this line with your code")'


def strip_solutions(source: str, task_id: str | None = None) -> str:
    """Replace each solution block with a stub at the indentation of its BEGIN marker."""
    out, inside = [], False
    for n, line in enumerate(source.split("\n"), 1):
        marker = line.strip()
        if marker.startswith(BEGIN):
            if inside:
                raise ValueError(f"line {n}: {BEGIN} inside another solution block")
            inside = True
            out.append(stub_line(line[:len(line) - len(line.lstrip())], task_id))
        elif marker.startswith(END):
            if not inside:
                raise ValueError(f"line {n}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"a {BEGIN} block is not closed")
    return "\n".join(out)


def exercise_notebook(solution: dict, name: str) -> dict:
    nb = copy.deepcopy(solution)
    for i, cell in enumerate(nb["cells"]):
        src = notebooks.source_of(cell)
        if BEGIN in src:
            tags = cell.get("metadata", {}).get("tags", [])
            task = next((t for t in tags if t.startswith("ex") and "." in t), None)
            try:
                src = strip_solutions(src, task)
            except ValueError as e:
                raise ValueError(f"cell {i}: {e}") from None
        cell["source"] = src
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    nb.setdefault("metadata", {}).setdefault("kstore", {})["generated_from"] = f"solutions/{name}"
    return nb


def render(nb: dict) -> str:
    """The notebook as nbformat writes it (1-space indent, sorted keys, trailing newline)."""
    import nbformat
    text = nbformat.v4.writes_json(nbformat.from_dict(nb))    # nbformat.writes minus the slow validation
    return text if text.endswith("\n") else text + "\n"


def expected_exercises(solutions_dir: Path = SOLUTIONS_DIR) -> dict[str, str]:
    """exercise file name → the text it must have."""
    out = {}
    for ex in EXERCISES.values():
        path = solutions_dir / ex.notebook
        if not path.exists():
            continue
        out[ex.notebook] = render(exercise_notebook(notebooks.load(path), ex.notebook))
    return out


def out_of_date(solutions_dir: Path = SOLUTIONS_DIR, exercises_dir: Path = EXERCISES_DIR) -> list[str]:
    problems = []
    expected = expected_exercises(solutions_dir)
    for name, text in expected.items():
        path = exercises_dir / name
        if not path.exists():
            problems.append(f"exercises/{name} is missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"exercises/{name} differs from what solutions/{name} generates")
    for path in sorted(exercises_dir.glob("*.ipynb")):
        if path.name not in expected:
            problems.append(f"exercises/{path.name} has no solution notebook")
    return problems


def generate(solutions_dir: Path = SOLUTIONS_DIR, exercises_dir: Path = EXERCISES_DIR) -> list[str]:
    written = []
    exercises_dir.mkdir(parents=True, exist_ok=True)
    for name, text in expected_exercises(solutions_dir).items():
        path = exercises_dir / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(str(path))
    return written


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true",
                   help="only check that exercises/ matches solutions/ (exit 1 if not)")


def run(args: argparse.Namespace) -> int:
    if args.check:
        problems = out_of_date()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("exercises/ is out of date: run `kstore exercises`", file=sys.stderr)
            return 1
        print(f"exercises/ is up to date ({len(expected_exercises())} notebooks)")
        return 0
    written = generate()
    for w in written:
        print(f"wrote {w}")
    print(f"exercises/ is up to date ({len(expected_exercises())} notebooks, {len(written)} written)")
    from ..my_engine import write_solutions_engine     # the solutions' engine, handed in with ex12's solution
    print(f"{write_solutions_engine()} is the solutions' functions as save() writes them")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kstore.grading.generate", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
