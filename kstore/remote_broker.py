"""`RemoteBroker`: the broker calls of kstore's tools, `Producer` and `Consumer`, answered by a
running broker over Kafka's protocol — what Kafka's AdminClient, KafkaProducer and KafkaConsumer
do behind their APIs.

`kstore topics | produce | consume | get-offsets | consumer-groups --bootstrap-server HOST:PORT`
use it where the offline tools open a `Broker` on a log directory. It offers the same methods with
the same results and the same exception classes, so the tools' code, and their output, is one.

Routing, as Kafka's clients do it: partition requests (Produce, Fetch, ListOffsets) go to the
partition's leader named by Metadata; offset commits and fetches go to the group's coordinator
(FindCoordinator); ListGroups asks every broker; the other admin requests go to any broker (here
the bootstrap one). Retriable errors (a moved or not yet ready leader or coordinator) refresh the
metadata and retry, 100 ms apart, for up to the request timeout, as Kafka's clients do.

Where it differs from Kafka's clients: classic (non-flexible) protocol versions only, so Metadata
carries no topic id (`describe_topic` leaves it empty, and the describe output omits it, as
kafka-topics does when a broker has none), and ListOffsets for max-timestamp (−3) is sent at v5
(Kafka's clients need v7; kstore's broker answers it at any version).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from . import protocol as P
from .broker import FetchResult, PartitionInfo, TopicInfo
from .clock import Clock, SystemClock
from .errors import CommitFailedError, KStoreError, UnknownTopicOrPartitionError, error_for_code
from .group_coordinator import OffsetAndMetadata
from .log import Isolation
from .network_client import KafkaConnection
from .records import MemoryRecords
from .segment import TimestampAndOffset

API = P.API_KEYS
# The versions this client sends (all within what kstore's broker supports, all non-flexible).
VERSION = {"Metadata": 8, "Produce": 8, "Fetch": 11, "ListOffsets": 5, "FindCoordinator": 2,
           "OffsetCommit": 7, "OffsetFetch": 5, "CreateTopics": 4, "CreatePartitions": 1,
           "DescribeConfigs": 3, "ListGroups": 2, "DescribeGroups": 4, "DeleteGroups": 1,
           "InitProducerId": 1, "AddPartitionsToTxn": 2, "EndTxn": 2}
TOPIC_RESOURCE = 2
E = P.ERRORS
# Retriable, as in Kafka's clients (InvalidMetadataException and its kind): refresh and try again.
LEADER_MOVED = (E["NOT_LEADER_OR_FOLLOWER"], E["LEADER_NOT_AVAILABLE"], E["BROKER_NOT_AVAILABLE"],
                E["UNKNOWN_TOPIC_OR_PARTITION"])
COORDINATOR_MOVED = (E["COORDINATOR_LOAD_IN_PROGRESS"], E["COORDINATOR_NOT_AVAILABLE"],
                     E["NOT_COORDINATOR"])


@dataclass(frozen=True)
class ProduceAck:
    """What the producer needs from a ProduceResponse (the fields of LogAppendInfo it reads)."""
    first_offset: int
    log_append_time: int


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    """"host:port,host:port" -> [(host, port)], with a clear error for a malformed entry."""
    out = []
    for address in (a.strip() for a in servers.split(",")):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise KStoreError(f"bootstrap servers are HOST:PORT[,HOST:PORT...], not {address!r} "
                              f"in {servers!r}")
        out.append((host, int(port)))
    return out


class RemoteBroker:
    def __init__(self, bootstrap_servers: str, *, client_id: str = "kstore-cli",
                 timeout_s: float = 30.0, clock: Clock | None = None):
        self.bootstrap_servers = bootstrap_servers
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.clock = clock or SystemClock()
        self._connections: dict[tuple[str, int], KafkaConnection] = {}
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._bootstrap = self._first_reachable(parse_bootstrap(bootstrap_servers))
        self._coordinator = RemoteGroupCoordinator(self)

    # ------------------------------------------------------------------ connections
    def _connection(self, address: tuple[str, int]) -> KafkaConnection:
        if address not in self._connections:
            self._connections[address] = KafkaConnection(*address, client_id=self.client_id,
                                                         timeout=self.timeout_s)
        return self._connections[address]

    def _first_reachable(self, addresses: list[tuple[str, int]]) -> tuple[str, int]:
        problems = []
        for address in addresses:
            try:
                self._connection(address).request(API["ApiVersions"], 0, {})
                return address
            except KStoreError as e:
                problems.append(str(e))
        raise KStoreError(f"no broker reachable at {self.bootstrap_servers}: {'; '.join(problems)}")

    def request(self, api: str, body: dict, node: int | None = None,
                expect_response: bool = True) -> dict | None:
        """One request to broker `node` (by its id in Metadata), or to the bootstrap broker."""
        address = self._bootstrap if node is None else self._brokers.get(node)
        if address is None:
            raise KStoreError(f"broker {node} is not in the cluster's metadata")
        return self._connection(address).request(API[api], VERSION[api], body,
                                                 expect_response=expect_response)

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    shutdown = close

    def __enter__(self) -> "RemoteBroker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ metadata
    def _metadata(self, topics: list[str] | None, allow_create: bool = False) -> dict:
        body = {"topics": None if topics is None else [{"name": t} for t in topics],
                "allow_auto_topic_creation": allow_create}
        response = self.request("Metadata", body)
        self._brokers = {b["node_id"]: (b["host"], b["port"]) for b in response["brokers"]}
        for t in response["topics"]:
            for p in t["partitions"]:
                self._leaders[(t["name"], p["partition_index"])] = p["leader_id"]
        return response

    def _topic_metadata(self, name: str, allow_create: bool = False) -> dict:
        (topic,) = self._metadata([name], allow_create)["topics"]
        code = topic["error_code"]
        if code:
            raise error_for_code(code, f"topic '{name}' does not exist"
                                 if code == P.ERRORS["UNKNOWN_TOPIC_OR_PARTITION"] else f"topic '{name}'")
        return topic

    def topics(self, include_internal: bool = False) -> list[str]:
        return [t["name"] for t in self._metadata(None)["topics"]
                if t["error_code"] == 0 and (include_internal or not t["is_internal"])]

    def topic_partition_counts(self) -> dict[str, int]:
        """topic -> partition count, for every topic (one Metadata request, never creating one)."""
        return {t["name"]: len(t["partitions"]) for t in self._metadata(None)["topics"]
                if t["error_code"] == 0}

    def partition_count(self, topic: str) -> int:
        return len(self._topic_metadata(topic)["partitions"])

    def ensure_topic(self, topic: str) -> None:
        """A producer's first Metadata request may create the topic (auto.create.topics.enable)."""
        self._topic_metadata(topic, allow_create=True)

    def describe_topic(self, name: str) -> TopicInfo:
        topic = self._topic_metadata(name)
        parts = [PartitionInfo(name, p["partition_index"], p["leader_id"], p["replica_nodes"],
                               p["isr_nodes"], p["leader_epoch"], -1, -1, -1)
                 for p in sorted(topic["partitions"], key=lambda p: p["partition_index"])]
        return TopicInfo(name, "", parts, self.topic_overrides(name), topic["is_internal"])

    def topic_overrides(self, name: str) -> dict[str, str]:
        """The configs set on the topic itself (DescribeConfigs, source DYNAMIC_TOPIC_CONFIG)."""
        body = {"resources": [{"resource_type": TOPIC_RESOURCE, "resource_name": name,
                               "configuration_keys": None}]}
        (result,) = self.request("DescribeConfigs", body)["results"]
        if result["error_code"]:
            raise error_for_code(result["error_code"], result["error_message"] or f"topic '{name}'")
        return {c["name"]: c["value"] for c in result["configs"] if c["config_source"] == 1}

    # ------------------------------------------------------------------ admin
    def create_topic(self, name: str, num_partitions: int | None = None,
                     replication_factor: int | None = 1, configs: dict | None = None) -> TopicInfo:
        body = {"topics": [{"name": name, "num_partitions": -1 if num_partitions is None
                            else num_partitions,
                            "replication_factor": -1 if replication_factor is None
                            else replication_factor, "assignments": [],
                            "configs": [{"name": k, "value": str(v)}
                                        for k, v in (configs or {}).items()]}],
                "timeout_ms": int(self.timeout_s * 1000), "validate_only": False}
        (result,) = self.request("CreateTopics", body)["topics"]
        if result["error_code"]:
            raise error_for_code(result["error_code"], result["error_message"] or f"topic '{name}'")
        return self.describe_topic(name)

    def create_partitions(self, name: str, new_total: int) -> TopicInfo:
        body = {"topics": [{"name": name, "count": new_total, "assignments": None}],
                "timeout_ms": int(self.timeout_s * 1000), "validate_only": False}
        (result,) = self.request("CreatePartitions", body)["results"]
        if result["error_code"]:
            raise error_for_code(result["error_code"], result["error_message"] or f"topic '{name}'")
        return self.describe_topic(name)

    # ------------------------------------------------------------------ partition requests
    def _leader(self, topic: str, partition: int) -> int:
        if (topic, partition) not in self._leaders:
            self._topic_metadata(topic)
        leader = self._leaders.get((topic, partition))
        if leader is None:
            raise UnknownTopicOrPartitionError(f"topic '{topic}' has no partition {partition}")
        return leader

    def retrying(self, attempt, retriable: tuple[int, ...], before_retry=None):
        """`attempt()` again while it fails with a retriable error code, for up to the request
        timeout, 100 ms apart (the retries and retry.backoff.ms of Kafka's clients)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return attempt()
            except KStoreError as e:
                if getattr(e, "error_code", None) not in retriable or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
            if before_retry is not None:
                before_retry()

    def _to_leader(self, topic: str, partition: int, send):
        """`send(leader_id)`; when the leader has moved, is down or has not yet opened a new
        partition, again after a metadata refresh. A partition Metadata does not list fails at once."""
        self._leader(topic, partition)
        return self.retrying(lambda: send(self._leader(topic, partition)), LEADER_MOVED,
                             before_retry=lambda: self._topic_metadata(topic))

    def list_offsets(self, topic: str, partition: int, timestamp: int) -> TimestampAndOffset:
        """−2 earliest, −1 latest (the high watermark), −3 max timestamp, or the first offset at
        or after a timestamp (offset −1: none)."""
        return self.list_offsets_many({(topic, partition): timestamp})[(topic, partition)]

    def list_offsets_many(self, requests: dict[tuple[str, int], int], read_committed: bool = False
                          ) -> dict[tuple[str, int], TimestampAndOffset]:
        """`list_offsets` for many partitions: one ListOffsets request per leader (all again, with
        fresh metadata, if a leader has moved). read_committed: latest is the LSO."""
        for tp in requests:
            self._leader(*tp)   # a partition Metadata does not list fails at once

        def attempt():
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for tp in requests:
                by_leader.setdefault(self._leader(*tp), []).append(tp)
            found = {}
            for leader, tps in by_leader.items():
                found.update(self._list_offsets_at(leader, tps, requests, read_committed))
            return {tp: found[tp] for tp in requests}
        topics = sorted({t for t, _ in requests})
        return self.retrying(attempt, LEADER_MOVED, before_retry=lambda: self._metadata(topics))

    def _list_offsets_at(self, leader: int, tps, requests, read_committed: bool = False) -> dict:
        by_topic: dict[str, list] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append({"partition_index": p, "current_leader_epoch": -1,
                                               "timestamp": requests[(t, p)]})
        body = {"replica_id": -1, "isolation_level": int(read_committed),
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}
        out = {}
        for topic in self.request("ListOffsets", body, leader)["topics"]:
            for part in topic["partitions"]:
                tp = (topic["name"], part["partition_index"])
                if part["error_code"]:
                    raise error_for_code(part["error_code"], f"ListOffsets {tp[0]}-{tp[1]}")
                epoch = part["leader_epoch"]
                out[tp] = TimestampAndOffset(part["timestamp"], part["offset"],
                                             None if epoch < 0 else epoch)
        return out

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1048576,
              isolation: str = Isolation.HIGH_WATERMARK, max_wait_ms: int = 0) -> FetchResult:
        body = {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1,
                "max_bytes": max_bytes, "session_id": 0, "session_epoch": -1, "rack_id": "",
                "isolation_level": 1 if isolation == Isolation.TXN_COMMITTED else 0,
                "forgotten_topics_data": [],
                "topics": [{"topic": topic, "partitions": [
                    {"partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                     "log_start_offset": -1, "partition_max_bytes": max_bytes}]}]}

        def send(leader):
            part = self.request("Fetch", body, leader)["responses"][0]["partitions"][0]
            if part["error_code"]:
                raise error_for_code(part["error_code"], f"fetch {topic}-{partition} at {offset}")
            return FetchResult(topic, partition, MemoryRecords(bytes(part["records"] or b"")),
                               part["high_watermark"], part["last_stable_offset"],
                               part["log_start_offset"],
                               tuple((a["producer_id"], a["first_offset"])
                                     for a in part["aborted_transactions"] or ()))
        return self._to_leader(topic, partition, send)

    def produce(self, topic: str, partition: int, records: bytes, acks=-1,
                timeout_ms: int | None = None, transactional_id: str | None = None) -> ProduceAck:
        acks, timeout_ms = self._produce_settings(acks, timeout_ms)
        body = _produce_body([(topic, partition, records)], acks, timeout_ms, transactional_id)

        def send(leader):
            response = self.request("Produce", body, leader, expect_response=acks != 0)
            return _produce_acks(response, [(topic, partition)])[(topic, partition)]
        return self._to_leader(topic, partition, send)

    def produce_many(self, batches: list[tuple[str, int, bytes]], acks=-1,
                     timeout_ms: int | None = None, transactional_id: str | None = None
                     ) -> dict[tuple[str, int], ProduceAck]:
        """`produce` of one batch for each of several partitions, in one Produce request per
        leader, as Kafka's Sender puts every ready batch for a broker into one request. A
        partition whose leader moved (or a leader that cannot be reached) goes again on its own
        through `produce`, which retries after a metadata refresh; any other error raises."""
        acks, timeout_ms = self._produce_settings(acks, timeout_ms)
        if len({(t, p) for t, p, _ in batches}) != len(batches):
            raise ValueError("a Produce request carries one batch per partition")
        by_leader: dict[int, list[tuple[str, int, bytes]]] = {}
        for topic, partition, records in batches:
            by_leader.setdefault(self._leader(topic, partition), []).append(
                (topic, partition, records))
        answers: dict[tuple[str, int], ProduceAck] = {}
        moved: list[tuple[str, int]] = []
        for leader, group in by_leader.items():
            try:
                response = self.request("Produce", _produce_body(group, acks, timeout_ms,
                                                                 transactional_id),
                                        leader, expect_response=acks != 0)
                answers.update(_produce_acks(response, [(t, p) for t, p, _ in group], moved))
            except KStoreError as e:
                if getattr(e, "error_code", None) not in LEADER_MOVED:
                    raise
                moved += [(t, p) for t, p, _ in group]
        if moved:
            self._metadata(sorted({t for t, _ in moved}))   # where the leaders are now
        for topic, partition, records in batches:   # the same bytes again, sequence included
            if (topic, partition) in moved:
                answers[(topic, partition)] = self.produce(topic, partition, records, acks,
                                                           timeout_ms, transactional_id)
        return answers

    def _produce_settings(self, acks, timeout_ms: int | None) -> tuple[int, int]:
        """acks as Kafka's number ("all" → -1), and this client's timeout where none is given."""
        acks = {"all": -1, "-1": -1, "1": 1, "0": 0}.get(str(acks), acks)
        return acks, int(self.timeout_s * 1000) if timeout_ms is None else timeout_ms

    def allocate_producer_id(self) -> int:
        """A producer id for an idempotent producer (InitProducerId, epoch 0), from any broker."""
        response = self.request("InitProducerId", {"transactional_id": None,
                                                   "transaction_timeout_ms": 60000})
        if response["error_code"]:
            raise error_for_code(response["error_code"], "InitProducerId")
        return response["producer_id"]

    # ------------------------------------------------------------------ groups
    @property
    def group_coordinator(self) -> "RemoteGroupCoordinator":
        return self._coordinator

    def broker_ids(self) -> list[int]:
        self._metadata([])
        return sorted(self._brokers)


class RemoteGroupCoordinator:
    """The `GroupCoordinator` calls of the tools and the consumer, over the network."""

    def __init__(self, broker: RemoteBroker):
        self.broker = broker

    def _coordinator(self, group_id: str) -> int:
        response = self.broker.request("FindCoordinator", {"key": group_id, "key_type": 0})
        if response["error_code"]:
            raise error_for_code(response["error_code"], response["error_message"]
                                 or f"no coordinator for group '{group_id}'")
        self.broker._brokers.setdefault(response["node_id"], (response["host"], response["port"]))
        return response["node_id"]

    def _to_coordinator(self, group_id: str, api: str, body: dict) -> dict:
        """The request to the group's coordinator; while the coordinator moves or loads its
        partition (a new `__consumer_offsets` leader), look it up again and retry."""
        def attempt():
            response = self.broker.request(api, body, self._coordinator(group_id))
            code = response.get("error_code", 0) or next(
                (p["error_code"] for t in response.get("topics", []) for p in t["partitions"]
                 if p["error_code"] in COORDINATOR_MOVED), 0)
            if code:
                raise error_for_code(code, f"{api} for group '{group_id}'")
            return response
        return self.broker.retrying(attempt, COORDINATOR_MOVED)

    def commit_offsets(self, group_id: str, offsets: dict, generation_id: int = -1,
                       member_id: str = "") -> dict[tuple[str, int], int]:
        """Commit (OffsetCommit; generation −1 and no member id for a consumer that assigns its
        own partitions, a group member's own otherwise). Raises CommitFailedError naming every
        partition the coordinator refused."""
        if not offsets:
            return {}
        committed = {tp: om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(om)
                     for tp, om in offsets.items()}
        by_topic: dict[str, list] = {}
        for (topic, partition), om in committed.items():
            by_topic.setdefault(topic, []).append({
                "partition_index": partition, "committed_offset": om.offset,
                "committed_leader_epoch": om.leader_epoch, "committed_metadata": om.metadata})
        body = {"group_id": group_id, "generation_id_or_member_epoch": generation_id,
                "member_id": member_id,
                "group_instance_id": None,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}
        response = self._to_coordinator(group_id, "OffsetCommit", body)
        codes = {(t["name"], p["partition_index"]): p["error_code"]
                 for t in response["topics"] for p in t["partitions"]}
        refused = {tp: code for tp, code in codes.items() if code}
        if refused:
            listing = ", ".join(f"{t}-{p}: {P.ERROR_NAMES.get(c, c)}" for (t, p), c in refused.items())
            # As in Kafka, the coordinator answers per partition: the others were committed.
            error = CommitFailedError(f"commit for group '{group_id}' refused for {listing}; "
                                      f"{len(codes) - len(refused)} other partition(s) committed")
            error.error_code = next(iter(refused.values()))
            raise error
        return {tp: om.offset for tp, om in committed.items()}

    def fetch_offsets(self, group_id: str, partitions=None) -> dict:
        body = {"group_id": group_id, "topics": None if partitions is None else [
            {"name": t, "partition_indexes": [p for (t2, p) in partitions if t2 == t]}
            for t in dict.fromkeys(t for t, _ in partitions)]}
        response = self._to_coordinator(group_id, "OffsetFetch", body)
        found = {}
        for t in response["topics"]:
            for p in t["partitions"]:
                if p["error_code"]:
                    raise error_for_code(p["error_code"], f"offset of {t['name']}-"
                                                          f"{p['partition_index']}")
                found[(t["name"], p["partition_index"])] = None if p["committed_offset"] < 0 else \
                    OffsetAndMetadata(p["committed_offset"], p["metadata"] or "",
                                      p["committed_leader_epoch"])
        if partitions is None:
            return {tp: om for tp, om in found.items() if om is not None}
        return {tp: found.get(tp) for tp in partitions}

    def describe_group(self, group_id: str):
        """DescribeGroups at the group's coordinator: its state and members (GroupDescription)."""
        from .group_metadata import describe_described_group
        response = self._to_coordinator(group_id, "DescribeGroups", {"groups": [group_id]})
        described = response["groups"][0]
        if described["error_code"]:
            raise error_for_code(described["error_code"], f"DescribeGroups of '{group_id}'")
        return describe_described_group(described, self._coordinator(group_id))

    def delete_group(self, group_id: str) -> None:
        response = self._to_coordinator(group_id, "DeleteGroups", {"groups_names": [group_id]})
        code = response["results"][0]["error_code"]
        if code:
            raise error_for_code(code, f"group '{group_id}' could not be deleted")

    def groups(self) -> list[str]:
        """Every group of the cluster: ListGroups to each broker (each lists the groups it
        coordinates), as Kafka's AdminClient.listConsumerGroups does."""
        names = set()
        for node in self.broker.broker_ids():
            response = self.broker.request("ListGroups", {}, node)
            if response["error_code"]:
                raise error_for_code(response["error_code"], f"ListGroups on broker {node}")
            names.update(g["group_id"] for g in response["groups"])
        return sorted(names)


def _produce_body(batches, acks: int, timeout_ms: int, transactional_id: str | None) -> dict:
    """A ProduceRequest with one batch for each (topic, partition, records), grouped by topic."""
    by_topic: dict[str, list[dict]] = {}
    for topic, partition, records in batches:
        by_topic.setdefault(topic, []).append(
            {"index": partition, "records": None if records is None else P.RecordsBuffer(records)})
    return {"transactional_id": transactional_id, "acks": acks, "timeout_ms": timeout_ms,
            "topic_data": [{"name": t, "partition_data": parts} for t, parts in by_topic.items()]}


def _produce_acks(response: dict | None, tps: list[tuple[str, int]],
                  moved: list[tuple[str, int]] | None = None) -> dict[tuple[str, int], ProduceAck]:
    """Each partition's ProduceAck from a ProduceResponse (acks=0: none came, offsets unknown).
    An error raises, except a moved leader's where `moved` collects the partition instead."""
    if response is None:
        return {tp: ProduceAck(-1, -1) for tp in tps}
    found = {(r["name"], part["index"]): part for r in response["responses"]
             for part in r["partition_responses"]}
    acks = {}
    for topic, partition in tps:
        part = found.get((topic, partition))
        if part is None:
            raise KStoreError(f"the Produce response has no answer for {topic}-{partition}")
        if part["error_code"]:
            if moved is not None and part["error_code"] in LEADER_MOVED:
                moved.append((topic, partition))
                continue
            raise error_for_code(part["error_code"], part["error_message"]
                                 or f"produce to {topic}-{partition}")
        acks[(topic, partition)] = ProduceAck(part["base_offset"], part["log_append_time_ms"])
    return acks
