"""Errors the engine raises, one per distinct problem, named after Kafka's exceptions.

Every message says what was wrong and with which value, so a learner (or a test) can tell the
problems apart without reading a stack trace. Kafka's class is given in each docstring.
"""


class KStoreError(Exception):
    """Base class of every kstore error."""


class CorruptRecordError(KStoreError):
    """Bytes that do not form a valid batch: bad CRC, bad length (Kafka: CorruptRecordException)."""


class InvalidRecordError(KStoreError):
    """A batch whose CRC is fine but whose contents break the format (Kafka: InvalidRecordException)."""


class OffsetOutOfRangeError(KStoreError):
    """A read or seek outside [log start offset, log end offset] (Kafka: OffsetOutOfRangeException)."""


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
