# Declarations that compile _validation.py into a C extension (see setup.py); the
# .py stays the pure-Python build and the one source of the logic. The purgatory
# checks the keys of every watch here: a C call, not a Python one.

cimport cython



@cython.locals(i=Py_ssize_t, j=Py_ssize_t, h=Py_hash_t)
cdef bint _distinct_and_hashable(list keys, Py_ssize_t n) except -1
@cython.locals(n=Py_ssize_t)
cpdef tuple keys_of(keys)
@cython.locals(plain=bint, watched=list, thresholds=list)
cpdef tuple thresholds_of(keys)
