"""ccoll: Python binding (ctypes, no compile step) of the ccoll collective library, libccoll.so.

    import ccoll
    uid = ccoll.get_unique_id()                       # on one rank; hand the 128 bytes to the others
    with ccoll.Communicator(nranks, uid, rank) as comm, ccoll.Compressor("quant:bits=4") as comp:
        comm.all_reduce(grad, op="avg", compressor=comp)   # numpy array or torch tensor, in place
        with ccoll.group():                                # point-to-point, as ncclGroupStart/End
            comm.send(x, peer=(rank + 1) % nranks)
            comm.recv(y, peer=(rank - 1) % nranks)

All logic is in the C library; this package only maps types. Every failure raises a ccoll.CcollError whose message
is the library's ccGetLastError sentence. The PyTorch DDP communication hook is ccoll.torch (imported on first use).
"""

import ctypes as _ctypes

from ._library import lib as _lib, path as library_path
from .communicator import ALGORITHMS, OPS, SPLIT_NOCOLOR, TRANSPORTS, Communicator, get_unique_id
from ._group import group
from .compressor import QUANT_HOMOMORPHIC, QUANT_REQUANT, Compressor, Param, param_bounds
from . import errors
from .errors import (CcollError, CcollSystemError, CcollTimeoutError, CudaError, InProgressError, InternalError,
                     InvalidArgumentError, InvalidUsageError, RemoteError)

__all__ = [
    "ALGORITHMS", "OPS", "SPLIT_NOCOLOR", "TRANSPORTS", "Communicator", "get_unique_id", "Compressor", "Param",
    "param_bounds", "QUANT_HOMOMORPHIC", "QUANT_REQUANT", "CcollError", "CcollSystemError", "CcollTimeoutError",
    "CudaError", "InProgressError", "InternalError", "InvalidArgumentError", "InvalidUsageError", "RemoteError",
    "version", "last_error", "library_path", "group",
]


def version():
    """ccGetVersion: the loaded library's version code, CC_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z."""
    v = _ctypes.c_int()
    errors.check(_lib.ccGetVersion(_ctypes.byref(v)))
    return v.value


def last_error():
    """ccGetLastError(NULL): the calling thread's last error sentence ("" if none)."""
    return (_lib.ccGetLastError(None) or b"").decode(errors="replace")


def __getattr__(name):
    # `import ccoll` must not import torch (seconds); ccoll.torch loads on first access.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'ccoll' has no attribute %r" % name)
