"""The ``aiopurgatory`` console script: one command, several subcommands.

Each subcommand lives in its own subpackage and is imported only when run, so
``aiopurgatory --help`` stays fast and heavy extras (rich, matplotlib, pyspark)
load only for the subcommand that needs them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module with ``main(argv) -> int``, one-line help, its extra)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "bench": (
        "aiopurgatory.bench.cli",
        "benchmarks: timer, purgatory, scale (extra: bench)",
        "bench",
    ),
    "analyze": (
        "aiopurgatory.pipeline.analyze",
        "analyse op event logs with Spark (extra: spark)",
        "spark",
    ),
    "replay": (
        "aiopurgatory.pipeline.replay",
        "replay request traces, on Spark or in this process (extra: spark)",
        "spark",
    ),
    "gen-trace": (
        "aiopurgatory.pipeline.trace",
        "generate a synthetic request trace (extra: spark)",
        "spark",
    ),
}

#: The third-party modules of the extras the commands use, and the extra that
#: installs each (None: the command's own extra). A missing one is a missing
#: extra, said in one line; any other import error is a bug (a traceback).
_EXTRA_OF: dict[str, str | None] = {
    "rich": None,
    "matplotlib": None,
    "pyspark": "spark",
    "py4j": "spark",
    "pandas": "spark",
    "pyarrow": "spark",
    "numpy": "spark",
    "uvloop": "uvloop",
    "trio": "trio",
}


def _usage() -> str:
    lines = ["usage: aiopurgatory <command> [options]", "       aiopurgatory --version", ""]
    lines += ["commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_, _) in _COMMANDS.items()]
    lines += ["", "Run 'aiopurgatory <command> --help' for a command's options."]
    return "\n".join(lines)


def _version() -> str:
    import aiopurgatory

    core = "compiled core" if aiopurgatory.COMPILED else "pure-Python core"
    return f"aiopurgatory {aiopurgatory.__version__} ({core}, Python {sys.version.split()[0]})"


def _missing_extra(command: str, exc: ImportError) -> int | None:
    """Say in one line which extra to install, if ``exc`` is a missing extra's module."""
    top = (exc.name or "").split(".")[0]
    if top not in _EXTRA_OF:
        return None
    extra = _EXTRA_OF[top] or _COMMANDS[command][2]
    print(
        f"aiopurgatory {command}: needs {top}, which is not installed: "
        f"pip install 'aiopurgatory[{extra}]'",
        file=sys.stderr,
    )
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aiopurgatory`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(_version())
        return 0
    command, rest = args[0], args[1:]
    if command not in _COMMANDS:
        print(f"aiopurgatory: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name = _COMMANDS[command][0]
    try:
        module = importlib.import_module(module_name)
        result: int = module.main(rest)
    except ImportError as exc:
        status = _missing_extra(command, exc)
        if status is None:
            raise
        return status
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
