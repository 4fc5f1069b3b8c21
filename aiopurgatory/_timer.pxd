# Declarations that compile _timer.py into a C extension (see setup.py); the .py
# stays the pure-Python build and the one source of the logic.

cimport cython

from aiopurgatory._ticks cimport ceil_tick, floor_tick
from aiopurgatory._wheel cimport Entry, TimingWheel

cdef object _copy_context
cdef extern from "pythread.h":
    # threading.get_ident() in the pure-Python build (see _timer.py).
    unsigned long get_ident "PyThread_get_thread_ident" ()
cdef object _STAGED
cdef Py_ssize_t _STAGE_LIMIT


cdef class _TimerEntry(Entry):
    cdef public object _when

    cdef _fire(self)
    cdef _timer_closed(self)


cdef class TimerHandle(_TimerEntry):
    cdef public tuple _args
    cdef public object _callback
    cdef public bint _cancelled
    cdef public object _context
    cdef public Timer _timer

    cdef _fire(self)
    cdef _timer_closed(self)


cdef class Timer:
    cdef object __weakref__
    cdef public object _armed
    cdef public bint _closed
    cdef public Py_ssize_t _count
    cdef public object _driver
    cdef public list _due_now
    cdef public object _early_wake
    cdef public bint _flush_requested
    cdef public object _last_lag_log
    cdef public object _last_tick
    cdef public long long _last_tick_value
    cdef public object _logger
    cdef public double _max_when
    cdef public unsigned long _running_in
    cdef public object _running_is
    cdef public bint _shared
    cdef public list _staged
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
    cpdef _unschedule(self, _TimerEntry entry)
    cpdef _arm(self, expiration, not_before=*)
    cpdef _disarm(self)
    @cython.locals(tick=cython.longlong)
    cpdef bint _insert(self, _TimerEntry entry) except -1
    @cython.locals(entry=_TimerEntry, due_now=list, when=double)
    cpdef _compact(self, double now)
    @cython.locals(wheel=TimingWheel, due=list)
    cpdef _drive(self, armed)
    @cython.locals(entry=_TimerEntry, i=Py_ssize_t)
    cpdef _run(self, list due)
    @cython.locals(entry=_TimerEntry)
    cdef _tell_closed(self, list entries)
