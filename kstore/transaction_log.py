"""What the transaction coordinator writes to `__transaction_state`, byte for byte.

Mirrors Kafka's `TransactionLog` with the message schemas `TransactionLogKey.json` and
`TransactionLogValue.json` (version 0, the classic non-flexible encoding):

* a transactional id lives in partition `Utils.abs(transactionalId.hashCode()) %
  transaction.state.log.num.partitions` (the same rule as the offsets topic);
* key   = version int16 (0) | transactionalId string;
* value = version int16 (0) | producerId int64 | producerEpoch int16 | transactionTimeoutMs int32 |
  transactionStatus int8 | transactionPartitions (int32 count, then topic string + int32 count of
  int32 partition ids; null = count −1, written for the Empty state) |
  transactionLastUpdateTimestampMs int64 | transactionStartTimestampMs int64.
A null value is a tombstone (an expired transactional id).

kstore differs from Kafka: Kafka 3.x writes value version 1 (the flexible encoding, with tagged
fields for the previous/next producer id) once the metadata version allows it; kstore writes v0,
which every Kafka version reads.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .coordinator_records import _expect_end, _read, _read_string, _string, partition_for
from .errors import InvalidRecordError

TRANSACTION_STATE_TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0

# TransactionState ids, as Kafka stores them.
STATES = {"Empty": 0, "Ongoing": 1, "PrepareCommit": 2, "PrepareAbort": 3, "CompleteCommit": 4,
          "CompleteAbort": 5, "Dead": 6, "PrepareEpochFence": 7}
STATE_NAMES = {v: k for k, v in STATES.items()}

__all__ = ["TRANSACTION_STATE_TOPIC", "STATES", "TransactionLogValue", "encode_key", "decode_key",
           "decode_value", "partition_for", "decode_transaction_log_record"]


def encode_key(transactional_id: str) -> bytes:
    return struct.pack(">h", KEY_VERSION) + _string(transactional_id)


def decode_key(data: bytes) -> str:
    version, pos = _read(">h", data, 0, "key version")
    if version != KEY_VERSION:
        raise InvalidRecordError(f"unknown transaction log key version {version}")
    tid, pos = _read_string(data, pos)
    _expect_end(data, pos, "TransactionLogKey")
    return tid


@dataclass(frozen=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str
    partitions: dict[str, list[int]] = field(default_factory=dict)
    last_update_ms: int = -1
    start_ms: int = -1

    def encode(self) -> bytes:
        out = [struct.pack(">hqhib", VALUE_VERSION, self.producer_id, self.producer_epoch,
                           self.timeout_ms, STATES[self.state])]
        if self.state == "Empty":
            out.append(struct.pack(">i", -1))
        else:
            out.append(struct.pack(">i", len(self.partitions)))
            for topic, parts in sorted(self.partitions.items()):
                out.append(_string(topic) + struct.pack(f">i{len(parts)}i", len(parts), *sorted(parts)))
        out.append(struct.pack(">qq", self.last_update_ms, self.start_ms))
        return b"".join(out)


def decode_value(data: bytes) -> TransactionLogValue:
    version, pos = _read(">h", data, 0, "value version")
    if version != VALUE_VERSION:
        raise InvalidRecordError(f"unknown transaction log value version {version}")
    pid, pos = _read(">q", data, pos, "producerId")
    epoch, pos = _read(">h", data, pos, "producerEpoch")
    timeout, pos = _read(">i", data, pos, "transactionTimeoutMs")
    status, pos = _read(">b", data, pos, "transactionStatus")
    if status not in STATE_NAMES:
        raise InvalidRecordError(f"unknown transaction status {status}")
    count, pos = _read(">i", data, pos, "transactionPartitions count")
    partitions: dict[str, list[int]] = {}
    for _ in range(max(count, 0)):
        topic, pos = _read_string(data, pos)
        n, pos = _read(">i", data, pos, "partition count")
        ids = []
        for _ in range(max(n, 0)):
            p, pos = _read(">i", data, pos, "partition id")
            ids.append(p)
        partitions[topic] = ids
    last_update, pos = _read(">q", data, pos, "transactionLastUpdateTimestampMs")
    start, pos = _read(">q", data, pos, "transactionStartTimestampMs")
    _expect_end(data, pos, "TransactionLogValue")
    return TransactionLogValue(pid, epoch, timeout, STATE_NAMES[status], partitions, last_update,
                               start)


def decode_transaction_log_record(key: bytes | None, value: bytes | None) -> tuple[str, str]:
    """(key text, payload text) of one `__transaction_state` record, as `kafka-dump-log.sh
    --transaction-log-decoder` prints them: JSON with the schema's camelCase field names."""
    import json

    def text(obj) -> str:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    if key is None:
        return "NO_KEY", "NO_PAYLOAD" if value is None else "unknown"
    try:
        key_text = text({"type": str(KEY_VERSION), "data": {"transactionalId": decode_key(key)}})
    except InvalidRecordError:
        return "unknown", "unknown"
    if value is None:
        return key_text, "<DELETE>"
    try:
        v = decode_value(value)
    except InvalidRecordError:
        return key_text, "unknown"
    partitions = None if v.state == "Empty" else [
        {"topic": t, "partitionIds": ps} for t, ps in sorted(v.partitions.items())]
    return key_text, text({"version": str(VALUE_VERSION), "data": {
        "producerId": v.producer_id, "producerEpoch": v.producer_epoch,
        "transactionTimeoutMs": v.timeout_ms, "transactionStatus": STATES[v.state],
        "transactionPartitions": partitions, "transactionLastUpdateTimestampMs": v.last_update_ms,
        "transactionStartTimestampMs": v.start_ms}})
