"""Errors the engine raises, one per distinct problem, named after Kafka's exceptions.

Every message says what was wrong and with which value, so a learner (or a test) can tell the
problems apart without reading a stack trace. Kafka's class is given in each docstring.
"""

import functools


class KStoreError(Exception):
    """Base class of every kstore error."""


class CorruptRecordError(KStoreError):
    """Bytes that do not form a valid batch: bad CRC, bad length (Kafka: CorruptRecordException)."""


class InvalidRecordError(KStoreError):
    """A batch whose CRC is fine but whose contents break the format (Kafka: InvalidRecordException)."""


class OffsetOutOfRangeError(KStoreError):
    """A read or seek outside [log start offset, log end offset] (Kafka: OffsetOutOfRangeException)."""


class InvalidTimestampError(KStoreError):
    """A record timestamp outside the topic's message.timestamp.before/after.max.ms window
    (Kafka: InvalidTimestampException, INVALID_TIMESTAMP)."""
    error_code = 32


class InvalidOffsetError(KStoreError):
    """An index append that is out of order (Kafka: InvalidOffsetException)."""


class IndexOffsetOverflowError(KStoreError):
    """An offset that cannot be stored relative to the segment base (Kafka: IndexOffsetOverflowException)."""


class LogSegmentOffsetOverflowError(KStoreError):
    """An append whose offsets do not fit in the segment (Kafka: LogSegmentOffsetOverflowException)."""


class IndexFullError(KStoreError):
    """An append to an index with no free slot (Kafka throws IllegalArgumentException)."""


class CorruptIndexError(KStoreError):
    """An index file that fails its sanity check (Kafka: CorruptIndexException)."""


class RecordTooLargeError(KStoreError):
    """A batch larger than max.message.bytes (Kafka: RecordTooLargeException)."""


class RecordBatchTooLargeError(KStoreError):
    """An append larger than segment.bytes (Kafka: RecordBatchTooLargeException)."""


class ConfigError(KStoreError, ValueError):
    """An unknown config name or an impossible value (Kafka: ConfigException)."""


class CheckpointError(KStoreError):
    """A checkpoint file that cannot be parsed (Kafka raises IOException / KafkaStorageException)."""


class InvalidTopicError(KStoreError, ValueError):
    """A topic name Kafka would refuse (Kafka: InvalidTopicException)."""


class LogError(KStoreError):
    """An operation the log cannot do in its current state (Kafka: KafkaException)."""


# ---- errors of the broker layer; `error_code` is Kafka's protocol error code (Errors.java) ----

class UnknownTopicOrPartitionError(KStoreError):
    """This server does not host this topic-partition."""
    error_code = 3


class TopicExistsError(KStoreError):
    error_code = 36


class InvalidPartitionsError(KStoreError, ValueError):
    error_code = 37


class InvalidReplicationFactorError(KStoreError, ValueError):
    error_code = 38


class PolicyViolationError(KStoreError):
    """A request the broker's policy refuses (Kafka: PolicyViolationException); kstore uses it
    for its bound on hosted partitions (max.broker.partitions)."""
    error_code = 44


class InvalidGroupIdError(KStoreError, ValueError):
    error_code = 24


class OffsetMetadataTooLargeError(KStoreError, ValueError):
    error_code = 12


class InvalidRequestError(KStoreError, ValueError):
    """A request that is well-formed but makes no sense (Kafka: InvalidRequestException)."""
    error_code = 42


class InvalidCommitOffsetError(InvalidRequestError):
    """A committed offset must be ≥ 0 (kstore refuses what Kafka would store and later ignore)."""


class InvalidRequiredAcksError(KStoreError, ValueError):
    error_code = 21


class NoOffsetForPartitionError(KStoreError):
    """auto.offset.reset=none and no committed offset."""


class CommitFailedError(KStoreError):
    """A commit was refused: every problem is listed and nothing was written."""


# ---- idempotent producers (ProducerAppendInfo's checks) ----

class OutOfOrderSequenceError(KStoreError):
    """A producer batch does not follow the producer's last sequence (OutOfOrderSequenceException)."""
    error_code = 45


class InvalidProducerEpochError(KStoreError):
    """A producer batch carries an epoch older than the one the partition has seen
    (InvalidProducerEpochException)."""
    error_code = 47


class TransactionCoordinatorFencedError(KStoreError):
    """A transaction marker from a coordinator older than the one that wrote the producer's last
    marker (TransactionCoordinatorFencedException)."""
    error_code = 52


# Kafka's codes for the engine's errors, for the wire protocol.
CorruptRecordError.error_code = 2           # CORRUPT_MESSAGE
OffsetOutOfRangeError.error_code = 1
RecordTooLargeError.error_code = 10         # MESSAGE_TOO_LARGE
RecordBatchTooLargeError.error_code = 18    # RECORD_LIST_TOO_LARGE
InvalidRecordError.error_code = 87
InvalidTopicError.error_code = 17
ConfigError.error_code = 40                 # INVALID_CONFIG
KStoreError.error_code = -1                 # UNKNOWN_SERVER_ERROR


# ---- replication ----

class NotLeaderOrFollowerError(KStoreError):
    """This broker is not the leader (or a follower) of the partition."""
    error_code = 6


class NotEnoughReplicasError(KStoreError):
    """acks=all with the ISR below min.insync.replicas: nothing was written."""
    error_code = 19


class NotEnoughReplicasAfterAppendError(KStoreError):
    """acks=all: the data was written but the ISR shrank below min.insync.replicas meanwhile."""
    error_code = 20


class RequestTimedOutError(KStoreError):
    error_code = 7


class FencedLeaderEpochError(KStoreError):
    error_code = 74


class UnknownLeaderEpochError(KStoreError):
    error_code = 75


class BrokerNotAvailableError(KStoreError):
    error_code = 8


# ---- admin requests ----

class InvalidReplicaAssignmentError(KStoreError, ValueError):
    """A manual replica assignment kstore cannot honour (Kafka: InvalidReplicaAssignmentException)."""
    error_code = 39


class CoordinatorNotAvailableError(KStoreError):
    error_code = 15


class NotCoordinatorError(KStoreError):
    """This broker does not lead the group's (or transactional id's) coordinator partition."""
    error_code = 16


# ---- consumer groups (kstore.group_membership) ----

class NonEmptyGroupError(KStoreError):
    """The group still has members (DeleteGroups, reset-offsets)."""
    error_code = 68


class GroupIdNotFoundError(KStoreError):
    error_code = 69


class GroupSubscribedToTopicError(KStoreError):
    error_code = 86


def error_code(e: BaseException) -> int:
    """Kafka's error code for an exception (UNKNOWN_SERVER_ERROR for one kstore did not expect)."""
    return getattr(e, "error_code", -1)


@functools.cache
def _by_code() -> dict[int, type]:
    """Kafka error code -> the kstore class raised for it (the first class to claim a code wins)."""
    found: dict[int, type] = {}
    pending = [KStoreError]
    while pending:
        cls = pending.pop(0)
        code = cls.__dict__.get("error_code")
        if code is not None:
            found.setdefault(code, cls)
        pending.extend(cls.__subclasses__())
    return found


def error_for_code(code: int, message: str) -> KStoreError:
    """The exception a client raises for an error code in a response: the class the broker raised
    for it (so `except UnknownTopicOrPartitionError` works the same offline and over the network),
    else KStoreError. The message ends with Kafka's name for the code."""
    from .protocol import ERROR_NAMES
    error = _by_code().get(code, KStoreError)(f"{message} ({ERROR_NAMES.get(code, 'UNKNOWN')})")
    error.error_code = code
    return error
