"""The course's structure: each chapter has goals, a live widget, check-yourself and interview
sections and a link to its exercise; the README's course map lists every chapter and matches the
files. (tests/test_notebooks.py runs every notebook.)"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = {f"{n:02d}" for n in range(15)}
NO_EXERCISE = {"00", "13", "14"}      # set-up check, optional, drill
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))


def text_of(nb, kind: str) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == kind)


def test_every_chapter_00_to_14_has_a_notebook():
    present = {p.name[:2] for p in NOTEBOOKS}
    assert present == CHAPTERS, f"missing chapters: {sorted(CHAPTERS - present)}"
    assert len(NOTEBOOKS) == len(CHAPTERS), "two notebooks share a chapter number"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_chapter_structure(path):
    nb = nbformat.read(path, as_version=4)
    md, code = text_of(nb, "markdown"), text_of(nb, "code")
    first = nb.cells[0].source
    assert re.search(r"goals", first, re.I), "the first cell states the learning goals"
    assert re.search(r"why this matters", md, re.I), "a 'why this matters in Kafka' paragraph"
    assert re.search(r"check yourself", md, re.I), "a 'check yourself' section"
    assert re.search(r"interview", md, re.I), "interview questions"
    assert "kstore.widgets" in code or "from kstore import widgets" in code, "a live widget"
    number = path.name[:2]
    if number not in NO_EXERCISE:
        links = re.findall(r"\(\.\./exercises/([^)]+\.ipynb)\)", md)
        assert links, "a link to the chapter's exercise"
        for link in links:
            assert (ROOT / "exercises" / link).exists(), f"linked exercise {link} does not exist"


def test_readme_course_map_matches_the_files():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The course"):]
    section = section[:section.index("\n## ", 5)]
    for path in NOTEBOOKS:
        row = next((line for line in section.splitlines() if line.startswith(f"| {path.name[:2]} |")), None)
        assert row, f"no course-map row for {path.name}"
        assert f"notebooks/{path.name}" in row, f"the row of chapter {path.name[:2]} does not name {path.name}"
        assert "planned" not in row.lower(), f"chapter {path.name[:2]} exists but is marked planned"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(cells[1:3]), "each row has a title and a one-line summary"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_chapters_run_kstore_commands_under_a_progress_bar(path):
    """A `kstore` command run from a chapter goes through `run_kstore`, which shows a bar when the
    subprocess takes a while (a loaded machine can take seconds to start Python); only the
    long-running `kstore serve` is started with Popen (its start-up wait has a `working` bar)."""
    code = text_of(nbformat.read(path, as_version=4), "code")
    direct = re.findall(r'"-m",\s*"kstore",\s*"([a-z-]+)"', code)
    assert all(cmd == "serve" for cmd in direct), \
        f"{path.name} runs kstore {sorted(set(direct) - {'serve'})} without run_kstore"
    if "spark_session(" in code:
        assert re.search(r"with working\([\s\S]*?\):\s*\n\s+spark = spark_session\(", code), \
            "Spark's start (the JVM, 10-20 s) runs under a working bar"


def _chapter(number: str):
    return nbformat.read(next(p for p in NOTEBOOKS if p.name.startswith(number)), as_version=4)


def test_welcome_where_next_links_every_chapter():
    md = text_of(_chapter("00"), "markdown")
    section = md[md.index("## Where next"):]
    for path in NOTEBOOKS[1:]:
        assert f"({path.name})" in section, f"chapter 00's 'Where next' does not link {path.name}"
    assert "(glossary.ipynb)" in section


def test_the_two_metadata_files_are_explained_together():
    """zookeeper.json (a cluster's shared tree) and kstore-cluster-metadata.json (a lone broker's)
    are named and told apart in one place."""
    cells = [c.source for p in NOTEBOOKS for c in nbformat.read(p, as_version=4).cells
             if c.cell_type == "markdown"]
    assert any("zookeeper.json" in s and "kstore-cluster-metadata.json" in s for s in cells)


def test_interview_deck_is_built_one_chapter_group_per_cell():
    nb = _chapter("14")
    deck = [c.source for c in nb.cells if c.cell_type == "code" and "CARDS += [" in c.source]
    assert len(deck) >= 8, "the drill's cards come in one cell per chapter group"
    assert max(len(c.source) for c in nb.cells) < 3000, "no 9.7k-character cell of cards"


def test_notes_on_down_conversion_and_system_calls_are_current():
    """Down-conversion is history since Kafka 4.0 wherever it is mentioned; sendfile saves far
    more than 'half the system calls' (chapter 11 measures thousands against one)."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            text = cell.source.replace("\n", " ")
            for m in re.finditer(r"down-?conver", text, re.I):
                around = text[max(0, m.start() - 300):m.end() + 300]
                assert "4.0" in around, f"{path.name}: a down-conversion note without Kafka 4.0: {around!r}"
            assert "half the system calls" not in text, path.name
