# Declarations that compile _purgatory_core.py into a C extension (see setup.py); the
# .py stays the pure-Python build and the one source of the logic.

cimport cython

# HISTOGRAMS: whether finished operations are counted in the histograms, a C
# constant declared once there (0 only in a build that measures their cost).
from aiopurgatory._duration_counts cimport HISTOGRAMS, _DurationCounts
from aiopurgatory._operation cimport DelayedOperation, _PurgatoryBase
from aiopurgatory._thresholds cimport ThresholdEntry, ThresholdIndex
from aiopurgatory._validation cimport keys_of, thresholds_of
from aiopurgatory._timer cimport Timer

# Read per operation: C variables, never looked up by name.
cdef object COMPLETED, EXPIRED, CANCELLED
# An entry's state out of the timer (see _timer_entry.py).
cdef int IDLE
# An entry's _when until it is scheduled (see _timer_states.py).
cdef double NO_DEADLINE
cdef dict _modules


@cython.locals(op=DelayedOperation, completed=Py_ssize_t)
cdef Py_ssize_t _check_ops(list ops) except -1


cdef class _PurgatoryCore(_PurgatoryBase):
    cdef object __weakref__
    cdef public Py_ssize_t _advances
    cdef public Py_ssize_t _watch_number
    cdef public dict _threshold_watchers
    cdef public dict _watermarks
    cdef public Py_ssize_t _cancelled
    cdef public bint _closed
    cdef public Py_ssize_t _completed
    cdef public Py_ssize_t _expired
    cdef public Py_ssize_t _failed
    cdef public _DurationCounts _lateness
    cdef public object _owner
    cdef public object _max_pending
    cdef public Py_ssize_t _pending
    cdef public Timer _timer
    cdef public object _tracer
    cdef public _DurationCounts _wait_cancelled
    cdef public _DurationCounts _wait_completed
    cdef public _DurationCounts _wait_expired
    cdef public _DurationCounts _wait_failed
    cdef public Py_ssize_t _watched
    cdef public dict _watchers

    cdef bint _watch_any(self, op, keys) except -1
    @cython.locals(timer=Timer, watchers=dict, ops=dict)
    cdef bint _watch(self, DelayedOperation op, tuple keys, tuple thresholds) except -1
    @cython.locals(everything=dict, watch=ThresholdIndex, i=Py_ssize_t, entry=ThresholdEntry,
                   last=ThresholdEntry)
    cdef _watch_thresholds(self, DelayedOperation op, tuple keys, tuple thresholds)
    @cython.locals(ops=dict, watch=ThresholdIndex, checked=list)
    cpdef check_and_complete(self, key)
    @cython.locals(ops=dict, watch=ThresholdIndex, checked=list, watermarks=dict)
    cpdef advance(self, key, value)
    cdef _check_traced(self, list checked, key)
    @cython.locals(watchers=dict, ops=dict, keys=tuple, waits=_DurationCounts, now=double, due=double,
                   timeout=double, late=double, wait=double, when=double)
    cdef _detach(self, DelayedOperation op, outcome)
    @cython.locals(everything=dict, watch=ThresholdIndex, entry=ThresholdEntry)
    cdef _unwatch_thresholds(self, DelayedOperation op)
    @cython.locals(watermarks=dict)
    cdef _forget(self, key)
    cdef _record(self, DelayedOperation op)
    cdef dict _plain_watchers(self, key)


cdef class WatermarkOperation(DelayedOperation):
    cdef public bint _all_keys

    @cython.locals(keys=tuple, marks=dict, i=Py_ssize_t, purgatory=_PurgatoryCore,
                   entry=ThresholdEntry)
    cpdef bint try_complete(self) except -1

# For Purgatory.watch (a coroutine of a Python class, in _purgatory): C calls
# from there, no lookup by name (cpdef: the module imports them too).
@cython.locals(parked=DelayedOperation)
cpdef object _park(_PurgatoryCore core, op, keys)
cpdef object _outcome_of(DelayedOperation op)
cpdef object _expire_now(DelayedOperation op)
