"""What the ``aiopurgatory`` commands share, so that they fail early and clearly.

Every check here runs before a command does any work (starts Spark, runs a
benchmark, writes a file), and a user's mistake becomes one line on stderr and
exit status 2, never a traceback:

* :class:`Parser`: argparse with one-line errors and every option's default
  in ``--help``;
* :func:`require`: the modules of an extra, naming the extra to install;
* :func:`check_output_file` and :class:`OutputDir`: output paths that exist,
  are writable and are not the wrong kind (a directory is never created
  above ``--out``: its parent must exist);
* :class:`Steps`: one line per step on stderr as it starts and ends, also when
  stderr is not a terminal (a CI log).

An output directory is written whole or not at all: a command writes into a
fresh staging directory beside ``--out`` and renames it into place when it
succeeds, so a reused ``--out`` never mixes two runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, TypeVar

T = TypeVar("T")

__all__ = [
    "MARKER",
    "OutputDir",
    "Parser",
    "Steps",
    "UsageError",
    "check_output_file",
    "require",
]

#: Written into every output directory a command completes: what wrote it.
#: ``--overwrite`` replaces only directories that have it.
MARKER = "_aiopurgatory.json"


class UsageError(Exception):
    """A user's mistake: the message is the one line the command prints (exit 2)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default unless its help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default == []
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        if isinstance(default, list | tuple):
            shown = ",".join(str(item) for item in default)
        else:
            shown = "%(default)s"
        return f"{text} (default: {shown})"


class Parser(argparse.ArgumentParser):
    """argparse for the ``aiopurgatory`` commands: an error is one line naming the
    command, and ``--help`` shows every option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")

    def add_output_dir(self) -> None:
        """``--out`` and ``--overwrite``, as :class:`OutputDir` takes them."""
        self.add_argument(
            "--out",
            required=True,
            help="output directory; its parent must exist; written whole when the run succeeds",
        )
        self.add_argument(
            "--overwrite",
            action="store_true",
            help="replace --out if an earlier run of a command wrote it (else a non-empty --out "
            "is refused)",
        )


def fail(prog: str, error: BaseException | str, status: int = 2) -> int:
    """Print ``prog: error`` as one line on stderr; return ``status``."""
    text = " ".join(str(error).split()) if str(error) else type(error).__name__
    print(f"{prog}: {text}", file=sys.stderr, flush=True)
    return status


def require(modules: Iterable[str], extra: str) -> None:
    """Import ``modules``; if one is missing, say which extra installs it.

    Raises:
        UsageError: naming the missing modules and ``pip install 'aiopurgatory[extra]'``.
    """
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UsageError(
            f"needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed: pip install 'aiopurgatory[{extra}]'"
        )


def _probe_writable(directory: Path, option: str, shown: str) -> None:
    """Create and remove a file in ``directory`` (``os.access`` says yes to root
    on a read-only filesystem)."""
    try:
        probe = directory / f".aiopurgatory-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{option} {shown}: cannot write in {directory}: {exc.strerror}") from None


def check_output_file(path: str | os.PathLike[str], option: str) -> Path:
    """Check that a command can write the file ``path`` (its parent exists and is
    writable; it is not a directory). Nothing is created.

    Raises:
        UsageError: naming ``option`` and the problem.
    """
    shown = os.fspath(path)
    target = Path(shown).absolute()
    if target.is_dir():
        raise UsageError(f"{option} {shown}: is a directory, expected a file")
    if not target.parent.is_dir():
        what = "is not a directory" if target.parent.exists() else "does not exist"
        raise UsageError(f"{option} {shown}: the directory {target.parent} {what}")
    _probe_writable(target.parent, option, shown)
    return target


def _within(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


class OutputDir:
    """A command's output directory, written whole or not at all.

    Checked at construction (nothing created): ``path`` is not a file, its parent
    exists and is writable, it holds none of the ``inputs``, and it is empty or
    absent unless ``overwrite`` is given, and then only if a command wrote it
    (:data:`MARKER`). :meth:`open` makes a staging directory beside it where the
    command writes; :meth:`commit` replaces ``path`` with it; leaving the
    ``with`` block without :meth:`commit` removes it.

    Raises:
        UsageError: naming ``option`` and the problem, and how to overwrite.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        option: str = "--out",
        overwrite: bool = False,
        inputs: Sequence[str] = (),
        command: str = "",
    ) -> None:
        shown = os.fspath(path)
        self.path = Path(shown).absolute()
        self.command = command
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"{option} {shown}: is a file, expected a directory")
        parent = self.path.parent
        if not parent.is_dir():
            what = "is not a directory" if parent.exists() else "does not exist (create it first)"
            raise UsageError(f"{option} {shown}: its parent directory {parent} {what}")
        _probe_writable(parent, option, shown)
        for item in inputs:
            if _within(Path(item).absolute(), self.path):
                raise UsageError(
                    f"{option} {shown} holds the input {item}: choose another {option}"
                )
        if self.path.is_dir() and any(self.path.iterdir()):
            if not overwrite:
                raise UsageError(
                    f"{option} {shown} is not empty (an earlier run?): pass --overwrite to "
                    f"replace it, or choose another {option}"
                )
            if not (self.path / MARKER).is_file():
                raise UsageError(
                    f"{option} {shown} holds files no aiopurgatory command wrote (no {MARKER}); "
                    f"--overwrite replaces only a command's own output: choose another {option}"
                )
        self.staging: Path | None = None

    @contextlib.contextmanager
    def open(self) -> Iterator[Path]:
        """Make the staging directory and yield it; removed unless committed."""
        self.staging = self.path.with_name(f".{self.path.name}.partial-{os.getpid()}")
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir()
        try:
            yield self.staging
        finally:
            if self.staging is not None and self.staging.exists():
                shutil.rmtree(self.staging, ignore_errors=True)

    def commit(self, argv: Sequence[str] = ()) -> None:
        """Mark the staging directory as this command's output and move it to ``path``
        (replacing what was there)."""
        staging = self.staging
        assert staging is not None, "commit() inside open()"
        (staging / MARKER).write_text(
            json.dumps(
                {
                    "command": self.command,
                    "argv": list(argv),
                    "version": _version(),
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                indent=1,
            )
            + "\n"
        )
        old = None
        if self.path.exists():
            old = self.path.with_name(f".{self.path.name}.old-{os.getpid()}")
            os.replace(self.path, old)
        os.replace(staging, self.path)
        self.staging = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _version() -> str:
    import aiopurgatory

    return aiopurgatory.__version__


class Steps:
    """Prints a command's steps on stderr as they start and end, with elapsed
    seconds, flushed at once (a CI log shows where a long run is).

    Args:
        prog: the command's name, the prefix of each line.
        quiet: print nothing (the seconds are still kept).
        file: where to print; default ``sys.stderr``.
    """

    def __init__(self, prog: str, *, quiet: bool = False, file: IO[str] | None = None) -> None:
        self.prog = prog
        self._quiet = quiet
        self._file = file
        self.started = time.perf_counter()
        #: Seconds of each finished step, by name.
        self.seconds: dict[str, float] = {}

    def say(self, text: str) -> None:
        """Print one line (elapsed seconds since the command started)."""
        if not self._quiet:
            elapsed = time.perf_counter() - self.started
            file = self._file if self._file is not None else sys.stderr
            print(f"{self.prog} [{elapsed:6.1f} s] {text}", file=file, flush=True)

    def run(self, name: str, what: str, start: Callable[[], tuple[T, int]]) -> tuple[T | None, int]:
        """A step that gives ``(thing, 0)`` or, when it failed and said why,
        ``(None, status)``: then no "done" line follows its message."""
        self.say(f"{name}: {what} ...")
        started = time.perf_counter()
        thing, status = start()
        if thing is None:
            return None, status
        seconds = time.perf_counter() - started
        self.seconds[name] = seconds
        self.say(f"{name}: done in {seconds:.1f} s")
        return thing, status

    @contextlib.contextmanager
    def step(self, name: str, what: str = "") -> Iterator[None]:
        """A step: one line when it starts (``name: what ...``), one when it ends."""
        self.say(f"{name}: {what} ..." if what else f"{name} ...")
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
        self.seconds[name] = seconds
        self.say(f"{name}: done in {seconds:.1f} s")
