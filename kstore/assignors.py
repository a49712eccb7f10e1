"""How a group's leader divides partitions among the members: Kafka's `RangeAssignor`.

Mirrors `org.apache.kafka.clients.consumer.RangeAssignor` (the consumers' default, first in
`partition.assignment.strategy`). The broker never runs this: the leader member does, client side,
and sends the result in SyncGroup. Per topic, independently:
* the topic's partitions in order 0..n-1, the members subscribed to it sorted (static members by
  group.instance.id first, then dynamic ones by member id);
* each member gets a contiguous range of n // m partitions, and the first n % m members one more.
So with 2 topics of 3 partitions and 2 members, the first member gets 2 + 2 and the second 1 + 1:
range is uneven across topics, which is why roundrobin and (cooperative-)sticky exist.
"""

from __future__ import annotations


def member_order(member_id: str, instance_id: str | None = None) -> tuple:
    """Kafka's MemberInfo order: static members (by instance id) before dynamic (by member id)."""
    return (0, instance_id, member_id) if instance_id is not None else (1, "", member_id)


def range_assign(subscriptions: dict[str, list[str]], partitions_per_topic: dict[str, int],
                 instance_ids: dict[str, str | None] | None = None) -> dict[str, list[tuple[str, int]]]:
    """{member id: [topics]} and {topic: partition count} -> {member id: [(topic, partition)]}."""
    instance_ids = instance_ids or {}
    assignment: dict[str, list[tuple[str, int]]] = {member: [] for member in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    for topic in topics:
        n = partitions_per_topic.get(topic, 0)
        members = sorted((m for m, ts in subscriptions.items() if topic in ts),
                         key=lambda m: member_order(m, instance_ids.get(m)))
        per_member, extra = divmod(n, len(members))
        for i, member in enumerate(members):
            start = per_member * i + min(i, extra)
            length = per_member + (1 if i < extra else 0)
            assignment[member].extend((topic, p) for p in range(start, start + length))
    return assignment
