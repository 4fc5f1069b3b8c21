"""The ``aiopurgatory`` console script: one command, several subcommands.

Each subcommand lives in its own subpackage and is imported only when run, so
``aiopurgatory --help`` stays fast and heavy extras (rich, matplotlib, pyspark)
load only for the subcommand that needs them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module with ``main(argv) -> int``, one-line help)
_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("aiopurgatory.bench.cli", "benchmarks: timer, purgatory, scale (extra: bench)"),
    "analyze": ("aiopurgatory.pipeline.analyze", "analyse op event logs with Spark (extra: spark)"),
    "replay": ("aiopurgatory.pipeline.replay", "replay request traces on Spark (extra: spark)"),
    "gen-trace": ("aiopurgatory.pipeline.trace", "generate a synthetic request trace"),
}


def _usage() -> str:
    lines = ["usage: aiopurgatory <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in _COMMANDS.items()]
    lines += ["", "Run 'aiopurgatory <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aiopurgatory`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in _COMMANDS:
        print(f"aiopurgatory: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _ = _COMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        print(
            f"aiopurgatory {command}: cannot import {module_name} ({exc}); "
            "install the extra named in 'aiopurgatory --help'",
            file=sys.stderr,
        )
        return 2
    result: int = module.main(rest)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
