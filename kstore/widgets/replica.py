"""Replica view: one partition's replicas side by side, with controls to drive replication.

Shows every broker of the partition as a column of cells, one per offset of its log (value and
leader epoch of the batch, committed cells — below the high watermark — in a darker shade), with
the HW and LEO markers, the broker's role (leader / follower / offline), the partition's leader
epoch, the ISR, the leader's view of its followers' LEOs, the controller's elections and the
truncation mode. Buttons produce to the leader, step one follower's fetch (or a whole round),
crash or restart a broker, run a preferred-leader election, and switch between leader-epoch
truncation (KIP-101) and the old high-watermark truncation.

Engine state read: `Cluster.state()` (each replica's log: records, LEO, HW, leader-epoch cache),
the metadata's partition state (leader, leader epoch, ISR) and the controller's elections.
Updates on each broker's log events for the partition (append, truncate, high_watermark, roll,
produce, ...) and on the cluster's own events (crash, restart, election, truncation_mode); after
a restart it follows the new broker's event bus.
"""

from __future__ import annotations

import os

from ..events import Event
from ..replica_fetcher import EPOCH_TRUNCATION, HW_TRUNCATION
from ._base import (LiveModel, WidgetView, attrs, button, esc, short_text, style)

EPOCH_COLOURS = ["#a0c4ff", "#ffd6a5", "#caffbf", "#ffc6ff", "#9bf6ff", "#fdffb6"]

REPLICA_CSS = """
.ks-rep .ks-brokers{display:flex;gap:22px;align-items:flex-start;}
.ks-rep .ks-broker{min-width:150px;}
.ks-rep .ks-broker.ks-offline{opacity:.45;}
.ks-rep .ks-bhead{font-weight:bold;margin-bottom:4px;min-height:92px;}
.ks-rep .ks-row{display:flex;align-items:center;height:24px;box-sizing:border-box;border-top:2px solid transparent;}
.ks-rep .ks-row.ks-hwline{border-top:2px solid #1d3557;}
.ks-rep .ks-cell{display:inline-block;box-sizing:border-box;width:96px;height:20px;line-height:17px;font-family:monospace;font-size:11px;padding:0 4px;border:1px solid #777;border-radius:2px;opacity:.55;overflow:hidden;}
.ks-rep .ks-cell.ks-committed{opacity:1;font-weight:bold;}
.ks-rep .ks-cell.ks-empty{border-style:dashed;background:#fff;opacity:1;}
.ks-rep .ks-marker{font-size:10px;line-height:14px;font-weight:bold;margin-left:4px;padding:0 3px;border-radius:2px;color:#fff;}
.ks-rep .ks-m-hw{background:#1d3557;}
.ks-rep .ks-m-leo{background:#c1121f;}
"""


class ReplicaModel(LiveModel):
    """The replicas of `topic`-`partition` in `cluster`, kept current by engine events."""

    BROKER_KINDS = ("append", "truncate", "high_watermark", "roll", "log_start_offset", "produce",
                    "delete", "load", "recover")

    def __init__(self, cluster, topic: str, partition: int = 0, max_cells: int = 40):
        super().__init__()
        self.cluster = cluster
        self.topic, self.partition = topic, partition
        self.max_cells = max_cells
        self.last_action = ""
        self.produced = 0
        self._broker_subs: dict[int, tuple[object, object]] = {}
        if getattr(cluster, "events", None) is not None:
            self.watch(cluster.events)
        self._follow_brokers()

    # ---- following the brokers' buses (a restarted broker has a new one)
    def _follow_brokers(self) -> None:
        name = f"{self.topic}-{self.partition}"
        for b, broker in self.cluster.brokers.items():
            bus = broker.events
            old = self._broker_subs.get(b)
            if old is not None and old[0] is bus:
                continue
            if old is not None:
                old[1]()

            def callback(event: Event) -> None:
                if os.path.basename(event.source) == name or (
                        event.details.get("topic") == self.topic
                        and event.details.get("partition") == self.partition):
                    self._on_event(event)
            self._broker_subs[b] = (bus, bus.subscribe(callback, self.BROKER_KINDS))

    def unwatch_all(self) -> None:
        super().unwatch_all()
        for _, unsubscribe in self._broker_subs.values():
            unsubscribe()
        self._broker_subs.clear()

    def apply_event(self, event: Event) -> bool | None:
        if event.kind in ("restart", "crash"):
            self._follow_brokers()
        return True

    # ---- state
    def partition_state(self) -> dict:
        return dict(self.cluster.metadata.partition_state(self.topic, self.partition))

    def replicas(self):
        return self.cluster.state(self.topic, self.partition)

    def markers(self, broker_id: int) -> dict:
        """{"hw": ..., "leo": ...} of one replica (−1 when it is down)."""
        for r in self.replicas():
            if r.broker_id == broker_id:
                return {"hw": r.high_watermark, "leo": r.log_end_offset}
        raise KeyError(broker_id)

    @property
    def truncation_mode(self) -> str:
        return self.cluster.truncation

    # ---- actions (each one is the real engine call)
    def _act(self, fn, describe) -> object:
        try:
            result = fn()
            self.last_action = describe(result)
        except Exception as e:
            result = None
            self.last_action = f"{type(e).__name__}: {e}"
        self.changed()
        return result

    def produce(self, values=None, acks: int = 1):
        if values is None:
            values = [f"m{self.produced}"]
        self.produced += len(values)
        return self._act(lambda: self.cluster.produce(self.topic, self.partition, values, acks=acks),
                         lambda r: f"produce {values} to leader {self.cluster.leader(self.topic, self.partition)}"
                                   + (f": {type(r.error).__name__}" if getattr(r, "error", None) else
                                      f" → offsets {r.info.first_offset}–{r.info.last_offset}"
                                      if getattr(r, "info", None) else ""))

    def fetch(self, broker_id: int):
        def describe(step) -> str:
            text = (f"broker {broker_id} {step.action}: {step.records} records from offset "
                    f"{step.fetch_offset}; leader HW {step.leader_hw}, own HW {step.high_watermark}")
            if step.detail:
                text += f" ({step.detail})"
            if step.exchanges:
                text += "; " + "; ".join(step.exchanges)
            return text
        return self._act(lambda: self.cluster.fetch(broker_id, self.topic, self.partition), describe)

    def fetch_round(self):
        """Every live follower fetches once (in broker order)."""
        return self._act(lambda: self.cluster.replicate(self.topic),
                         lambda steps: "fetch round: " + ", ".join(
                             f"broker {s.broker_id} {s.action} {s.records}" for s in steps))

    def toggle_broker(self, broker_id: int):
        """Crash a live broker, restart a dead one."""
        if self.cluster.brokers[broker_id].alive:
            return self._act(lambda: self.cluster.crash(broker_id),
                             lambda el: f"broker {broker_id} crashed; elections: "
                                        f"{[(e.new_leader, e.leader_epoch) for e in el]}")
        return self._act(lambda: self.cluster.restart(broker_id),
                         lambda el: f"broker {broker_id} restarted; "
                                    f"{'; '.join(t.detail for t in getattr(self.cluster, 'last_truncations', []))}")

    def elect(self):
        """Preferred-leader election (the first replica of the assignment, if alive and in the ISR)."""
        def describe(e) -> str:
            if e is None:
                return "no election: the preferred leader already leads, or is down / out of the ISR"
            return f"election: broker {e.new_leader} leads in epoch {e.leader_epoch} ({e.reason})"
        return self._act(lambda: self.cluster.elect_preferred_leader(self.topic, self.partition),
                         describe)

    def set_truncation(self, mode: str):
        return self._act(lambda: self.cluster.set_truncation(mode),
                         lambda _: f"truncation mode: {mode}")

    def toggle_truncation(self):
        other = HW_TRUNCATION if self.truncation_mode == EPOCH_TRUNCATION else EPOCH_TRUNCATION
        return self.set_truncation(other)

    # ---- rendering
    @staticmethod
    def _epoch_of(offset: int, epochs: list) -> int:
        found = -1
        for epoch, start in epochs:
            if start <= offset:
                found = epoch
        return found

    def _column(self, r, rows: range, isr: list[int]) -> str:
        if not r.alive:
            return (f"<div{attrs(class_='ks-broker ks-offline', data_broker=r.broker_id, data_role='offline')}>"
                    f"<div class='ks-bhead'>broker {r.broker_id} — down</div></div>")
        values = dict(r.values)
        in_isr = "in ISR" if r.broker_id in isr else "out of ISR"
        head = (f"broker {r.broker_id} — {r.role}<br><span class='ks-note'>{in_isr} · LEO "
                f"{r.log_end_offset} · HW {r.high_watermark} · epoch {r.leader_epoch}</span>")
        if r.remote_leos:
            head += f"<br><span class='ks-note'>follower LEOs seen: {esc(r.remote_leos)}</span>"
        cells = []
        for o in rows:
            markers = ""
            if o == r.high_watermark:
                markers += "<span class='ks-marker ks-m-hw'>HW</span>"
            if o == r.log_end_offset:
                markers += "<span class='ks-marker ks-m-leo'>LEO</span>"
            row_cls = "ks-row ks-hwline" if o == r.high_watermark else "ks-row"
            if o in values:
                epoch = self._epoch_of(o, r.epochs)
                cls = "ks-cell ks-committed" if o < r.high_watermark else "ks-cell"
                colour = EPOCH_COLOURS[epoch % len(EPOCH_COLOURS)] if epoch >= 0 else "#eee"
                tip = (f"offset {o}, value {short_text(values[o], 30)}, leader epoch {epoch}, "
                       f"{'committed' if o < r.high_watermark else 'not committed'}")
                cell = (f"<span{attrs(class_=cls, title=tip, style=f'background:{colour}', data_offset=o)}>"
                        f"{o}: {esc(short_text(values[o], 8))} e{epoch}</span>")
            elif o < r.log_start_offset:
                cell = "<span class='ks-cell ks-empty'>(deleted)</span>"
            else:
                cell = "<span class='ks-cell ks-empty'>&nbsp;</span>" if markers else ""
            cells.append(f"<div class='{row_cls}'>{cell}{markers}</div>")
        return (f"<div{attrs(class_='ks-broker', data_broker=r.broker_id, data_role=r.role, data_hw=r.high_watermark, data_leo=r.log_end_offset)}>"
                f"<div class='ks-bhead'>{head}</div>{''.join(cells)}</div>")

    def render_html(self) -> str:
        s = self.partition_state()
        reps = self.replicas()
        top = max([r.log_end_offset for r in reps if r.alive] + [0])
        first = max(0, top - self.max_cells + 1)
        rows = range(first, top + 1)
        elections = [e for e in self.cluster.controller.elections
                     if (e.topic, e.partition) == (self.topic, self.partition)][-4:]
        el = "; ".join(f"epoch {e.leader_epoch}: {e.old_leader}→{e.new_leader} ({e.reason})"
                       for e in elections) or "none yet"
        head = (f"<h4>{esc(self.topic)}-{self.partition}: leader {s.get('leader')} · leader epoch "
                f"{s.get('leader_epoch')} · ISR {s.get('isr')} · truncation by "
                f"{'leader epoch' if self.truncation_mode == EPOCH_TRUNCATION else 'high watermark'}</h4>"
                f"<p class='ks-note'>elections: {esc(el)}</p>")
        action = f"<p class='ks-note ks-last'><b>last action:</b> {esc(self.last_action)}</p>" \
            if self.last_action else ""
        cols = "".join(self._column(r, rows, s.get("isr", [])) for r in reps)
        return (style(REPLICA_CSS) +
                f'<div class="ks-view ks-rep"{attrs(data_leader=s.get("leader"), data_epoch=s.get("leader_epoch"), data_isr=s.get("isr"))}>'
                f"{head}{action}<div class='ks-brokers'>{cols}</div></div>")


class ReplicaView(WidgetView):
    """The replica view as a widget with its controls."""

    def __init__(self, cluster_or_model, topic: str | None = None, partition: int = 0,
                 min_interval: float = 0.05):
        import ipywidgets as W

        self.model = cluster_or_model if isinstance(cluster_or_model, ReplicaModel) \
            else ReplicaModel(cluster_or_model, topic, partition)
        m = self.model
        self.produce_button = button(W, "Produce", "produce one record to the leader", "ks-rep-produce")
        self.round_button = button(W, "Fetch round", "every live follower fetches once", "ks-rep-round")
        self.elect_button = button(W, "Elect preferred leader", "preferred leader election", "ks-rep-elect")
        self.mode = W.ToggleButtons(options=[("epoch truncation", EPOCH_TRUNCATION),
                                             ("HW truncation", HW_TRUNCATION)],
                                    value=m.truncation_mode, style={"button_width": "150px"})
        self.mode.add_class("ks-rep-mode")
        self.fetch_buttons, self.toggle_buttons = {}, {}
        for b in sorted(m.cluster.brokers):
            self.fetch_buttons[b] = button(W, f"broker {b} fetches", f"one fetch by broker {b}",
                                            f"ks-rep-fetch-{b}")
            self.toggle_buttons[b] = button(W, f"crash {b}", f"crash or restart broker {b}",
                                             f"ks-rep-toggle-{b}")
            self.fetch_buttons[b].on_click(lambda _, b=b: m.fetch(b))
            self.toggle_buttons[b].on_click(lambda _, b=b: m.toggle_broker(b))
        self.produce_button.on_click(lambda _: m.produce())
        self.round_button.on_click(lambda _: m.fetch_round())
        self.elect_button.on_click(lambda _: m.elect())
        self._updating = False
        self.mode.observe(self._on_mode, names="value")
        self.html = W.HTML()
        self.widget = W.VBox([
            W.HBox([self.produce_button, self.round_button, self.elect_button, self.mode]),
            W.HBox(list(self.fetch_buttons.values())), W.HBox(list(self.toggle_buttons.values())),
            self.html])
        self.widget.add_class("kstore-replicas")
        self.start_timeline(min_interval)

    def _on_mode(self, change) -> None:
        if not self._updating:
            self.model.set_truncation(change["new"])

    def sync_controls(self) -> None:
        m = self.model
        self._updating = True
        try:
            self.mode.value = m.truncation_mode
            for b, button in self.toggle_buttons.items():
                alive = m.cluster.brokers[b].alive
                button.description = f"crash {b}" if alive else f"restart {b}"
                self.fetch_buttons[b].disabled = not alive
        finally:
            self._updating = False

