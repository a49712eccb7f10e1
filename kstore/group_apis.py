"""The consumer group requests of the broker: JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
DescribeGroups, DeleteGroups, OffsetDelete (Kafka's `KafkaApis.handleJoinGroupRequest` & co.).

A mixin of `KafkaServer`, like `AdminApis`. JoinGroup and SyncGroup are answered *later*: the
membership logic takes a callback, and the handler awaits a future the callback completes, so a
held JoinGroup waits on the event loop without holding up any other connection.
"""

from __future__ import annotations

import asyncio
import contextvars

from . import protocol as P
from .errors import KStoreError, error_code

E = P.ERRORS

# The client address of the connection whose request is being handled (set per connection task).
client_host: contextvars.ContextVar[str] = contextvars.ContextVar("client_host", default="")


class GroupApis:
    def _group_handlers(self) -> dict:
        api = P.API_KEYS
        return {api["JoinGroup"]: self._join_group, api["SyncGroup"]: self._sync_group,
                api["Heartbeat"]: self._heartbeat, api["LeaveGroup"]: self._leave_group,
                api["DescribeGroups"]: self._describe_groups, api["DeleteGroups"]: self._delete_groups,
                api["OffsetDelete"]: self._offset_delete}

    def _coordinator_error(self, group_id: str) -> int | None:
        """NOT_COORDINATOR when this broker does not lead the group's partition (else None)."""
        try:
            self.broker.group_coordinator._ensure_fresh(group_id)
        except KStoreError as e:
            return error_code(e)
        return None

    async def _answer_later(self, start) -> dict:
        """Run `start(callback)` and wait until the membership logic calls the callback."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def answer(response: dict) -> None:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(response))
        start(answer)
        return await future

    async def _join_group(self, version, body, header) -> dict:
        error = self._coordinator_error(body["group_id"])
        if error is not None:
            return {"throttle_time_ms": 0, "error_code": error, "member_id": body["member_id"]}
        membership = self.broker.group_coordinator.membership
        response = await self._answer_later(lambda answer: membership.join_group(
            body, header.client_id or "", "/" + client_host.get(), version, answer))
        return {"throttle_time_ms": 0, **response}

    async def _sync_group(self, version, body, header) -> dict:
        error = self._coordinator_error(body["group_id"])
        if error is not None:
            return {"throttle_time_ms": 0, "error_code": error, "assignment": b""}
        membership = self.broker.group_coordinator.membership
        response = await self._answer_later(lambda answer: membership.sync_group(body, answer))
        return {"throttle_time_ms": 0, **response}

    async def _heartbeat(self, version, body, header) -> dict:
        error = self._coordinator_error(body["group_id"])
        if error is not None:
            return {"throttle_time_ms": 0, "error_code": error}
        return {"throttle_time_ms": 0, **self.broker.group_coordinator.membership.heartbeat(body)}

    async def _leave_group(self, version, body, header) -> dict:
        error = self._coordinator_error(body["group_id"])
        if error is not None:
            return {"throttle_time_ms": 0, "error_code": error, "members": []}
        members = (body["members"] if version >= 3
                   else [{"member_id": body["member_id"], "group_instance_id": None}])
        results = self.broker.group_coordinator.membership.leave_group(body["group_id"], members)
        if version >= 3:
            return {"throttle_time_ms": 0, "error_code": 0, "members": results}
        return {"throttle_time_ms": 0, "error_code": results[0]["error_code"]}

    async def _describe_groups(self, version, body, header) -> dict:
        return {"throttle_time_ms": 0,
                "groups": [self._describe_group(group_id) for group_id in body["groups"]]}

    def _describe_group(self, group_id: str) -> dict:
        coordinator = self.broker.group_coordinator
        entry = {"error_code": 0, "group_id": group_id, "group_state": "Dead", "protocol_type": "",
                 "protocol_data": "", "members": []}
        try:
            entry["group_state"] = coordinator.group_state(group_id)
        except KStoreError as e:
            return {**entry, "error_code": error_code(e)}
        group = coordinator.membership.group(group_id)
        if group is None:
            return entry
        entry["protocol_type"] = group.protocol_type or ""
        if group.state == "Stable":   # Kafka names the protocol and shows bytes only when stable
            entry["protocol_data"] = group.protocol_name or ""
        for m in group.members.values():
            stable = group.state == "Stable" and group.protocol_name
            entry["members"].append({
                "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                "client_id": m.client_id, "client_host": m.client_host,
                "member_metadata": m.metadata(group.protocol_name) if stable else b"",
                "member_assignment": m.assignment if stable else b""})
        return entry

    async def _delete_groups(self, version, body, header) -> dict:
        results = []
        for group_id in body["groups_names"]:
            code = 0
            try:
                self.broker.group_coordinator.delete_group(group_id)
            except KStoreError as e:
                code = error_code(e)
            results.append({"group_id": group_id, "error_code": code})
        return {"throttle_time_ms": 0, "results": results}

    async def _offset_delete(self, version, body, header) -> dict:
        wanted = [(t["name"], p["partition_index"]) for t in body["topics"] for p in t["partitions"]]
        try:
            results = self.broker.group_coordinator.delete_offsets(body["group_id"], wanted)
        except KStoreError as e:
            return {"error_code": error_code(e), "throttle_time_ms": 0, "topics": []}
        topics: dict[str, list] = {}
        for (topic, partition), error in results.items():
            topics.setdefault(topic, []).append(
                {"partition_index": partition, "error_code": E[error] if error else 0})
        return {"error_code": 0, "throttle_time_ms": 0,
                "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()]}
