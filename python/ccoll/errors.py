"""Exceptions: one class per ccResult_t, all subclasses of CcollError, carrying ccGetLastError's sentence."""

from ._library import lib

SUCCESS = 0
UNHANDLED_CUDA_ERROR = 1
SYSTEM_ERROR = 2
INTERNAL_ERROR = 3
INVALID_ARGUMENT = 4
INVALID_USAGE = 5
REMOTE_ERROR = 6
IN_PROGRESS = 7
TIMEOUT = 8


class CcollError(RuntimeError):
    """A ccoll call failed. str(e) is the library's sentence; e.result is the ccResult_t value."""

    result = None

    def __init__(self, message, result=None):
        super().__init__(message)
        if result is not None:
            self.result = result

    @property
    def result_string(self):
        """ccGetErrorString(result): the short, static name of the result code."""
        return lib.ccGetErrorString(self.result if self.result is not None else -1).decode()


class CudaError(CcollError):
    result = UNHANDLED_CUDA_ERROR


class CcollSystemError(CcollError):
    result = SYSTEM_ERROR


class InternalError(CcollError):
    result = INTERNAL_ERROR


class InvalidArgumentError(CcollError, ValueError):
    result = INVALID_ARGUMENT


class InvalidUsageError(CcollError):
    result = INVALID_USAGE


class RemoteError(CcollError):
    result = REMOTE_ERROR


class InProgressError(CcollError):
    result = IN_PROGRESS


class CcollTimeoutError(CcollError, TimeoutError):
    result = TIMEOUT


_BY_RESULT = {cls.result: cls for cls in (CudaError, CcollSystemError, InternalError, InvalidArgumentError,
                                          InvalidUsageError, RemoteError, InProgressError, CcollTimeoutError)}


def check(result, comm_handle=None):
    """Raises the exception for a non-success ccResult_t, with the sentence the library recorded for it.

    Call it right after the failing call, on the same thread: the sentence is per thread (ctypes runs the call on
    the calling thread).
    """
    if result == SUCCESS:
        return
    message = (lib.ccGetLastError(comm_handle) or b"").decode(errors="replace")
    if not message:
        message = lib.ccGetErrorString(result).decode()
    raise _BY_RESULT.get(result, CcollError)(message, result)
