"""The coordinator's timed waits, as delayed operations (see :mod:`examples.broker.coordinator`).

:class:`DelayedJoin` and :class:`InitialDelayedJoin` (a group's join phase),
:class:`DelayedSync` (members' SyncGroup after a join) and
:class:`DelayedHeartbeat` (a member's session). Each calls back into its
:class:`~examples.broker.coordinator.GroupCoordinator` when it completes or
expires; the coordinator re-exports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiopurgatory as ap

from .groups import Group, GroupState, Member

if TYPE_CHECKING:
    from .coordinator import GroupCoordinator

__all__ = ["DelayedHeartbeat", "DelayedJoin", "DelayedSync", "InitialDelayedJoin"]


class DelayedJoin(ap.DelayedOperation):
    """A group's join phase, in the rebalance purgatory under the group id.

    Completes when every known member has rejoined (``try_complete``), or expires
    after the rebalance timeout; either way ``on_complete`` ends the phase:
    members that did not rejoin are removed and the next generation starts.

    Args:
        coordinator: the coordinator that owns the group.
        group: the rebalancing group.
        timeout: seconds (the largest rebalance timeout of the members).
    """

    __slots__ = ("_coordinator", "group")

    def __init__(self, coordinator: GroupCoordinator, group: Group, timeout: float) -> None:
        super().__init__(timeout)
        self._coordinator = coordinator
        self.group = group

    def try_complete(self) -> bool:
        """Complete once every known member is waiting in JoinGroup."""
        if self.group.all_members_joined():
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        """End the join phase (also at expiry): late members out, next generation in."""
        self._coordinator.complete_join(self.group, self)


class InitialDelayedJoin(DelayedJoin):
    """The join phase of an empty group: waits for more members before the first generation.

    Never completes early unless the group empties again. At expiry, if new
    members arrived during the delay and rebalance time is left, a new
    ``InitialDelayedJoin`` of ``min(delay, remaining)`` takes over (Kafka's
    ``InitialDelayedJoin``); otherwise the join phase ends.

    Args:
        coordinator: the coordinator that owns the group.
        group: the group (empty when the phase started).
        delay: seconds to wait this round.
        configured_delay: ``initial_rebalance_delay``, the length of each round.
        remaining: rebalance time left after this round.
    """

    __slots__ = ("_configured", "_remaining")

    def __init__(
        self,
        coordinator: GroupCoordinator,
        group: Group,
        delay: float,
        configured_delay: float,
        remaining: float,
    ) -> None:
        super().__init__(coordinator, group, delay)
        self._configured = configured_delay
        self._remaining = remaining

    def try_complete(self) -> bool:
        """Only an emptied group ends the delay early (nobody left to wait for)."""
        if not self.group.members:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        """At expiry, extend the delay if members are still arriving, else end the phase."""
        group = self.group
        if self._coordinator.closed:
            return
        if group.members and group.new_member_added and self._remaining > 0:
            group.new_member_added = False
            delay = min(self._configured, self._remaining)
            self._coordinator.watch_join(
                group,
                InitialDelayedJoin(
                    self._coordinator,
                    group,
                    delay,
                    self._configured,
                    max(self._remaining - delay, 0.0),
                ),
            )
            return
        super().on_complete()


class DelayedSync(ap.DelayedOperation):
    """After a join: every member must send SyncGroup within the rebalance timeout.

    Completes when no member of this generation is still to sync (or the group
    moved on); at expiry the members that did not sync are removed and the group
    rebalances (Kafka's ``DelayedSync``).

    Args:
        coordinator: the coordinator that owns the group.
        group: the group, in CompletingRebalance.
        generation: the generation the members must sync.
        timeout: seconds (the group's rebalance timeout).
    """

    __slots__ = ("_coordinator", "generation", "group")

    def __init__(
        self, coordinator: GroupCoordinator, group: Group, generation: int, timeout: float
    ) -> None:
        super().__init__(timeout)
        self._coordinator = coordinator
        self.group = group
        self.generation = generation

    def try_complete(self) -> bool:
        """Complete once every member synced, or the generation or state changed."""
        group = self.group
        if (
            not group.pending_sync
            or group.generation != self.generation
            or group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
        ):
            return self.force_complete()
        return False

    def on_expiration(self) -> None:
        """Remove the members that never sent SyncGroup; the group rebalances."""
        self._coordinator.expire_pending_sync(self.group, self.generation)


class DelayedHeartbeat(ap.DelayedOperation):
    """A member's session: expires unless a heartbeat (or join/sync/commit) arrives in time.

    Args:
        coordinator: the coordinator that owns the group.
        group: the member's group.
        member: the member.
        timeout: seconds (the member's session timeout).
    """

    __slots__ = ("_coordinator", "group", "member")

    def __init__(
        self, coordinator: GroupCoordinator, group: Group, member: Member, timeout: float
    ) -> None:
        super().__init__(timeout)
        self._coordinator = coordinator
        self.group = group
        self.member = member

    def try_complete(self) -> bool:
        """Complete when the member proved alive, or is no longer in the group."""
        if self.member.removed or self.member.has_satisfied_heartbeat():
            return self.force_complete()
        return False

    def on_expiration(self) -> None:
        """Session timeout: unless it is waiting in a join or sync, the member is removed."""
        member = self.member
        if not member.removed and not member.has_satisfied_heartbeat():
            self._coordinator.remove_member(self.group, member, "session_timeout")
