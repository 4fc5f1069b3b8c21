"""A consumer group as the coordinator keeps it: its state, its members, its protocol.

Plain data and the rules that need no clock and no purgatory (who joined, which
protocol every member supports, a member's heartbeat); the waits are
:mod:`examples.broker.group_operations` and the requests
:mod:`examples.broker.coordinator`, which re-exports these classes.
"""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING

from .group_messages import (
    JoinGroupResult,
)
from .partition import TopicPartition

if TYPE_CHECKING:
    from .group_operations import DelayedHeartbeat, DelayedJoin

__all__ = ["Group", "GroupState", "Member"]


class GroupState(enum.Enum):
    """The classic group state machine of Kafka's coordinator."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class Member:
    """A group member: its subscription (protocols), timeouts and pending callbacks."""

    __slots__ = (
        "assignment",
        "awaiting_join",
        "awaiting_sync",
        "client_host",
        "client_id",
        "heartbeat_op",
        "heartbeat_satisfied",
        "member_id",
        "protocols",
        "rebalance_timeout",
        "removed",
        "session_timeout",
    )

    def __init__(
        self,
        member_id: str,
        client_id: str,
        session_timeout: float,
        rebalance_timeout: float,
        protocols: list[tuple[str, bytes]],
        client_host: str = "",
    ) -> None:
        self.member_id = member_id
        self.client_id = client_id
        self.client_host = client_host
        self.session_timeout = session_timeout
        self.rebalance_timeout = rebalance_timeout
        self.protocols = protocols
        self.assignment = b""
        self.awaiting_join: asyncio.Future[JoinGroupResult] | None = None
        self.awaiting_sync: asyncio.Future[tuple[int, bytes]] | None = None
        self.heartbeat_satisfied = False
        self.heartbeat_op: DelayedHeartbeat | None = None
        self.removed = False

    def metadata_for(self, protocol: str) -> bytes:
        """This member's metadata (subscription) for one protocol."""
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def has_satisfied_heartbeat(self) -> bool:
        """Kafka's rule: members waiting in a join or sync are alive by definition."""
        return (
            self.heartbeat_satisfied
            or self.awaiting_join is not None
            or self.awaiting_sync is not None
        )


class Group:
    """One consumer group: members, generation, state and committed offsets."""

    __slots__ = (
        "generation",
        "group_id",
        "join_op",
        "leader_id",
        "members",
        "new_member_added",
        "offsets",
        "pending_sync",
        "protocol",
        "protocol_type",
        "state",
    )

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.pending_sync: set[str] = set()
        self.new_member_added = False
        self.join_op: DelayedJoin | None = None
        self.offsets: dict[TopicPartition, tuple[int, str | None]] = {}

    def add(self, member: Member) -> None:
        """Add a member; the first one becomes leader."""
        self.members[member.member_id] = member
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        """Remove a member; a new leader is the oldest remaining member (Kafka's choice)."""
        member = self.members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        if member is not None:
            member.removed = True
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def all_members_joined(self) -> bool:
        """Kafka's ``hasAllMembersJoined``: every known member has a join pending."""
        return all(m.awaiting_join is not None for m in self.members.values())

    def rebalance_timeout(self) -> float:
        """The largest rebalance timeout of the members (0 for no members)."""
        return max((m.rebalance_timeout for m in self.members.values()), default=0.0)

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Can a member with these protocols join (same type, a protocol in common)?"""
        names = {name for name, _ in protocols}
        if not protocol_type or not names:
            return False
        if not self.members:
            return True
        if protocol_type != self.protocol_type:
            return False
        return bool(names & self._candidates())

    def _candidates(self) -> set[str]:
        candidates: set[str] | None = None
        for member in self.members.values():
            names = {name for name, _ in member.protocols}
            candidates = names if candidates is None else candidates & names
        return candidates or set()

    def select_protocol(self) -> str:
        """Each member votes for its most preferred common protocol; most votes wins."""
        candidates = self._candidates()
        votes: dict[str, int] = {}
        for member in self.members.values():
            for name, _ in member.protocols:
                if name in candidates:
                    votes[name] = votes.get(name, 0) + 1
                    break
        return max(votes, key=lambda name: votes[name])
