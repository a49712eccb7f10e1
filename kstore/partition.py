"""One partition on one broker: the leader's bookkeeping of its followers, or a follower's role.

Mirrors Kafka's `Partition` (kafka.cluster) with its `ReplicaState`s:
* the leader keeps, for each follower, the LEO the follower reported in its latest fetch (its
  *remote LEO*) and when it was last caught up;
* the leader's high watermark is the smallest LEO in the ISR (and does not move while the ISR is
  smaller than min.insync.replicas); a follower's HW is min(leader HW in the fetch response, own LEO);
* followers join the ISR when they reach the HW and an offset of the current leader epoch, and
  leave it when they fall more than replica.lag.time.max.ms behind.
The rules are pure functions at the top, so a notebook, an exercise and the engine share them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .errors import (FencedLeaderEpochError, NotEnoughReplicasError, NotLeaderOrFollowerError,
                     OffsetOutOfRangeError, UnknownLeaderEpochError)
from .leader_epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from .log import Isolation, Log, LogAppendInfo
from .segment import FetchDataInfo


# ------------------------------------------------------------------------------------------------
# The rules (pure)
# ------------------------------------------------------------------------------------------------

# What a leader does with a produce request, by its `acks` (Kafka's ReplicaManager.appendRecords,
# Partition.appendRecordsToLeader and DelayedProduce); the strings name the outcome.
ACKS_INVALID = "INVALID_REQUIRED_ACKS"
ACKS_REFUSED = "NOT_ENOUGH_REPLICAS"
ACKS_NO_RESPONSE = "append, no response"
ACKS_AT_ONCE = "append, answer at once"
ACKS_WHEN_REPLICATED = "append, answer when the ISR has it"


def acks_decision(acks: int, isr_size: int, min_insync_replicas: int, replication_factor: int) -> str:
    """0, 1 and −1 are the legal values; acks=−1 is refused before anything is written when the ISR
    is smaller than min(min.insync.replicas, replication factor); otherwise the records are appended
    and answered never (0), at once (1) or once the HW passes them (−1)."""
    if acks not in (0, 1, -1) or isinstance(acks, bool):
        return ACKS_INVALID
    if acks == 0:
        return ACKS_NO_RESPONSE
    if acks == 1:
        return ACKS_AT_ONCE
    if isr_size < min(min_insync_replicas, replication_factor):
        return ACKS_REFUSED
    return ACKS_WHEN_REPLICATED


def leader_high_watermark(leader_leo: int, isr_follower_leos: list[int], isr_size: int,
                          min_insync_replicas: int, replication_factor: int) -> int | None:
    """The HW the leader may move to, or None when the ISR is below the effective min ISR
    (Partition.maybeIncrementLeaderHW): the smallest LEO among the leader and its ISR followers."""
    if isr_size < min(min_insync_replicas, replication_factor):
        return None
    return min([leader_leo, *isr_follower_leos])


def follower_high_watermark(leader_hw: int, follower_leo: int) -> int:
    """A follower's HW after a fetch: it cannot know more than the leader told it, nor more than it has."""
    return min(leader_hw, follower_leo)


def is_caught_up(follower_leo: int, leader_leo: int, last_caught_up_ms: int, now: int,
                 replica_lag_time_max_ms: int) -> bool:
    """ReplicaState.isCaughtUp: at the leader's LEO, or caught up within replica.lag.time.max.ms."""
    return follower_leo == leader_leo or now - last_caught_up_ms <= replica_lag_time_max_ms


def may_join_isr(follower_leo: int, leader_hw: int, leader_epoch_start_offset: int) -> bool:
    """Partition.isFollowerInSync: at or past the HW, and holding data of the current leader epoch."""
    return follower_leo >= leader_hw and follower_leo >= leader_epoch_start_offset


# ------------------------------------------------------------------------------------------------
# State
# ------------------------------------------------------------------------------------------------

@dataclass
class ReplicaState:
    """What the leader knows of one follower (Kafka's ReplicaState)."""
    broker_id: int
    log_end_offset: int = -1           # the fetch offset of its latest fetch ("remote LEO")
    log_start_offset: int = -1
    last_fetch_leader_leo: int = -1
    last_fetch_time_ms: int = 0
    last_caught_up_time_ms: int = 0


@dataclass(frozen=True)
class DivergingEpoch:
    epoch: int
    end_offset: int


@dataclass
class LeaderFetch:
    """A follower's (or consumer's) fetch as the leader processed it. `data`, `high_watermark`
    and friends are what the response carries; they are read again if the fetch was delayed."""
    replica_id: int
    fetch_offset: int
    max_bytes: int
    isolation: str
    data: FetchDataInfo | None = None
    high_watermark: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    diverging_epoch: DivergingEpoch | None = None
    error: Exception | None = None
    delayed: bool = False


@dataclass
class Partition:
    topic: str
    partition: int
    broker_id: int
    log: Log
    clock: object
    replicas: list[int] = field(default_factory=list)
    leader_id: int = -1
    leader_epoch: int = -1
    isr: list[int] = field(default_factory=list)
    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 30000
    remote: dict[int, ReplicaState] = field(default_factory=dict)
    on_isr_change: object = None     # callback(partition): the leader reports ISR changes (AlterPartition)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    data_arrived: threading.Condition = field(init=False, repr=False)
    hw_changed: threading.Condition = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_arrived = threading.Condition(self.lock)
        self.hw_changed = threading.Condition(self.lock)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    # ---- becoming leader or follower (LeaderAndIsr)
    def make_leader(self, leader_epoch: int, isr: list[int], replicas: list[int]) -> None:
        with self.lock:
            now = self.clock.milliseconds()
            self.leader_id, self.leader_epoch = self.broker_id, leader_epoch
            self.isr, self.replicas = list(isr), list(replicas)
            # KIP-279: the new epoch starts at the LEO, before any new data.
            self.log.leader_epoch_cache.assign(leader_epoch, self.log.log_end_offset)
            self.remote = {b: ReplicaState(b, last_caught_up_time_ms=now if b in isr else 0)
                           for b in replicas if b != self.broker_id}
            self.maybe_increment_leader_hw()

    def make_follower(self, leader_id: int, leader_epoch: int, isr: list[int], replicas: list[int]) -> None:
        with self.lock:
            self.leader_id, self.leader_epoch = leader_id, leader_epoch
            self.isr, self.replicas = list(isr), list(replicas)
            self.remote = {}

    @property
    def leader_epoch_start_offset(self) -> int:
        entry = self.log.leader_epoch_cache.latest_entry()
        return entry.start_offset if entry and entry.epoch == self.leader_epoch else self.log.log_end_offset

    # ---- the leader's high watermark
    def maybe_increment_leader_hw(self) -> bool:
        with self.lock:
            if not self.is_leader:
                return False
            now = self.clock.milliseconds()
            leos = []
            for b, state in self.remote.items():
                # The "maximal ISR": ISR members, and caught-up followers about to join it.
                caught_up = is_caught_up(state.log_end_offset, self.log.log_end_offset,
                                         state.last_caught_up_time_ms, now,
                                         self.replica_lag_time_max_ms)
                if b in self.isr or caught_up:
                    leos.append(state.log_end_offset)   # −1 until its first fetch: HW waits
            new_hw = leader_high_watermark(self.log.log_end_offset, leos, len(self.isr),
                                           self.min_insync_replicas, len(self.replicas) or 1)
            if new_hw is None or new_hw <= self.high_watermark:
                return False
            self.log.maybe_increment_high_watermark(new_hw)
            self.hw_changed.notify_all()
            return True

    # ---- produce on the leader
    def append_records_to_leader(self, records: bytes, required_acks: int) -> LogAppendInfo:
        return self._as_leader(required_acks, lambda: self.log.append_as_leader(
            records, leader_epoch=self.leader_epoch))

    def adopt_segment_as_leader(self, path: str, required_acks: int) -> LogAppendInfo | None:
        """Log.adopt_as_leader on the leader, with a produce's checks (None: not adoptable, the
        caller appends the file's bytes instead)."""
        return self._as_leader(required_acks, lambda: self.log.adopt_as_leader(
            path, leader_epoch=self.leader_epoch))

    def _as_leader(self, required_acks: int, append) -> LogAppendInfo | None:
        with self.lock:
            if not self.is_leader:
                raise NotLeaderOrFollowerError(
                    f"broker {self.broker_id} is not the leader of {self.name} (leader: {self.leader_id})")
            decision = acks_decision(required_acks, len(self.isr), self.min_insync_replicas,
                                     len(self.replicas) or 1)
            if decision == ACKS_REFUSED:
                raise NotEnoughReplicasError(
                    f"the size of the current ISR {self.isr} is insufficient to satisfy the "
                    f"min.isr requirement of {self.min_insync_replicas} for partition {self.name}")
            info = append()
            if info is None:
                return None
            self.maybe_increment_leader_hw()
            self.data_arrived.notify_all()
            return info

    # ---- fetch on the leader
    def check_current_epoch(self, current_leader_epoch: int | None) -> None:
        if current_leader_epoch is None or current_leader_epoch < 0:
            return
        if current_leader_epoch < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"the request's leader epoch {current_leader_epoch} is older than the current "
                f"leader epoch {self.leader_epoch} of {self.name}")
        if current_leader_epoch > self.leader_epoch:
            raise UnknownLeaderEpochError(
                f"the request's leader epoch {current_leader_epoch} is newer than the current "
                f"leader epoch {self.leader_epoch} of {self.name}")

    def fetch_records(self, replica_id: int, fetch_offset: int, max_bytes: int,
                      last_fetched_epoch: int | None = None, current_leader_epoch: int | None = None
                      ) -> LeaderFetch:
        """Process a fetch (Partition.fetchRecords). Replicas (replica_id ≥ 0) read up to the LEO
        and report their LEO; consumers (replica_id −1) read up to the HW. The response values
        are captured *before* the follower's state is updated."""
        with self.lock:
            is_follower = replica_id >= 0
            if not self.is_leader:
                raise NotLeaderOrFollowerError(
                    f"broker {self.broker_id} is not the leader of {self.name}")
            self.check_current_epoch(current_leader_epoch)
            isolation = Isolation.LOG_END if is_follower else Isolation.HIGH_WATERMARK
            result = LeaderFetch(replica_id, fetch_offset, max_bytes, isolation)
            if is_follower and last_fetched_epoch is not None and last_fetched_epoch >= 0:
                diverging = self._diverging_epoch(last_fetched_epoch, fetch_offset)
                if diverging is not None:
                    result.diverging_epoch = diverging
                    self._capture(result, read=False)
                    return result
            self._capture(result, read=True)
            if is_follower and replica_id in self.remote:
                self._update_follower_fetch_state(replica_id, fetch_offset, result.log_end_offset)
                self.maybe_expand_isr(replica_id)
                self.maybe_increment_leader_hw()
            return result

    def _capture(self, result: LeaderFetch, read: bool) -> None:
        result.high_watermark = self.high_watermark
        result.log_start_offset = self.log.log_start_offset
        result.log_end_offset = self.log.log_end_offset
        if read:
            result.data = self.log.read(result.fetch_offset, result.max_bytes, result.isolation)

    def reread(self, result: LeaderFetch) -> LeaderFetch:
        """A delayed fetch completes by reading the log again (DelayedFetch.onComplete), so it
        carries the HW as it is now — including any move its own fetch caused."""
        with self.lock:
            if not self.is_leader:
                result.error = NotLeaderOrFollowerError(f"{self.name} has a new leader")
                return result
            try:
                self._capture(result, read=True)
            except OffsetOutOfRangeError as e:
                result.error = e
            result.delayed = True
            return result

    def _diverging_epoch(self, last_fetched_epoch: int, fetch_offset: int) -> DivergingEpoch | None:
        """Fetch-time divergence detection (Partition.readRecords, Fetch v12+)."""
        epoch, end = self.log.leader_epoch_cache.end_offset_for(last_fetched_epoch, self.log.log_end_offset)
        if epoch == UNDEFINED_EPOCH or end == UNDEFINED_EPOCH_OFFSET:
            raise OffsetOutOfRangeError(
                f"the leader of {self.name} has no epoch at or below {last_fetched_epoch}")
        if epoch < last_fetched_epoch or end < fetch_offset:
            return DivergingEpoch(epoch, end)
        return None

    def _update_follower_fetch_state(self, replica_id: int, fetch_offset: int, leader_leo: int) -> None:
        state = self.remote[replica_id]
        now = self.clock.milliseconds()
        if fetch_offset >= leader_leo:
            state.last_caught_up_time_ms = now
        elif fetch_offset >= state.last_fetch_leader_leo:
            state.last_caught_up_time_ms = max(state.last_caught_up_time_ms, state.last_fetch_time_ms)
        state.log_end_offset = fetch_offset
        state.log_start_offset = self.log.log_start_offset
        state.last_fetch_leader_leo = leader_leo
        state.last_fetch_time_ms = now

    # ---- ISR
    def maybe_expand_isr(self, replica_id: int) -> bool:
        state = self.remote.get(replica_id)
        if state is None or replica_id in self.isr:
            return False
        if may_join_isr(state.log_end_offset, self.high_watermark, self.leader_epoch_start_offset):
            # Appended, as Kafka's Partition.prepareIsrExpand sends `isr + newInSyncReplicaId`:
            # after a restart `describe` shows e.g. Replicas 1,2,3 and Isr 1,3,2.
            self.isr = self.isr + [replica_id]
            if self.on_isr_change is not None:
                self.on_isr_change(self)
            return True
        return False

    def out_of_sync_replicas(self) -> list[int]:
        """ISR followers that are no longer caught up (Partition.getOutOfSyncReplicas)."""
        now = self.clock.milliseconds()
        return [b for b in self.isr if b != self.broker_id and b in self.remote and not is_caught_up(
            self.remote[b].log_end_offset, self.log.log_end_offset,
            self.remote[b].last_caught_up_time_ms, now, self.replica_lag_time_max_ms)]

    def maybe_shrink_isr(self) -> list[int]:
        with self.lock:
            if not self.is_leader:
                return []
            gone = self.out_of_sync_replicas()
            if gone:
                self.isr = [b for b in self.isr if b not in gone]
                self.maybe_increment_leader_hw()   # a smaller ISR may let the HW move
            return gone

    def last_offset_for_leader_epoch(self, leader_epoch: int, current_leader_epoch: int | None = None
                                     ) -> tuple[int, int]:
        """OffsetsForLeaderEpoch on the leader: (epoch, end offset) for the requested epoch."""
        with self.lock:
            if not self.is_leader:
                raise NotLeaderOrFollowerError(f"broker {self.broker_id} is not the leader of {self.name}")
            self.check_current_epoch(current_leader_epoch)
            return self.log.leader_epoch_cache.end_offset_for(leader_epoch, self.log.log_end_offset)
