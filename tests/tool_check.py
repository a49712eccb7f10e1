"""Tests that need a system tool (a browser, Java, kcat...): outside CI a missing tool is a SKIP that
says what is missing and the one command that adds it; with CI=true (where .ci/run installs the tools)
it is a FAILURE, so nothing is silently left untested there."""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci(environ=os.environ) -> bool:
    return environ.get("CI", "").strip().lower() == "true"


def require_tool(candidates: list[str], what: str, install: str, environ=os.environ) -> str:
    """The first of `candidates` (absolute paths or names on PATH) that exists; otherwise skip (or
    fail in CI) with "`what` is missing: install it with `install`"."""
    for candidate in candidates:
        found = candidate if os.path.isabs(candidate) and os.access(candidate, os.X_OK) \
            else None if os.path.isabs(candidate) else shutil.which(candidate)
        if found:
            return found
    message = (f"{what} is missing (looked for {', '.join(candidates)}): install it with "
               f"`{install}`")
    if in_ci(environ):
        pytest.fail(message + " — CI=true, so this is a failure, not a skip", pytrace=False)
    pytest.skip(message)
