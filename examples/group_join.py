"""A consumer group rebalance: JoinGroup requests held by a DelayedJoin.

The group coordinator holds every member's JoinGroup until the rebalance can
complete: a ``DelayedJoin``, watched under the group's key, completes when every
known member has (re)joined, or expires after the rebalance timeout (the members'
``max.poll.interval``), and then the members that did not rejoin in time are
removed from the new generation. A removed member's late JoinGroup gets
``UNKNOWN_MEMBER_ID``; it rejoins as a new member, which starts another rebalance.
An empty group forms its first generation through an ``InitialDelayedJoin``
(``group.initial.rebalance.delay``), which only expires, extending itself while
new members keep arriving.

Timeline of the default run: ``--members`` consumers start and form generation 1;
at ``--new-member-at`` one more consumer joins, which starts a rebalance; members
notice it on their next heartbeat and rejoin after finishing their current batch
(log-normal delay), except ``--late`` members whose batch takes longer than the
rebalance timeout. Runs on virtual time unless ``--real-time``, on asyncio unless
``--loop`` says otherwise (uvloop, trio: the body is anyio code).
``python -m examples.group_join --members 6 --late 2``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import anyio

if __name__ == "__main__" and not __package__:
    # Run as a script (python examples/group_join.py): make the examples package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiopurgatory as ap
from examples._kafka import (
    Errors,
    LogNormal,
    add_runtime_arguments,
    checked_config,
    non_negative_float,
    positive_float,
    positive_int,
    run_main,
    run_timed,
    running_clock,
)

__all__ = [
    "Config",
    "DelayedJoin",
    "GroupCoordinator",
    "GroupResult",
    "InitialDelayedJoin",
    "JoinResponse",
    "Rebalance",
    "main",
    "run",
    "simulate",
]


@dataclass(frozen=True)
class Config:
    """The parameters of a run (seconds; Kafka's defaults scaled down about tenfold).

    Raises:
        ValueError: a field is out of range (the message names it).
    """

    #: Consumers that start the group.
    members: int = 6
    #: Of those, how many stall longer than the rebalance timeout in the first rebalance.
    late: int = 2
    #: When one more consumer joins and triggers a rebalance (None: never).
    new_member_at: float | None = 1.0
    #: ``max.poll.interval``: the rebalance timeout of every member.
    rebalance_timeout: float = 3.0
    #: ``group.initial.rebalance.delay``.
    initial_rebalance_delay: float = 0.3
    #: ``heartbeat.interval``: how soon members notice a rebalance.
    heartbeat_interval: float = 0.3
    #: Time a member needs to finish its current batch before rejoining.
    rejoin_delay: LogNormal = field(default_factory=lambda: LogNormal(0.2, 1.0))
    #: The run stops after this many seconds.
    duration: float = 10.0
    seed: int = 1
    group_id: str = "billing"

    def __post_init__(self) -> None:
        if isinstance(self.members, bool) or not isinstance(self.members, int) or self.members < 1:
            raise ValueError(f"members must be an integer >= 1, got {self.members!r}")
        if isinstance(self.late, bool) or not isinstance(self.late, int):
            raise ValueError(f"late must be an integer, got {self.late!r}")
        if not 0 <= self.late <= self.members:
            raise ValueError(
                f"late must be between 0 and members ({self.members}), got {self.late}"
            )
        for name in ("rebalance_timeout", "heartbeat_interval", "duration"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if not 0 <= self.initial_rebalance_delay < math.inf:
            raise ValueError(
                f"initial_rebalance_delay must be a finite number >= 0, "
                f"got {self.initial_rebalance_delay!r}"
            )
        if self.new_member_at is not None and not 0 <= self.new_member_at < math.inf:
            raise ValueError(f"new_member_at must be >= 0 or None, got {self.new_member_at!r}")


@dataclass(frozen=True)
class JoinResponse:
    """The coordinator's answer to one JoinGroup request."""

    error: Errors
    member_id: str = ""
    generation: int = -1
    leader: str = ""
    #: The generation's members, sent to the leader only (it computes the assignment).
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rebalance:
    """One completed join phase: how generation ``generation`` formed."""

    generation: int
    #: ``InitialDelayedJoin`` or ``DelayedJoin``.
    op_type: str
    #: ``completed`` (every known member joined) or ``expired`` (the timeout passed).
    outcome: str
    #: Seconds from the start of the run.
    started: float
    finished: float
    members: tuple[str, ...]
    #: Members removed because they had not rejoined in time.
    removed: tuple[str, ...]


class _PendingJoin:
    """A JoinGroup the coordinator holds: answered once, then its request returns."""

    __slots__ = ("_answered", "response")

    def __init__(self) -> None:
        self._answered = anyio.Event()
        self.response: JoinResponse | None = None

    def answered(self) -> bool:
        return self._answered.is_set()

    def answer(self, response: JoinResponse) -> None:
        # May run in a timer callback (the join expired): Event.set() needs no task.
        self.response = response
        self._answered.set()

    async def wait(self) -> JoinResponse:
        await self._answered.wait()
        assert self.response is not None
        return self.response


class _Member:
    __slots__ = ("awaiting_join", "member_id", "rebalance_timeout")

    def __init__(self, member_id: str, rebalance_timeout: float) -> None:
        self.member_id = member_id
        self.rebalance_timeout = rebalance_timeout
        self.awaiting_join: _PendingJoin | None = None


class DelayedJoin(ap.DelayedOperation):
    """Completes the join phase when every known member has joined (Kafka's ``DelayedJoin``)."""

    def __init__(self, coordinator: GroupCoordinator, timeout: float) -> None:
        super().__init__(timeout)
        self.coordinator = coordinator

    def try_complete(self) -> bool:
        """Complete once every known member is waiting in a JoinGroup."""
        return self.coordinator.all_members_joined() and self.force_complete()

    def on_complete(self) -> None:
        """Form the next generation (also on expiry: late members are removed)."""
        self.coordinator.complete_join(self)


class InitialDelayedJoin(DelayedJoin):
    """The first join of an empty group: waits ``initial_rebalance_delay``, never less.

    A group that has just become non-empty would otherwise complete its join with
    the first member alone. While new members keep arriving the delay is extended,
    one ``delay`` at a time, up to the rebalance timeout (Kafka's ``InitialDelayedJoin``).
    """

    def __init__(self, coordinator: GroupCoordinator, delay: float, remaining: float) -> None:
        super().__init__(coordinator, delay)
        self.delay = delay
        self.remaining = remaining

    def try_complete(self) -> bool:
        """Never completes early: only the delay ends it."""
        return False

    def on_complete(self) -> None:
        """Extend while members keep joining, else form the generation."""
        coordinator = self.coordinator
        if coordinator.new_member_added and self.remaining > 0:
            coordinator.new_member_added = False
            delay = min(self.delay, self.remaining)
            coordinator.watch_join(InitialDelayedJoin(coordinator, delay, self.remaining - delay))
        else:
            coordinator.complete_join(self)


class GroupCoordinator:
    """One consumer group's coordinator: members, generations, and the join purgatory."""

    def __init__(self, config: Config, origin: float = 0.0) -> None:
        self.config = config
        # Loop time of the run's start: rebalance times are reported relative to it.
        self.origin = origin
        self.key = ("group", config.group_id)
        self.purgatory: ap.Purgatory[DelayedJoin] = ap.Purgatory("rebalance")
        self.state = "Empty"
        self.generation = 0
        self.leader = ""
        self.members: dict[str, _Member] = {}
        self.new_member_added = False
        self.rebalances: list[Rebalance] = []
        self._member_ids = itertools.count(1)
        self._join_started = 0.0
        self._first_op_type = ""

    # -- requests ------------------------------------------------------------------------

    async def join_group(self, member_id: str) -> JoinResponse:
        """A JoinGroup request: wait until the join phase ends, then get the generation."""
        if member_id and member_id not in self.members:
            return JoinResponse(Errors.UNKNOWN_MEMBER_ID, member_id)
        if not member_id:
            member_id = f"consumer-{next(self._member_ids)}"
            self.members[member_id] = _Member(member_id, self.config.rebalance_timeout)
            self.new_member_added = True
        pending = _PendingJoin()
        self.members[member_id].awaiting_join = pending
        if self.state in ("Empty", "Stable"):
            self._prepare_rebalance()
        else:
            self.purgatory.check_and_complete(self.key)
        return await pending.wait()

    def heartbeat(self, member_id: str, generation: int) -> Errors:
        """A Heartbeat: tells a member whether it must rejoin."""
        if member_id not in self.members:
            return Errors.UNKNOWN_MEMBER_ID
        if self.state == "PreparingRebalance" or generation != self.generation:
            return Errors.REBALANCE_IN_PROGRESS
        return Errors.NONE

    # -- the join phase ----------------------------------------------------------------------

    def all_members_joined(self) -> bool:
        """Every known member has a JoinGroup waiting (Kafka's ``hasAllMembersJoined``)."""
        return all(m.awaiting_join is not None for m in self.members.values())

    def watch_join(self, op: DelayedJoin) -> None:
        """Park a join operation under the group's key."""
        self.purgatory.try_complete_else_watch(op, [self.key])

    def _prepare_rebalance(self) -> None:
        self._join_started = anyio.current_time() - self.origin
        op: DelayedJoin
        if self.state == "Empty":
            delay = min(self.config.initial_rebalance_delay, self.config.rebalance_timeout)
            op = InitialDelayedJoin(self, delay, self.config.rebalance_timeout - delay)
            self.new_member_added = False
        else:
            op = DelayedJoin(self, max(m.rebalance_timeout for m in self.members.values()))
        self._first_op_type = type(op).__name__
        self.state = "PreparingRebalance"
        self.watch_join(op)

    def complete_join(self, op: DelayedJoin) -> None:
        """Remove members that did not rejoin, bump the generation, answer the joiners."""
        # When the join expires this runs in the timer's callback, where no task runs:
        # anyio.current_time() would not find its backend there (on asyncio).
        now = running_clock()()
        removed = tuple(m for m, s in self.members.items() if s.awaiting_join is None)
        for member_id in removed:
            del self.members[member_id]
        self.generation += 1
        joined = tuple(self.members)
        if self.leader not in self.members:
            self.leader = joined[0] if joined else ""
        self.state = "Stable" if joined else "Empty"
        assert op.outcome is not None
        self.rebalances.append(
            Rebalance(
                self.generation,
                self._first_op_type,
                op.outcome.value,
                self._join_started,
                now - self.origin,
                joined,
                removed,
            )
        )
        for member_id, member in self.members.items():
            pending, member.awaiting_join = member.awaiting_join, None
            assert pending is not None
            if not pending.answered():
                pending.answer(
                    JoinResponse(
                        Errors.NONE,
                        member_id,
                        self.generation,
                        self.leader,
                        joined if member_id == self.leader else (),
                    )
                )


@dataclass
class GroupResult:
    """What a run produced (seconds)."""

    config: Config
    rebalances: list[Rebalance]
    #: Error code -> JoinGroup responses.
    join_errors: Counter[str]
    #: JoinGroup requests sent, and how many were answered (equal unless one is pending).
    join_requests: int
    join_responses: int
    #: The final generation and its members.
    generation: int
    members: tuple[str, ...]
    state: str
    statistics: ap.PurgatoryStatistics
    elapsed: float


async def simulate(config: Config) -> GroupResult:
    """Run the group's members and coordinator on the running loop; return what happened.

    anyio code: runs on asyncio, uvloop and trio alike.
    """
    now = running_clock()
    start = now()
    coordinator = GroupCoordinator(config, origin=start)
    join_errors: Counter[str] = Counter()
    sent = 0

    async def join(member_id: str) -> JoinResponse:
        nonlocal sent
        sent += 1
        response = await coordinator.join_group(member_id)
        join_errors[response.error.name] += 1
        return response

    async def consumer(index: int, starts_at: float, late: bool) -> None:
        rng = random.Random(f"{config.seed}-member{index}")
        await anyio.sleep(starts_at)
        response = await join("")
        while True:
            await anyio.sleep(config.heartbeat_interval)
            error = coordinator.heartbeat(response.member_id, response.generation)
            if error is Errors.NONE:
                continue
            if error is Errors.REBALANCE_IN_PROGRESS:
                # Finish the batch in hand (the poll loop) before rejoining.
                delay = config.rejoin_delay.sample(rng)
                if late:
                    delay += config.rebalance_timeout
                    late = False
                await anyio.sleep(delay)
                response = await join(response.member_id)
            if response.error is Errors.UNKNOWN_MEMBER_ID or error is Errors.UNKNOWN_MEMBER_ID:
                # Removed from the group: start over as a new member.
                response = await join("")

    starter = random.Random(f"{config.seed}-start")
    late_members = set(starter.sample(range(config.members), config.late))
    try:
        async with anyio.create_task_group() as members:
            for i in range(config.members):
                # Members start within the initial rebalance delay, in a random order.
                starts_at = starter.uniform(0, config.initial_rebalance_delay)
                members.start_soon(consumer, i, starts_at, i in late_members)
            if config.new_member_at is not None:
                members.start_soon(consumer, config.members, config.new_member_at, False)
            await anyio.sleep(config.duration)
            members.cancel_scope.cancel()
    finally:
        statistics = coordinator.purgatory.statistics()
        coordinator.purgatory.close()
    return GroupResult(
        config=config,
        rebalances=coordinator.rebalances,
        join_errors=join_errors,
        join_requests=sent,
        join_responses=sum(join_errors.values()),
        generation=coordinator.generation,
        members=tuple(coordinator.members),
        state=coordinator.state,
        statistics=statistics,
        elapsed=now() - start,
    )


def run(config: Config, *, real_time: bool = False, loop: str = "asyncio") -> GroupResult:
    """Run a whole simulation of ``config`` and return its result: on virtual time
    unless ``real_time``, on ``loop``, seeded with ``config.seed``
    (:func:`examples._kafka.run_main`)."""
    return run_main(lambda: simulate(config), real_time=real_time, loop=loop, seed=config.seed)


def format_summary(result: GroupResult, wall: float) -> str:
    """A short plain-text summary of ``result``."""
    c = result.config
    lines = [
        f"group {c.group_id!r}: {c.members} members ({c.late} late), rebalance timeout "
        f"{c.rebalance_timeout:g} s ({result.elapsed:.2f} s simulated in {wall:.2f} s)",
    ]
    for r in result.rebalances:
        removed = f", removed {', '.join(r.removed)}" if r.removed else ""
        lines.append(
            f"  generation {r.generation}: {r.op_type} {r.outcome} at {r.finished:.3f} s "
            f"after {r.finished - r.started:.3f} s, {len(r.members)} members{removed}"
        )
    errors = ", ".join(f"{name} {count}" for name, count in sorted(result.join_errors.items()))
    lines += [
        f"  JoinGroup: {result.join_requests} sent, {result.join_responses} answered ({errors})",
        f"  final: generation {result.generation}, {result.state}, {len(result.members)} members",
        f"  purgatory: {result.statistics}",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The example's argument parser."""
    d = Config()
    parser = argparse.ArgumentParser(
        prog="group_join", description="Simulate a consumer group rebalance with DelayedJoin."
    )
    parser.add_argument("--members", type=positive_int, default=d.members)
    parser.add_argument("--late", type=int, default=d.late, help="members that rejoin too late")
    parser.add_argument(
        "--new-member-at",
        type=non_negative_float,
        default=d.new_member_at,
        help="seconds until a new member joins and triggers a rebalance",
    )
    parser.add_argument(
        "--no-new-member", action="store_true", help="no member joins later (no rebalance)"
    )
    parser.add_argument(
        "--rebalance-timeout", type=positive_float, default=d.rebalance_timeout, help="seconds"
    )
    parser.add_argument("--duration", type=positive_float, default=d.duration, help="seconds")
    add_runtime_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    config = checked_config(
        parser,
        args,
        lambda: Config(
            members=args.members,
            late=args.late,
            new_member_at=None if args.no_new_member else args.new_member_at,
            rebalance_timeout=args.rebalance_timeout,
            duration=args.duration,
            seed=args.seed,
        ),
    )
    result, wall = run_timed(args, functools.partial(run, config))
    print(format_summary(result, wall))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
