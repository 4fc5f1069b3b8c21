# Declarations that compile _duration_counts.py into a C extension (see setup.py); the
# .py stays the pure-Python build and the one source of the logic.

cimport cython

cdef extern from *:
    """
    #ifndef AIOPURGATORY_HISTOGRAMS
    #define AIOPURGATORY_HISTOGRAMS 1
    #endif
    """
    # A C constant: with AIOPURGATORY_HISTOGRAMS=0 the C compiler drops the
    # recording code (setup.py, AIOPURGATORY_NO_HISTOGRAMS=1).
    const bint HISTOGRAMS "AIOPURGATORY_HISTOGRAMS"

cdef long long _FIRST
cdef long long _LAST
cdef long long _E10, _E11, _E12, _E13
cdef Py_ssize_t _PER_DECADE
cdef Py_ssize_t _DECADES
cdef Py_ssize_t _OVERFLOW


@cython.locals(u=cython.longlong, p=cython.longlong, q=cython.longlong, d=Py_ssize_t, j=Py_ssize_t)
cpdef Py_ssize_t bucket_index(long long ns) except -1


@cython.final
cdef class _DurationCounts:
    cdef object _array
    cdef long long[::1] _counts
    cdef public double _max
    cdef public double _sum

    @cython.locals(i=Py_ssize_t)
    cpdef void add(self, double seconds)
    cpdef counts(self)
    cpdef reset(self)
