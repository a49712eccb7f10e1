"""The command-line tools, modelled on Kafka's: kafka-topics, kafka-console-producer,
kafka-console-consumer, kafka-get-offsets and kafka-consumer-groups.

They work offline on a log directory (`--log-dir DIR`): each opens the directory as a broker
would (taking its `.lock`, so they refuse a directory a running broker holds) and shuts down
cleanly. The tools that only read (get-offsets, topics --list/--describe, consumer-groups, consume
without --group) open it read-only: they change no file in it, and refuse a missing directory. Or they talk to a running broker (`--bootstrap-server HOST:PORT`, `kstore serve`) over
Kafka's protocol through `RemoteBroker`, which has the same methods as `Broker`: each tool below
is one piece of code for both. Output formats follow Kafka's tools so the two can be compared.

Offline, `consume` stops at the end of the log. Against a broker it waits for new records, as
kafka-console-consumer does, until `--max-messages`, `--timeout-ms` without a record, or Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from .broker import Broker
from .cli_progress import ProgressLine, counted
from .config import BrokerConfig
from .consumer import Consumer
from .errors import KStoreError
from .producer import Producer
from .remote_broker import RemoteBroker


def _properties(items: list[str] | None, option: str = "--property") -> dict[str, str]:
    props = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise KStoreError(f"{option} takes name=value, got {item!r}")
        props[name.strip()] = value
    return props


def _bool_property(props: dict[str, str], name: str, default: bool) -> bool:
    value = props.get(name, str(default)).strip().lower()
    if value not in ("true", "false"):
        raise KStoreError(f"{name} must be true or false, not {props[name]!r}")
    return value == "true"


def _decode_separator(s: str) -> str:
    return s.encode("utf-8").decode("unicode_escape")   # "\t" on the command line means a tab


def _open(args, read_only: bool = False) -> Broker | RemoteBroker:
    """A running broker, or the log dir opened offline. `read_only` tools (listing, describing,
    reading) change nothing in the directory, and refuse one that does not exist."""
    if args.bootstrap_server:
        return RemoteBroker(args.bootstrap_server)
    return Broker(args.log_dir, read_only=read_only)


# ------------------------------------------------------------------------------ kstore topics
def topics(args, out: TextIO) -> int:
    actions = [a for a in ("create", "list", "describe", "alter") if getattr(args, a)]
    if len(actions) != 1:
        raise KStoreError("give exactly one of --create, --list, --describe, --alter")
    if args.create:   # checked before the log dir is opened: a refused --create writes nothing
        configs = _create_arguments(args)
    with _open(args, read_only=args.list or args.describe) as broker:
        if args.list:
            for name in sorted(broker.topics(include_internal=True)):
                out.write(name + "\n")
        elif args.create:
            rf = args.replication_factor
            broker.create_topic(args.topic, args.partitions, 1 if rf is None else rf, configs)
            out.write(f"Created topic {args.topic}.\n")
        elif args.alter:
            if not args.topic or args.partitions is None:
                raise KStoreError("--alter needs --topic and --partitions")
            broker.create_partitions(args.topic, args.partitions)
        elif args.describe:
            names = [args.topic] if args.topic else sorted(broker.topics())
            for name in names:
                info = broker.describe_topic(name)
                configs = ",".join(f"{k}={v}" for k, v in sorted(info.configs.items()))
                # kafka-topics leaves the id out when the broker gives none (classic Metadata)
                topic_id = f"\tTopicId: {info.topic_id}" if info.topic_id else ""
                out.write(f"Topic: {info.name}{topic_id}\tPartitionCount: "
                          f"{info.partition_count}\tReplicationFactor: {info.replication_factor}\t"
                          f"Configs: {configs}\n")
                for p in info.partitions:
                    out.write(f"\tTopic: {info.name}\tPartition: {p.partition}\tLeader: {p.leader}\t"
                              f"Replicas: {','.join(map(str, p.replicas))}\t"
                              f"Isr: {','.join(map(str, p.isr))}\n")
    return 0


def _create_arguments(args) -> dict[str, str]:
    """The checks of TopicCommand, and (offline) the topic's name and configs; its configs."""
    if not args.topic:
        raise KStoreError("--create needs --topic")
    configs = _properties(args.config, "--config")
    rf = args.replication_factor
    if rf is not None and not 1 <= rf <= 32767:   # TopicCommand's check
        raise KStoreError(f"the replication factor must be between 1 and 32767 inclusive, "
                          f"not {rf}")
    if args.partitions is not None and args.partitions < 1:
        raise KStoreError(f"the partitions must be greater than 0, not {args.partitions}")
    if not args.bootstrap_server:   # a broker checks them itself, with the same rules
        from .config import LogConfig
        from .topic import validate_topic_name
        validate_topic_name(args.topic)
        LogConfig(configs)
    return configs


# ------------------------------------------------------------------------------ kstore produce
def produce(args, inp: TextIO, out: TextIO) -> int:
    props = _properties(args.property)
    parse_key = props.get("parse.key", "false").lower() == "true"
    separator = _decode_separator(props.get("key.separator", "\t"))
    _check_producer_arguments(args)   # before the log dir is opened: a refusal writes nothing
    with _open(args) as broker:
        producer = Producer(broker, acks=args.acks, batch_size=args.batch_size,
                            linger_ms=args.linger_ms, compression_type=args.compression_codec)
        futures = []
        progress = ProgressLine(f"produce to {args.topic}", "records")   # stderr, only on a TTY
        for line_no, line in enumerate(counted(inp, progress), start=1):
            line = line.rstrip("\n")
            key = None
            if parse_key:
                key, sep, value = line.partition(separator)
                if not sep:
                    raise KStoreError(f"no key separator {separator!r} found on line {line_no}: "
                                      f"{line!r}")
            else:
                value = line
            try:
                future = producer.send(args.topic, value, key=key, partition=args.partition)
            except ValueError as e:   # e.g. a --partition the topic does not have
                raise KStoreError(str(e)) from None
            futures.append((key, value, future))
        producer.close()
        progress.finish()
        failed = 0
        for key, value, future in futures:
            error = future.exception()
            if error is not None:   # reported per record, as kafka-console-producer does
                failed += 1
                sys.stderr.write(f"Error when sending message to topic {args.topic} with key: "
                                 f"{'null' if key is None else len(key.encode())} bytes, value: "
                                 f"{len(value.encode())} bytes with error: {error}\n")
        if args.verbose:
            out.write(f"sent {len(futures) - failed} record(s) in {producer.batches_sent} "
                      f"batch(es)\n")
    return 1 if failed else 0


def _check_producer_arguments(args) -> None:
    from .compression import Compression
    for name, value in (("--batch-size", args.batch_size), ("--linger-ms", args.linger_ms)):
        if value < 0:
            raise KStoreError(f"{name} must be 0 or more, not {value}")
    if args.partition is not None and args.partition < 0:
        raise KStoreError(f"--partition must be 0 or more, not {args.partition}")
    try:
        Compression.from_name(args.compression_codec)
    except ValueError as e:
        raise KStoreError(f"--compression-codec: {e}") from None


# ------------------------------------------------------------------------------ kstore consume
def consume(args, out: TextIO) -> int:
    props = _properties(args.property)
    flag = lambda name: props.get(name, "false").lower() == "true"   # noqa: E731
    separator = _decode_separator(props.get("key.separator", "\t"))
    line_separator = _decode_separator(props.get("line.separator", "\n"))
    if args.max_messages == -1:   # kafka-console-consumer's spelling of "no limit"
        args.max_messages = None
    if args.offset is not None and args.partition is None:
        raise KStoreError("--offset needs --partition (as in kafka-console-consumer)")
    if args.offset is not None and args.offset not in ("earliest", "latest") and (
            not args.offset.lstrip("-").isdigit() or int(args.offset) < 0):
        raise KStoreError(f"the offset value {args.offset!r} is incorrect: give 'earliest', "
                          f"'latest' or a non-negative offset")
    if args.timestamp is not None and args.timestamp < 0:
        raise KStoreError(f"--timestamp takes a time in ms since the epoch (0 or more), not "
                          f"{args.timestamp}")
    with _open(args, read_only=args.group is None) as broker:
        n = broker.partition_count(args.topic)
        partitions = [args.partition] if args.partition is not None else list(range(n))
        consumer_props = _properties(args.consumer_property, "--consumer-property")
        consumer = Consumer(broker, group_id=args.group,
                            auto_offset_reset="earliest" if args.from_beginning else "latest",
                            enable_auto_commit=args.group is not None,
                            check_crcs=_bool_property(consumer_props, "check.crcs", True),
                            isolation_level=_isolation_level(args, consumer_props))
        tps = [(args.topic, p) for p in partitions]
        member = None
        if args.group is not None and args.partition is None and isinstance(broker, RemoteBroker):
            # subscribe: join the group, and read what the group's leader assigns us
            from .consumer_coordinator import ConsumerCoordinator
            member = consumer.group_member = ConsumerCoordinator(
                broker, args.group, [args.topic], client_id="kstore-console-consumer")
            member.ensure_active(consumer)
        else:
            consumer.assign(tps)
        if args.offset is not None:
            offset = args.offset
            if offset in ("earliest", "latest"):
                (consumer.seek_to_beginning if offset == "earliest" else consumer.seek_to_end)(tps)
            else:
                consumer.seek(tps[0], int(offset))
        elif args.timestamp is not None:
            for tp in tps:
                consumer.seek_to_timestamp(tp, args.timestamp)
        elif args.from_beginning and args.group is None:
            consumer.seek_to_beginning(tps)
        printed = 0
        # stderr, only on a terminal, and only when the records go elsewhere (a file, a pipe)
        progress = ProgressLine(f"consume from {args.topic}", "records", beside=out)
        live = isinstance(broker, RemoteBroker)   # a running broker: wait for new records
        last_record = time.monotonic()
        try:
            while args.max_messages is None or printed < args.max_messages:
                if member is not None:     # stay in the group; follow its rebalances
                    member.poll_heartbeat()
                    member.ensure_active(consumer)
                limit = None if args.max_messages is None else args.max_messages - printed
                batch = consumer.poll(max_records=limit)
                if not batch:
                    idle_ms = (time.monotonic() - last_record) * 1000
                    if not live or (args.timeout_ms is not None and idle_ms >= args.timeout_ms):
                        break   # offline, the end of the log ends the run
                    time.sleep(0.05)
                    continue
                last_record = time.monotonic()
                n = _print_records(batch, out, flag, separator, line_separator)
                printed += n
                progress.update(n)
        except KeyboardInterrupt:
            pass   # Ctrl-C ends a live run; the positions reached are still committed below
        progress.finish()
        consumer.close(autocommit=args.group is not None)
        if member is not None:
            member.leave()
        sys.stderr.write(f"Processed a total of {printed} messages\n")
    return 0


def _isolation_level(args, consumer_props: dict[str, str]) -> str:
    """--isolation-level when given, else the consumer property, else read_uncommitted: the
    order kafka-console-consumer merges them in (CommandLineUtils.maybeMergeOptions)."""
    level = args.isolation_level or consumer_props.get("isolation.level", "read_uncommitted")
    if level not in ("read_uncommitted", "read_committed"):
        raise KStoreError(f"invalid value {level!r} for isolation.level: it must be one of "
                          f"read_committed, read_uncommitted")
    return level


def _print_records(batch, out: TextIO, flag, separator: str, line_separator: str) -> int:
    """kafka-console-consumer's DefaultMessageFormatter: the print.* fields, then the value."""
    for r in batch:
        parts = []
        if flag("print.timestamp"):
            parts.append(f"{r.timestamp_type}:{r.timestamp}")
        if flag("print.partition"):
            parts.append(f"Partition:{r.partition}")
        if flag("print.offset"):
            parts.append(f"Offset:{r.offset}")
        if flag("print.key"):
            parts.append("null" if r.key is None else r.key.decode("utf-8", "replace"))
        parts.append("null" if r.value is None else r.value.decode("utf-8", "replace"))
        out.write(separator.join(parts) + line_separator)
    out.flush()
    return len(batch)


# ------------------------------------------------------------------------------ get-offsets
def get_offsets(args, out: TextIO) -> int:
    spec = {"earliest": -2, "latest": -1, "max-timestamp": -3}
    time = spec.get(str(args.time), None)
    if time is None:
        try:
            time = int(args.time)
        except ValueError:
            time = None
        if time is None or time < -3:   # −1, −2, −3 are Kafka's spellings of the three names
            raise KStoreError(f"malformed --time {args.time!r}: give -1 or latest, -2 or earliest, "
                              f"-3 or max-timestamp, or a timestamp in ms (0 or more)")
    with _open(args, read_only=True) as broker:
        names = [args.topic] if args.topic else sorted(broker.topics())
        for name in names:
            n = broker.partition_count(name)
            parts = [args.partitions] if args.partitions is not None else range(n)
            for p in parts:
                found = broker.list_offsets(name, p, time)
                out.write(f"{name}:{p}:{'' if found.offset < 0 else found.offset}\n")
    return 0


# ------------------------------------------------------------------------------ consumer-groups
def consumer_groups(args, out: TextIO) -> int:
    from .consumer_groups_tool import check_reset_arguments, consumer_groups as run
    if (args.describe or args.delete or args.reset_offsets) and not args.group:
        raise KStoreError("--describe, --delete and --reset-offsets need --group GROUP")
    if args.reset_offsets:
        check_reset_arguments(args)
    changes = args.delete or (args.reset_offsets and args.execute)
    with _open(args, read_only=not changes) as broker:
        if (not changes and not isinstance(broker, RemoteBroker)
                and "__consumer_offsets" not in broker.topics(include_internal=True)):
            # Offline, a directory without __consumer_offsets has no groups (and gets none created).
            if args.list:
                return 0
            if args.group:
                sys.stderr.write(f"Error: Consumer group '{args.group}' does not exist.\n")
                return 1
        return run(broker, args, out)


# ------------------------------------------------------------------------------ argparse
def add_parsers(sub) -> None:
    def with_log_dir(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--log-dir", help="work offline on this log directory (no broker may "
                                             "be running on it)")
        where.add_argument("--bootstrap-server", metavar="HOST:PORT[,HOST:PORT]",
                           help="talk to a running broker (kstore serve)")
        return p

    t = with_log_dir(sub.add_parser("topics", help="create, list, describe or alter topics "
                                    "(kafka-topics)"))
    for flag in ("create", "list", "describe", "alter"):
        t.add_argument(f"--{flag}", action="store_true")
    t.add_argument("--topic")
    t.add_argument("--partitions", type=int)
    t.add_argument("--replication-factor", type=int)
    t.add_argument("--config", action="append", metavar="NAME=VALUE")
    t.set_defaults(func=lambda a: topics(a, sys.stdout))

    p = with_log_dir(sub.add_parser("produce", help="one record per stdin line "
                                    "(kafka-console-producer)"))
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int)
    p.add_argument("--property", action="append", metavar="NAME=VALUE",
                   help="parse.key=true, key.separator=:")
    p.add_argument("--acks", default="all")
    p.add_argument("--batch-size", type=int, default=16384)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--compression-codec", default="none")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(func=lambda a: produce(a, sys.stdin, sys.stdout))

    c = with_log_dir(sub.add_parser("consume", help="print records (kafka-console-consumer)"))
    c.add_argument("--topic", required=True)
    c.add_argument("--partition", type=int)
    c.add_argument("--from-beginning", action="store_true")
    c.add_argument("--offset", help="an offset, earliest or latest (needs --partition)")
    c.add_argument("--timestamp", type=int, help="start at the first record at or after this ms time")
    c.add_argument("--group")
    c.add_argument("--max-messages", type=int)
    c.add_argument("--timeout-ms", type=int, help="with --bootstrap-server: stop after this long "
                                                  "without a record (default: wait for more)")
    c.add_argument("--property", action="append", metavar="NAME=VALUE",
                   help="print.key=true, print.offset=true, print.partition=true, "
                        "print.timestamp=true, key.separator=...")
    c.add_argument("--consumer-property", action="append", metavar="NAME=VALUE",
                   help="consumer config: check.crcs=true|false (default true), "
                        "isolation.level=read_committed|read_uncommitted")
    c.add_argument("--isolation-level", help="read_committed: leave out records of aborted and "
                   "still open transactions; read_uncommitted (the default): print every record")
    c.set_defaults(func=lambda a: consume(a, sys.stdout))

    g = with_log_dir(sub.add_parser("get-offsets", help="offsets by time (kafka-get-offsets)"))
    g.add_argument("--topic")
    g.add_argument("--partitions", type=int)
    g.add_argument("--time", default="latest",
                   help="earliest, latest, max-timestamp or a timestamp in ms")
    g.set_defaults(func=lambda a: get_offsets(a, sys.stdout))

    sv = sub.add_parser("serve", help="run a broker speaking Kafka's protocol")
    sv.add_argument("--log-dir", help="the broker's log directory (a single broker)")
    sv.add_argument("--cluster-dir", help="run as one broker of a multi-broker cluster sharing this "
                                          "directory (with --broker-id)")
    sv.add_argument("--broker-id", type=int, default=0)
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=9092)
    sv.add_argument("--copy-fetch", action="store_true",
                    help="send fetched records through user space instead of os.sendfile")
    sv.add_argument("--override", action="append", metavar="NAME=VALUE",
                    help="broker config, e.g. auto.create.topics.enable=false, or a topic "
                         "config's broker-wide default, e.g. log.segment.bytes=1048576")
    sv.add_argument("--my-engine", metavar="FOLDER",
                    help="serve with your saved exercise functions plugged in (kstore.my_engine)")
    sv.set_defaults(func=lambda a: _serve(a))

    cg = with_log_dir(sub.add_parser("consumer-groups", help="committed offsets and lag "
                                     "(kafka-consumer-groups)"))
    cg.add_argument("--list", action="store_true")
    cg.add_argument("--describe", action="store_true")
    cg.add_argument("--group")
    cg.add_argument("--members", action="store_true", help="with --describe: the members")
    cg.add_argument("--verbose", action="store_true", help="with --members: their partitions")
    cg.add_argument("--state", action="store_true", help="with --describe: state, strategy")
    cg.add_argument("--offsets", action="store_true", help="with --describe: offsets, lag (default)")
    cg.add_argument("--delete", action="store_true", help="delete a group without members")
    cg.add_argument("--reset-offsets", action="store_true",
                    help="move a group's committed offsets (the group must have no members)")
    cg.add_argument("--topic", action="append", metavar="TOPIC[:P,P]")
    cg.add_argument("--all-topics", action="store_true")
    cg.add_argument("--to-earliest", action="store_true")
    cg.add_argument("--to-latest", action="store_true")
    cg.add_argument("--to-offset", type=int)
    cg.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss")
    cg.add_argument("--dry-run", action="store_true")
    cg.add_argument("--execute", action="store_true")
    cg.set_defaults(func=lambda a: consumer_groups(a, sys.stdout))


def _serve(args) -> int:
    if bool(args.log_dir) == bool(args.cluster_dir):
        raise KStoreError("give --log-dir (one broker) or --cluster-dir with --broker-id")
    if not 0 <= args.port <= 65535:
        raise KStoreError(f"--port must be between 0 and 65535 (0: any free port), not {args.port}")
    if not 0 <= args.broker_id <= 2**31 - 1:   # Kafka's node.id / broker.id: an int32, 0 or more
        raise KStoreError(f"--broker-id must be between 0 and 2147483647, not {args.broker_id}")
    overrides = _properties(args.override, "--override")
    BrokerConfig(overrides)  # a bad --override is the one line printed, before anything starts
    from .malloc import keep_freed_buffers
    keep_freed_buffers()     # a Produce request's buffer reuses freed memory (kstore/malloc.py)
    if args.my_engine:       # the learner's own code runs in this broker: their machine, their engine
        from .my_engine import use_my_engine
        use_my_engine(args.my_engine.rstrip("/") or args.my_engine)
    if args.cluster_dir:
        if args.port == 0:   # it registers its port for the others before it listens
            raise KStoreError("--cluster-dir needs a fixed --port: the other brokers reach this "
                              "one at the port it registers in the cluster's metadata")
        from .cluster_node import ClusterNode
        from .server import configure_logging, raise_open_file_limit
        configure_logging()   # its recovery warnings on stdout too, as a lone broker's
        raise_open_file_limit()
        node = ClusterNode(args.cluster_dir, args.broker_id, args.port, args.host,
                           broker_config=overrides, zero_copy=not args.copy_fetch)
        print(f"kstore broker {args.broker_id} of the cluster in {args.cluster_dir} on "
              f"{args.host}:{args.port}", flush=True)
        node.run()
        print("kstore broker stopped cleanly", flush=True)
        return 0
    from .server import serve
    serve(args.log_dir, args.host, args.port, zero_copy=not args.copy_fetch,
          broker_config=overrides)
    return 0
