"""Quiz / flashcards: interview questions, answer hidden until revealed, scored by the reader.

Shows one card at a time (its number, topic and question); "Reveal" shows the answer, then "I knew
it" / "Not yet" records a self-score and moves on; the summary counts known, not-yet and unseen
cards, and "Retry missed" runs the not-yet cards again. Pure state in `QuizModel`; no engine state.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._base import (WidgetView, attrs, esc, style)

QUIZ_CSS = """
.ks-quiz .ks-card{border:1px solid #999;border-radius:6px;padding:8px 12px;max-width:720px;background:#fffdf5;}
.ks-quiz .ks-q{font-weight:bold;margin:4px 0;}
.ks-quiz .ks-a{margin:6px 0;padding:6px;background:#e8f4ff;border-radius:4px;}
.ks-quiz .ks-topic{color:#777;font-size:11px;}
"""


@dataclass(frozen=True)
class Card:
    question: str
    answer: str
    topic: str = ""


DEFAULT_CARDS = [
    Card("How does Kafka store a partition on disk?",
         "As a directory of segments. Each segment is a .log of record batches plus a sparse "
         ".index (offset → position) and .timeindex (timestamp → offset), all named by the "
         "segment's base offset (20 digits).", "storage"),
    Card("Why is the offset index sparse, and what does a lookup cost?",
         "An entry is written only every index.interval.bytes (4096) of appended data, so the index "
         "stays small and memory-mappable. A lookup bisects the segments, binary-searches the index "
         "for the largest entry ≤ the target, then scans at most ~4 KB of batch headers.", "indexes"),
    Card("Which bytes of a record batch does the CRC cover, and why?",
         "Bytes 21 to the end (attributes onwards). baseOffset, batchLength, partitionLeaderEpoch and "
         "magic come before it, so the broker can assign offsets and stamp the leader epoch without "
         "recomputing the CRC.", "format"),
    Card("What is the high watermark, and when does it move?",
         "The offset below which every record is on all ISR replicas (committed). The leader moves it "
         "to the minimum LEO of the ISR, which it learns from the followers' next fetch offsets — so "
         "a follower's second fetch round is what advances it.", "replication"),
    Card("Why did Kafka replace high-watermark truncation with leader epochs (KIP-101)?",
         "A restarted follower truncating to its own (stale) HW could lose committed data or diverge "
         "from the leader. With leader epochs it asks the leader for the end offset of its latest "
         "epoch and truncates exactly where the logs diverge.", "replication"),
    Card("What does log compaction guarantee, and what happens to tombstones?",
         "At least the latest record of every key is kept, with its original offset (gaps appear). "
         "A tombstone (null value) is kept until its delete horizon (delete.retention.ms after the "
         "cleaning that first saw it), then dropped.", "compaction"),
    Card("Why is zero-copy (sendfile) faster for consumers?",
         "Bytes go from the page cache to the socket inside the kernel: no copy into a user-space "
         "buffer and back, one sendfile call for a whole byte range where read + send take two "
         "per chunk (thousands for a segment), no garbage to collect. It works because the "
         "on-disk format is the wire format.", "network"),
    Card("Where are a consumer group's committed offsets stored?",
         "In the compacted internal topic __consumer_offsets, in partition "
         "abs(hashCode(group.id)) % 50, as OffsetCommitKey/OffsetCommitValue records; the "
         "coordinator replays it into a cache on startup.", "consumers"),
]


class QuizModel:
    """A deck, the current card, whether its answer is shown, and the self-scores."""

    def __init__(self, cards: list[Card] | None = None):
        self.cards = list(cards or DEFAULT_CARDS)
        if not self.cards:
            raise ValueError("a quiz needs at least one card")
        self.order = list(range(len(self.cards)))
        self.position = 0
        self.revealed = False
        self.scores: dict[int, bool] = {}      # card index -> knew it?
        self._listeners: list = []

    def on_change(self, listener) -> None:
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener(self, None)

    @property
    def current(self) -> int:
        return self.order[self.position]

    @property
    def card(self) -> Card:
        return self.cards[self.current]

    def reveal(self) -> None:
        self.revealed = True
        self._changed()

    def score(self, knew: bool) -> None:
        """Record the self-score of the current card and go to the next one."""
        self.scores[self.current] = bool(knew)
        self.next()

    def next(self) -> None:
        self.position = (self.position + 1) % len(self.order)
        self.revealed = False
        self._changed()

    def prev(self) -> None:
        self.position = (self.position - 1) % len(self.order)
        self.revealed = False
        self._changed()

    def retry_missed(self) -> None:
        missed = [i for i, ok in self.scores.items() if not ok]
        if missed:
            self.order, self.position, self.revealed = sorted(missed), 0, False
            self._changed()

    def summary(self) -> dict:
        known = sum(1 for ok in self.scores.values() if ok)
        return {"known": known, "not_yet": len(self.scores) - known,
                "unseen": len(self.cards) - len(self.scores), "total": len(self.cards)}

    def render_html(self) -> str:
        c, s = self.card, self.summary()
        answer = f"<div class='ks-a'>{esc(c.answer)}</div>" if self.revealed else \
            "<div class='ks-note'>(answer hidden — think, then Reveal)</div>"
        return (style(QUIZ_CSS) +
                f'<div class="ks-view ks-quiz"{attrs(data_card=self.current, data_revealed=str(self.revealed).lower())}>'
                f"<div class='ks-card'><div class='ks-topic'>card {self.position + 1} of "
                f"{len(self.order)} · {esc(c.topic)}</div><div class='ks-q'>{esc(c.question)}</div>"
                f"{answer}</div><p class='ks-note'>known {s['known']} · not yet {s['not_yet']} · "
                f"unseen {s['unseen']}</p></div>")


class QuizView(WidgetView):
    """The flashcards as a widget: Reveal, I knew it, Not yet, ◀ ▶, Retry missed."""

    def __init__(self, cards=None):
        import ipywidgets as W

        self.model = cards if isinstance(cards, QuizModel) else QuizModel(cards)
        m = self.model
        self.reveal_button = W.Button(description="Reveal answer")
        self.reveal_button.add_class("ks-quiz-reveal")
        self.knew = W.Button(description="I knew it", button_style="success")
        self.knew.add_class("ks-quiz-knew")
        self.not_yet = W.Button(description="Not yet", button_style="warning")
        self.prev = W.Button(description="◀", layout=W.Layout(width="40px"))
        self.next = W.Button(description="▶", layout=W.Layout(width="40px"))
        self.retry = W.Button(description="Retry missed")
        self.html = W.HTML()
        self.reveal_button.on_click(lambda _: m.reveal())
        self.knew.on_click(lambda _: m.score(True))
        self.not_yet.on_click(lambda _: m.score(False))
        self.prev.on_click(lambda _: m.prev())
        self.next.on_click(lambda _: m.next())
        self.retry.on_click(lambda _: m.retry_missed())
        self.widget = W.VBox([self.html, W.HBox([self.prev, self.reveal_button, self.knew,
                                                 self.not_yet, self.next, self.retry])])
        self.widget.add_class("kstore-quiz")
        m.on_change(lambda *_: self._draw())
        self._draw()

    def _draw(self) -> None:
        self.html.value = self.model.render_html()
        self.knew.disabled = self.not_yet.disabled = not self.model.revealed
