# Declarations that compile _timer.py into a C extension (see setup.py); the .py
# stays the pure-Python build and the one source of the logic.

cimport cython

cimport aiopurgatory.cthread as _thread

from aiopurgatory._ticks cimport ceil_tick, floor_tick
from aiopurgatory._timer_entry cimport _EntrySet, _TimerEntry
from aiopurgatory._timer_handle cimport TimerHandle
from aiopurgatory._wheel cimport TimingWheel

cdef object _copy_context
cdef Py_ssize_t _STAGE_LIMIT
# Named values of _timer_states.py, kept in C variables.
cdef int IDLE, STAGED, WAITING, DUE
cdef long long UNARMED


cdef class Timer(_EntrySet):
    cdef object __weakref__
    cdef public bint _closed
    cdef public list _due_now
    cdef public object _early_wake
    cdef public bint _flush_requested
    cdef public object _last_lag_log
    cdef public object _logger
    cdef public double _max_when
    cdef public unsigned long _running_in
    cdef public object _running_is
    cdef public bint _shared
    cdef public double _tick_width
    cdef public object _time
    cdef public TimingWheel _wheel

    cpdef bint _is_current(self) except -1
    @cython.locals(handle=TimerHandle)
    cdef TimerHandle _new_handle(self, when, callback, tuple args, context)
    cpdef _deadline(self, delay, name)
    @cython.locals(staged=list)
    cpdef _schedule(self, _TimerEntry entry, when)
    cpdef _request_flush(self)
    cpdef _arm(self, long long expiration, not_before=*)
    cdef _insert(self, _TimerEntry entry)
    @cython.locals(entry=_TimerEntry, due_now=list)
    cpdef _compact(self, double now)
    @cython.locals(wheel=TimingWheel, due=list, entry=_TimerEntry, woken=bint)
    cpdef _drive(self, long long armed)
    @cython.locals(entry=_TimerEntry, i=Py_ssize_t)
    cpdef _run(self, list due)
    @cython.locals(entry=_TimerEntry)
    cdef _tell_closed(self, list entries)
