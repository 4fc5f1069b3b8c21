"""Hypothesis stateful test: the subscription's interest against a model, no server.

The model is the obvious one: a Redis connection (the channels it is subscribed
to after the commands sent so far, and the answers not yet read, in order,
among which the server's own ``unsubscribe`` of a channel it dropped), the
wanted partitions computed from the rule "a key watched, or none for ``linger``
seconds since", and the keys that still owe a read made while their partition
is subscribed. :class:`~aiopurgatory.redis._interest.Interest` is fed the same
events in any order (watches, sweeps, sends, answers, drops by the server,
connections lost and renewed, a reconnection with watches and releases under
way) and must agree on every step:

* the partitions it wants are the model's;
* never two commands in flight for one partition (but after the server's own
  unsubscribe crossed an UNSUBSCRIBE of ours: the two cannot be told apart);
* a read it asks for is made while the key's partition is subscribed (or its
  drop by the server is still unread: the client cannot know it yet);
* once everything sent is answered, the connection is subscribed to exactly the
  wanted partitions, each one subscribed in the interest's eyes too, and no key
  owes a read.
"""

from __future__ import annotations

from collections import deque

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aiopurgatory.redis._interest import (
    _TO_SEND,
    RESYNC,
    SEND,
    WANTED,
    Action,
    Dropped,
    Interest,
    Read,
    State,
)

PARTITIONS = 4
LINGER = 2.0
KEYS = st.integers(0, 11)  # three keys per partition: they share partitions often
STEPS = st.sampled_from([0.0, 0.5, 1.0, 2.5])


def of(key: object) -> int:
    assert isinstance(key, int)
    return key % PARTITIONS


class InterestMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.interest = Interest(of, linger=LINGER)
        self.now = 0.0
        # The connection: None while down; channels subscribed after the commands
        # sent; the answers not read yet ("subscribe"/"unsubscribe", partition,
        # whether the server sent it by itself).
        self.connected = False
        self.connecting = False
        self.server: set[int] = set()
        self.answers: deque[tuple[str, int, bool]] = deque()
        self.in_flight: dict[int, int] = {}  # our commands not answered yet
        # Partitions where the server's own unsubscribe came while our command was
        # in flight: the interest takes it for the answer (the two cannot be told
        # apart), so it may send the next command before the real answer comes.
        self.ambiguous: set[int] = set()
        # The model's interest.
        self.wanted: set[int] = set()
        self.since: dict[int, float] = {}  # the last watch of it, or its last key leaving
        self.swept: set[int] = set()
        self.watched: set[int] = set()
        self.unread: set[int] = set()

    # -- the model's side --------------------------------------------------------------

    def _dropped_unread(self, n: int) -> bool:
        return any(kind == "unsubscribe" and own and p == n for kind, p, own in self.answers)

    def _apply(self, actions: object, *, check: bool | None = None) -> None:
        assert isinstance(actions, list | tuple)
        for action in actions:
            self._apply_one(action, check)

    def _apply_one(self, action: Action, check: bool | None) -> None:
        if action is RESYNC:
            self.unread = {k for k in self.unread if of(k) not in self.server}
        elif isinstance(action, Read):
            if check is not None:
                assert action.check is check
            for key in action.keys:
                n = of(key)
                assert n in self.server or self._dropped_unread(n), (
                    f"{key!r} read while partition {n} is not subscribed"
                )
                if n in self.server:
                    self.unread.discard(key)
        elif isinstance(action, Dropped):
            assert action.partition in self.wanted
        else:
            assert action is SEND

    def _release(self, n: int) -> None:
        self.wanted.discard(n)
        self.watched = {k for k in self.watched if of(k) != n}
        self.unread = {k for k in self.unread if of(k) != n}

    # -- interest ------------------------------------------------------------------------

    @rule(keys=st.lists(KEYS, max_size=4), step=STEPS)
    def need(self, keys: list[int], step: float) -> None:
        self.now += step
        for key in keys:
            n = of(key)
            self.wanted.add(n)
            self.since[n] = self.now
            self.watched.add(key)
            if n not in self.server:
                self.unread.add(key)
        ready, _ = self.interest.need(keys, self.now)
        if ready:
            self._apply([Read(ready, False)], check=False)

    @rule(keys=st.sets(KEYS, max_size=6), step=STEPS)
    def sweep(self, keys: set[int], step: float) -> None:
        self.now += step
        had = {of(k) for k in self.swept}
        has = {of(k) for k in keys}
        for n in had - has:
            self.since[n] = self.now
        for key in keys - self.swept:
            self.wanted.add(of(key))
            self.watched.add(key)
            if of(key) not in self.server:
                self.unread.add(key)
        self.swept = set(keys)
        for n in list(self.wanted):
            if n not in has and self.now - self.since[n] > LINGER:
                self._release(n)
        self._apply(self.interest.sweep(set(keys), self.now))

    # -- the connection ----------------------------------------------------------------

    @precondition(lambda self: self.connected)
    @rule()
    def send(self) -> None:
        leave, join = self.interest.commands()
        assert leave == sorted(leave)
        assert join == sorted(join)
        assert not set(leave) & set(join)
        for kind, group in (("unsubscribe", leave), ("subscribe", join)):
            for n in group:
                assert not self.in_flight.get(n) or n in self.ambiguous, (
                    f"a second command in flight for {n}"
                )
                self.in_flight[n] = self.in_flight.get(n, 0) + 1
                (self.server.discard if kind == "unsubscribe" else self.server.add)(n)
                self.answers.append((kind, n, False))

    @precondition(lambda self: self.connected and self.answers)
    @rule()
    def answer(self) -> None:
        kind, n, own = self.answers.popleft()
        if own and self.in_flight.get(n):
            self.ambiguous.add(n)
        elif not own:
            self.in_flight[n] -= 1
            if not self.in_flight[n]:
                self.ambiguous.discard(n)
        if kind == "subscribe":
            self._apply(self.interest.subscribe_answered(n), check=True)
        else:
            self._apply(self.interest.unsubscribe_answered(n))

    @precondition(lambda self: self.connected and self.server)
    @rule(pick=st.integers(0, PARTITIONS - 1))
    def server_drops_a_subscription(self, pick: int) -> None:
        n = sorted(self.server)[pick % len(self.server)]
        self.server.discard(n)
        self.answers.append(("unsubscribe", n, True))
        # What it publishes from now on is missed: its keys owe a read again.
        self.unread |= {k for k in self.watched if of(k) == n}

    @precondition(lambda self: self.connected)
    @rule()
    def connection_lost(self) -> None:
        self.interest.disconnected()
        self._down()

    def _down(self) -> None:
        self.connected = self.connecting = False
        self.server.clear()
        self.answers.clear()
        self.in_flight.clear()
        self.ambiguous.clear()
        self.unread |= self.watched

    @precondition(lambda self: not self.connected and not self.connecting)
    @rule()
    def reconnect(self) -> None:
        channels = self.interest.reconnecting()
        assert sorted(channels) == sorted(self.wanted)
        self.connecting = True
        self.server = set(channels)

    @precondition(lambda self: self.connecting)
    @rule()
    def reconnected(self) -> None:
        actions = self.interest.connected()
        assert RESYNC in actions
        self.connecting = False
        self.connected = True
        self._apply(actions)

    @precondition(lambda self: self.connecting)
    @rule()
    def reconnect_failed(self) -> None:
        self.interest.disconnected()
        self._down()

    @rule()
    def settle(self) -> None:
        """Answer everything: the connection ends up with exactly the wanted partitions."""
        if not self.connected:
            if not self.connecting:
                self.reconnect()
            self.reconnected()
        for _ in range(10):
            self.send()
            while self.answers:
                self.answer()
        assert self.interest.commands() == ([], [])
        assert self.server == self.wanted
        assert all(self.interest.state(n) is State.SUBSCRIBED for n in self.wanted)
        assert self.interest.covers(self.watched)
        assert not self.unread, f"{sorted(self.unread)} never read while subscribed"

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def wants_what_the_model_wants(self) -> None:
        assert sorted(self.interest.wanted()) == sorted(self.wanted)

    @invariant()
    def its_indexes_follow_its_states(self) -> None:
        interest = self.interest
        states = interest._state
        assert interest._pending == {n for n, s in states.items() if s in _TO_SEND}
        # Keys wait only in a partition wanted and not subscribed yet.
        assert all(states.get(n) in WANTED - {State.SUBSCRIBED} for n in interest._waiting)
        assert set(interest._idle) <= set(interest.wanted())
        assert not set(interest._idle) & set(interest._count)
        assert set(interest._count) <= set(interest.wanted())

    @invariant()
    def subscribed_in_its_eyes_is_subscribed_on_the_server(self) -> None:
        if not self.connected:
            return
        for n in range(PARTITIONS):
            if self.interest.state(n) is State.SUBSCRIBED:
                assert n in self.server or self._dropped_unread(n)


InterestMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestInterestAgainstModel = InterestMachine.TestCase
