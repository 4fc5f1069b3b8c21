# Declarations only: no module of this name exists. _timer.pxd cimports this file
# under the name of the standard library's ``_thread`` module, which _timer.py
# imports: in the compiled core ``_thread.get_ident()`` is then this C function
# (no Python call, no int object; once per watched operation on loops that do
# not track their thread), in the pure-Python core the standard library's.
# Cython resolves an attribute of a name that is both cimported and imported
# through the cimport first (as ``cimport numpy as np`` with ``import numpy as np``).

from cpython.pythread cimport PyThread_get_thread_ident


cdef inline unsigned long get_ident() noexcept:
    return PyThread_get_thread_ident()
