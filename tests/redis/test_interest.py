"""The subscription's interest (sans-IO): its races, one by one, without a server.

Each test plays a connection by hand: the commands :meth:`Interest.commands`
hands out are "sent", and their answers fed back in the order Redis gives them.
"""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

import aiopurgatory as ap
from aiopurgatory.redis import RedisTriggers
from aiopurgatory.redis._interest import RESYNC, SEND, Dropped, Interest, Read, State


def of(key: object) -> int:
    assert isinstance(key, int)
    return key % 10  # key 13 is in partition 3


def subscribed(*keys: int, linger: float = 5.0) -> Interest:
    """An interest on a live connection, with the partitions of ``keys`` subscribed."""
    interest = Interest(of, linger=linger)
    assert interest.reconnecting() == []
    assert interest.connected() == (RESYNC,)
    if keys:
        assert interest.need(list(keys), 0.0) == ([], True)
        _, join = interest.commands()
        for n in join:
            interest.subscribe_answered(n)
    assert interest.covers(keys)
    return interest


def test_a_key_of_a_subscribed_partition_is_read_at_once_others_after_the_confirmation() -> None:
    interest = subscribed(3)
    assert interest.need([13], 1.0) == ([13], False)  # read now, no check
    assert interest.need([4, 14], 1.0) == ([], True)  # a SUBSCRIBE to send
    assert interest.commands() == ([], [4])
    assert interest.state(4) is State.SUBSCRIBING
    assert not interest.covers([4])
    # Subscribed first, read next (and checked: a trigger may have gone by unseen).
    assert interest.subscribe_answered(4) == [Read([4, 14], True)]
    assert interest.covers([4, 14])
    assert interest.subscribed == 2


def test_a_partition_lingers_then_is_released_and_unsubscribed() -> None:
    interest = subscribed(3, linger=5.0)
    assert interest.sweep({3}, 1.0) == ()  # the sweep finds the key: not idle
    assert interest.sweep(set(), 2.0) == ()  # the key left at 2.0
    assert interest.sweep(set(), 7.0) == ()  # 5 s: not more than linger yet
    assert interest.state(3) is State.SUBSCRIBED
    assert interest.sweep(set(), 7.5) == (SEND,)
    assert interest.state(3) is State.LEAVING
    assert interest.wanted() == []
    assert interest.commands() == ([3], [])
    assert interest.unsubscribe_answered(3) == ()
    assert interest.state(3) is None


def test_watched_again_before_its_unsubscribe_is_sent_a_partition_stays_subscribed() -> None:
    interest = subscribed(3, linger=1.0)
    assert interest.sweep(set(), 2.0) == (SEND,)
    assert interest.state(3) is State.LEAVING
    # Still subscribed on the server: read at once, no command at all.
    assert interest.need([3], 2.5) == ([3], False)
    assert interest.state(3) is State.SUBSCRIBED
    assert interest.commands() == ([], [])


def test_watched_again_while_its_unsubscribe_is_in_flight_it_subscribes_after_the_answer() -> None:
    interest = subscribed(3, linger=1.0)
    interest.sweep(set(), 2.0)
    assert interest.commands() == ([3], [])
    assert interest.need([3], 2.5) == ([], False)
    assert interest.state(3) is State.RETURNING
    assert interest.commands() == ([], [])  # one command in flight per partition
    assert interest.unsubscribe_answered(3) == (SEND,)
    assert interest.commands() == ([], [3])
    assert interest.subscribe_answered(3) == [Read([3], True)]
    assert interest.covers([3])


def test_released_while_its_subscribe_is_in_flight_then_watched_again_it_ends_subscribed() -> None:
    """The linger race: before the state machine, the partition ended wanted, with
    its key waiting, and no SUBSCRIBE sent (until the next reconnection)."""
    interest = subscribed(linger=0.5)
    interest.need([3], 0.0)
    assert interest.commands() == ([], [3])
    assert interest.sweep(set(), 1.0) == ()  # released, its SUBSCRIBE unanswered
    assert interest.state(3) is State.ABANDONING
    assert interest.need([13], 1.1) == ([], False)
    assert interest.state(3) is State.SUBSCRIBING
    assert interest.subscribe_answered(3) == [Read([13], True)]
    assert interest.commands() == ([], [])
    assert interest.covers([13])


def test_released_while_its_subscribe_is_in_flight_it_is_unsubscribed_after_the_answer() -> None:
    interest = subscribed(linger=0.5)
    interest.need([3], 0.0)
    interest.commands()
    interest.sweep(set(), 1.0)
    assert interest.subscribe_answered(3) == (SEND,)
    assert interest.commands() == ([3], [])
    interest.unsubscribe_answered(3)
    assert interest.state(3) is None


def test_a_subscription_the_server_ends_is_renewed_and_resynced_once_confirmed() -> None:
    interest = subscribed(3)
    actions = interest.unsubscribe_answered(3)  # nobody asked: the server's own
    assert actions == [Dropped(3), SEND]
    assert interest.state(3) is State.LOST
    assert not interest.covers([3])
    assert interest.commands() == ([], [3])
    # The resync waits for the new SUBSCRIBE: a read before it could still miss
    # a trigger published before the subscription is back.
    assert interest.need([13], 1.0) == ([], False)
    assert interest.subscribe_answered(3) == (RESYNC,)
    assert interest.covers([3, 13])


def test_the_servers_own_unsubscribe_crossing_ours_still_ends_subscribed() -> None:
    """The one ambiguity: the two unsubscribes cannot be told apart."""
    interest = subscribed(3, linger=1.0)
    interest.sweep(set(), 2.0)
    assert interest.commands() == ([3], [])  # our UNSUBSCRIBE in flight
    # The server's own, sent before it read ours, comes first: taken for the answer.
    assert interest.unsubscribe_answered(3) == ()
    assert interest.need([3], 2.5) == ([], True)
    assert interest.commands() == ([], [3])
    # The real answer to ours: taken for the server's own (a needless resync).
    assert interest.unsubscribe_answered(3) == [Dropped(3)]
    assert interest.subscribe_answered(3) == (RESYNC,)
    assert interest.covers([3])


def test_a_lost_connection_forgets_what_was_in_flight_the_next_subscribes_the_wanted() -> None:
    interest = subscribed(3, 5, linger=1.0)
    interest.need([6], 0.0)
    interest.commands()  # 6's SUBSCRIBE in flight
    interest.sweep({3, 6}, 2.0)  # 5 released: its UNSUBSCRIBE waits
    assert interest.state(5) is State.LEAVING
    interest.disconnected()
    assert interest.subscribed == 0
    assert interest.state(5) is None
    assert sorted(interest.reconnecting()) == [3, 6]
    assert interest.connected() == (RESYNC,)
    assert interest.covers([3, 6])
    assert interest.commands() == ([], [])


def test_the_reconnection_race_watches_and_releases_while_the_new_connection_subscribes() -> None:
    """Before the state machine, a partition released while a new connection
    subscribed stayed subscribed (unwanted) until the next reconnection."""
    interest = subscribed(3, 5, linger=1.0)
    interest.sweep({3}, 0.0)
    interest.disconnected()
    assert sorted(interest.reconnecting()) == [3, 5]
    assert interest.need([7], 1.5) == ([], True)  # not in the new connection's SUBSCRIBE
    assert interest.sweep({3}, 2.0) == ()  # 5 released, its SUBSCRIBE in flight
    assert interest.state(5) is State.ABANDONING
    assert interest.connected() == (RESYNC, SEND)
    assert interest.commands() == ([5], [7])
    assert interest.subscribe_answered(7) == [Read([7], True)]
    assert interest.unsubscribe_answered(5) == ()
    assert sorted(interest.wanted()) == [3, 7]
    assert interest.covers([3, 7])


def test_a_reconnection_that_fails_leaves_the_wanted_partitions_queued() -> None:
    interest = subscribed(3)
    interest.disconnected()
    interest.reconnecting()
    interest.disconnected()  # the SUBSCRIBE timed out
    assert interest.state(3) is State.QUEUED
    assert interest.reconnecting() == [3]


def test_answers_nobody_waits_for_change_nothing() -> None:
    interest = subscribed(3)
    assert interest.subscribe_answered(3) == ()
    assert interest.subscribe_answered(4) == ()
    assert interest.unsubscribe_answered(4) == ()
    assert interest.covers([3])
    assert interest.wanted() == [3]


def test_keys_that_cannot_cross_the_wire_are_left_out_of_the_sweep() -> None:
    interest = Interest(lambda key: 0, linger=1.0)
    assert interest.sweep({(1, 2), 3.5}, 0.0) == ()
    assert interest.wanted() == []


@pytest.mark.parametrize("linger", [-1.0, float("nan")])
def test_a_negative_linger_is_refused(linger: float) -> None:
    with pytest.raises(ValueError, match="linger"):
        Interest(of, linger=linger)


async def test_the_subscriber_carries_out_the_actions() -> None:
    purgatory: ap.Purgatory[ap.WatermarkOperation] = ap.Purgatory("acts")
    triggers = RedisTriggers(purgatory, "redis://127.0.0.1:1/0")  # never entered
    subscriber = triggers._subscriber
    assert subscriber is not None
    with capture_logs() as logs:
        subscriber._act([Dropped(3), SEND, RESYNC, Read(["k"], True)])
    assert [(e["event"], e.get("partition")) for e in logs] == [
        ("aiopurgatory.redis.unsubscribed_by_server", 3)
    ]
    assert subscriber._changed.is_set()
    reader = triggers._reader
    assert reader._resync
    assert list(reader._checks) == ["k"]
