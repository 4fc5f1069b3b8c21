"""The processes a local cluster starts: who they are, their children, their logs, the state file.

A process is named by its pid and its start time (from ``/proc``), so that a pid
recycled by another process is never taken for it; its descendants are found
through ``/proc`` too. :class:`_State` is what ``cluster.json`` records. Used by
:class:`~aiopurgatory.pipeline.cluster.LocalCluster`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__: list[str] = []


_PROC = Path("/proc")


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks after boot), or None if it is gone or a zombie.

    Pid and start time together name one process: a pid reused later by another
    process has another start time. Without /proc (not Linux) only whether the
    pid exists is known, and the start time is 0.
    """
    if not _PROC.is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0
    fields = _stat_fields(_PROC / str(pid))
    if fields is None or fields[0] == "Z":
        return None
    return int(fields[19])


def _stat_fields(process: Path) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, from the state
    (field 3) on; None if the process is gone."""
    try:
        stat = (process / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after it.
    return stat[stat.rfind(")") + 2 :].split()


def _children(pid: int) -> list[int]:
    """The pids of every descendant of ``pid`` (from /proc; none known without it)."""
    parents: dict[int, list[int]] = {}
    if not _PROC.is_dir():
        return []
    for entry in _PROC.iterdir():
        fields = _stat_fields(entry) if entry.name.isdigit() else None
        if fields is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:]) or f"({path} is empty)"


@dataclass
class _Process:
    name: str
    pid: int
    start_ticks: int
    log: str
    port: int | None = None

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks


@dataclass
class _State:
    directory: str
    python: str
    master_port: int
    master_ui_port: int
    connect_port: int | None
    workers: int
    cores: int
    processes: list[_Process] = field(default_factory=list)
