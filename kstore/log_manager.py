"""A log directory holding many partition logs, and the checkpoint files that describe them.

Mirrors Kafka's `LogManager`: on startup it reads `recovery-point-offset-checkpoint` and
`log-start-offset-checkpoint`, notices `.kafka_cleanshutdown` (and then skips recovery), and
opens every `<topic>-<partition>` directory. It writes the checkpoints atomically and, on a clean
shutdown, flushes every log and writes the clean-shutdown marker.

It also runs the two housekeeping jobs, on demand (`run_retention()`, `run_cleaner()`) or on its
scheduler (`start_retention()`, `start_cleaner()`; call `scheduler.run_due()` after advancing a
`ManualClock`, or `scheduler.start()` for a real-time background thread):
* retention (`kafka-log-retention`, every `log.retention.check.interval.ms`): delete old segments of
  logs whose policy is not compact (all logs when the cleaner is off);
* the cleaner (every `log.cleaner.backoff.ms`): compact the dirtiest compacted log, then apply
  retention to compacted logs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid

from .checkpoint import (CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_CHECKPOINT,
                         RECOVERY_POINT_CHECKPOINT, OffsetCheckpointFile, atomic_write)
from .clock import SYSTEM, Clock
from .config import BrokerConfig, LogConfig
from .errors import CheckpointError, KStoreError, LogError
from .events import EventBus
from .log import Log, parse_topic_partition
from .log_loader import READ_ONLY_HINT
from .metadata_image import CLUSTER_METADATA_DIR
from .scheduler import Scheduler
from .topic import partition_dir_name, validate_topic_name

DELETE_DIR_SUFFIX = "-delete"   # a deleted partition's directory, waiting to be removed
_log = logging.getLogger("kstore.log_manager")
_log.addHandler(logging.NullHandler())   # quiet as a library (notebooks); the CLI and serve show it


class LogManager:
    def __init__(self, log_dir: str, config: LogConfig | dict | None = None,
                 clock: Clock | None = None, *, topic_configs: dict[str, dict] | None = None,
                 events: EventBus | None = None, scheduler: Scheduler | None = None,
                 broker_config: BrokerConfig | dict | None = None, single_replica: bool = True,
                 read_only: bool = False):
        """`read_only` (offline read-only tools): nothing in the directory is created, changed or
        removed — no marker removal, no recovery, no checkpoints, no new logs."""
        self.log_dir = os.path.abspath(log_dir)
        self.read_only = read_only
        self.topic_configs = dict(topic_configs or {})
        self.clock = clock or SYSTEM
        self.events = events or EventBus()
        self.scheduler = scheduler or Scheduler(self.clock)
        self.broker_config = (broker_config if isinstance(broker_config, BrokerConfig)
                              else BrokerConfig(broker_config or {})).with_topic_defaults(config)
        # What every topic without overrides of its own gets: the broker's log.segment.bytes, ...
        self.default_config = self.broker_config.log_config()
        self.single_replica = single_replica   # False: a replica manager moves the HWs
        self._logs: dict[tuple[str, int], Log] = {}
        self._tasks: dict[str, object] = {}
        self._cleaner = None
        self._lock = threading.RLock()
        self.had_clean_shutdown = False
        self.broker_epoch = -1
        if not read_only:
            os.makedirs(self.log_dir, exist_ok=True)
        self._recovery_file = OffsetCheckpointFile(os.path.join(self.log_dir, RECOVERY_POINT_CHECKPOINT))
        self._start_file = OffsetCheckpointFile(os.path.join(self.log_dir, LOG_START_OFFSET_CHECKPOINT))

    @classmethod
    def open(cls, log_dir: str, config: LogConfig | dict | None = None,
             clock: Clock | None = None, **kwargs) -> "LogManager":
        manager = cls(log_dir, config, clock, **kwargs)
        manager.load_logs()
        return manager

    # ---- loading
    def load_logs(self) -> None:
        marker = os.path.join(self.log_dir, CLEAN_SHUTDOWN_FILE)
        self.had_clean_shutdown = os.path.exists(marker)
        if self.had_clean_shutdown:
            try:
                with open(marker, encoding="utf-8") as f:
                    self.broker_epoch = int(json.load(f).get("brokerEpoch", -1))
            except (ValueError, OSError):
                self.broker_epoch = -1
            # Removed before any file is touched (Kafka removes it after loading): loading resizes
            # the active segments' indexes, and a crash in between must not leave a marker that
            # makes the next start trust those index files. (Read-only tools change nothing.)
            if not self.read_only:
                os.remove(marker)
        # As Kafka's LogManager: an unreadable checkpoint is not fatal, it only costs work —
        # recovery from offset 0, log start offsets from each log's first segment.
        recovery_points = self._read_or_reset(self._recovery_file, "resetting the recovery "
                                              "checkpoint to 0")
        start_offsets = self._read_or_reset(self._start_file, "resetting to the base offset of "
                                            "the first segment")
        for name in sorted(os.listdir(self.log_dir)):
            path = os.path.join(self.log_dir, name)
            if os.path.isdir(path) and name.endswith(DELETE_DIR_SUFFIX) and not self.read_only:
                shutil.rmtree(path, ignore_errors=True)   # a deleted topic's, left by a stop
                continue
            if not os.path.isdir(path) or name.endswith((DELETE_DIR_SUFFIX, "-future", "-stray")):
                continue
            try:
                tp = parse_topic_partition(path)
            except Exception:
                continue  # not a partition directory
            try:
                log = Log.open(path, self.config_for(tp[0]), self.clock,
                               recovery_point=recovery_points.get(tp, 0),
                               log_start_offset=start_offsets.get(tp, 0),
                               had_clean_shutdown=self.had_clean_shutdown,
                               events=self.events, scheduler=self.scheduler,
                               single_replica=self.single_replica,
                               # KRaft's own log is Kafka's raft layer's: only read
                               read_only=self.read_only or name == CLUSTER_METADATA_DIR)
            except KStoreError as e:
                if name != CLUSTER_METADATA_DIR:
                    raise
                # kstore never serves nor writes KRaft's log (its topics are replayed from the
                # .log files directly), so a damaged index there must not stop the broker.
                _log.warning("%s not loaded (its topics are still read from its .log files): %s",
                             name, str(e).replace(READ_ONLY_HINT, ""))
                continue
            for change in log.load_report.changes():
                _log.warning("%s: %s", name, change)
            log.producer_id_expiration_ms = self.broker_config["producer.id.expiration.ms"]
            self._logs[tp] = log

    @staticmethod
    def _read_or_reset(checkpoint: OffsetCheckpointFile, reset: str) -> dict:
        try:
            return checkpoint.read()
        except (CheckpointError, OSError, UnicodeDecodeError) as e:
            _log.warning("Error occurred while reading %s, %s: %s",
                         os.path.basename(checkpoint.path), reset, e)
            return {}

    def config_for(self, topic: str) -> LogConfig:
        return self.default_config.with_overrides(self.topic_configs.get(topic, {}))

    # ---- logs
    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int,
                          config: LogConfig | dict | None = None) -> Log:
        with self._lock:
            log = self._logs.get((topic, partition))
            if log is not None:
                return log
            if self.read_only:
                raise LogError(f"{partition_dir_name(topic, partition)} is not in {self.log_dir} "
                               f"(offline read-only tools create nothing)")
            if config is not None:
                overrides = config.overrides if isinstance(config, LogConfig) else dict(config)
                LogConfig(overrides)  # validate before anything is written
                self.topic_configs[topic] = overrides
            path = os.path.join(self.log_dir, partition_dir_name(topic, partition))
            log = Log.open(path, self.config_for(topic), self.clock, events=self.events,
                           scheduler=self.scheduler, had_clean_shutdown=True,
                           single_replica=self.single_replica)
            log.producer_id_expiration_ms = self.broker_config["producer.id.expiration.ms"]
            self._logs[(topic, partition)] = log
            return log

    def async_delete(self, topic: str, partition: int) -> None:
        """Remove a partition's log (Kafka's LogManager.asyncDelete, for a deleted topic): its
        directory is renamed to `<topic>-<partition>.<id>-delete` at once (never loaded again),
        and closed and removed `file.delete.delay.ms` later, so that a fetch already sending
        from its files finishes on them, as for deleted segments."""
        with self._lock:
            log = self._logs.pop((topic, partition), None)
        if log is None:
            return
        doomed = f"{log.dir}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
        os.rename(log.dir, doomed)
        # No checkpoint may keep the partition: a topic created again under the name would start
        # at an old log start offset, or its compaction be taken as done up to an old offset.
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()
        self.cleaner.forget((topic, partition))

        def remove() -> None:
            log.close_without_flush()
            shutil.rmtree(doomed, ignore_errors=True)
        self.scheduler.schedule(f"delete-log-{topic}-{partition}", remove,
                                delay_ms=log.config.file_delete_delay_ms)

    def logs(self) -> dict[tuple[str, int], Log]:
        return dict(self._logs)

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self._logs})

    # ---- checkpoints
    def _writable_logs(self) -> dict[tuple[str, int], Log]:
        return {tp: log for tp, log in self._logs.items() if not log.read_only}

    def checkpoint_recovery_points(self) -> None:
        if not self.read_only:
            self._recovery_file.write({tp: log.recovery_point
                                       for tp, log in self._writable_logs().items()})

    def checkpoint_log_start_offsets(self) -> None:
        """Only logs whose start offset is above their first segment's base are listed (Kafka)."""
        if not self.read_only:
            self._start_file.write({tp: log.log_start_offset
                                    for tp, log in self._writable_logs().items()
                                    if log.log_start_offset > log.segments[0].base_offset})

    # ---- retention
    def run_retention(self) -> int:
        """One retention pass (LogManager.cleanupLogs); returns the number of segments deleted."""
        with self._lock:
            cleaner_on = self.broker_config["log.cleaner.enable"]
            deleted = 0
            for log in list(self._writable_logs().values()):
                if not log.closed and (not cleaner_on or not log.config.compact):
                    deleted += log.delete_old_segments()
            self.checkpoint_log_start_offsets()   # start offsets move without deletions too
            self.events.emit("retention", self.log_dir, deleted_segments=deleted)
            return deleted

    def start_retention(self) -> None:
        """Schedule the retention task every log.retention.check.interval.ms."""
        self._start_task("kafka-log-retention", self.run_retention,
                         self.broker_config["log.retention.check.interval.ms"])

    def start_producer_expiration(self) -> None:
        """Schedule the producer id expiration check every
        producer.id.expiration.check.interval.ms."""
        self._start_task("PeriodicProducerExpirationCheck", self.remove_expired_producers,
                         self.broker_config["producer.id.expiration.check.interval.ms"])

    def remove_expired_producers(self) -> int:
        """Every log forgets its producers idle for producer.id.expiration.ms; returns how many."""
        with self._lock:
            return sum(len(log.remove_expired_producers())
                       for log in list(self._logs.values()) if not log.closed)

    # ---- compaction
    @property
    def cleaner(self):
        if self._cleaner is None:
            from .cleaner import LogCleaner   # compaction is only loaded when used
            b = self.broker_config
            self._cleaner = LogCleaner(self.log_dir, self.clock,
                                       dedupe_buffer_size=b["log.cleaner.dedupe.buffer.size"],
                                       threads=max(1, b["log.cleaner.threads"]),
                                       load_factor=b["log.cleaner.io.buffer.load.factor"])
        return self._cleaner

    def run_cleaner(self, max_rounds: int = 100) -> list:
        """Clean the dirtiest compacted logs until none qualifies; return the cleaning results."""
        results = []
        with self._lock:
            for _ in range(max_rounds):
                result = self.cleaner.clean_filthiest(self._writable_logs().values())
                if result is None:
                    break
                results.append(result)
            for log in self._writable_logs().values():   # retention for compact,delete logs
                if log.config.compact and not log.closed:
                    log.delete_old_segments()
            self.checkpoint_log_start_offsets()
        return results

    def start_cleaner(self) -> None:
        """Schedule the cleaner every log.cleaner.backoff.ms (if log.cleaner.enable)."""
        if self.broker_config["log.cleaner.enable"]:
            self._start_task("kafka-log-cleaner", self.run_cleaner,
                             self.broker_config["log.cleaner.backoff.ms"])

    def _start_task(self, name: str, fn, period_ms: int) -> None:
        if name in self._tasks:
            return
        self._tasks[name] = self.scheduler.schedule(
            name, fn, delay_ms=self.broker_config["log.initial.task.delay.ms"], period_ms=period_ms)

    def stop_task(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            self.scheduler.cancel(task)

    def stop_background_tasks(self) -> None:
        for name in list(self._tasks):
            self.stop_task(name)

    def _stop_scheduler(self) -> None:
        """Stop the background tasks and wait for the scheduler's thread, without holding the
        manager's lock: a task running now (a retention pass) takes that lock, and joining its
        thread while holding it would wait forever."""
        self.stop_background_tasks()
        self.scheduler.shutdown()

    def flush_all(self) -> None:
        for log in self._writable_logs().values():
            log.flush()
        self.checkpoint_recovery_points()

    def crash(self, lose_unflushed: bool = False) -> None:
        """What a killed broker leaves behind: no flush, no checkpoints, no clean-shutdown marker.
        With `lose_unflushed`, also what a power loss leaves: every segment is cut back to what was
        fsynced (its recovery point), the page cache being gone."""
        self._stop_scheduler()
        with self._lock:
            for log in self._logs.values():
                if lose_unflushed and not log.read_only:
                    log.lose_unflushed_data()
                log.close_without_flush()

    def shutdown(self) -> None:
        """Clean shutdown: flush and close every log, write the checkpoints and the marker."""
        if self.read_only:
            for log in self._logs.values():
                log.close()   # read-only logs only drop their file handles
            return
        self._stop_scheduler()
        with self._lock:
            for log in self._logs.values():
                log.close(flush=True)
            self.checkpoint_recovery_points()
            self.checkpoint_log_start_offsets()
            atomic_write(os.path.join(self.log_dir, CLEAN_SHUTDOWN_FILE),
                         json.dumps({"version": 0, "brokerEpoch": self.broker_epoch},
                                    separators=(",", ":")))
            self.events.emit("shutdown", self.log_dir)

    close = shutdown

    def __enter__(self) -> "LogManager":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"LogManager({self.log_dir!r}, logs={sorted(self._logs)})"


validate_topic = validate_topic_name
