"""`kstore consumer-groups`: Kafka's `kafka-consumer-groups.sh` (ConsumerGroupCommand).

    --list [--state]
    --describe --group G [--members [--verbose] | --state | --offsets (default)]
    --reset-offsets --group G (--topic T[:P,P] | --all-topics)
        (--to-earliest | --to-latest | --to-offset N | --to-datetime T) [--dry-run | --execute]
    --delete --group G

Works on a log directory (offline) and against a running broker (DescribeGroups, OffsetCommit,
DeleteGroups), with the same output. As in Kafka, offsets are reset only for a group without
active members ("Error: Assignments can only be reset if the group ... is inactive"), and without
--execute a reset is only shown (a dry run). The coordinator refuses commits to a group with
members anyway; the check here only makes the message clear.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import TextIO

from .errors import KStoreError

ACTIVE_STATES = ("PreparingRebalance", "CompletingRebalance", "Stable")


def _table(out: TextIO, header: tuple, rows: list[tuple], min_widths: tuple[int, ...],
           blank_line_first: bool = True) -> None:
    """ConsumerGroupCommand's printf tables: each column but the last left-aligned in at least
    its minimum width (15 for names, 10 for PARTITION, 15 for offsets...), widened to its widest
    cell for the columns Kafka widens, and the last column unpadded."""
    widths = [max(minimum, len(h), *(len(r[i]) for r in rows)) if minimum >= 0 else -minimum
              for i, (h, minimum) in enumerate(zip(header, min_widths))]

    def line(cells) -> str:
        *padded, last = cells
        return "".join(c.ljust(w) + " " for c, w in zip(padded, widths)) + last

    out.write(("\n" if blank_line_first else "") + line(header) + "\n")
    for r in rows:
        out.write(line(r) + "\n")


def consumer_groups(broker, args, out: TextIO, err: TextIO | None = None) -> int:
    err = err or sys.stderr
    coordinator = broker.group_coordinator
    if args.list:
        if args.state:   # --list --state: each group with its state (Kafka asks ListGroups v4+)
            _table(out, ("GROUP", "STATE"),
                   [(g, coordinator.describe_group(g).state) for g in coordinator.groups()], (15, 0),
                   blank_line_first=False)
            return 0
        for g in coordinator.groups():
            out.write(g + "\n")
        return 0
    if not args.group:
        raise KStoreError("give --list, or --group GROUP with --describe, --reset-offsets or --delete")
    if args.delete:
        return _delete(coordinator, args.group, out, err)
    if args.reset_offsets:
        return _reset_offsets(broker, coordinator, args, out, err)
    if not args.describe:
        raise KStoreError("give one of --describe, --reset-offsets, --delete")
    description = coordinator.describe_group(args.group)
    if description.state == "Dead":
        err.write(f"Error: Consumer group '{args.group}' does not exist.\n")
        return 1
    if args.state:
        return _describe_state(broker, description, out)
    if args.members:
        return _describe_members(description, args.verbose, out, err)
    return _describe_offsets(broker, coordinator, description, out, err)


def _warn_state(description, err: TextIO) -> None:
    if description.state == "Empty":
        err.write(f"\nConsumer group '{description.group_id}' has no active members.\n")
    elif description.state in ("PreparingRebalance", "CompletingRebalance"):
        err.write(f"\nWarning: Consumer group '{description.group_id}' is rebalancing.\n")


def _describe_offsets(broker, coordinator, description, out: TextIO, err: TextIO) -> int:
    offsets = coordinator.fetch_offsets(description.group_id)
    owner = {tp: m for m in description.members for tp in m.assignment}
    _warn_state(description, err)
    rows = []
    for topic, partition in sorted(set(offsets) | set(owner)):
        om, member = offsets.get((topic, partition)), owner.get((topic, partition))
        end = broker.list_offsets(topic, partition, -1).offset   # latest = the high watermark
        current = "-" if om is None else str(om.offset)
        lag = "-" if om is None else str(max(end - om.offset, 0))
        who = ("-", "-", "-") if member is None else (member.member_id, member.host, member.client_id)
        rows.append((description.group_id, topic, str(partition), current, str(end), lag, *who))
    if not rows:   # Kafka prints no table for a group with nothing to show (the state line only)
        return 0
    # %-Gs %-Ts %-10s %-15s %-15s %-15s %-Cs %-Hs %s; G, T, C, H at least 15, else the widest
    _table(out, ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                 "CONSUMER-ID", "HOST", "CLIENT-ID"), rows, (15, 15, -10, -15, -15, -15, 15, 15, 0))
    return 0


def _describe_members(description, verbose: bool, out: TextIO, err: TextIO) -> int:
    _warn_state(description, err)
    # "%-Gs %-Cs %-Hs %-Ls %-15s " then ASSIGNMENT with --verbose: #PARTITIONS is always padded
    rows = []
    for m in description.members:
        row = (description.group_id, m.member_id, m.host, m.client_id, str(len(m.assignment)))
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(m.assignment):
            by_topic.setdefault(t, []).append(p)
        assignment = ",".join(f"{t}({','.join(map(str, ps))})" for t, ps in by_topic.items()) or "-"
        rows.append(row + (assignment if verbose else "",))
    _table(out, ("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS",
                 "ASSIGNMENT" if verbose else ""), rows, (15, 15, 15, 15, -15, 0))
    return 0


def _describe_state(broker, description, out: TextIO) -> int:
    host, port = _coordinator_address(broker, description.coordinator)
    # "%-Gs %-Cs %-20s %-20s %s", G at least 15, C at least 25; two spaces before "(id)"
    _table(out, ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
           [(description.group_id, f"{host}:{port}  ({description.coordinator})",
             description.protocol or "-", description.state, str(len(description.members)))],
           (15, 25, -20, -20, 0))
    return 0


def _coordinator_address(broker, node: int) -> tuple[str, int]:
    known = getattr(broker, "_brokers", None)
    if known and node in known:
        return known[node]
    return getattr(broker, "host", "127.0.0.1"), getattr(broker, "port", 9092)


def _delete(coordinator, group: str, out: TextIO, err: TextIO) -> int:
    try:
        coordinator.delete_group(group)
    except KStoreError as e:
        reason = ("The group is not empty." if getattr(e, "error_code", None) == 68
                  else "The group id does not exist." if getattr(e, "error_code", None) == 69
                  else str(e))
        err.write(f"Error: Deletion of some consumer groups failed:\n"
                  f"* Group '{group}' could not be deleted due to: {reason}\n")
        return 1
    out.write(f"Deletion of requested consumer groups ('{group}') was successful.\n")
    return 0


# ---- --reset-offsets
def check_reset_arguments(args) -> None:
    """What can be checked before the log dir is opened (a writable open creates files)."""
    targets = [x for x in ("to_earliest", "to_latest", "to_offset", "to_datetime")
               if getattr(args, x) not in (None, False)]
    if len(targets) != 1:
        raise KStoreError("--reset-offsets needs exactly one of --to-earliest, --to-latest, "
                          "--to-offset, --to-datetime")
    for spec in args.topic or []:
        _, _, parts = spec.partition(":")
        if parts and not all(p.strip().isdigit() for p in parts.split(",")):
            raise KStoreError(f"--topic {spec!r}: give TOPIC or TOPIC:P,P with partition numbers")
    if args.to_datetime is not None:
        parse_datetime(args.to_datetime)


def _reset_offsets(broker, coordinator, args, out: TextIO, err: TextIO) -> int:
    check_reset_arguments(args)
    state = coordinator.describe_group(args.group).state
    if state in ACTIVE_STATES:
        err.write(f"Error: Assignments can only be reset if the group '{args.group}' is inactive, "
                  f"but the current state is {state}.\n")
        return 1
    partitions = _partitions_to_reset(broker, coordinator, args)
    new = {tp: _new_offset(broker, tp, args) for tp in partitions}
    if args.execute:
        coordinator.commit_offsets(args.group, new)
    elif not args.dry_run:
        err.write("WARN: No action will be performed as the --execute option is missing. "
                  "In a future major release, the default behavior of this command will be to "
                  "prompt the user before executing the reset rather than doing a dry run. You "
                  "should add the --dry-run option explicitly if you are scripting this command "
                  "and want to keep the current default behavior without prompting.\n")
    _table(out, ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"),
           [(args.group, t, str(p), str(o)) for (t, p), o in sorted(new.items())], (15, 15, -10, 0))
    return 0


def _partitions_to_reset(broker, coordinator, args) -> list[tuple[str, int]]:
    if args.all_topics:
        return sorted(coordinator.fetch_offsets(args.group))
    if not args.topic:
        raise KStoreError("--reset-offsets needs --topic TOPIC[:P,P] or --all-topics")
    found = []
    for spec in args.topic:
        topic, _, parts = spec.partition(":")
        count = broker.partition_count(topic)
        chosen = [int(p) for p in parts.split(",")] if parts else list(range(count))
        bad = [p for p in chosen if not 0 <= p < count]
        if bad:
            raise KStoreError(f"topic '{topic}' has no partition {bad[0]} (it has {count})")
        found += [(topic, p) for p in chosen]
    return found


def _new_offset(broker, tp: tuple[str, int], args) -> int:
    earliest = broker.list_offsets(*tp, -2).offset
    latest = broker.list_offsets(*tp, -1).offset
    if args.to_earliest:
        return earliest
    if args.to_latest:
        return latest
    if args.to_offset is not None:   # Kafka clamps an offset outside the log to its ends
        return min(max(args.to_offset, earliest), latest)
    found = broker.list_offsets(*tp, parse_datetime(args.to_datetime)).offset
    return latest if found is None or found < 0 else found


def parse_datetime(text: str) -> int:
    """Kafka's --to-datetime format, YYYY-MM-DDTHH:mm:SS.sss with an optional zone
    (Z or ±hh:mm); without one, the local time zone, as Kafka's tool assumes."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise KStoreError(f"--to-datetime {text!r} is not YYYY-MM-DDTHH:mm:SS.sss") from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)
