# Declarations that compile _watch.py into a C extension (see setup.py); the .py
# stays the pure-Python build and the one source of the logic. _Watch is a Python
# class (it derives from asyncio.Future); its methods and _new_watch call the
# core's functions in C.

from aiopurgatory._purgatory_core cimport _outcome, _park

cdef object _future_init, _blocking, _FINISHED


cpdef _new_watch(purgatory, op, keys)
