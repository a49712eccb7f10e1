"""A follower's side of replication: truncate to where it agrees with the leader, then fetch.

Mirrors Kafka's `AbstractFetcherThread` / `ReplicaFetcherThread`:
* after a leader change or a restart, a follower first finds the offset where its log stops
  agreeing with the new leader's: by leader epochs (OffsetsForLeaderEpoch, KIP-101/279), or — the
  behaviour before Kafka 0.11, kept as a switch so its failures can be shown — by cutting its log
  to its own high watermark;
* then it fetches from its LEO; it appends what comes back with the leader's offsets, sets
  HW = min(leader's HW, own LEO), and follows the leader's log start offset;
* a fetch past the leader's end (OFFSET_OUT_OF_RANGE) truncates to the leader's LEO; one below the
  leader's start restarts the log at the leader's log start offset.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .errors import KStoreError, OffsetOutOfRangeError
from .leader_epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from .partition import follower_high_watermark

EPOCH_TRUNCATION = "leader_epoch"
HW_TRUNCATION = "high_watermark"


def truncation_offset(leader_epoch: int, leader_end_offset: int, own_end_offset_for_epoch: tuple[int, int] | None,
                      log_end_offset: int, high_watermark: int) -> tuple[int, bool]:
    """Where a follower truncates, given the leader's answer (E, O) for the follower's latest epoch
    (AbstractFetcherThread.getOffsetTruncationState). Returns (offset, done); done is False when
    the follower must ask again with its new latest epoch (KIP-279).

    `own_end_offset_for_epoch` is the follower's own `end_offset_for(E)`, or None when it has no
    epoch at or below E.
    """
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
        return high_watermark, True                      # the leader knows no epochs: old rule
    if leader_epoch == UNDEFINED_EPOCH:
        return min(leader_end_offset, log_end_offset), True
    if own_end_offset_for_epoch is None or own_end_offset_for_epoch[0] == UNDEFINED_EPOCH:
        return min(leader_end_offset, log_end_offset), True
    own_epoch, own_end = own_end_offset_for_epoch
    if own_epoch != leader_epoch:                        # we lack epoch E: cut back and ask again
        return min(own_end, log_end_offset), False
    return min(leader_end_offset, own_end, log_end_offset), True


@dataclass
class FetchState:
    fetch_offset: int
    needs_truncation: bool = True
    in_flight: object | None = None      # a delayed fetch parked at the leader


@dataclass
class FollowerStep:
    """What one step of a follower did (the course shows these)."""
    broker_id: int
    topic: str
    partition: int
    action: str                   # "truncate", "fetch", "waiting", "diverged", "error", "idle"
    fetch_offset: int = -1
    records: int = 0
    truncated_to: int | None = None
    leader_hw: int | None = None
    high_watermark: int | None = None
    log_end_offset: int | None = None
    detail: str = ""
    exchanges: list[str] = field(default_factory=list)


class ReplicaFetcher:
    """Fetches for every partition this broker follows. `step(tp)` does one round for one
    partition: the stepped mode calls it, the running mode calls it from a thread."""

    def __init__(self, replica_manager, transport, truncation_mode: str = EPOCH_TRUNCATION):
        self.rm = replica_manager
        self.transport = transport        # .leader_replica_manager(broker_id) -> ReplicaManager
        self.truncation_mode = truncation_mode
        self.states: dict[tuple[str, int], FetchState] = {}
        self.max_bytes = 1048576
        self._tp_locks: dict[tuple[str, int], threading.RLock] = {}
        self.last_delayed_step: FollowerStep | None = None

    def _tp_lock(self, tp) -> threading.RLock:
        return self._tp_locks.setdefault(tp, threading.RLock())

    def add_partition(self, tp: tuple[str, int]) -> None:
        partition = self.rm.partition(*tp)
        self.states[tp] = FetchState(partition.log.log_end_offset, needs_truncation=True)

    def remove_partition(self, tp: tuple[str, int]) -> None:
        state = self.states.pop(tp, None)
        if state is not None and state.in_flight is not None:
            state.in_flight.cancelled = True

    # ---- truncation
    def truncate(self, tp: tuple[str, int]) -> FollowerStep:
        partition = self.rm.partition(*tp)
        log = partition.log
        step = FollowerStep(self.rm.broker_id, *tp, action="truncate")
        if self.truncation_mode == HW_TRUNCATION or log.leader_epoch_cache.is_empty():
            target = log.high_watermark
            step.detail = f"truncate to own high watermark {target}"
        else:
            leader = self.transport.leader_replica_manager(partition.leader_id)
            while True:
                latest = log.leader_epoch_cache.latest_epoch()
                epoch, end = leader.last_offset_for_leader_epoch(tp, latest)
                step.exchanges.append(f"OffsetsForLeaderEpoch(epoch {latest}) → "
                                      f"(epoch {epoch}, end offset {end})")
                own = log.leader_epoch_cache.end_offset_for(epoch, log.log_end_offset) \
                    if epoch != UNDEFINED_EPOCH else None
                target, done = truncation_offset(epoch, end, own, log.log_end_offset, log.high_watermark)
                if done:
                    break
                log.truncate_to(target)
            step.detail = f"truncate by leader epoch to {target}"
        log.truncate_to(target)
        state = self.states[tp]
        state.fetch_offset = log.log_end_offset
        state.needs_truncation = False
        step.truncated_to = target
        step.log_end_offset = log.log_end_offset
        step.high_watermark = log.high_watermark
        return step

    # ---- fetching
    def step(self, tp: tuple[str, int], max_wait_ms: int | None = None) -> FollowerStep:
        """One round: truncate if needed, else fetch. With a wait, a fetch that finds no data is
        parked at the leader and completes later (new data, or the wait runs out)."""
        with self._tp_lock(tp):
            return self._step(tp, max_wait_ms)

    def _step(self, tp: tuple[str, int], max_wait_ms: int | None) -> FollowerStep:
        state = self.states.get(tp)
        if state is None:
            return FollowerStep(self.rm.broker_id, *tp, action="idle", detail="not a follower")
        if state.in_flight is not None:
            return FollowerStep(self.rm.broker_id, *tp, action="waiting",
                                fetch_offset=state.fetch_offset, detail="a fetch is parked at the leader")
        truncation = self.truncate(tp) if state.needs_truncation else None
        step = self._fetch(tp, state, max_wait_ms)
        if truncation is not None:   # one round: find the point of agreement, then fetch
            step.truncated_to = truncation.truncated_to
            step.exchanges = truncation.exchanges + step.exchanges
            step.detail = "; ".join(d for d in (truncation.detail, step.detail) if d)
        return step

    def _fetch(self, tp, state: FetchState, max_wait_ms: int | None) -> FollowerStep:
        partition = self.rm.partition(*tp)
        leader = self.transport.leader_replica_manager(partition.leader_id)
        last_epoch = None
        if self.truncation_mode == EPOCH_TRUNCATION:
            last_epoch = partition.log.leader_epoch_cache.latest_epoch()
        wait = self.rm.config["replica.fetch.wait.max.ms"] if max_wait_ms is None else max_wait_ms
        try:
            result = leader.fetch_for_follower(self.rm.broker_id, tp, state.fetch_offset,
                                               self.max_bytes, last_epoch, partition.leader_epoch,
                                               max_wait_ms=wait,
                                               on_complete=lambda r: self._on_delayed(tp, r))
        except OffsetOutOfRangeError as e:
            return self._out_of_range(tp, leader, str(e))
        except KStoreError as e:
            return FollowerStep(self.rm.broker_id, *tp, action="error", fetch_offset=state.fetch_offset,
                                detail=f"{type(e).__name__}: {e}")
        if result.delayed_pending:
            state.in_flight = result
            return FollowerStep(self.rm.broker_id, *tp, action="waiting", fetch_offset=state.fetch_offset,
                                detail=f"no data at {state.fetch_offset}: parked at the leader "
                                       f"up to {wait} ms")
        return self.process_response(tp, result)

    def _on_delayed(self, tp, result) -> None:
        with self._tp_lock(tp):
            state = self.states.get(tp)
            if state is None or state.in_flight is not result:
                return
            state.in_flight = None
            self.last_delayed_step = self.process_response(tp, result)

    def _out_of_range(self, tp, leader, detail: str) -> FollowerStep:
        partition = self.rm.partition(*tp)
        log = partition.log
        leader_leo, leader_start = leader.log_end_and_start(tp)
        state = self.states[tp]
        if state.fetch_offset > leader_leo:
            log.truncate_to(leader_leo)                   # past the leader's end: cut back to it
            target = leader_leo
        else:
            log.truncate_fully_and_start_at(leader_start)  # below the leader's start: start over
            target = leader_start
        state.fetch_offset = log.log_end_offset
        return FollowerStep(self.rm.broker_id, *tp, action="truncate", truncated_to=target,
                            log_end_offset=log.log_end_offset, high_watermark=log.high_watermark,
                            detail=f"OFFSET_OUT_OF_RANGE ({detail}): truncated to {target}")

    def process_response(self, tp, result) -> FollowerStep:
        partition = self.rm.partition(*tp)
        log = partition.log
        state = self.states[tp]
        step = FollowerStep(self.rm.broker_id, *tp, action="fetch", fetch_offset=result.fetch_offset,
                            leader_hw=result.high_watermark)
        if result.error is not None:
            step.action, step.detail = "error", f"{type(result.error).__name__}: {result.error}"
            return step
        if result.diverging_epoch is not None:
            d = result.diverging_epoch
            own = log.leader_epoch_cache.end_offset_for(d.epoch, log.log_end_offset)
            target, done = truncation_offset(d.epoch, d.end_offset, own, log.log_end_offset,
                                             log.high_watermark)
            log.truncate_to(target)
            state.fetch_offset = log.log_end_offset
            state.needs_truncation = not done
            step.action, step.truncated_to = "diverged", target
            step.detail = f"diverging epoch {d.epoch} ending at {d.end_offset}: truncated to {target}"
        else:
            data = result.data.records.read_bytes() if result.data and result.data.records else b""
            if data:
                info = log.append_as_follower(data)
                step.records = info.num_messages
            state.fetch_offset = log.log_end_offset
            if result.log_start_offset > log.log_start_offset and \
                    result.log_start_offset <= log.high_watermark:
                log.maybe_increment_log_start_offset(result.log_start_offset, "leader log start")
            log.update_high_watermark(follower_high_watermark(result.high_watermark, log.log_end_offset))
        step.high_watermark = log.high_watermark
        step.log_end_offset = log.log_end_offset
        return step
