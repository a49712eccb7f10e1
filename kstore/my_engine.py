"""Your engine: the functions you wrote in the exercises, saved chapter by chapter, and one switch
that runs kstore with all of them plugged in.

In an exercise notebook (the last cell):

    from kstore.my_engine import save
    save("ex04")       # your PASSING functions of exercise 04 → my_engine/ch04_finding_a_message.py

Each chapter's file is plain Python you own: the functions' source plus the imports and helpers they
use, rewritten on every save (diff it, edit it, import it: `from my_engine.ch01_record_batch import
write_varint`). Only functions whose task's tests pass are saved.

Then, in a notebook or at the command line:

    import kstore; kstore.use_my_engine("my_engine")     # prints which parts are yours
    kstore serve --log-dir data --my-engine my_engine/

composes the per-chapter plugs of `kstore.grading.live` for every part you saved; where you have not
written a part, kstore's own code serves it.

Not every saved function is called by a serving broker: encode_batch (kstore's batch builder
encodes each record with your encode_record), compact (the cleaner's copy loop is kstore's; it keeps
and groups by your rules), range_assign (assignment runs in the clients) and after_crash (a model of
what a consumer re-reads). They are saved
and graded by their own tests; the status line and the capstone list them.
`send_range` runs where the engine sends a `FileSlice` itself (the chapter 11 demos); behind
`kstore serve` the network server sends each Fetch response's file slice with chapter 12's
`serve_fetch` when you saved it, else with chapter 11's `send_range` when you saved that (its own
non-blocking `os.sendfile` loop otherwise).

From scratch: define whole components as classes in `my_engine/from_scratch.py` (save() never
touches it) — `OffsetIndex` (every segment's .index), `OffsetMap` (the cleaner's key → offset map),
`RollPolicy` (its `should_roll(...)` decides every roll) — and the same switch plugs them in.

The capstone (chapter 12, ex12.2): `load_engine("my_engine")` in the exercise 12 notebook puts
your saved functions in the notebook, and six graded checks run them as one engine
(`kstore.grading.capstone`); `capstone("my_engine")` runs the same checks here and prints them.

This runs YOUR code inside the broker process that serves real clients, on your machine: that is the
point (your engine, your data). It is never done by the grader: `kstore grade` runs learner code only
in its confined worker, and `save()` / `use_my_engine()` do nothing while a notebook is being graded
(`load_engine()` does run there: in the confined learner process, loading the learner's own files).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import importlib.util
import inspect
import logging
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .grading.exercises import EXERCISES, FUNCTION_TASK, Exercise

DEFAULT_FOLDER = "my_engine"
log = logging.getLogger("kstore.my_engine")

# The parts of the engine a learner can own: (name in the status line, the functions it needs).
# A part is yours when every function it needs is saved.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("varints", ("write_varint", "read_varint", "write_varlong")),
    ("record", ("encode_record",)),
    ("index entries", ("index_entries",)),
    ("index search", ("largest_lower_bound_slot",)),
    ("index lookup", ("offset_index_lookup",)),
    ("segment names", ("segment_file_name", "base_offset_from_file_name")),
    ("roll timing", ("time_waited_for_roll",)),
    ("roll", ("should_roll",)),
    ("segment lookup", ("floor_segment",)),
    ("offset lookup", ("translate_offset",)),
    ("timestamp lookup", ("offset_for_timestamp",)),
    ("recovery", ("valid_prefix_length", "rebuild_index")),
    ("retention", ("deletable_segments",)),
    ("time retention", ("retention_time_breached",)),
    ("size retention", ("size_breach_count",)),
    ("compaction rule", ("should_retain_record",)),
    ("cleaning groups", ("group_segments_by_size",)),
    ("cleaner choice", ("choose_filthiest",)),
    ("key partitioner", ("partition_for_key",)),
    ("group placement", ("partition_for",)),
    ("offset commit writing", ("encode_offset_commit",)),
    ("offset commit reading", ("decode_offset_commit",)),
    ("high watermark", ("leader_high_watermark",)),
    ("follower high watermark", ("follower_high_watermark",)),
    ("ISR shrink", ("is_caught_up",)),
    ("ISR join", ("may_join_isr",)),
    ("acks", ("acks_decision",)),
    ("idempotence", ("classify_batch",)),
    ("read_committed", ("read_committed",)),
    ("epoch lookup", ("end_offset_for",)),
    ("truncation", ("truncation_offset",)),
    ("elections", ("elect_leader",)),
    ("fetch range", ("fetch_range",)),
    ("sendfile", ("send_range",)),
    ("fetch serving", ("serve_fetch",)),
)
PLUGGED = {f for _, names in PARTS for f in names}

# The "from scratch" path: whole components as the learner's own classes, defined in
# `my_engine/from_scratch.py` (a file save() never touches). Class name → (its part in the status
# line, what the engine does with it).
FROM_SCRATCH_FILE = "from_scratch.py"
CLASS_SEAMS: dict[str, tuple[str, str]] = {
    "OffsetIndex": ("offset index (your class)", "every segment's .index is opened with it "
                    "(Kafka's OffsetIndex: append, lookup, truncate, trim, resize)"),
    "OffsetMap": ("cleaner's offset map (your class)", "the cleaner builds its key → latest offset map with "
                  "it (Kafka's SkimpyOffsetMap: put, get, update_latest_offset, clear, size, slots)"),
    "RollPolicy": ("roll policy (your class)", "one instance decides every roll: "
                   "should_roll(size, messages_size, segment_bytes, time_waited_ms, segment_ms, "
                   "index_full, base_offset, max_offset_in_messages)"),
}


# ================================================================================ saving
def chapter_file(ex: Exercise) -> str:
    """`04-finding-a-message.ipynb` → `ch04_finding_a_message.py`."""
    stem = Path(ex.notebook).stem
    return f"ch{stem.replace('-', '_')}.py"


def save(exercise_id: str, namespace: dict[str, Any] | None = None, folder: str | os.PathLike = DEFAULT_FOLDER,
         *, notebook: str | os.PathLike | None = None, quiet: bool = False) -> Path | None:
    """Run the tests of `exercise_id` ("ex04") on your definitions and write the functions of every
    task that passes to `folder/chNN_<chapter>.py` (replacing the file). Returns its path."""
    if os.environ.get("KSTORE_GRADING") == "1":
        return None
    from .grading.checker import check
    ex = EXERCISES[exercise_id]
    ns = namespace if namespace is not None else sys._getframe(1).f_globals
    result = check(ex.id, ns, quiet=True)
    passing = [f for t in ex.tasks if result.task_passed(t.id) for f in t.functions]
    failing = [t for t in ex.tasks if not result.task_passed(t.id)]
    path = write_chapter(folder, ex, ns, passing, notebook=notebook)
    if not quiet:
        print(f"saved to {path}: {', '.join(passing) or 'nothing yet'}")
        if failing:
            print("not saved (their tests do not pass yet): " +
                  ", ".join(f"{'/'.join(t.functions)} — check(\"{t.id}\")" for t in failing))
    return path


def write_chapter(folder: str | os.PathLike, ex: Exercise, ns: dict[str, Any], names: list[str], *,
                  notebook: str | os.PathLike | None = None, sources: tuple[str, ...] = ()) -> Path:
    """Write `names` (functions in `ns`) with the imports, constants and helpers they use, as one
    readable module. No checking: `save()` decides what goes in."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    init = folder / "__init__.py"
    if not init.exists():
        init.write_text('"""My engine: the functions I wrote in the kstore exercises, one file per '
                        'chapter (written by kstore.my_engine.save)."""\n')
    cells = _notebook_sources(notebook) + list(ns.get("In", []) or []) + list(sources)
    imports: dict[str, None] = {}
    constants: dict[str, str] = {}
    bodies: dict[str, str] = {}
    pending = list(names)
    while pending:
        name = pending.pop(0)
        if name in bodies:
            continue
        fn = ns[name]
        bodies[name] = function_source(fn, name, cells)
        for ref in sorted(_global_names(fn.__code__)):
            if ref in bodies or ref in constants or ref not in ns or ref == name:
                continue
            obj = ns[ref]
            if isinstance(obj, types.ModuleType):
                imports[_import_line(obj.__name__, ref)] = None
            elif callable(obj) and getattr(obj, "__module__", None) == ns.get("__name__", "__main__"):
                pending.append(ref)             # a helper of the learner's own: saved with them
            elif getattr(obj, "__module__", None) and getattr(obj, "__qualname__", None):
                qual = obj.__qualname__
                imports[f"from {obj.__module__} import {qual}" + ("" if qual == ref else f" as {ref}")] = None
            elif isinstance(obj, (int, float, str, bytes, bool, tuple, frozenset, type(None))):
                constants[ref] = f"{ref} = {obj!r}"
    header = (f'"""Chapter {ex.chapter:02d} — {ex.title}: my passing functions '
              f'({", ".join(names) or "none yet"}).\n\n'
              f'Written by kstore.my_engine.save("{ex.id}"); a new save replaces this file.\n"""')
    sections = [header]
    if imports:
        sections.append("\n".join(sorted(imports)))
    if constants:
        sections.append("\n".join(constants.values()))
    sections.append(f"SAVED = {tuple(names)!r}    # the functions whose tests passed: the engine plugs in these")
    helpers = [n for n in bodies if n not in names]
    functions = [_without_markers(bodies[n]) for n in names]
    if helpers:
        functions[-1:] = [(functions[-1] + "\n\n\n" if functions else "") +
                          f"# Used by the functions above (not plugged into the engine): {', '.join(helpers)}"]
        functions += [_without_markers(bodies[n]) for n in helpers]
    text = "\n\n".join(sections) + ("\n\n\n" + "\n\n\n".join(functions) if functions else "") + "\n"
    path = folder / chapter_file(ex)
    path.write_text(text)
    return path


def _without_markers(src: str) -> str:
    """The solution notebooks' `### BEGIN/END SOLUTION` lines are not part of anyone's code."""
    lines = [ln for ln in src.rstrip().splitlines() if ln.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")]
    return "\n".join(lines)


def _import_line(module: str, name: str) -> str:
    package, _, last = module.rpartition(".")
    if module == name:
        return f"import {module}"
    if package and last == name:
        return f"from {package} import {name}"
    return f"import {module} as {name}"


def _notebook_sources(notebook) -> list[str]:
    if notebook is None:
        return []
    from .grading.notebooks import code_cells, load
    return [c.source for c in code_cells(load(notebook))]


def function_source(fn: Callable, name: str, cells: list[str]) -> str:
    """The source of `fn`: from Python's line cache (what IPython keeps of every cell), else the last
    of `cells` that defines `name` at the top level."""
    try:
        src = inspect.getsource(fn)
        if src.lstrip().startswith(("def ", "async def ", "@")):
            return src
    except (OSError, TypeError):
        pass
    candidates = []
    for cell in reversed(cells):
        try:
            tree = ast.parse(cell)
        except SyntaxError:
            continue
        for node in reversed(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                candidates.append(ast.get_source_segment(cell, node, padded=True) or ast.unparse(node))
    for src in candidates:            # the definition whose bytecode is the function's: the one that ran
        if _same_code(src, name, fn):
            return src
    if candidates:
        return candidates[0]
    raise ValueError(f"cannot find the source of {name}: define it in a cell of this notebook")


def _same_code(src: str, name: str, fn: Callable) -> bool:
    try:
        module = compile(src, "<candidate>", "exec")
    except SyntaxError:
        return False
    code = next((c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == name), None)
    return code is not None and code.co_code == fn.__code__.co_code and code.co_names == fn.__code__.co_names


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names - set(dir(builtins))


# ================================================================================ loading & plugging
def load_functions(folder: str | os.PathLike, *, every_saved: bool = False
                   ) -> tuple[dict[str, tuple[Callable, str]], list[str]]:
    """{function name: (function, file name)} of every chapter file in `folder` (the functions the
    engine plugs in; `every_saved`: every saved exercise function), and one line per file that
    could not be loaded."""
    wanted = set(FUNCTION_TASK) if every_saved else PLUGGED
    found: dict[str, tuple[Callable, str]] = {}
    problems: list[str] = []
    folder = Path(folder)
    for path in sorted(folder.glob("ch[0-9][0-9]_*.py")):
        name = f"kstore_my_engine_{path.stem}"
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception as e:                  # the learner's file: say what is wrong, serve anyway
            sys.modules.pop(name, None)
            problems.append(f"{path.name} could not be loaded ({type(e).__name__}: {e}); its parts are kstore's")
            continue
        saved = getattr(module, "SAVED", None)
        for attr, value in vars(module).items():
            if saved is not None and attr not in saved:
                continue
            if attr in wanted and callable(value) and getattr(value, "__module__", None) == name:
                found[attr] = (value, path.name)
    return found, problems


def load_classes(folder: str | os.PathLike) -> tuple[dict[str, type], list[str]]:
    """The learner's own component classes (CLASS_SEAMS) in `folder/from_scratch.py`, and one line
    if that file could not be loaded."""
    path = Path(folder) / FROM_SCRATCH_FILE
    if not path.is_file():
        return {}, []
    name = "kstore_my_engine_from_scratch"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        return {}, [f"{path.name} could not be loaded ({type(e).__name__}: {e}); kstore's classes serve"]
    return {c: getattr(module, c) for c in CLASS_SEAMS if isinstance(getattr(module, c, None), type)}, []


def class_patches(classes: dict[str, type]) -> list:
    """Plug the learner's classes in where the engine makes those components."""
    from . import cleaner, segment
    from .grading import live
    patches: list = []
    if "OffsetIndex" in classes:
        patches.append(live.Patch(segment, "OffsetIndex", classes["OffsetIndex"]))
    if "OffsetMap" in classes:
        patches.append(live.Patch(cleaner, "SkimpyOffsetMap", classes["OffsetMap"]))
    if "RollPolicy" in classes:
        patches += live.segment_rolling(should_roll=classes["RollPolicy"]().should_roll)
    return patches


def load_engine(folder: str | os.PathLike = DEFAULT_FOLDER, namespace: dict[str, Any] | None = None, *,
                quiet: bool = False) -> list[str]:
    """Put every function saved in `folder` into `namespace` (the notebook's globals) — except
    those the notebook defines itself, which are newer. Returns the names loaded. This runs your
    own files in your own process (also when graded: in the confined learner process)."""
    ns = namespace if namespace is not None else sys._getframe(1).f_globals
    functions, problems = load_functions(folder, every_saved=True) if Path(folder).is_dir() else ({}, [])
    loaded = sorted(n for n in functions if not callable(ns.get(n)))
    ns.update({n: functions[n][0] for n in loaded})
    if not quiet:
        missing = [f for f in FUNCTION_TASK if f not in functions and not callable(ns.get(f))]
        print(f"your engine ({folder}): {len(loaded)} saved functions loaded"
              + (f"; not saved yet: {', '.join(missing)}" if missing else "; nothing missing"))
        for line in problems:
            print(line)
    return loaded


def capstone(folder: str | os.PathLike = DEFAULT_FOLDER, root: str | os.PathLike | None = None):
    """Chapter 12's capstone on the engine saved in `folder` (run here, on your machine): prints
    one line per check and returns the `kstore.grading.capstone.Capstone`."""
    import tempfile
    from .grading.capstone import run_capstone
    functions, problems = load_functions(folder, every_saved=True) if Path(folder).is_dir() else ({}, [])
    classes, class_problems = load_classes(folder) if Path(folder).is_dir() else ({}, [])
    problems += class_problems
    with tempfile.TemporaryDirectory(prefix="kstore-capstone-") as tmp:
        result = run_capstone({n: fn for n, (fn, _) in functions.items()}, root or tmp, classes=classes)
    print(result.summary())
    for res in result.results.values():
        if not res.passed:
            print(res.feedback())
    for line in problems:
        print(line)
    return result


def _yours(fn: Callable, name: str, file: str, engine: "MyEngine") -> Callable:
    """The learner's function as the engine calls it: the first call and any error are logged with
    the function's name and file, so a misbehaving engine says whose code ran."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if name not in engine.called:
            engine.called.add(name)
            log.info("my_engine: the engine ran your %s (%s) for the first time", name, file)
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            log.error("my_engine: your %s (%s) raised %s: %s", name, file, type(e).__name__, e)
            raise
    return call


@dataclass
class MyEngine:
    """Which parts of the engine run the learner's code, and the patches that make it so."""
    folder: str
    yours: list[str] = field(default_factory=list)
    kstores: list[str] = field(default_factory=list)
    unplugged: list[str] = field(default_factory=list)    # saved, no engine seam: checked by tests only
    problems: list[str] = field(default_factory=list)
    called: set[str] = field(default_factory=set)
    _stack: contextlib.ExitStack | None = None

    @property
    def status(self) -> str:
        if not self.yours:
            line = f"my engine ({self.folder}): all parts are kstore's"
        else:
            line = (f"my engine ({self.folder}): yours: {', '.join(self.yours)}; "
                    f"kstore's: {', '.join(self.kstores) or 'none'}")
        extra = [f"saved, checked by their tests only: {', '.join(self.unplugged)}"] if self.unplugged else []
        return "\n".join([line, *extra, *self.problems])

    def __repr__(self) -> str:
        return self.status

    def _ipython_display_(self) -> None:
        """The status is already printed: a `use_my_engine(...)` cell shows it once."""

    def close(self) -> None:
        """Put kstore's own code back everywhere."""
        global _current
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        if _current is self:
            _current = None


_current: MyEngine | None = None


def active() -> MyEngine | None:
    """The switch that is on in this process (views show it as a badge), or None."""
    return _current


def use_my_engine(folder: str | os.PathLike = DEFAULT_FOLDER, *, quiet: bool = False) -> MyEngine | None:
    """Plug every function saved in `folder` into the engine (in this process) and print which parts
    are yours. Calling it again replaces the previous switch; `.close()` on the result undoes it.
    Runs your code in this process — your own machine and engine, never the grader."""
    global _current
    if os.environ.get("KSTORE_GRADING") == "1":
        return None
    if _current is not None:
        _current.close()
    engine = MyEngine(str(folder))
    functions, engine.problems = load_functions(folder) if Path(folder).is_dir() else ({}, [
        f"{folder}: no such folder yet (save() in an exercise notebook creates it)"])
    fns, engine.yours, engine.kstores = plugged(
        {n: _yours(fn, n, file, engine) for n, (fn, file) in functions.items()})
    engine.unplugged = sorted(n for n in functions if n not in PLUGGED)
    classes, class_problems = load_classes(folder) if Path(folder).is_dir() else ({}, [])
    engine.problems += class_problems
    engine.yours += [CLASS_SEAMS[c][0] for c in classes]
    stack = contextlib.ExitStack()
    from .grading import live
    stack.enter_context(live.plug(_patches(live, fns), class_patches(classes)))
    engine._stack = stack
    _current = engine
    if not quiet:
        print(engine.status)
    return engine


def plugged(functions: dict[str, Callable]) -> tuple[dict[str, Callable], list[str], list[str]]:
    """(the functions the engine runs, the parts that are yours, the parts that are kstore's): a
    part is yours when every function it needs is in `functions`."""
    fns: dict[str, Callable] = {}
    yours: list[str] = []
    kstores: list[str] = []
    for part, names in PARTS:
        if all(n in functions for n in names):
            yours.append(part)
            fns.update((n, functions[n]) for n in names)
        else:
            kstores.append(part)
    return fns, yours, kstores


def _patches(live, fns: dict[str, Callable]) -> list:
    """Compose the chapters' plugs for the functions in `fns` (each plug takes the ones it knows)."""
    from . import records, varint

    def pick(*names):
        return {n: fns[n] for n in names if n in fns}
    patches: list = []
    if pick("write_varint", "read_varint", "write_varlong", "encode_record"):
        patches += live.record_encoding(fns.get("write_varint", varint.write_varint),
                                        fns.get("read_varint", varint.read_varint),
                                        fns.get("write_varlong", varint.write_varlong),
                                        fns.get("encode_record", records.encode_record))
    if "valid_prefix_length" in fns:
        patches += live.crash_recovery(fns["valid_prefix_length"], fns["rebuild_index"])
    for plug, names in ((live.sparse_index, ("index_entries", "largest_lower_bound_slot", "offset_index_lookup")),
                        (live.segment_rolling, ("segment_file_name", "base_offset_from_file_name",
                                                "time_waited_for_roll", "should_roll")),
                        (live.finding_messages, ("floor_segment", "translate_offset", "offset_for_timestamp")),
                        (live.retention_rules, ("deletable_segments", "retention_time_breached",
                                                "size_breach_count")),
                        (live.compaction, ("should_retain_record", "group_segments_by_size", "choose_filthiest")),
                        (live.key_partitioning, ("partition_for_key",)),
                        (live.committed_offsets, ("partition_for", "encode_offset_commit", "decode_offset_commit")),
                        (live.replication_rules, ("leader_high_watermark", "follower_high_watermark",
                                                  "is_caught_up", "may_join_isr")),
                        (live.acks_rules, ("acks_decision",)),
                        (live.producer_decisions, ("classify_batch",)),
                        (live.read_committed_rule, ("read_committed",)),
                        (live.leader_epochs, ("end_offset_for", "truncation_offset")),
                        (live.elections, ("elect_leader",)),
                        (live.zero_copy, ("fetch_range", "send_range")),
                        (live.fetch_serving, ("serve_fetch",))):
        chosen = pick(*names)
        if chosen:
            patches += plug(**chosen)
    if "send_range" in fns and "serve_fetch" not in fns:     # chapter 11's loop sends the fetch responses
        send_range = fns["send_range"]
        patches += live.fetch_serving(lambda sock, fd, start, end: send_range(sock, fd, start, end - start))
    return patches


# ================================================================================ feedback
def diagnose_fetch(folder: str | os.PathLike, partition_dir: str | os.PathLike, offset: int,
                   max_bytes: int = 1 << 20) -> list[str]:
    """When a client read the wrong records: ask each of the learner's read-path functions what it
    answers for a fetch from `offset` of the partition in `partition_dir` (opened read-only with
    kstore's own code) and compare with kstore's answer. One line per function that differs."""
    from .grading.views import SegmentView
    from .log import Log
    functions, _ = load_functions(folder)
    out: list[str] = []

    def compare(name: str, call: Callable[[Callable], Any], engine_answer: Any) -> None:
        if name not in functions:
            return
        fn, file = functions[name]
        try:
            answer = call(fn)
        except Exception as e:
            out.append(f"your {name} ({file}) raised {type(e).__name__}: {e}")
            return
        if _plain(answer) != _plain(engine_answer):
            out.append(f"your {name} ({file}) answered {answer!r} for offset {offset}; kstore's answers "
                       f"{engine_answer!r}")

    log = Log.open(str(partition_dir), had_clean_shutdown=True, read_only=True)
    try:
        bases = [s.base_offset for s in log.segments]
        segment = log.floor_segment(offset)
        compare("floor_segment", lambda f: f(list(bases), offset), None if segment is None else segment.base_offset)
        if segment is None:
            return out
        index = segment.offset_index
        keys = [e.offset for e in index.entries_list()]
        compare("largest_lower_bound_slot", lambda f: f(list(keys), offset), index.largest_lower_bound_slot_for(offset))
        entries = [(e.offset, e.position) for e in index.entries_list()]
        compare("offset_index_lookup", lambda f: f(list(entries), segment.base_offset, offset),
                tuple(index.lookup(offset)))
        found = segment.translate_offset(offset)
        compare("translate_offset", lambda f: f(SegmentView(segment), offset),
                None if found is None else (found.position, found.size))
        read = segment.read(offset, max_bytes, min_one_message=True)
        compare("fetch_range", lambda f: f(SegmentView(segment, with_translate=True), offset, max_bytes, True),
                None if read is None else (read.records.position, read.records.size))
        return out
    finally:
        log.close()


def _plain(answer: Any) -> Any:
    """Named tuples and lists compare as the tuples a learner returns."""
    return tuple(answer) if isinstance(answer, (tuple, list)) else answer


def diagnose_recovery(folder: str | os.PathLike, partition_dir: str | os.PathLike) -> list[str]:
    """After a restart served damaged records: ask the learner's `valid_prefix_length` where each
    segment's valid bytes end, and compare with kstore's own recovery run on a copy of the segment.
    One line per segment where they differ."""
    import shutil
    import tempfile
    from .clock import SystemClock
    from .config import LogConfig
    from .segment import LogSegment
    functions, _ = load_functions(folder)
    if "valid_prefix_length" not in functions:
        return []
    fn, file = functions["valid_prefix_length"]
    out: list[str] = []
    for path in sorted(Path(partition_dir).glob("*.log")):
        data = path.read_bytes()
        with tempfile.TemporaryDirectory(prefix="kstore-diagnose-") as tmp:
            shutil.copy(path, tmp)
            segment = LogSegment.open(tmp, int(path.stem), LogConfig(), SystemClock(), file_already_exists=True)
            try:
                kstores = len(data) - segment.recover()
            finally:
                segment.close()
        try:
            yours = fn(data)
        except Exception as e:
            out.append(f"your valid_prefix_length ({file}) raised {type(e).__name__}: {e} on {path.name}")
            continue
        if yours != kstores:
            out.append(f"your valid_prefix_length ({file}) keeps {yours} bytes of {path.name}; kstore's recovery "
                       f"keeps {kstores} (the first bad batch starts there)")
    return out


# ================================================================================ the solutions' engine
def solutions_engine_files() -> dict[str, str]:
    """{file name: text} of the engine a learner who finished every exercise has: each solution
    notebook's functions, written as `save()` writes them (`solutions/my_engine/`, which the
    grader hands in beside the chapter 12 solution)."""
    import tempfile
    from .grading.notebooks import exec_definitions
    with tempfile.TemporaryDirectory() as tmp:
        for ex in EXERCISES.values():
            ns = exec_definitions(ex.solution_path)
            write_chapter(tmp, ex, ns, list(ex.functions), notebook=ex.solution_path)
        return {p.name: p.read_text() for p in sorted(Path(tmp).glob("*.py"))}


def write_solutions_engine(folder: str | os.PathLike | None = None) -> Path:
    """Write `solutions/my_engine/` (replacing its chapter files)."""
    from .grading.exercises import SOLUTIONS_DIR
    out = Path(folder) if folder is not None else SOLUTIONS_DIR / DEFAULT_FOLDER
    out.mkdir(parents=True, exist_ok=True)
    for name, text in solutions_engine_files().items():
        (out / name).write_text(text)
    return out
