# Declarations that compile _purgatory.py into a C extension (see setup.py); the
# .py stays the pure-Python build and the one source of the logic.

from aiopurgatory._operation cimport DelayedOperation, _Owner
from aiopurgatory._timer cimport Timer


cdef class _PurgatoryCore(_Owner):
    cdef object __weakref__
    cdef public Py_ssize_t _cancelled
    cdef public bint _closed
    cdef public Py_ssize_t _completed
    cdef public Py_ssize_t _delayed
    cdef public Py_ssize_t _expired
    cdef public Py_ssize_t _failed
    cdef public object _loop
    cdef public object _max_pending
    cdef public Py_ssize_t _pending
    cdef public Timer _timer
    cdef public Py_ssize_t _watched
    cdef public dict _watchers

    cpdef _detach(self, DelayedOperation op, outcome)
    cpdef _record(self, DelayedOperation op)
