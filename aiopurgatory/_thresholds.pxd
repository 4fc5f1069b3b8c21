# Declarations that compile _thresholds.py into a C extension (see setup.py); the
# .py stays the pure-Python build and the one source of the logic.

cimport cython

cdef object heappop, heappush, heapify, insort


@cython.final
cdef class ThresholdEntry:
    cdef public ThresholdEntry next
    cdef public Py_ssize_t number
    cdef public object op
    cdef public object threshold


@cython.locals(entry=ThresholdEntry)
cdef list _unfinished(list entries)


cdef class ThresholdIndex:
    cdef public Py_ssize_t count
    cdef public Py_ssize_t head
    cdef public list heap
    cdef public Py_ssize_t live
    cdef public object mark
    cdef public list reached
    cdef public list run

    @cython.locals(entry=ThresholdEntry, mark=object, run=list)
    cpdef ThresholdEntry add(self, op, threshold, Py_ssize_t number)
    cpdef list pending(self)
    @cython.locals(reached=list, checked=list, kept=list, run=list, heap=list,
                   head=Py_ssize_t, end=Py_ssize_t, entry=ThresholdEntry)
    cpdef list reach(self, value)
    @cython.locals(heap=list, run=list, reached=list, waiting=Py_ssize_t,
                   live=Py_ssize_t, count=Py_ssize_t)
    cpdef remove(self, threshold)
