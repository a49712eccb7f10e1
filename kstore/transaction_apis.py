"""The transaction requests of the broker: InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit and WriteTxnMarkers (Kafka's
`KafkaApis.handleAddPartitionsToTxnRequest` & co.).

A mixin of `KafkaServer`, like `GroupApis`. The coordinator waits for its acks=all appends, which
in a cluster need follower fetches this same event loop serves, so its calls run on a worker
thread (`_off_loop`) and the loop stays free.
"""

from __future__ import annotations

import asyncio

from . import protocol as P
from .errors import KStoreError, error_code
from .transaction_coordinator import write_marker_locally

E = P.ERRORS

# Below these versions a client does not know PRODUCER_FENCED; Kafka answers INVALID_PRODUCER_EPOCH.
_FENCED_FROM = {"AddPartitionsToTxn": 2, "AddOffsetsToTxn": 2, "EndTxn": 2, "InitProducerId": 4}


def _code(name: str, api: str, version: int) -> int:
    if name == "PRODUCER_FENCED" and version < _FENCED_FROM.get(api, 0):
        name = "INVALID_PRODUCER_EPOCH"
    return E[name]


class TransactionApis:
    def _transaction_handlers(self) -> dict:
        api = P.API_KEYS
        return {api["AddPartitionsToTxn"]: self._add_partitions_to_txn,
                api["AddOffsetsToTxn"]: self._add_offsets_to_txn, api["EndTxn"]: self._end_txn,
                api["TxnOffsetCommit"]: self._txn_offset_commit,
                api["WriteTxnMarkers"]: self._write_txn_markers}

    @staticmethod
    async def _off_loop(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def _init_transactional_producer_id(self, version, body) -> dict:
        error, pid, epoch = await self._off_loop(
            self.broker.transaction_coordinator.init_producer_id, body["transactional_id"],
            body["transaction_timeout_ms"])
        return {"throttle_time_ms": 0, "error_code": _code(error, "InitProducerId", version),
                "producer_id": pid, "producer_epoch": epoch}

    async def _add_partitions_to_txn(self, version, body, header) -> dict:
        topics = body["v3_and_below_topics"]
        wanted = [(t["name"], p) for t in topics for p in t["partitions"]]
        errors = await self._off_loop(self.broker.transaction_coordinator.add_partitions,
                                      body["v3_and_below_transactional_id"],
                                      body["v3_and_below_producer_id"],
                                      body["v3_and_below_producer_epoch"], wanted)
        results = []
        for t in topics:
            results.append({"name": t["name"], "results_by_partition": [
                {"partition_index": p,
                 "partition_error_code": _code(errors[(t["name"], p)], "AddPartitionsToTxn", version)}
                for p in t["partitions"]]})
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": results}

    async def _add_offsets_to_txn(self, version, body, header) -> dict:
        error = await self._off_loop(self.broker.transaction_coordinator.add_offsets,
                                     body["transactional_id"], body["producer_id"],
                                     body["producer_epoch"], body["group_id"])
        return {"throttle_time_ms": 0, "error_code": _code(error, "AddOffsetsToTxn", version)}

    async def _end_txn(self, version, body, header) -> dict:
        error = await self._off_loop(self.broker.transaction_coordinator.end_txn,
                                     body["transactional_id"], body["producer_id"],
                                     body["producer_epoch"], body["committed"], False)
        return {"throttle_time_ms": 0, "error_code": _code(error, "EndTxn", version)}

    async def _txn_offset_commit(self, version, body, header) -> dict:
        """Offsets written as a transactional batch of the producer; the group sees them only
        once the transaction's COMMIT marker lands in its `__consumer_offsets` partition."""
        coordinator = self.broker.group_coordinator
        group = body["group_id"]
        topics, valid = self._commit_entries(body["topics"])
        error = None
        if not group:
            error = E["INVALID_GROUP_ID"]
        elif valid:
            try:
                prepared = coordinator.prepare_commit(group, valid, producer_id=body["producer_id"],
                                                      producer_epoch=body["producer_epoch"])
                result = self.broker.produce_request("__consumer_offsets", prepared.partition,
                                                     prepared.batch, -1)
                while not result.done:
                    await asyncio.sleep(0.002)
                coordinator.complete_commit(prepared, result)
            except KStoreError as e:
                error = error_code(e)
        if error is not None:
            for t in topics:
                for p in t["partitions"]:
                    if (t["name"], p["partition_index"]) in valid or not group:
                        p["error_code"] = error
        return {"throttle_time_ms": 0, "topics": topics}

    async def _write_txn_markers(self, version, body, header) -> dict:
        """From a transaction coordinator on another broker: append the markers here."""
        out = []
        for marker in body["markers"]:
            topics = []
            for t in marker["topics"]:
                parts = []
                for p in t["partition_indexes"]:
                    error = await self._off_loop(
                        write_marker_locally, self.broker, t["name"], p, marker["producer_id"],
                        marker["producer_epoch"], marker["transaction_result"],
                        marker["coordinator_epoch"])
                    parts.append({"partition_index": p, "error_code": E[error]})
                topics.append({"name": t["name"], "partitions": parts})
            out.append({"producer_id": marker["producer_id"], "topics": topics})
        return {"markers": out}
