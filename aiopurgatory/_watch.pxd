# Declarations that compile _watch.py into a C extension (see setup.py); the .py
# stays the pure-Python build and the one source of the logic.

cimport cython

from aiopurgatory._operation cimport DelayedOperation
from aiopurgatory._purgatory_core cimport _outcome, _park

cdef object _copy_context
# The states of a _Watch: C ints.
cdef int _NEW, _YIELDED, _WAITING, _WOKEN, _CANCELLED, _FORWARDING, _DONE


@cython.final
cdef class _Watch:
    cdef public object _callback
    cdef public object _context
    cdef public object _keys
    cdef public object _op
    cdef public object _purgatory
    cdef public int _state

    cpdef send(self, value)
    @cython.locals(op=DelayedOperation)
    cpdef throw(self, typ, val=*, tb=*)
    @cython.locals(op=DelayedOperation)
    cpdef close(self)
    cdef _start(self)
    cdef _forward(self, value, exc)
    cpdef get_loop(self)
    @cython.locals(op=DelayedOperation)
    cpdef bint cancel(self, msg=*) except -1
    cpdef set_result(self, _result)
    cdef _schedule(self)
    cdef _cancelled_error(self)


@cython.locals(new=_Watch)
cpdef _Watch _new_watch(purgatory, op, keys)
