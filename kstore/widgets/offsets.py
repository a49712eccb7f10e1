"""Offsets view: consumer groups, their committed offsets, the log end offsets and the lag.

Shows, like `kafka-consumer-groups.sh --describe`, one row per group and partition: the committed
offset, the log end offset a consumer can reach (the high watermark) and the LEO, and the lag
(HW − committed). For each group it names the `__consumer_offsets` partition that holds its
commits (`abs(hashCode(group)) % partitions`) with that partition's LEO and size, and the offset
of the record that holds the latest commit.

Engine state read: the committed offsets are decoded from the `__consumer_offsets` log files
themselves (OffsetCommitKey/OffsetCommitValue records, tombstones remove them) — replayed once,
then only the records each `append` event adds; the topic partitions' HW and LEO come from their
logs. Updates on the broker's append, high_watermark, truncate, delete and topic_created events.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..coordinator_records import (GroupMetadataKey, OffsetCommitKey, decode_key,
                                   decode_offset_commit_value, partition_for)
from ..events import Event
from ._base import (HtmlView, LiveModel, attrs, fmt_bytes, fmt_ts, style, table)

OFFSETS_TOPIC = "__consumer_offsets"

OFF_CSS = """
.ks-off td.ks-lag{font-weight:bold;}
.ks-off td.ks-lag0{color:#2a9d8f;}
"""


@dataclass(frozen=True)
class Commit:
    offset: int
    commit_timestamp: int
    metadata: str
    coordinator_partition: int
    record_offset: int            # where the commit record sits in __consumer_offsets-N


class OffsetsModel(LiveModel):
    """Committed offsets and lag of every group on `broker`, read from `__consumer_offsets`."""

    KINDS = ("append", "high_watermark", "truncate", "delete", "topic_created", "clean", "load")

    def __init__(self, broker):
        super().__init__()
        self.broker = broker
        self.committed: dict[str, dict[tuple[str, int], Commit]] = {}
        self.records_read = 0
        self._replay()
        self.watch(broker.events, self.KINDS)

    # ---- reading __consumer_offsets
    @property
    def num_partitions(self) -> int:
        node = self.broker.metadata.topic(OFFSETS_TOPIC)
        return len(node["partitions"]) if node else 0

    def _offsets_log(self, p: int):
        return self.broker.logs.get_log(OFFSETS_TOPIC, p)

    def _replay(self) -> None:
        self.committed.clear()
        for p in range(self.num_partitions):
            log = self._offsets_log(p)
            if log is not None:
                for record in log.records():
                    self._apply(p, record)

    def _apply(self, p: int, record) -> None:
        self.records_read += 1
        if record.key is None:
            return
        key = decode_key(record.key)
        if isinstance(key, OffsetCommitKey):
            group = self.committed.setdefault(key.group, {})
            tp = (key.topic, key.partition)
            if record.value is None:
                group.pop(tp, None)
                if not group:
                    self.committed.pop(key.group, None)
            else:
                v = decode_offset_commit_value(record.value)
                group[tp] = Commit(v.offset, v.commit_timestamp, v.metadata, p, record.offset)
        elif isinstance(key, GroupMetadataKey) and record.value is None:
            self.committed.pop(key.group, None)

    def apply_event(self, event: Event) -> bool | None:
        name = os.path.basename(event.source)
        if event.kind == "topic_created" and event.details.get("topic") == OFFSETS_TOPIC:
            self._replay()
            return True
        if name.startswith(OFFSETS_TOPIC + "-"):
            p = int(name.rsplit("-", 1)[1])
            if event.kind == "append":
                log = self._offsets_log(p)
                if log is not None:
                    for record in log.records(event.details["first_offset"]):
                        if record.offset <= event.details["last_offset"]:
                            self._apply(p, record)
                return True
            if event.kind in ("truncate", "delete", "clean"):
                self._replay()
                return True
            return False          # HW moves of __consumer_offsets: nothing shown changes
        return True

    # ---- state
    def rows(self) -> list[dict]:
        """One row per (group, topic, partition), like kafka-consumer-groups --describe."""
        out = []
        n = self.num_partitions
        for group in sorted(self.committed):
            cp = partition_for(group, n) if n else None
            for (topic, part), c in sorted(self.committed[group].items()):
                log = self.broker.logs.get_log(topic, part)
                hw = log.high_watermark if log else None
                leo = log.log_end_offset if log else None
                out.append({"group": group, "topic": topic, "partition": part,
                            "committed": c.offset, "log_end_offset": hw, "leo": leo,
                            "lag": None if hw is None else hw - c.offset,
                            "coordinator_partition": cp, "record_offset": c.record_offset,
                            "commit_time": c.commit_timestamp})
        return out

    def lag(self, group: str, topic: str, partition: int) -> int | None:
        for r in self.rows():
            if (r["group"], r["topic"], r["partition"]) == (group, topic, partition):
                return r["lag"]
        return None

    def coordinator_partitions(self) -> list[dict]:
        """Each group's __consumer_offsets partition with its LEO and size."""
        out, n = [], self.num_partitions
        for group in sorted(self.committed):
            p = partition_for(group, n)
            log = self._offsets_log(p)
            out.append({"group": group, "partition": f"{OFFSETS_TOPIC}-{p}",
                        "leo": log.log_end_offset if log else None,
                        "bytes": log.size_in_bytes() if log else 0})
        return out

    # ---- rendering
    def render_html(self) -> str:
        rows = self.rows()
        body = [[r["group"], r["topic"], r["partition"], r["committed"], r["log_end_offset"],
                 r["leo"], r["lag"], f"{OFFSETS_TOPIC}-{r['coordinator_partition']} @ {r['record_offset']}",
                 fmt_ts(r["commit_time"])] for r in rows]
        groups = table(["group", "topic", "partition", "committed offset", "log end offset (HW)",
                        "LEO", "lag", "commit record", "committed at"], body)
        coords = table(["group", "coordinator partition", "its LEO", "its size"],
                       [[c["group"], c["partition"], c["leo"], fmt_bytes(c["bytes"])]
                        for c in self.coordinator_partitions()])
        note = (f"<p class='ks-note'>Committed offsets decoded from the {OFFSETS_TOPIC} files "
                f"({self.records_read} records read; {self.num_partitions} partitions). Lag = "
                f"log end offset − committed offset; the log end offset a consumer sees is the "
                f"high watermark.</p>")
        if not self.num_partitions:
            note = f"<p class='ks-note'>{OFFSETS_TOPIC} does not exist yet (no group committed).</p>"
        return (style(OFF_CSS) +
                f'<div class="ks-view ks-off"{attrs(data_groups=len(self.committed), data_rows=len(rows))}>'
                f"<h4>consumer groups on broker {self.broker.broker_id}</h4>{note}{groups}"
                f"<h4>where each group's commits live</h4>{coords}</div>")


class OffsetsView(HtmlView):
    """The offsets view as a widget (one HTML block, redrawn on the broker's events)."""

    model_class = OffsetsModel
    css_class = "kstore-offsets"
