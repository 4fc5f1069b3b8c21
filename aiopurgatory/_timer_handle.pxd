# Declarations that compile _timer_handle.py into a C extension (see setup.py); the
# .py stays the pure-Python build and the one source of the logic.

from aiopurgatory._timer_entry cimport _EntrySet, _TimerEntry

# Named values of _timer_states.py, kept in C variables.
cdef int IDLE
cdef object STATE_NAMES


cdef class TimerHandle(_TimerEntry):
    cdef public tuple _args
    cdef public object _callback
    cdef public bint _cancelled
    cdef public object _context
    cdef public _EntrySet _timer

    cdef _fire(self)
    cdef _timer_closed(self)
