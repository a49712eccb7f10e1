"""The graded exercises of the course: one per chapter 01–12, each with 1–7 tasks.

This is the one place that names the tasks. The solutions live in `solutions/NN-*.ipynb` (each
task's code cell is tagged `solution` and the task id, e.g. `ex01.3`); the tests that grade them
live in `tests/exercise_tests/test_exNN.py` (each test is marked `@task("ex01.3", points=...)`);
`tests/test_grading.py` checks that the three agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS_DIR = ROOT / "solutions"
EXERCISES_DIR = ROOT / "exercises"
TESTS_DIR = ROOT / "tests" / "exercise_tests"


@dataclass(frozen=True)
class Task:
    id: str                      # "ex01.3"
    title: str
    functions: tuple[str, ...]   # the names the learner defines

    @property
    def exercise_id(self) -> str:
        return self.id.split(".")[0]


@dataclass(frozen=True)
class Exercise:
    id: str                      # "ex01"
    notebook: str                # "01-record-batch.ipynb" (same name in solutions/ and exercises/)
    title: str
    tasks: tuple[Task, ...]

    @property
    def chapter(self) -> int:
        return int(self.id[2:])

    @property
    def solution_path(self) -> Path:
        return SOLUTIONS_DIR / self.notebook

    @property
    def exercise_path(self) -> Path:
        return EXERCISES_DIR / self.notebook

    @property
    def test_file(self) -> str:
        return f"test_{self.id}.py"

    def task(self, task_id: str) -> Task:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(task_id)

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(f for t in self.tasks for f in t.functions)


def _ex(id_: str, notebook: str, title: str, *tasks: tuple) -> Exercise:
    """Tasks are numbered in order; `(title, functions, n)` fixes a task's number (a task added after
    numbers that other tasks of the same exercise hold)."""
    return Exercise(id_, notebook, title,
                    tuple(Task(f"{id_}.{t[2] if len(t) > 2 else i}", t[0], t[1]) for i, t in enumerate(tasks, 1)))


EXERCISES: dict[str, Exercise] = {e.id: e for e in [
    _ex("ex01", "01-record-batch.ipynb", "The append-only log and the record batch",
        ("Zig-zag varint", ("write_varint",)),
        ("Read a varint back", ("read_varint",)),
        ("Varlong: 64-bit zig-zag", ("write_varlong",)),
        ("Encode a record", ("encode_record",)),
        ("Encode a batch with its CRC", ("encode_batch",))),
    _ex("ex02", "02-sparse-index.ipynb", "The sparse index",
        ("When to add an index entry", ("index_entries",)),
        ("Largest entry ≤ target", ("largest_lower_bound_slot",)),
        ("Offset index lookup", ("offset_index_lookup",))),
    _ex("ex03", "03-segments-and-rolling.ipynb", "Segments and rolling",
        ("Segment file names", ("segment_file_name", "base_offset_from_file_name")),
        ("Time waited for a roll", ("time_waited_for_roll",)),
        ("The roll decision", ("should_roll",))),
    _ex("ex04", "04-finding-a-message.ipynb", "Finding a message",
        ("Which segment holds the offset", ("floor_segment",)),
        ("Offset → position", ("translate_offset",)),
        ("Timestamp → offset", ("offset_for_timestamp",))),
    _ex("ex05", "05-crash-recovery.ipynb", "Crashes and recovery",
        ("Find the truncation point", ("valid_prefix_length",)),
        ("Rebuild the offset index", ("rebuild_index",))),
    _ex("ex06", "06-retention.ipynb", "Retention",
        ("Deletable segments", ("deletable_segments",)),
        ("Time retention", ("retention_time_breached",)),
        ("Size retention", ("size_breach_count",))),
    _ex("ex07", "07-compaction.ipynb", "Compaction",
        ("Which records a cleaning keeps", ("should_retain_record",)),
        ("Group segments for cleaning", ("group_segments_by_size",)),
        ("Compact a segment set", ("compact",)),
        ("Which log the cleaner picks", ("choose_filthiest",))),
    _ex("ex08", "08-partitions-and-offsets.ipynb", "Topics, partitions and committed offsets",
        ("Java's String.hashCode", ("java_string_hashcode",)),
        ("The partition of a group", ("partition_for",)),
        ("Encode an offset commit", ("encode_offset_commit",)),
        ("Decode an offset commit", ("decode_offset_commit",)),
        ("The range assignor", ("range_assign",)),
        ("The partition of a key: murmur2", ("partition_for_key",), 6),
        ("What a crash re-delivers or loses", ("after_crash",), 7)),
    _ex("ex09", "09-replication-hw.ipynb", "Replication: LEO and the high watermark",
        ("The leader's high watermark", ("leader_high_watermark",)),
        ("The follower's high watermark", ("follower_high_watermark",)),
        ("Is a follower caught up?", ("is_caught_up",)),
        ("May a follower join the ISR?", ("may_join_isr",)),
        ("Duplicate or out of order?", ("classify_batch",)),
        ("The acks decision", ("acks_decision",), 6),
        ("What read_committed keeps", ("read_committed",), 7)),
    _ex("ex10", "10-leader-epochs.ipynb", "Leader epochs and elections",
        ("Epoch lookup", ("end_offset_for",)),
        ("The follower's truncation point", ("truncation_offset",)),
        ("The election decision: clean or unclean", ("elect_leader",))),
    _ex("ex11", "11-zero-copy.ipynb", "Zero-copy fetch",
        ("The byte range of a fetch", ("fetch_range",)),
        ("Serve it with sendfile", ("send_range",))),
    _ex("ex12", "12-real-clients.ipynb", "Capstone: your code serves real Kafka clients",
        ("Serve a fetch's byte range", ("serve_fetch",)),
        ("Your engine, end to end", ())),
]}

# Tasks that grade the learner's whole engine: every other task's function they saved runs as
# their own while these tests run (no reference stands in; kstore.grading.capstone referees them).
WHOLE_ENGINE_TASKS = frozenset({"ex12.2"})

TASKS: dict[str, Task] = {t.id: t for e in EXERCISES.values() for t in e.tasks}
FUNCTION_TASK: dict[str, str] = {f: t.id for t in TASKS.values() for f in t.functions}


def exercise(exercise_id: str) -> Exercise:
    try:
        return EXERCISES[exercise_id]
    except KeyError:
        raise KeyError(f"no exercise {exercise_id!r}; there are {', '.join(EXERCISES)}") from None


def parse_target(target: str) -> tuple[Exercise, Task | None]:
    """'ex04' → (exercise 04, None); 'ex04.2' → (exercise 04, its task 2). Also accepts '4', '04.2'."""
    t = str(target).strip().lower()
    if not t.startswith("ex"):
        t = "ex" + t
    head, _, tail = t.partition(".")
    digits = head[2:]
    if not digits.isdigit():
        raise KeyError(f"{target!r} is not an exercise or task id (try 'ex04' or 'ex04.2')")
    ex = exercise(f"ex{int(digits):02d}")
    if not tail:
        return ex, None
    try:
        return ex, ex.task(f"{ex.id}.{int(tail)}")
    except (KeyError, ValueError):
        raise KeyError(f"{ex.id} has tasks {', '.join(t.id for t in ex.tasks)}; "
                       f"there is no {target!r}") from None


def exercise_for_notebook_name(name: str) -> Exercise | None:
    """The exercise a notebook belongs to, from a file name such as `03-segments-and-rolling.ipynb`
    (or any name starting with the chapter number, e.g. `03-alice.ipynb`)."""
    base = Path(name).name
    for ex in EXERCISES.values():
        if base == ex.notebook:
            return ex
    digits = ""
    for ch in base:
        if ch.isdigit():
            digits += ch
        else:
            break
    if digits and f"ex{int(digits):02d}" in EXERCISES:
        return EXERCISES[f"ex{int(digits):02d}"]
    return None
