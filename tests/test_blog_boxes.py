"""Every mistake the popular blog posts on Kafka storage make has a "The blog says / Kafka does" box
in the chapter where it belongs, drawn by `kstore.course.blog_says` and followed, in the same cell, by
code that shows Kafka's behaviour on the engine. The blogs' worked examples come back with their
numbers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat

from kstore.course import BLOG_MARKER, BLOG_SERIES, blog_box_html

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))

# mistake id -> what the blogs claim (issue 18's list; a box must exist for each)
MISTAKES = {
    "hw-backed-up": "messages below the HW are backed up; consumers can read offset = HW",
    "follower-sends-ack": "followers send an Ack to the leader",
    "preferred-replica-first-of-isr": "the preferred replica is the first of the ISR",
    "compaction-keeps-n-versions": "compaction keeps the last N versions; keys must be unique",
    "offsets-partition-topic-and-group": "__consumer_offsets partition from a hash of topic and group",
    "no-key-random-partition": "no key -> a random key and a random partition",
    "timeindex-one-to-one": ".timeindex entries one-to-one with .index",
    "mmap-dma-serving": "log files served by mmap + DMA",
    "consumer-zero-copy": "consumers zero-copy from socket to memory",
    "size-unchanged-delayed-write": "file size does not change after send -> delayed write",
    "io-scheduler-list": "NOOP/CFQ/DEADLINE/ANTICIPATORY as current advice",
    "segment-named-before-first": "a segment is named after the offset before its first message",
    "zero-copy-on-produce": "Kafka writes with zero-copy too",
    "partition-count": "adding partitions is harmless for keyed data",
}


def boxes() -> list[tuple[str, str, str]]:
    """(notebook, mistake id, the cell's source) for every blog_says call in the chapters."""
    found = []
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code" or "blog_says(" not in cell.source:
                continue
            for node in ast.walk(ast.parse(cell.source)):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "blog_says":
                    found.append((path.name, ast.literal_eval(node.args[0]), cell.source))
    return found


def test_every_listed_mistake_has_a_box():
    ids = [mistake for _, mistake, _ in boxes()]
    missing = sorted(set(MISTAKES) - set(ids))
    assert not missing, f"no 'The blog says / Kafka does' box for: {[MISTAKES[m] for m in missing]}"
    assert len(ids) == len(set(ids)), "a mistake is boxed twice"


def test_each_box_is_shown_live_in_its_cell():
    """After the box, the same cell runs engine code (more than the call itself)."""
    for name, mistake, source in boxes():
        tree = ast.parse(source)
        others = [s for s in tree.body
                  if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                          and getattr(s.value.func, "id", None) == "blog_says")]
        assert others, f"{name}: the {mistake} box has no live demonstration in its cell"


def test_no_old_style_myth_box_is_left():
    for path in NOTEBOOKS:
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
        for old in ('a segment is named after the offset before', '"Kafka writes with zero-copy too."',
                    '"adding partitions later is harmless'):
            assert old not in text or "blog_says" in text.split(old)[0][-2000:], \
                f"{path.name} still has the markdown myth box {old!r}"


def test_box_names_the_source_with_the_chinese_term():
    html = blog_box_html("x", "claim with `code`", "does **this** <safely>", term="高水位")
    assert BLOG_MARKER in html and 'data-mistake="x"' in html
    assert "popular Chinese blog series on Kafka storage" in BLOG_SERIES and re.search(r"[\u4e00-\u9fff]",
                                                                                       BLOG_SERIES)
    assert "<code>code</code>" in html and "<b>this</b>" in html and "&lt;safely&gt;" in html
    assert "高水位" in html


def test_worked_examples_of_the_blogs_are_reproduced():
    """The numbers a reader of those posts knows appear in the chapters' code and prose."""
    text = {p.name[:2]: "\n".join(c.source for c in nbformat.read(p, as_version=4).cells) for p in NOTEBOOKS}
    assert "170410" in text["04"] and "[4, 476]" in text["04"] and "340" in text["04"]
    assert "[0, 50]" in text["10"] and "[1, 89]" in text["10"] and "[2, 100]" in text["10"]


def test_every_box_gives_the_chinese_term_beside_the_english_one():
    """As the glossary does: each box's `term=` names the idea in English and in Chinese."""
    for name, mistake, source in boxes():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "blog_says":
                term = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "term"), "")
                assert re.search(r"[A-Za-z]", term) and re.search(r"[\u4e00-\u9fff]", term), \
                    f"{name}: the {mistake} box has no English + Chinese term ({term!r})"
