"""Notes for the instructor, not points: a task whose function *is* the published solution (the same
code once docstrings, annotations and the names of local variables are set aside), or which calls
kstore's own implementation of the very thing the task asks for (`kstore.varint.write_varint` for
ex01.1). Run by the harness on the notebook's text; the learner's code is never run for this.
"""

from __future__ import annotations

import ast
import re
from typing import Iterable

from . import notebooks
from .exercises import EXERCISES

#: kstore names that do a task's job, beyond a function of the same name.
COUNTERPARTS: dict[str, tuple[str, ...]] = {
    "encode_batch": ("build_batch", "RecordBatch"),
    "largest_lower_bound_slot": ("largest_lower_bound_slot_for",),
    "offset_index_lookup": ("OffsetIndex",),
    "segment_file_name": ("filename_prefix_from_offset",),
    "base_offset_from_file_name": ("offset_from_file_name",),
    "offset_for_timestamp": ("find_offset_by_timestamp",),
    "valid_prefix_length": ("recover",),
    "retention_time_breached": ("retention_ms_breached",),
    "size_breach_count": ("retention_size_breached",),
    "compact": ("LogCleaner", "clean_log"),
    "encode_offset_commit": ("OffsetCommitKey", "OffsetCommitValue"),
    "decode_offset_commit": ("OffsetCommitKey", "OffsetCommitValue", "decode_offset_commit_value"),
    "fetch_range": ("FetchDataInfo",),
    "send_range": ("send_to", "FileSlice"),
    "serve_fetch": ("send_to", "FileSlice", "KafkaServer"),
}


def _parse(source: str) -> ast.Module | None:
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except (SyntaxError, ValueError):
        return None


def definitions(sources: Iterable[str]) -> tuple[dict[str, ast.FunctionDef], dict[str, str]]:
    """(the last top-level definition of each function, local name → the kstore path it imports)."""
    defs: dict[str, ast.FunctionDef] = {}
    imports: dict[str, str] = {}
    for source in sources:
        tree = _parse(source)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "kstore":
                        imports[a.asname or a.name.split(".")[0]] = a.name if a.asname else "kstore"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kstore":
                for a in node.names:
                    imports[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs[node.name] = node
    return defs, imports


class _Normalise(ast.NodeTransformer):
    """Drop docstrings and annotations; number the function's own names in order of appearance."""

    def __init__(self):
        self.names: dict[str, str] = {}

    def _local(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_FunctionDef(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:] or [ast.Pass()]
        node.body, node.returns, node.name = body, None, "f"
        for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
            a.annotation = None
            a.arg = self._local(a.arg)
        self.generic_visit(node)
        return node

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Store) or node.id in self.names:
            node.id = self._local(node.id)
        return node

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        return ast.Assign(targets=[node.target], value=node.value or ast.Constant(None))


def fingerprint(fn: ast.FunctionDef) -> str:
    import copy
    return ast.dump(_Normalise().visit(copy.deepcopy(fn)), annotate_fields=False, include_attributes=False)


def _kstore_uses(fn: ast.FunctionDef, imports: dict[str, str]) -> set[str]:
    """The kstore paths the function's body refers to ('kstore.varint.write_varint')."""
    used = set()
    for node in ast.walk(fn):
        if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(getattr(node, "ctx", None), ast.Load):
            parts = []
            cur = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in imports:
                used.add(".".join([imports[cur.id], *reversed(parts)]))
    return used


def _solution_sources(exercise_id: str) -> list[str]:
    nb = notebooks.load(EXERCISES[exercise_id].solution_path)
    return [c.source for c in notebooks.code_cells(nb) if "setup" in c.tags or "solution" in c.tags]


def notes(sources: list[str], exercise_id: str) -> list[str]:
    """One note per task whose function is the published solution or calls kstore's own."""
    mine, imports = definitions(sources)
    try:
        reference, _ = definitions(_solution_sources(exercise_id))
    except (OSError, ValueError):
        reference = {}
    out = []
    for task in EXERCISES[exercise_id].tasks:
        for name in task.functions:
            fn = mine.get(name)
            if fn is None:
                continue
            ref = reference.get(name)
            if ref is not None and fingerprint(fn) == fingerprint(ref):
                out.append(f"{task.id}: {name} is the published solution (the same code up to names, "
                           f"comments and docstrings)")
                continue
            wanted = {name, *COUNTERPARTS.get(name, ())}
            hits = sorted(u for u in _kstore_uses(fn, imports) if wanted & set(re.split(r"\.", u)[1:]))
            if hits:
                out.append(f"{task.id}: {name} calls kstore's own implementation ({', '.join(hits)})")
    return out
