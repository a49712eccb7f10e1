"""All partitions of one broker, and the requests that wait for something (Kafka's purgatory).

Mirrors Kafka's `ReplicaManager` with its `DelayedFetch` / `DelayedProduce` purgatories:
* `append_records` appends to leaders; with acks=all the request waits until the HW passes its
  last offset (done), the ISR shrinks below min.insync.replicas (NOT_ENOUGH_REPLICAS_AFTER_APPEND),
  or the timeout runs out (REQUEST_TIMED_OUT);
* `fetch_for_follower` answers at once when there is data, otherwise parks the fetch for up to
  replica.fetch.wait.max.ms; a parked fetch completes when new data arrives or the wait runs out,
  reading the log again at that moment (so it carries the HW its own fetch moved);
* `high_watermark_checkpoint` writes `replication-offset-checkpoint` every
  replica.high.watermark.checkpoint.interval.ms; `shrink_isr` runs every replica.lag.time.max.ms / 2.
Waiting requests complete in `check_purgatory()`, which the stepped cluster calls after each
action and the running cluster calls from its threads.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Callable

from .checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from .errors import (NotEnoughReplicasAfterAppendError, NotLeaderOrFollowerError,
                     RequestTimedOutError, UnknownTopicOrPartitionError)
from . import partition as partition_rules
from .log import LogAppendInfo
from .partition import LeaderFetch, Partition
from .replica_fetcher import EPOCH_TRUNCATION, ReplicaFetcher


@dataclass
class PendingFetch(LeaderFetch):
    deadline_ms: int = 0
    partition: Partition | None = None
    on_complete: Callable | None = None
    delayed_pending: bool = False
    cancelled: bool = False


@dataclass
class ProduceResult:
    """The outcome of a produce: `done` once answered; `error` set if it failed."""
    topic: str
    partition: int
    acks: int
    info: LogAppendInfo | None = None
    error: Exception | None = None
    done: bool = False
    required_offset: int = -1
    deadline_ms: int = 0
    event: threading.Event = field(default_factory=threading.Event, repr=False)

    def complete(self, error: Exception | None = None) -> None:
        self.error, self.done = error, True
        self.event.set()

    @property
    def base_offset(self) -> int:
        return self.info.first_offset if self.info else -1

    def wait(self, timeout: float | None = None) -> "ProduceResult":
        self.event.wait(timeout)
        return self


class ReplicaManager:
    def __init__(self, broker, transport, truncation_mode: str = EPOCH_TRUNCATION):
        self.broker = broker
        self.broker_id = broker.broker_id
        self.config = broker.config
        self.clock = broker.clock
        self._lock = threading.RLock()
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.fetcher = ReplicaFetcher(self, transport, truncation_mode)
        self._delayed_fetches: list[PendingFetch] = []
        self._delayed_produces: list[ProduceResult] = []
        self._hw_file = OffsetCheckpointFile(os.path.join(broker.log_dir, REPLICATION_OFFSET_CHECKPOINT))
        checkpointed = self._hw_file.read()
        for tp, log in broker.logs.logs().items():   # restart: HW from the checkpoint (§9.1)
            log.update_high_watermark(checkpointed.get(tp, 0))
        scheduler = broker.logs.scheduler
        lag = self.config["replica.lag.time.max.ms"]
        self._tasks = [
            scheduler.schedule("isr-expiration", self.shrink_isr, delay_ms=lag // 2, period_ms=lag // 2),
            scheduler.schedule("highwatermark-checkpoint", self.checkpoint_high_watermarks,
                               delay_ms=self.config["replica.high.watermark.checkpoint.interval.ms"],
                               period_ms=self.config["replica.high.watermark.checkpoint.interval.ms"]),
        ]

    # ---- partitions
    def partition(self, topic: str, partition: int) -> Partition:
        p = self.partitions.get((topic, partition))
        if p is None:
            raise UnknownTopicOrPartitionError(
                f"broker {self.broker_id} does not host {topic}-{partition}")
        return p

    def become_leader_or_follower(self, topic: str, partition: int, leader: int, leader_epoch: int,
                                  isr: list[int], replicas: list[int]) -> Partition:
        """Apply a LeaderAndIsr decision of the controller to this broker's replica."""
        with self._lock:
            tp = (topic, partition)
            p = self.partitions.get(tp)
            if p is None:
                log = self.broker.open_partition_log(topic, partition)
                p = self.partitions[tp] = Partition(topic, partition, self.broker_id, log, self.clock)
                p.on_isr_change = lambda part: self.broker.alter_partition_isr(
                    part.topic, part.partition, part.leader_epoch, part.isr)
            p.min_insync_replicas = p.log.config.min_insync_replicas
            p.replica_lag_time_max_ms = self.config["replica.lag.time.max.ms"]
            was_follower_of = None if p.is_leader else (p.leader_id, p.leader_epoch)
            if leader == self.broker_id:
                self.fetcher.remove_partition(tp)
                p.make_leader(leader_epoch, isr, replicas)
            else:
                p.make_follower(leader, leader_epoch, isr, replicas)
                if was_follower_of != (leader, leader_epoch) or tp not in self.fetcher.states:
                    self.fetcher.remove_partition(tp)
                    if leader >= 0:
                        self.fetcher.add_partition(tp)
            self._fail_waiting_if_not_leader(p)
            return p

    def update_isr(self, topic: str, partition: int, isr: list[int]) -> None:
        p = self.partitions.get((topic, partition))
        if p is not None:
            with p.lock:
                p.isr = list(isr)
                p.maybe_increment_leader_hw()
            self.check_purgatory()

    # ---- produce
    def append_records(self, topic: str, partition: int, records: bytes, acks: int,
                       timeout_ms: int = 30000) -> ProduceResult:
        result = ProduceResult(topic, partition, acks)
        p = self.partition(topic, partition)
        try:
            result.info = p.append_records_to_leader(records, acks)
        except Exception as e:          # NOT_LEADER, NOT_ENOUGH_REPLICAS, CORRUPT_MESSAGE, ...
            result.complete(e)
            return result
        self.broker.events.emit("produce", self.broker.log_dir, topic=topic, partition=partition,
                                first_offset=result.info.first_offset, last_offset=result.info.last_offset)
        decision = partition_rules.acks_decision(acks, len(p.isr), p.min_insync_replicas, len(p.replicas) or 1)
        if decision != partition_rules.ACKS_WHEN_REPLICATED or p.high_watermark > result.info.last_offset:
            result.complete()
        else:
            result.required_offset = result.info.last_offset + 1
            result.deadline_ms = self.clock.milliseconds() + timeout_ms
            with self._lock:
                self._delayed_produces.append(result)
        self.check_purgatory()
        return result

    # ---- fetch
    def fetch_for_follower(self, replica_id: int, tp: tuple[str, int], fetch_offset: int,
                           max_bytes: int, last_fetched_epoch: int | None,
                           current_leader_epoch: int | None, max_wait_ms: int = 0,
                           min_bytes: int = 1, on_complete: Callable | None = None) -> PendingFetch:
        p = self.partition(*tp)
        result = PendingFetch(replica_id, fetch_offset, max_bytes, "", partition=p,
                              on_complete=on_complete)
        with p.lock:
            isr_before = list(p.isr)
            fetched = p.fetch_records(replica_id, fetch_offset, max_bytes, last_fetched_epoch,
                                      current_leader_epoch)
            isr_after, epoch = list(p.isr), p.leader_epoch
        if isr_after != isr_before:   # the follower joined the ISR: AlterPartition, as for a shrink
            self.broker.alter_partition_isr(tp[0], tp[1], epoch, isr_after)
        for name in ("isolation", "data", "high_watermark", "log_start_offset", "log_end_offset",
                     "diverging_epoch", "error"):
            setattr(result, name, getattr(fetched, name))
        has_data = result.data is not None and result.data.size >= min_bytes
        if not has_data and result.diverging_epoch is None and max_wait_ms > 0:
            result.delayed_pending = True
            result.deadline_ms = self.clock.milliseconds() + max_wait_ms
            with self._lock:
                self._delayed_fetches.append(result)
        self.check_purgatory(exclude=result)
        return result

    def log_end_and_start(self, tp: tuple[str, int]) -> tuple[int, int]:
        p = self.partition(*tp)
        return p.log.log_end_offset, p.log.log_start_offset

    def last_offset_for_leader_epoch(self, tp: tuple[str, int], epoch: int | None,
                                     current_leader_epoch: int | None = None) -> tuple[int, int]:
        if epoch is None:
            return -1, -1
        return self.partition(*tp).last_offset_for_leader_epoch(epoch, current_leader_epoch)

    # ---- purgatory
    def check_purgatory(self, exclude: PendingFetch | None = None) -> int:
        """Complete the waiting requests whose condition now holds; return how many completed."""
        now = self.clock.milliseconds()
        completed = 0
        with self._lock:
            fetches = [f for f in self._delayed_fetches if f is not exclude]
            produces = list(self._delayed_produces)
        for f in fetches:
            if f.cancelled:
                self._drop_fetch(f)
                continue
            p = f.partition
            new_data = (p.log.log_end_offset > f.fetch_offset if f.replica_id >= 0
                        else p.high_watermark > f.fetch_offset)
            if new_data or now >= f.deadline_ms or not p.is_leader:
                self._drop_fetch(f)
                p.reread(f)
                f.delayed_pending = False
                completed += 1
                if f.on_complete is not None:
                    f.on_complete(f)
        for r in produces:
            p = self.partitions.get((r.topic, r.partition))
            error = None
            if p is None or not p.is_leader:
                error = NotLeaderOrFollowerError(f"{r.topic}-{r.partition} has a new leader")
            elif p.high_watermark >= r.required_offset:
                error = None
            elif len(p.isr) < min(p.min_insync_replicas, len(p.replicas) or 1):
                error = NotEnoughReplicasAfterAppendError(
                    f"the data was written, but the ISR {p.isr} of {p.name} shrank below "
                    f"min.insync.replicas={p.min_insync_replicas} before it was replicated")
            elif now >= r.deadline_ms:
                error = RequestTimedOutError(
                    f"offset {r.required_offset - 1} of {p.name} was not replicated to the ISR "
                    f"{p.isr} within the request timeout")
            else:
                continue
            with self._lock:
                if r in self._delayed_produces:
                    self._delayed_produces.remove(r)
            r.complete(error)
            completed += 1
        return completed

    def _drop_fetch(self, f: PendingFetch) -> None:
        with self._lock:
            if f in self._delayed_fetches:
                self._delayed_fetches.remove(f)

    def _fail_waiting_if_not_leader(self, p: Partition) -> None:
        if not p.is_leader:
            self.check_purgatory()

    def pending(self) -> dict:
        with self._lock:
            return {"fetches": len(self._delayed_fetches), "produces": len(self._delayed_produces)}

    # ---- periodic tasks
    def shrink_isr(self) -> dict[tuple[str, int], list[int]]:
        """Remove followers that fell behind (isr-expiration); the controller records the change."""
        removed = {}
        for tp, p in list(self.partitions.items()):
            gone = p.maybe_shrink_isr()
            if gone:
                removed[tp] = gone
                self.broker.alter_partition_isr(tp[0], tp[1], p.leader_epoch, p.isr)
        if removed:
            self.check_purgatory()
        return removed

    def checkpoint_high_watermarks(self) -> None:
        """Write the HW of every hosted partition. Entries of partitions this broker does not
        host (yet) but whose directory is still on disk are kept: a checkpoint is never rewritten
        with less than it held for data that still exists."""
        hws = {tp: p.high_watermark for tp, p in self.partitions.items()}
        for tp, hw in self._hw_file.read().items():
            if tp not in hws and os.path.isdir(os.path.join(self.broker.log_dir, f"{tp[0]}-{tp[1]}")):
                hws[tp] = hw
        self._hw_file.write(hws)

    def shutdown(self) -> None:
        for task in self._tasks:
            self.broker.logs.scheduler.cancel(task)
        for tp in list(self.fetcher.states):   # our own fetches parked at leaders are abandoned
            self.fetcher.remove_partition(tp)
        for r in list(self._delayed_produces):
            r.complete(RequestTimedOutError("the broker shut down"))
        self._delayed_produces.clear()
        with self._lock:
            parked, self._delayed_fetches = list(self._delayed_fetches), []
        for f in parked:   # the connection drops: a parked follower fetch fails (and is retried)
            f.error, f.delayed_pending = NotLeaderOrFollowerError(
                f"broker {self.broker_id} shut down while the fetch was waiting"), False
            if f.on_complete is not None:
                f.on_complete(f)
