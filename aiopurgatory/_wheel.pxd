# Declarations that compile _wheel.py into a C extension (see setup.py); the .py
# stays the pure-Python build and the one source of the logic.

cdef class Entry:
    cdef public object _bucket
    cdef public object _id_key
    cdef public long long _tick


cimport cython

# Ticks are C long longs here (see _TICK_MAX in _wheel.py).
cdef long long _TICK_MAX
cdef long long _NOT_QUEUED


cdef class Bucket:
    cdef public dict entries
    cdef public long long first


cdef class _Level:
    cdef public list buckets
    cdef public long long current
    cdef public long long end
    cdef public long long span
    cdef public long long width


cdef long long _end(long long current, long long span)


cdef class TimingWheel:
    cdef public list _levels
    cdef public list _queue
    cdef public Py_ssize_t _pushes
    cdef public long long current
    cdef public long long wheel_size

    cpdef restart(self, long long start)
    @cython.locals(e=cython.longlong, level=_Level, bucket=Bucket, entries=dict, seq=Py_ssize_t)
    cpdef bint add(self, Entry entry) except -1
    @cython.locals(levels=list, level=_Level)
    cpdef _Level _grow(self, long long e)
    @cython.locals(queue=list, bucket=Bucket, key=cython.longlong)
    cpdef next_expiration(self)
    @cython.locals(queue=list, bucket=Bucket, entries=dict, entry=Entry, due=list,
                   key=cython.longlong)
    cpdef list advance(self, long long now)
    @cython.locals(level=_Level, current=cython.longlong)
    cpdef _set_clock(self, long long tick)
