# Declarations that compile _wheel.py into a C extension (see setup.py); the .py
# stays the pure-Python build and the one source of the logic.

cdef class Entry:
    cdef public object _bucket
    cdef public object _key
    cdef public object _tick


cdef class Bucket:
    cdef public dict entries
    cdef public object first


cdef class _Level:
    cdef public list buckets
    cdef public object current
    cdef public object end
    cdef public object span
    cdef public object width


cimport cython


cdef class TimingWheel:
    cdef public list _levels
    cdef public list _queue
    cdef public object _seq
    cdef public object current
    cdef public object wheel_size

    @cython.locals(level=_Level, bucket=Bucket, entries=dict)
    cpdef bint add(self, Entry entry) except -1
    cpdef _Level _grow(self, e)
    @cython.locals(queue=list, bucket=Bucket)
    cpdef next_expiration(self)
    @cython.locals(queue=list, bucket=Bucket, entries=dict, entry=Entry, due=list)
    cpdef list advance(self, now)
    @cython.locals(level=_Level)
    cpdef _set_clock(self, tick)
