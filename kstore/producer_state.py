"""The last batch each idempotent producer wrote to a partition.

A small part of Kafka's `ProducerStateManager`: for every producer id it keeps the epoch, the last
sequence and the offset of the last data batch. The cleaner needs it to keep the batch holding a
producer's last sequence (even when compaction empties it), and idempotent producers need it to spot
duplicates. Rebuilt from batch headers when a log is loaded or truncated.

kstore differs from Kafka: no snapshot files are written and producer ids never expire
(Kafka expires them after `producer.id.expiration.ms` of inactivity).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .records import NO_PRODUCER_ID, RecordBatch


@dataclass(frozen=True)
class ProducerEntry:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_data_offset: int | None      # None when the producer's last batch was a control batch
    last_timestamp: int


class ProducerStateManager:
    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}

    def update(self, batch: RecordBatch) -> None:
        if batch.producer_id == NO_PRODUCER_ID:
            return
        previous = self._producers.get(batch.producer_id)
        if batch.is_control:
            self._producers[batch.producer_id] = ProducerEntry(
                batch.producer_id, batch.producer_epoch,
                previous.last_sequence if previous else -1, None, batch.max_timestamp)
        else:
            self._producers[batch.producer_id] = ProducerEntry(
                batch.producer_id, batch.producer_epoch, batch.last_sequence, batch.last_offset,
                batch.max_timestamp)

    def rebuild(self, batches: Iterable[RecordBatch]) -> None:
        self._producers.clear()
        for batch in batches:
            self.update(batch)

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def active_producers(self) -> dict[int, ProducerEntry]:
        return dict(self._producers)

    def __len__(self) -> int:
        return len(self._producers)
