"""Group view: one consumer group as its coordinator sees it — state, generation, leader, members
and the partitions each one owns — with the states it went through.

Shows the classic protocol's state machine as a strip (Empty → PreparingRebalance →
CompletingRebalance → Stable, the current state highlighted), the generation, the chosen
assignor and the leader; one row per member with its client id, host, session deadline (how long
until the coordinator drops it without a heartbeat) and its assignment, decoded from the bytes the
leader sent in SyncGroup. Below, the history of (state, generation) the group went through.

Engine state read: the coordinator's `GroupMetadata` for the group (the same object JoinGroup,
SyncGroup and Heartbeat change). Updates on the broker's "group" events, emitted by the
coordinator whenever the group's state, generation, leader, members or assignments change.
"""

from __future__ import annotations

from ..consumer_protocol import decode_assignment
from ..events import Event
from ..group_metadata import COMPLETING_REBALANCE, EMPTY, PREPARING_REBALANCE, STABLE
from ._base import HtmlView, LiveModel, attrs, esc, style, table

STATES = (EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE)

GROUP_CSS = """
.ks-grp .ks-states{display:flex;gap:4px;margin:4px 0;}
.ks-grp .ks-state{border:1px solid #bbb;border-radius:3px;padding:2px 6px;color:#777;}
.ks-grp .ks-state.ks-now{background:#264653;color:#fff;border-color:#264653;font-weight:bold;}
.ks-grp td.ks-parts{text-align:left;}
"""


class GroupModel(LiveModel):
    """Group `group_id` on `broker`'s coordinator, kept current by "group" events."""

    def __init__(self, broker, group_id: str):
        super().__init__()
        self.broker, self.group_id = broker, group_id
        self.membership = broker.group_coordinator.membership
        self.history: list[tuple[str, int]] = []
        self._record()
        self.watch(broker.events, {"group"}, source=group_id)

    def apply_event(self, event: Event) -> bool | None:
        self._record()
        return True

    def _record(self) -> None:
        point = (self.state, self.generation)
        if not self.history or self.history[-1] != point:
            self.history.append(point)

    # ---- state
    @property
    def group(self):
        return self.membership.group(self.group_id)

    @property
    def state(self) -> str:
        return self.group.state if self.group is not None else EMPTY

    @property
    def generation(self) -> int:
        return self.group.generation_id if self.group is not None else 0

    def members(self) -> list[dict]:
        """One row per member: ids, whether it leads, session time left, its partitions."""
        group, now = self.group, self.broker.clock.milliseconds()
        if group is None:
            return []
        out = []
        for m in group.members.values():
            try:
                partitions = decode_assignment(m.assignment).partitions
            except ValueError:
                partitions = []
            waiting = ("JoinGroup" if m.awaiting_join else "SyncGroup" if m.awaiting_sync else None)
            out.append({"member_id": m.member_id, "client_id": m.client_id, "host": m.client_host,
                        "instance_id": m.group_instance_id, "leader": m.member_id == group.leader_id,
                        "waiting_in": waiting,
                        "session_left_ms": None if waiting else max(m.heartbeat_deadline - now, 0),
                        "partitions": sorted(partitions)})
        return out

    def owner_of(self) -> dict[tuple[str, int], str]:
        return {tp: m["client_id"] or m["member_id"] for m in self.members() for tp in m["partitions"]}

    # ---- rendering
    def render_html(self) -> str:
        group = self.group
        strip = "".join(f'<span class="ks-state{" ks-now" if s == self.state else ""}">{esc(s)}</span>'
                        for s in STATES)
        facts = (f"generation <b>{self.generation}</b>, assignor "
                 f"<b>{esc(group.protocol_name or '-') if group else '-'}</b>, leader "
                 f"<b>{esc(group.leader_id or '-') if group else '-'}</b>")
        rows = [[m["member_id"], m["client_id"], m["host"], "yes" if m["leader"] else "",
                 f"waiting in {m['waiting_in']}" if m["waiting_in"] else f"{m['session_left_ms']} ms",
                 ", ".join(f"{t}-{p}" for t, p in m["partitions"]) or "-"] for m in self.members()]
        members = table(["member id", "client id", "host", "leader", "session left", "partitions"], rows)
        history = " → ".join(f"{s} (gen {g})" for s, g in self.history[-12:])
        return (style(GROUP_CSS) +
                f'<div class="ks-view ks-grp"{attrs(data_state=self.state, data_generation=self.generation, data_members=len(rows))}>'
                f"<h4>consumer group {esc(self.group_id)}</h4><div class='ks-states'>{strip}</div>"
                f"<p class='ks-note'>{facts}</p>{members}"
                f"<p class='ks-note'>history: {esc(history)}</p></div>")


class GroupView(HtmlView):
    """The group view as a widget (redrawn on the coordinator's "group" events)."""

    model_class = GroupModel
    css_class = "kstore-group"

    def __init__(self, broker, group_id: str, min_interval: float = 0.1):
        super().__init__(GroupModel(broker, group_id), min_interval)
