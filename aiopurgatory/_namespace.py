"""What ``dir()`` shows of a public module: its API, not the names it uses.

A module's namespace also holds what it imported to do its work (``Any``,
``asyncio``, the private submodules of a package...); ``dir()``, tab completion
and ``help()`` should show a user the public API only. A public module ends
with ``__dir__ = public_dir(__name__, __all__)`` (PEP 562): its ``dir()`` lists
``__all__``, the names given in ``extra`` (lazily loaded submodules) and the
module's dunders (``__version__``, ``__doc__``...). Every attribute stays
reachable (``getattr`` does not consult ``__dir__``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

__all__ = ["public_dir"]


def public_dir(module_name: str, public: Iterable[str]) -> Callable[[], list[str]]:
    """A module-level ``__dir__`` for ``module_name`` listing ``public`` and its dunders."""
    names = frozenset(public)

    def __dir__() -> list[str]:
        namespace = vars(sys.modules[module_name])
        dunders = {name for name in namespace if name.startswith("__") and name.endswith("__")}
        return sorted(names | dunders)

    return __dir__
