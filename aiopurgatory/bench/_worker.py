"""The isolated benchmark process: ``python -m aiopurgatory.bench._worker SPEC``.

Imports every workload module (each registers its runner), runs the one spec
given as JSON and prints its result as one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys

from . import acks, parked, purgatory, realistic, scale, timer  # noqa: F401 - each registers its runner
from ._common import quiet_logging
from ._registry import runner


def main(argv: list[str]) -> int:
    quiet_logging()
    spec = json.loads(argv[0])
    result = runner(spec["bench"])(spec)
    # One JSON line on stdout; everything else goes to stderr.
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
