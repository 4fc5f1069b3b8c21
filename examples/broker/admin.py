"""A tiny line-based admin port: break followers from a terminal while clients run.

``python -m examples.broker --admin-port 9093``, then ``nc 127.0.0.1 9093``::

    stall 1          follower 1 stops fetching (stays in the ISR until replica_lag_time_max)
    resume 1
    crash 2          follower 2 dies: out of every ISR at once
    restart 2        rejoins each ISR once caught up to the high watermark
    lag 1 0.25       follower 1 takes 0.25 s to replicate each fetch
    state            ISR / HW / LEO of every partition, follower states
    stats            purgatory statistics
    groups           consumer groups: state, generation, leader, members
    help             the commands

Every command gets one line back, starting with ``ok`` or ``error``; an unknown
command's error names the known ones, a known one with the wrong arguments its
usage. Loopback only by default: there is no authentication.
"""

from __future__ import annotations

import asyncio
import json

from .server import Broker

__all__ = ["COMMANDS", "execute", "start_admin_server"]

_MAX_LINE = 1024

#: Each command and its usage (what follows the command word).
COMMANDS = {
    "stall": "FOLLOWER",
    "resume": "FOLLOWER",
    "crash": "FOLLOWER",
    "restart": "FOLLOWER",
    "lag": "FOLLOWER SECONDS",
    "state": "",
    "stats": "",
    "groups": "",
    "help": "",
}
_KNOWN = ", ".join(f"{name} {usage}".strip() for name, usage in COMMANDS.items())


async def execute(broker: Broker, line: str) -> str:
    """Run one admin command; return the reply line (without newline)."""
    words = line.split()
    if not words:
        return "error empty command"
    command, args = words[0].lower(), words[1:]
    try:
        if command in ("stall", "resume", "crash", "restart") and len(args) == 1:
            if not args[0].isdigit():
                return _usage(command)
            follower_id = int(args[0])
            if command == "stall":
                broker.stall_follower(follower_id)
            elif command == "resume":
                broker.resume_follower(follower_id)
            elif command == "crash":
                await broker.crash_follower(follower_id)
            else:
                broker.restart_follower(follower_id)
            return f"ok {command} {follower_id}"
        if command == "lag" and len(args) == 2:
            try:
                follower_id, seconds = int(args[0]), float(args[1])
            except ValueError:
                return _usage(command)
            broker.set_follower_lag(follower_id, seconds)
            return f"ok lag {follower_id} {seconds}"
        if command == "state" and not args:
            state = {
                "followers": {f.id: f.state for f in broker.followers},
                "partitions": {
                    str(tp): {
                        "isr": sorted(p.isr),
                        "high_watermark": p.high_watermark,
                        "log_end_offset": p.log_end_offset,
                    }
                    for tp, p in broker.partitions.items()
                },
            }
            return "ok " + json.dumps(state)
        if command == "stats" and not args:
            stats = {
                name: {
                    "pending": s.pending,
                    "completed": s.completed,
                    "expired": s.expired,
                    "cancelled": s.cancelled,
                    "advances": s.advances,
                }
                for name, s in broker.statistics().items()
            }
            return "ok " + json.dumps(stats)
        if command == "groups" and not args:
            return "ok " + json.dumps(broker.coordinator.describe())
        if command == "help" and not args:
            return f"ok commands: {_KNOWN}"
    except ValueError as exc:
        return f"error {exc}"
    if command in COMMANDS:
        return _usage(command)
    return f"error unknown command {words[0][:80]!r}; commands: {_KNOWN}"


def _usage(command: str) -> str:
    return f"error usage: {command} {COMMANDS[command]}".rstrip()


async def start_admin_server(broker: Broker, host: str, port: int) -> asyncio.Server:
    """Listen for admin commands on ``host:port`` (0 picks a free port)."""

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                if len(line) > _MAX_LINE:
                    writer.write(b"error line too long\n")
                    break
                reply = await execute(broker, line.decode(errors="replace"))
                writer.write(reply.encode() + b"\n")
                await writer.drain()
        except (ConnectionError, ValueError):
            # ValueError: a line longer than the StreamReader limit.
            pass
        finally:
            writer.close()

    return await asyncio.start_server(session, host, port, limit=_MAX_LINE * 4)
