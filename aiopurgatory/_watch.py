"""``Purgatory.watch``, kept out of the compiled core on purpose.

A native coroutine is the cheapest thing a parked request can await: compiled
by Cython, the same ``async def`` becomes a Cython coroutine whose locals live in
a separate closure object, and which a Python caller's ``await`` reaches through
one more wrapper object; that is two more objects the cyclic collector tracks and
about 50 more bytes per parked request, for no CPU saved, since the body is three
calls into the compiled core (``bench parked``, issue 54). So this module has no
``.pxd``: it is never compiled, and :class:`~aiopurgatory.Purgatory` takes its
``watch`` from here on both cores.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any, TypeVar

from ._operation import DelayedOperation, Outcome
from ._purgatory_core import _outcome, _park

# Purgatory's own (aiopurgatory._purgatory.OpT) would be an import cycle.
OpT = TypeVar("OpT", bound=DelayedOperation)

__all__ = ["watch"]


async def watch(self: Any, op: OpT, keys: Iterable[Hashable] | Mapping[Hashable, float]) -> Outcome:
    """:meth:`try_complete_else_watch`, then wait until ``op`` finishes.

    ``keys`` is a list (or other iterable but a tuple) of keys, or a Mapping
    of keys to thresholds (see :meth:`advance`).

    The caller owns the operation: if the awaiting task is cancelled (asyncio
    task cancellation, a trio or anyio cancel scope, on any backend) the
    operation is cancelled and the cancellation propagates. Raises everything that
    :meth:`try_complete_else_watch` raises, and also what is listed below.

    Returns:
        ``Outcome.COMPLETED`` or ``Outcome.EXPIRED``; ``Outcome.CANCELLED`` if
        someone else cancelled it (``op.cancel()``, ``cancel_for_key``, ``close``).

    Raises:
        RuntimeError: awaited on another loop than the one the purgatory is bound to.
        Exception: whatever a callback of ``op`` raised (the op is finished).
    """
    # The waiter takes the place of ``keys`` in the frame: the caller's list of
    # keys is released as soon as the op is parked rather than kept as long as
    # it waits, and the frame has one slot less (three locals, not four: the
    # coroutine falls from 232 to 224 bytes, one allocator size class less).
    # About 96 bytes and one GC-tracked object less per parked wait (issue 54).
    keys = _park(self, op, keys)
    if keys is not None:
        try:
            await keys  # type: ignore[misc]  # the waiter now (see above)
        except BaseException:
            # Cancelled (asyncio's CancelledError, trio's Cancelled, an anyio
            # cancel scope) or abandoned: the caller owns the op, withdraw it.
            op.cancel()
            raise
    return _outcome(op)


watch.__qualname__ = "Purgatory.watch"
