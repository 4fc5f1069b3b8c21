# Declarations that compile _ticks.py into a C extension (see setup.py); the .py
# stays the pure-Python build and the one source of the logic. C functions: the
# timer converts a deadline per entry that reaches the wheel, and the clock per wake-up.

cimport cython


@cython.locals(q=double, n=cython.longlong)
cpdef long long floor_tick(double now, double tick, double limit) noexcept
@cython.locals(q=double, e=cython.longlong)
cpdef long long ceil_tick(double when, double tick, double limit) noexcept
