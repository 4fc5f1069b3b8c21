# Declarations that compile _purgatory.py into a C extension (see setup.py); the
# .py stays the pure-Python build and the one source of the logic. Purgatory is a
# Python class (it is Generic); its watch() is _watch.py's (compiled there), the
# rest calls the core's functions in C.

from aiopurgatory._purgatory_core cimport _PurgatoryCore, _expire_now
