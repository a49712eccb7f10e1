"""`TransactionManager`: the client side of Kafka's transactions over the network — what
KafkaProducer's `TransactionManager` does behind initTransactions, send and commitTransaction.

    txn = TransactionManager(client, "app-0")      # client: a RemoteBroker
    txn.init()                           # InitProducerId: producer id + epoch; fences older users
    txn.add_partitions([("t", 0)])       # AddPartitionsToTxn, before the first batch to a partition
    client.produce("t", 0, batch, transactional_id=txn.transactional_id)   # batches carry pid/epoch
    txn.commit()   # or txn.abort()      # EndTxn: the coordinator writes COMMIT/ABORT markers

Every call goes to the transactional id's coordinator (FindCoordinator, key type 1: the leader
of its `__transaction_state` partition), and is retried while the coordinator moves or loads,
and on CONCURRENT_TRANSACTIONS (the coordinator is still finishing the previous transaction of
this id, e.g. aborting the one a fenced producer left open) — as Kafka's client retries them.

`end_transaction` ends a transaction another process began, knowing its id, producer id and
epoch: the second phase of a two-phase commit (the Spark sink's driver commits what its tasks
wrote). Kafka's own producer has no public call for this; Flink's Kafka sink does the same thing
by setting the producer id and epoch of a new producer before calling commitTransaction.
"""

from __future__ import annotations

from . import protocol as P
from .errors import KStoreError, error_for_code

E = P.ERRORS
# Retried, as Kafka's TransactionManager retries them (RetriableException and its kind).
RETRIABLE = (E["COORDINATOR_LOAD_IN_PROGRESS"], E["COORDINATOR_NOT_AVAILABLE"],
             E["NOT_COORDINATOR"], E["CONCURRENT_TRANSACTIONS"])
DEFAULT_TRANSACTION_TIMEOUT_MS = 60000       # the producer's transaction.timeout.ms


class TransactionManager:
    """One transactional id's producer id, epoch and open transaction, over a `RemoteBroker`."""

    def __init__(self, client, transactional_id: str,
                 timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS):
        if not transactional_id:
            raise KStoreError("a transactional id is a non-empty string")
        self.client = client
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.producer_id, self.producer_epoch = -1, -1
        self.partitions: set[tuple[str, int]] = set()     # in the open transaction

    def _coordinator(self) -> int:
        response = self.client.request("FindCoordinator",
                                       {"key": self.transactional_id, "key_type": 1})
        if response["error_code"]:
            raise error_for_code(response["error_code"], response["error_message"]
                                 or f"no coordinator for transactional id '{self.transactional_id}'")
        self.client._brokers.setdefault(response["node_id"], (response["host"], response["port"]))
        return response["node_id"]

    def _call(self, api: str, body: dict, errors) -> dict:
        """The request to the coordinator, retried on RETRIABLE; `errors(response)` lists the
        error codes of the answer (one, or one per partition)."""
        def attempt():
            response = self.client.request(api, body, self._coordinator())
            codes = [c for c in errors(response) if c]
            if codes:
                code = next((c for c in codes if c not in RETRIABLE), codes[0])
                raise error_for_code(code, f"{api} for transactional id '{self.transactional_id}'")
            return response
        return self.client.retrying(attempt, RETRIABLE)

    def init(self) -> tuple[int, int]:
        """InitProducerId: this id's producer id and a new epoch. An older producer with the same
        id is fenced from now on, and a transaction it left open is aborted first."""
        response = self._call("InitProducerId", {"transactional_id": self.transactional_id,
                                                 "transaction_timeout_ms": self.timeout_ms},
                              lambda r: [r["error_code"]])
        self.producer_id, self.producer_epoch = response["producer_id"], response["producer_epoch"]
        self.partitions = set()
        return self.producer_id, self.producer_epoch

    def add_partitions(self, partitions) -> None:
        """AddPartitionsToTxn for the partitions not in the transaction yet."""
        new = sorted(set(partitions) - self.partitions)
        if not new:
            return
        by_topic: dict[str, list[int]] = {}
        for topic, p in new:
            by_topic.setdefault(topic, []).append(p)
        body = {"v3_and_below_transactional_id": self.transactional_id,
                "v3_and_below_producer_id": self.producer_id,
                "v3_and_below_producer_epoch": self.producer_epoch,
                "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}
        self._call("AddPartitionsToTxn", body, lambda r: [
            p["partition_error_code"] for t in r["results_by_topic_v3_and_below"]
            for p in t["results_by_partition"]])
        self.partitions.update(new)

    def commit(self) -> None:
        end_transaction(self.client, self.transactional_id, self.producer_id,
                        self.producer_epoch, commit=True)
        self.partitions = set()

    def abort(self) -> None:
        end_transaction(self.client, self.transactional_id, self.producer_id,
                        self.producer_epoch, commit=False)
        self.partitions = set()


def end_transaction(client, transactional_id: str, producer_id: int, producer_epoch: int,
                    commit: bool) -> None:
    """EndTxn for the transaction of (transactional id, producer id, epoch): its coordinator
    writes a COMMIT (or ABORT) marker into every partition of it. Sending it again after it
    succeeded answers success again; a fenced or timed-out transaction raises (PRODUCER_FENCED /
    INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE)."""
    txn = TransactionManager(client, transactional_id)
    txn._call("EndTxn", {"transactional_id": transactional_id, "producer_id": producer_id,
                         "producer_epoch": producer_epoch, "committed": commit},
              lambda r: [r["error_code"]])
