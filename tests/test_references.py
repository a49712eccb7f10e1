"""The project stands alone: every file a notebook, exercise, solution, README, doc, test or engine
comment cites (`something.md`, `something.ipynb`) is in the repository, and every `§N.M` it cites is a
section of the project's own reference, docs/kafka-storage-notes.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTES = ROOT / "docs" / "kafka-storage-notes.md"
CITED_FILE = re.compile(r"(?<![\w/.-])((?:\.{1,2}/)?[\w./-]*[\w-]\.(?:md|ipynb))\b")
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)?)")
URL = re.compile(r"https?://\S+")
# The design documents the project was built from live outside the repository.
OUTSIDE = ("kafka-storage.md", "course-design.md", "kafka-protocol.md", "spark-datasource.md",
           "/work/shared")
PATTERN = re.compile(r"NN|XX|\*")


def repo_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).exists()]


def citing_files() -> list[Path]:
    wanted = []
    for path in repo_files():
        rel = path.relative_to(ROOT)
        top = rel.parts[0]
        if top in ("notebooks", "exercises", "solutions", "docs") and path.suffix in (".ipynb", ".md"):
            wanted.append(path)
        elif rel.name == "README.md" or (top in ("tests", "kstore") and path.suffix == ".py"):
            wanted.append(path)
    return sorted(wanted)


def text_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    return path.read_text(encoding="utf-8")


def notes_sections() -> set[str]:
    """'4', '4.2', … for every `## 4.` / `### 4.2` heading of the notes."""
    found = set()
    for line in NOTES.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{2,3} (\d+)(?:\.(\d+))?[ .]", line)
        if m:
            found.add(m.group(1) if m.group(2) is None else f"{m.group(1)}.{m.group(2)}")
    return found


def cited_files(text: str) -> set[str]:
    """File names cited in `text`, leaving out URLs and patterns such as `NN-title.ipynb`."""
    return {c for c in CITED_FILE.findall(URL.sub(" ", text)) if not PATTERN.search(c)}


def resolves(citation: str, citing: Path, names: set[str], paths: set[str]) -> bool:
    if "/" not in citation.lstrip("./"):
        return Path(citation).name in names
    if (citing.parent / citation).resolve().exists():
        return True
    return citation.lstrip("./") in paths


def test_the_reference_exists_and_has_numbered_sections():
    assert NOTES.exists(), "docs/kafka-storage-notes.md is the project's own reference"
    assert {"1.6", "1.11", "2.6", "4.2", "7.3", "8.2", "9.5", "10.1", "12"} <= notes_sections()


def test_a_missing_citation_is_caught():
    """The checks below can fail: a made-up file and a made-up section are found."""
    files = repo_files()
    names, paths = {p.name for p in files}, {str(p.relative_to(ROOT)) for p in files}
    text = "see kafka-storage.md §1.6 and `../docs/nowhere.ipynb`, and notes §99.1"
    cited = cited_files(text)
    assert cited == {"kafka-storage.md", "../docs/nowhere.ipynb"}
    assert not any(resolves(c, ROOT / "notebooks" / "x.ipynb", names, paths) for c in cited)
    assert "99.1" not in notes_sections()
    assert resolves("../docs/kafka-storage-notes.md", ROOT / "notebooks" / "x.ipynb", names, paths)


@pytest.mark.parametrize("path", citing_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_file_and_section_exists(path):
    files = repo_files()
    names, paths = {p.name for p in files}, {str(p.relative_to(ROOT)) for p in files}
    text = text_of(path)
    if path.suffix == ".py":    # code names files in many ways (fixtures, tmp files): check prose only
        outside = [name for name in OUTSIDE if name in text and path != Path(__file__).resolve()]
        assert not outside, f"{path.relative_to(ROOT)} cites {outside}, which are not in the repository"
    missing = sorted(c for c in cited_files(text) if path.suffix != ".py"
                     and not resolves(c, path, names, paths))
    assert not missing, f"{path.relative_to(ROOT)} cites files the repository does not contain: {missing}"
    sections = notes_sections() | ({"99.1"} if path == Path(__file__).resolve() else set())
    unknown = sorted(set(SECTION.findall(text)) - sections)
    assert not unknown, (f"{path.relative_to(ROOT)} cites §{unknown}, not sections of "
                         "docs/kafka-storage-notes.md")


REPO_PATH = re.compile(r"(?<![\w/.~-])((?:kstore|tests|bench|docs|notebooks|exercises|solutions)/[\w./-]*\w)")


def missing_repo_paths(text: str, files: list[str]) -> list[str]:
    """Paths into the repository's own folders (`kstore/cli.py`, `tests/fixtures/...`) that name
    neither a file nor a folder of it; patterns (`exNN`, `NN-title`) and scratch folders aside."""
    dirs = {str(Path(f).parents[i]) for f in files for i in range(len(Path(f).parents) - 1)}
    known = set(files) | dirs
    return sorted({c for c in REPO_PATH.findall(URL.sub(" ", text))
                   if c not in known and not PATTERN.search(c) and not c.endswith("/tmp")})


def test_a_missing_repo_path_is_caught():
    files = ["kstore/cli.py", "tests/fixtures/kafka-kraft-logs/x/00.log"]
    text = "see kstore/cli.py, tests/fixtures/kafka-kraft-logs and kstore/nowhere.py or bench/exNN.py"
    assert missing_repo_paths(text, files) == ["kstore/nowhere.py"]


@pytest.mark.parametrize("path", [p for p in citing_files() if p.suffix != ".py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_repo_path_exists(path):
    """Beyond .md/.ipynb citations: any `kstore/...`, `tests/...`, `bench/...` path a notebook,
    exercise, solution, README or doc names is in the repository."""
    files = [str(p.relative_to(ROOT)) for p in repo_files()]
    missing = missing_repo_paths(text_of(path), files)
    assert not missing, f"{path.relative_to(ROOT)} names paths the repository does not contain: {missing}"
