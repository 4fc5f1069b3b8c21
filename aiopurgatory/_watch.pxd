# Declarations that compile _watch.py into a C extension (see setup.py); the .py
# stays the pure-Python build and the one source of the logic. What is here
# besides declarations is the C side of _Watch's coroutine protocol: its am_send
# and tp_iternext slots, which call _step (the .py's logic) and hand back the
# outcome without a StopIteration object or a traceback, and which _watch.py
# installs when compiled (_fast_slots), with the method-descriptor flag of
# _WatchFunction.

cimport cython
from cpython.object cimport PyObject, PyTypeObject

from aiopurgatory._operation cimport DelayedOperation
from aiopurgatory._purgatory_core cimport _outcome_of, _park

cdef object Future, _FINISHED, _MethodType


cdef class _Watch:
    cdef public object _op
    cdef public object _state


cdef class _WatchFunction:
    cdef dict __dict__


@cython.locals(new=_Watch)
cpdef _Watch _new_watch(purgatory, op, keys)
@cython.locals(op=DelayedOperation)
cdef object _step(_Watch w, value)
cdef object _forward(_Watch w, value, exc)


cdef extern from "Python.h":
    void Py_INCREF(object)
    void PyType_Modified(PyTypeObject*)
    ctypedef struct _AsyncMethods "PyAsyncMethods":
        void* am_send
    ctypedef struct _TypeSlots "PyTypeObject":
        _AsyncMethods* tp_as_async
        void* tp_iternext
        unsigned long tp_flags
    enum: Py_TPFLAGS_METHOD_DESCRIPTOR


cdef extern from *:
    """
    /* _Watch's tp_iternext (next(), and the interpreter's await from Python
       3.12 on): its am_send, with a returned value raised as StopIteration's
       (as CPython's own _PyGen_SetStopIterationValue does) and no traceback. */
    static int (*aiopurgatory_watch_send)(PyObject *, PyObject *, PyObject **) = NULL;

    static PyObject *aiopurgatory_watch_next(PyObject *self) {
        PyObject *result = NULL;
        int status = aiopurgatory_watch_send(self, Py_None, &result);
        if (status == 1) {
            return result;
        }
        if (status == 0) {
            if (PyTuple_Check(result) || PyExceptionInstance_Check(result)) {
                PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, result);
                Py_DECREF(result);
                if (stop == NULL) {
                    return NULL;
                }
                PyErr_SetObject(PyExc_StopIteration, stop);
                Py_DECREF(stop);
            } else {
                PyErr_SetObject(PyExc_StopIteration, result);
                Py_DECREF(result);
            }
        }
        return NULL;
    }
    """
    void* aiopurgatory_watch_send
    void* aiopurgatory_watch_next


# am_send (PySendResult: 0 returned, 1 yielded, -1 raised): what asyncio's task
# calls to step a coroutine, and the interpreter's await on Python 3.11.
cdef inline int _am_send(PyObject* self, PyObject* arg, PyObject** result) except -1:
    cdef _Watch w = <_Watch>self
    got = _step(w, <object>arg)
    Py_INCREF(got)
    result[0] = <PyObject*>got
    return 0 if w._state is _FINISHED else 1


cdef inline int _fast_slots() except -1:
    cdef _TypeSlots* slots = <_TypeSlots*>_Watch
    global aiopurgatory_watch_send
    aiopurgatory_watch_send = <void*>_am_send
    if slots.tp_as_async != NULL:  # Cython gives _Watch one for its __await__
        slots.tp_as_async.am_send = <void*>_am_send
    slots.tp_iternext = <void*>aiopurgatory_watch_next
    PyType_Modified(<PyTypeObject*>_Watch)
    # purgatory.watch(op, keys) calls _WatchFunction(purgatory, op, keys) at
    # once, as for a function (its __call__ takes the purgatory first), with no
    # bound method made and called on the way; purgatory.watch alone is still
    # bound by __get__.
    cdef _TypeSlots* function = <_TypeSlots*>_WatchFunction
    function.tp_flags |= Py_TPFLAGS_METHOD_DESCRIPTOR
    PyType_Modified(<PyTypeObject*>_WatchFunction)
    return 0
