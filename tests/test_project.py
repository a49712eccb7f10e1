"""The project skeleton: layout, set-up files kept in step, notebooks committed clean."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# conda-forge package name -> PyPI name, where the two differ.
CONDA_TO_PYPI = {
    "playwright-python": "playwright",
    "python-confluent-kafka": "confluent-kafka",
}

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def _canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _split(requirement: str) -> tuple[str, str, frozenset[str]]:
    """'pandas>=2.1,<4' -> ('pandas', '', {'>=2.1', '<4'}); extras kept apart; markers refused."""
    m = _NAME.match(requirement)
    assert m, f"cannot parse requirement {requirement!r}"
    name, extras, spec = m.groups()
    assert ";" not in spec, f"environment markers are not mirrored: {requirement!r}"
    clauses = frozenset(c.replace(" ", "") for c in spec.split(",") if c.strip())
    return _canonical(name), extras or "", clauses


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _environment() -> dict:
    with open(ROOT / "environment.yml", encoding="utf-8") as f:
        return yaml.safe_load(f)


def _environment_requirements() -> tuple[dict[str, frozenset[str]], list[str]]:
    """Every package named in environment.yml (conda and pip sections), by PyPI name."""
    env = _environment()
    found: dict[str, frozenset[str]] = {}
    pip_lines: list[str] = []
    for entry in env["dependencies"]:
        if isinstance(entry, dict):
            assert set(entry) == {"pip"}, f"unexpected section in environment.yml: {entry}"
            pip_lines.extend(entry["pip"])
            for line in entry["pip"]:
                if line.startswith("-"):  # options such as "-e .[test]"
                    continue
                name, _, clauses = _split(line)
                assert name not in found, f"{name} is listed twice in environment.yml"
                found[name] = clauses
            continue
        name, _, clauses = _split(str(entry))
        name = CONDA_TO_PYPI.get(name, name)
        assert name not in found, f"{name} is listed twice in environment.yml"
        found[name] = clauses
    return found, pip_lines


def _pyproject_requirements() -> list[str]:
    project = _pyproject()["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["test"])


def test_environment_yml_mirrors_pyproject_ranges():
    in_env, _ = _environment_requirements()
    requirements = _pyproject_requirements()
    assert requirements, "pyproject.toml declares no dependencies"
    problems = []
    for requirement in requirements:
        name, _, clauses = _split(requirement)
        if name not in in_env:
            problems.append(f"{requirement}: missing from environment.yml")
        elif in_env[name] != clauses:
            problems.append(
                f"{requirement}: environment.yml has {','.join(sorted(in_env[name])) or '(any)'}"
            )
    assert not problems, "environment.yml is out of step with pyproject.toml:\n" + "\n".join(problems)


def test_environment_yml_installs_the_package_and_python_311():
    env = _environment()
    assert env["name"] == "kstore"
    assert "conda-forge" in env["channels"]
    conda_entries = [str(e).replace(" ", "") for e in env["dependencies"] if not isinstance(e, dict)]
    assert "python=3.11" in conda_entries
    assert "pip" in conda_entries
    _, pip_lines = _environment_requirements()
    assert "-e .[test]" in [line.strip() for line in pip_lines]
    assert _pyproject()["project"]["requires-python"] == ">=3.11,<3.12"


def test_pyyaml_used_here_is_a_declared_test_dependency():
    names = {_split(r)[0] for r in _pyproject()["project"]["optional-dependencies"]["test"]}
    assert "pyyaml" in names


@pytest.mark.parametrize(
    "path",
    ["kstore", "notebooks", "exercises", "solutions", "tests", "bench", ".ci"],
)
def test_top_level_directories_exist(path):
    assert (ROOT / path).is_dir(), f"{path}/ is missing"


@pytest.mark.parametrize(
    "path", ["README.md", "Makefile", "environment.yml", "pyproject.toml", ".gitignore"]
)
def test_top_level_files_exist(path):
    assert (ROOT / path).is_file(), f"{path} is missing"


def test_ci_run_is_an_executable_bash_script_that_runs_make_test():
    run = ROOT / ".ci" / "run"
    assert run.is_file()
    assert os.access(run, os.X_OK), ".ci/run is not executable"
    text = run.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash") or text.startswith("#!/bin/bash")
    assert "set -euo pipefail" in text
    assert re.search(r"^make test\s*$", text, re.M), ".ci/run must call the README's `make test`"
    subprocess.run(["bash", "-n", str(run)], check=True)


def test_git_keeps_the_executable_bit_of_ci_run():
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        return  # not a git checkout (e.g. an unpacked sdist): the file-mode check above suffices
    out = subprocess.run(
        ["git", "ls-files", "-s", ".ci/run"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    if out:  # tracked: the index must record mode 100755
        assert out.startswith("100755"), f".ci/run is tracked without +x: {out.strip()}"


def test_make_lab_command_is_bound_to_loopback_and_opens_the_course():
    dry = subprocess.run(
        ["make", "-n", "lab", "LAB_ARGS=--no-browser"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"},
    ).stdout
    lab_line = [line for line in dry.splitlines() if " lab " in line and "jupyter" in line]
    assert lab_line, dry
    assert "--ServerApp.ip=127.0.0.1" in lab_line[-1]
    assert "--LabApp.default_url=/lab/tree/notebooks" in lab_line[-1]
    assert f'--ServerApp.root_dir="{ROOT}"' in lab_line[-1]
    assert lab_line[-1].rstrip().endswith("--no-browser")


def test_gitignore_covers_generated_files():
    lines = set((ROOT / ".gitignore").read_text(encoding="utf-8").split())
    for pattern in [".venv/", "__pycache__/", "*.egg-info/", ".pytest_cache/", ".ipynb_checkpoints/"]:
        assert pattern in lines, f".gitignore lacks {pattern}"


def test_kafka_fixture_log_dirs_are_in_the_repo():
    fixtures = ROOT / "tests" / "fixtures" / "kafka-kraft-logs"
    readme = (fixtures / "README.md").read_text(encoding="utf-8")
    assert "MIT License" in readme and "CodeCrafters" in readme
    for commit, size_meta, size_foo in [("510714e", 9333, 80), ("e856b9a", 8630, 150)]:
        base = fixtures / commit
        assert (base / ".kafka_cleanshutdown").is_file(), "hidden files were not copied"
        assert (base / "__cluster_metadata-0" / "00000000000000000000.log").stat().st_size == size_meta
        assert (base / "foo-0" / "00000000000000000000.log").stat().st_size == size_foo
        assert (base / "foo-0" / "00000000000000000000.index").stat().st_size == 0


def _notebooks_to_check() -> list[Path]:
    paths: set[Path] = set()
    if (ROOT / ".git").exists() and shutil.which("git"):
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", "*.ipynb"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        paths.update(ROOT / p for p in out.decode().split("\0") if p)
    for folder in ("notebooks", "exercises", "solutions"):
        paths.update(
            p for p in (ROOT / folder).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
        )
    return sorted(p for p in paths if p.exists())


def test_notebooks_are_committed_without_outputs():
    notebooks = _notebooks_to_check()
    assert notebooks, "no notebook found (notebooks/ should hold at least 00)"
    dirty = []
    for path in notebooks:
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert nb.get("nbformat") == 4, f"{path.relative_to(ROOT)}: not an nbformat-4 notebook"
        for i, cell in enumerate(nb["cells"]):
            if cell.get("cell_type") != "code":
                continue
            if cell.get("outputs"):
                dirty.append(f"{path.relative_to(ROOT)} cell {i}: has outputs")
            if cell.get("execution_count") is not None:
                dirty.append(f"{path.relative_to(ROOT)} cell {i}: has an execution count")
    assert not dirty, "clear the outputs before committing:\n" + "\n".join(dirty)
