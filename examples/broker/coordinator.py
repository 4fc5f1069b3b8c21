"""The group coordinator: consumer groups (join, sync, heartbeat, leave, offsets).

A sans-wire model of Kafka's classic ``GroupCoordinator`` (before static
membership and KIP-394): the server decodes requests, calls the methods here and
encodes what they return. Every timed wait is an aiopurgatory delayed operation:

* ``rebalance`` purgatory, keyed by group id:

  - :class:`DelayedJoin`: a group's join phase. Completes once every known member
    has sent JoinGroup again, or expires after the largest rebalance timeout of
    the members; either way members that did not rejoin are removed, the next
    generation starts and every waiting JoinGroup is answered (the leader gets
    the members' subscriptions).
  - :class:`InitialDelayedJoin`: the join phase of an empty group waits
    ``initial_rebalance_delay`` (Kafka's ``group.initial.rebalance.delay.ms``),
    extended while new members keep arriving, up to the rebalance timeout, so a
    set of consumers started together gets one generation instead of many.
  - :class:`DelayedSync`: after a join, members must send SyncGroup within the
    rebalance timeout; those who do not are removed and the group rebalances.

* ``heartbeat`` purgatory, keyed by (group id, member id): one
  :class:`DelayedHeartbeat` per member, rescheduled by each heartbeat (and each
  commit or successful join/sync); if the session timeout passes without one,
  the member is removed and the group rebalances.

The per-request waits themselves (a JoinGroup waiting for the join phase to end,
a follower's SyncGroup waiting for the leader's assignment) are futures on the
member, Kafka's "awaiting callbacks". If the client goes away while one of them
waits (its request task is cancelled), the member is removed as if it had sent
LeaveGroup, which re-checks or starts the group's rebalance: Kafka would keep it
until a timeout instead.

The group's data is :mod:`examples.broker.groups` and the delayed operations
:mod:`examples.broker.group_operations`; this module re-exports both.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import aiopurgatory as ap

from .admin_messages import DescribedGroup, DescribedMember, ListedGroup
from .group_messages import (
    JoinGroupResult,
    OffsetFetchPartition,
)
from .group_operations import DelayedHeartbeat, DelayedJoin, DelayedSync, InitialDelayedJoin
from .groups import Group, GroupState, Member
from .messages import (
    ErrorCode,
)
from .partition import TopicPartition

__all__ = [
    "DelayedHeartbeat",
    "DelayedJoin",
    "DelayedSync",
    "Group",
    "GroupCoordinator",
    "GroupState",
    "InitialDelayedJoin",
    "Member",
]

#: Longest commit metadata string accepted (Kafka's offset.metadata.max.bytes).
MAX_OFFSET_METADATA = 4096


# -- delayed operations ------------------------------------------------------------------


# -- the coordinator ---------------------------------------------------------------------------


class GroupCoordinator:
    """Consumer groups of one broker (which coordinates every group).

    Args:
        rebalance_purgatory: where join phases and sync deadlines wait (key: group id).
        heartbeat_purgatory: where member sessions wait (key: (group id, member id)).
        partition_exists: whether a topic-partition exists (commits to others fail).
        min_session_timeout: smallest session timeout accepted (seconds).
        max_session_timeout: largest session timeout accepted (seconds).
        initial_rebalance_delay: how long an empty group waits for more members.
        logger: a structlog-compatible logger.
    """

    def __init__(
        self,
        rebalance_purgatory: ap.Purgatory[ap.DelayedOperation],
        heartbeat_purgatory: ap.Purgatory[DelayedHeartbeat],
        partition_exists: Callable[[TopicPartition], bool],
        *,
        min_session_timeout: float,
        max_session_timeout: float,
        initial_rebalance_delay: float,
        logger: Any,
    ) -> None:
        self.rebalance_purgatory = rebalance_purgatory
        self.heartbeat_purgatory = heartbeat_purgatory
        self._partition_exists = partition_exists
        self.min_session_timeout = min_session_timeout
        self.max_session_timeout = max_session_timeout
        self.initial_rebalance_delay = initial_rebalance_delay
        self.log = logger
        self.groups: dict[str, Group] = {}
        self.closed = False

    # -- JoinGroup ------------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        client_host: str = "",
    ) -> JoinGroupResult:
        """Handle JoinGroup; waits until the group's join phase ends.

        ``client_host`` is the member's address, shown by DescribeGroups.
        """
        if self.closed:
            return JoinGroupResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=member_id)
        if not group_id:
            return JoinGroupResult(ErrorCode.INVALID_GROUP_ID, member_id=member_id)
        session_timeout = session_timeout_ms / 1000
        if not self.min_session_timeout <= session_timeout <= self.max_session_timeout:
            return JoinGroupResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=member_id)
        rebalance_timeout = max(rebalance_timeout_ms, 0) / 1000
        group = self.groups.get(group_id)
        if group is None and member_id:
            return JoinGroupResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id)
        if not (group or Group(group_id)).supports(protocol_type, protocols):
            return JoinGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        future: asyncio.Future[JoinGroupResult] = asyncio.get_running_loop().create_future()
        if not member_id:
            member = Member(
                f"{client_id or 'member'}-{uuid.uuid4()}",
                client_id,
                session_timeout,
                rebalance_timeout,
                protocols,
                client_host,
            )
            member.awaiting_join = future
            if not group.members:
                group.protocol_type = protocol_type
            if group.state is GroupState.PREPARING_REBALANCE:
                # Read by InitialDelayedJoin: someone arrived during the delay.
                group.new_member_added = True
            group.add(member)
            self.log.info("broker.group_member_added", group=group_id, member=member.member_id)
            self._maybe_prepare_rebalance(group, "new member")
        else:
            known = group.members.get(member_id)
            if known is None or group.state in (GroupState.EMPTY, GroupState.DEAD):
                return JoinGroupResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id)
            member = known
            same = member.protocols == protocols
            if group.state is GroupState.COMPLETING_REBALANCE and same:
                # A retried join of this generation: answer it again.
                return self._join_result(group, member)
            if group.state is GroupState.STABLE and same and member_id != group.leader_id:
                return self._join_result(group, member)
            self._update_member(member, session_timeout, rebalance_timeout, protocols, future)
            self._maybe_prepare_rebalance(group, "member rejoined with changes")
        if group.state is GroupState.PREPARING_REBALANCE:
            self.rebalance_purgatory.check_and_complete(group_id)
        try:
            return await future
        except asyncio.CancelledError:
            # The client went away while waiting: take the member out now.
            if member.awaiting_join is future and not member.removed:
                member.awaiting_join = None
                self.remove_member(group, member, "disconnected_during_join")
            raise

    def _update_member(
        self,
        member: Member,
        session_timeout: float,
        rebalance_timeout: float,
        protocols: list[tuple[str, bytes]],
        future: asyncio.Future[JoinGroupResult],
    ) -> None:
        old = member.awaiting_join
        if old is not None and not old.done():
            # The same member joined again on another connection: the newer request wins.
            old.set_result(JoinGroupResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.session_timeout = session_timeout
        member.rebalance_timeout = rebalance_timeout
        member.protocols = protocols
        member.awaiting_join = future

    def _join_result(self, group: Group, member: Member) -> JoinGroupResult:
        protocol = group.protocol or ""
        members: list[tuple[str, bytes]] = []
        if member.member_id == group.leader_id:
            members = [(m.member_id, m.metadata_for(protocol)) for m in group.members.values()]
        return JoinGroupResult(
            ErrorCode.NONE,
            group.generation,
            protocol,
            group.leader_id or "",
            member.member_id,
            members,
        )

    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state in (
            GroupState.EMPTY,
            GroupState.STABLE,
            GroupState.COMPLETING_REBALANCE,
        ):
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            # Followers waiting for the old generation's assignment must rejoin.
            self._propagate_sync(group, ErrorCode.REBALANCE_IN_PROGRESS)
        group.pending_sync.clear()
        op: DelayedJoin
        if group.state is GroupState.EMPTY:
            delay = self.initial_rebalance_delay
            op = InitialDelayedJoin(
                self,
                group,
                delay,
                delay,
                max(group.rebalance_timeout() - delay, 0.0),
            )
        else:
            op = DelayedJoin(self, group, group.rebalance_timeout())
        group.state = GroupState.PREPARING_REBALANCE
        self.log.info(
            "broker.group_rebalance",
            group=group.group_id,
            generation=group.generation,
            members=len(group.members),
            reason=reason,
        )
        # The old sync deadline (if any) sees the state change and completes.
        self.rebalance_purgatory.check_and_complete(group.group_id)
        self.watch_join(group, op)

    def watch_join(self, group: Group, op: DelayedJoin) -> None:
        """Park a group's join phase in the rebalance purgatory (it may complete at once)."""
        group.join_op = op
        self.rebalance_purgatory.try_complete_else_watch(op, [group.group_id])

    def complete_join(self, group: Group, op: DelayedJoin) -> None:
        """End of the join phase (``DelayedJoin.on_complete``): start the next generation."""
        if group.join_op is op:
            group.join_op = None
        if self.closed or group.state is not GroupState.PREPARING_REBALANCE:
            return
        for member in [m for m in group.members.values() if m.awaiting_join is None]:
            self.log.info(
                "broker.group_member_removed",
                group=group.group_id,
                member=member.member_id,
                reason="not_rejoined",
            )
            group.remove(member.member_id)
            self.heartbeat_purgatory.check_and_complete((group.group_id, member.member_id))
        group.generation += 1
        group.new_member_added = False
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol = None
            group.protocol_type = None
            group.leader_id = None
            self.log.info("broker.group_empty", group=group.group_id, generation=group.generation)
            if not group.offsets:
                self.groups.pop(group.group_id, None)
            return
        group.protocol = group.select_protocol()
        group.state = GroupState.COMPLETING_REBALANCE
        group.pending_sync = set(group.members)
        self.log.info(
            "broker.group_joined",
            group=group.group_id,
            generation=group.generation,
            protocol=group.protocol,
            leader=group.leader_id,
            members=len(group.members),
        )
        for member in list(group.members.values()):
            future = member.awaiting_join
            member.awaiting_join = None
            if future is not None and not future.done():
                future.set_result(self._join_result(group, member))
            self._complete_and_schedule_heartbeat(group, member)
        self.rebalance_purgatory.try_complete_else_watch(
            DelayedSync(self, group, group.generation, group.rebalance_timeout()),
            [group.group_id],
        )

    # -- SyncGroup ------------------------------------------------------------------------------

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: list[tuple[str, bytes]],
    ) -> tuple[int, bytes]:
        """Handle SyncGroup: (error code, this member's assignment).

        A follower waits here until the leader's SyncGroup brings the assignment.
        """
        if self.closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, b""
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, b""
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION, b""
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS, b""
        if group.state is GroupState.STABLE:
            self._synced(group, member)
            return ErrorCode.NONE, member.assignment
        if group.state is not GroupState.COMPLETING_REBALANCE:
            return ErrorCode.UNKNOWN_MEMBER_ID, b""
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        old = member.awaiting_sync
        if old is not None and not old.done():
            old.set_result((ErrorCode.REBALANCE_IN_PROGRESS, b""))
        member.awaiting_sync = future
        if member_id == group.leader_id:
            given = dict(assignments)
            for other in group.members.values():
                other.assignment = given.get(other.member_id, b"")
            group.state = GroupState.STABLE
            self.log.info("broker.group_stable", group=group_id, generation=group.generation)
            self._propagate_sync(group, ErrorCode.NONE)
        try:
            error, assignment = await future
        except asyncio.CancelledError:
            if member.awaiting_sync is future and not member.removed:
                member.awaiting_sync = None
                self.remove_member(group, member, "disconnected_during_sync")
            raise
        if error == ErrorCode.NONE and not member.removed:
            self._synced(group, member)
        return error, assignment

    def _synced(self, group: Group, member: Member) -> None:
        group.pending_sync.discard(member.member_id)
        self._complete_and_schedule_heartbeat(group, member)
        self.rebalance_purgatory.check_and_complete(group.group_id)

    def _propagate_sync(self, group: Group, error: int) -> None:
        for member in group.members.values():
            future = member.awaiting_sync
            member.awaiting_sync = None
            if future is not None and not future.done():
                assignment = member.assignment if error == ErrorCode.NONE else b""
                future.set_result((error, assignment))

    def expire_pending_sync(self, group: Group, generation: int) -> None:
        """``DelayedSync`` expired: members of this generation that did not sync leave."""
        if self.closed or group.generation != generation:
            return
        for member_id in list(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                self.remove_member(group, member, "no_sync_in_time")

    # -- Heartbeat, LeaveGroup, member removal ---------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        """Handle Heartbeat: an error code (REBALANCE_IN_PROGRESS tells the member to rejoin)."""
        if self.closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None or group.state is GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        self._complete_and_schedule_heartbeat(group, member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group_id: str, member_id: str) -> int:
        """Handle LeaveGroup: the member goes and the group rebalances."""
        if self.closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self.remove_member(group, member, "left")
        return ErrorCode.NONE

    def remove_member(self, group: Group, member: Member, reason: str) -> None:
        """Take a member out (left, failed or gone) and rebalance what remains."""
        if member.removed:
            return
        self.log.info(
            "broker.group_member_removed",
            group=group.group_id,
            member=member.member_id,
            reason=reason,
        )
        # Requests of this member still waiting (e.g. a LeaveGroup from another
        # connection while its JoinGroup waits) are answered, as Kafka does.
        joining, syncing = member.awaiting_join, member.awaiting_sync
        if joining is not None and not joining.done():
            joining.set_result(
                JoinGroupResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member.member_id)
            )
        if syncing is not None and not syncing.done():
            syncing.set_result((ErrorCode.UNKNOWN_MEMBER_ID, b""))
        member.awaiting_join = None
        member.awaiting_sync = None
        group.remove(member.member_id)
        self.heartbeat_purgatory.check_and_complete((group.group_id, member.member_id))
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"member {reason}")
        elif group.state is GroupState.PREPARING_REBALANCE:
            self.rebalance_purgatory.check_and_complete(group.group_id)

    def _complete_and_schedule_heartbeat(self, group: Group, member: Member) -> None:
        # Kafka's completeAndScheduleNextHeartbeatExpiration: the pending session op
        # completes (the member proved alive) and a new one starts its session timeout.
        key = (group.group_id, member.member_id)
        member.heartbeat_satisfied = True
        self.heartbeat_purgatory.check_and_complete(key)
        member.heartbeat_satisfied = False
        if self.closed or member.removed:
            return
        op = DelayedHeartbeat(self, group, member, member.session_timeout)
        member.heartbeat_op = op
        self.heartbeat_purgatory.try_complete_else_watch(op, [key])

    # -- offsets ----------------------------------------------------------------------------------

    def commit_offsets(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        offsets: list[tuple[TopicPartition, int, str | None]],
    ) -> list[tuple[TopicPartition, int]]:
        """Handle OffsetCommit: an error code per partition.

        Generation -1 with no member id is a commit by a consumer that assigns its
        partitions itself; it is accepted while the group has no active members.
        """
        error = self._commit_error(group_id, generation, member_id)
        if error != ErrorCode.NONE:
            return [(tp, error) for tp, _, _ in offsets]
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        results: list[tuple[TopicPartition, int]] = []
        for tp, offset, metadata in offsets:
            if metadata is not None and len(metadata) > MAX_OFFSET_METADATA:
                results.append((tp, ErrorCode.OFFSET_METADATA_TOO_LARGE))
            elif not self._partition_exists(tp):
                results.append((tp, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            else:
                group.offsets[tp] = (offset, metadata)
                results.append((tp, ErrorCode.NONE))
        member = group.members.get(member_id)
        if member is not None:
            self._complete_and_schedule_heartbeat(group, member)
        return results

    def _commit_error(self, group_id: str, generation: int, member_id: str) -> int:
        if self.closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION
        if generation < 0 and group.state is GroupState.EMPTY:
            return ErrorCode.NONE
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def fetch_offsets(
        self, group_id: str, topics: list[tuple[str, list[int]]] | None
    ) -> tuple[int, list[tuple[str, list[OffsetFetchPartition]]]]:
        """Handle OffsetFetch: (group error, per topic the committed offsets, -1 if none).

        ``topics`` None lists every partition the group has an offset for.
        """
        if self.closed:
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
            return error, [
                (t, [OffsetFetchPartition(p, -1, None, error) for p in ps])
                for t, ps in topics or []
            ]
        group = self.groups.get(group_id)
        committed = group.offsets if group is not None else {}
        if topics is None:
            by_topic: dict[str, list[int]] = {}
            for tp in sorted(committed):
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            topics = list(by_topic.items())
        answer: list[tuple[str, list[OffsetFetchPartition]]] = []
        for topic, partitions in topics:
            rows = []
            for index in partitions:
                offset, metadata = committed.get(TopicPartition(topic, index), (-1, ""))
                rows.append(OffsetFetchPartition(index, offset, metadata))
            answer.append((topic, rows))
        return ErrorCode.NONE, answer

    # -- administration: DescribeGroups, ListGroups, DeleteGroups --------------------------------

    def describe_groups(self, group_ids: list[str]) -> list[DescribedGroup]:
        """Handle DescribeGroups, as Kafka: an unknown group is ``Dead`` with no error.

        Members' subscriptions and assignments are shown only while the group is
        ``Stable`` (in a rebalance they are being replaced).
        """
        answer: list[DescribedGroup] = []
        for group_id in group_ids:
            if self.closed:
                answer.append(
                    DescribedGroup(group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, "", "", "")
                )
                continue
            group = self.groups.get(group_id)
            if group is None:
                answer.append(
                    DescribedGroup(group_id, ErrorCode.NONE, GroupState.DEAD.value, "", "")
                )
                continue
            stable = group.state is GroupState.STABLE
            protocol = group.protocol or ""
            members = [
                DescribedMember(
                    m.member_id,
                    m.client_id,
                    m.client_host,
                    m.metadata_for(protocol) if stable else b"",
                    m.assignment if stable else b"",
                )
                for m in group.members.values()
            ]
            answer.append(
                DescribedGroup(
                    group_id,
                    ErrorCode.NONE,
                    group.state.value,
                    group.protocol_type or "",
                    protocol if stable else "",
                    members,
                )
            )
        return answer

    def list_groups(self, states: list[str], types: list[str]) -> tuple[int, list[ListedGroup]]:
        """Handle ListGroups: (error, groups), filtered by state and type when asked.

        Filters compare case-insensitively, as Kafka does; every group here is a
        ``classic`` group.
        """
        if self.closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        wanted_states = {s.lower() for s in states}
        if types and "classic" not in {t.lower() for t in types}:
            return ErrorCode.NONE, []
        return ErrorCode.NONE, [
            ListedGroup(gid, g.protocol_type or "", g.state.value)
            for gid, g in self.groups.items()
            if not wanted_states or g.state.value.lower() in wanted_states
        ]

    def delete_groups(self, group_ids: list[str]) -> list[tuple[str, int]]:
        """Handle DeleteGroups: an empty group and its committed offsets go.

        Errors as Kafka: ``GROUP_ID_NOT_FOUND`` (no such group),
        ``NON_EMPTY_GROUP`` (it has members), ``INVALID_GROUP_ID`` (empty id).
        """
        results: list[tuple[str, int]] = []
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if self.closed:
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE
            elif not group_id:
                error = ErrorCode.INVALID_GROUP_ID
            elif group is None:
                error = ErrorCode.GROUP_ID_NOT_FOUND
            elif group.members or group.state is not GroupState.EMPTY:
                error = ErrorCode.NON_EMPTY_GROUP
            else:
                group.state = GroupState.DEAD
                del self.groups[group_id]
                self.log.info("broker.group_deleted", group=group_id)
                error = ErrorCode.NONE
            results.append((group_id, error))
        return results

    def forget_partitions(self, tps: set[TopicPartition]) -> None:
        """Drop committed offsets of deleted partitions (Kafka does so on topic deletion)."""
        for group in self.groups.values():
            for tp in tps & group.offsets.keys():
                del group.offsets[tp]

    # -- shutdown and introspection -------------------------------------------------------------

    async def close(self) -> None:
        """Answer every waiting JoinGroup/SyncGroup (COORDINATOR_NOT_AVAILABLE), drop the ops."""
        if self.closed:
            return
        self.closed = True
        for group in self.groups.values():
            for member in group.members.values():
                if member.awaiting_join is not None and not member.awaiting_join.done():
                    member.awaiting_join.set_result(
                        JoinGroupResult(
                            ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=member.member_id
                        )
                    )
                if member.awaiting_sync is not None and not member.awaiting_sync.done():
                    member.awaiting_sync.set_result((ErrorCode.COORDINATOR_NOT_AVAILABLE, b""))
                member.awaiting_join = member.awaiting_sync = None
        self.rebalance_purgatory.close()
        self.heartbeat_purgatory.close()

    def describe(self) -> dict[str, dict[str, Any]]:
        """Each group's state, generation, leader, members and assignment sizes."""
        return {
            gid: {
                "state": g.state.value,
                "generation": g.generation,
                "protocol": g.protocol,
                "leader": g.leader_id,
                "members": list(g.members),
                "committed_partitions": len(g.offsets),
            }
            for gid, g in self.groups.items()
        }
