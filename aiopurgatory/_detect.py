"""Which async library is running: the one place that tells asyncio and trio apart.

A leaf module (it imports nothing of the package), so that both the dispatch in
:mod:`aiopurgatory._backends` and the drivers can ask it. The answer is the one
sniffio gives: a running trio task means trio (also in trio's guest mode on an
asyncio host loop), else a running asyncio loop (uvloop included) means asyncio,
else an active ``trio.run`` in this thread (a ``run_sync_soon`` callback) means
trio. trio is only looked at if the program imported it, so asking costs asyncio
programs a dictionary lookup and one C call.
"""

from __future__ import annotations

import asyncio
import sys

__all__ = ["current_backend", "in_trio_task"]

_get_running_loop = asyncio._get_running_loop  # C; None outside a running loop


def current_backend() -> str | None:
    """``"asyncio"`` or ``"trio"`` for the running async library, or None.

    A trio task comes first: in trio's guest mode it runs inside an asyncio
    host loop's callbacks, where ``asyncio._get_running_loop()`` is the host's.
    """
    if in_trio_task():
        return "trio"
    if _get_running_loop() is not None:
        return "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None and trio.lowlevel.in_trio_run():
        return "trio"
    return None


def in_trio_task() -> bool:
    """True in a trio task (also one of trio's guest mode, on an asyncio host loop)."""
    trio = sys.modules.get("trio")
    return trio is not None and trio.lowlevel.in_trio_task()
