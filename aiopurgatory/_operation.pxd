# Declarations that compile _operation.py into a C extension (see setup.py); the
# .py stays the pure-Python build and the one source of the logic.

from aiopurgatory._timer_entry cimport _TimerEntry

# The outcomes as C variables: read on every operation, never looked up by name.
cdef object COMPLETED, EXPIRED, CANCELLED, FAILED
# An entry's state out of the timer (see _timer_entry.py).
cdef int IDLE
# An entry's _when until it is scheduled (see _timer_states.py).
cdef double NO_DEADLINE
cdef object Future, _set_result
cdef _wake(waiter)

cdef class DelayedOperation


cdef class _PurgatoryBase:
    cdef public object _logger
    cdef public object _name
    cdef public object _recorder

    cdef _detach(self, DelayedOperation op, outcome)
    cdef _record(self, DelayedOperation op)


cdef class DelayedOperation(_TimerEntry):
    cdef public tuple _keys
    cdef public object _outcome
    cdef public _PurgatoryBase _purgatory
    # A tuple until joined, then the first ThresholdEntry (see _operation.py).
    cdef public object _thresholds
    cdef public object _timeout
    cdef public object _waiters

    cpdef bint done(self) except -1
    cpdef bint cancelled(self) except -1
    cpdef result(self)
    cpdef exception(self)
    cpdef bint cancel(self) except -1
    cpdef bint force_complete(self) except -1
    cdef _add_waiter(self, waiter)
    cdef _result(self)
    cdef _finished(self, waiters)
    cdef _fire(self)
    cdef bint _finish(self, outcome, failure=*, bint raised=*) except -1
    cdef _timer_closed(self)
    cdef _try_complete_failed(self, exc, bint raised=*)
    cdef _try_complete_raised(self, exc)
    cdef _received(self)
    cdef _callback_failed(self, exc, callback, bint raised=*)
