"""The `kstore grade` and `kstore exercises` subcommands (added to `kstore`'s parser by cli.py)."""

from __future__ import annotations

import argparse


def add_parsers(sub) -> None:
    from . import generate, grade
    g = sub.add_parser("grade", help="grade submitted exercise notebooks offline (CSV/JSON report)",
                       description="Grade submitted exercise notebooks offline: each in its own process with time and memory limits; per-test points to CSV (and JSON).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    grade.add_arguments(g)
    g.set_defaults(func=grade.run)
    e = sub.add_parser("exercises", help="generate exercises/ from solutions/ (or --check it)",
                       description=generate.__doc__.split("\n\n")[0])
    generate.add_arguments(e)
    e.set_defaults(func=generate.run)
