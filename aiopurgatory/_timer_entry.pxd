# Declarations that compile _timer_entry.py into a C extension (see setup.py); the
# .py stays the pure-Python build and the one source of the logic.

from aiopurgatory._wheel cimport Entry

# Named values of _timer_states.py, kept in C variables.
cdef int IDLE, STAGED, WAITING
cdef long long UNARMED


cdef class _TimerEntry(Entry):
    cdef public int _state
    # A C double: no float object per scheduled entry (NO_DEADLINE until scheduled).
    cdef public double _when

    cdef _fire(self)
    cdef _timer_closed(self)


cdef class _EntrySet:
    cdef public long long _armed
    cdef public Py_ssize_t _count
    cdef public object _driver
    cdef public list _staged

    cpdef _unschedule(self, _TimerEntry entry)
    cpdef _disarm(self)
