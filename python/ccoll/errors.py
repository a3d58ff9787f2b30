"""Exceptions: one class per ccResult_t, all subclasses of CcollError, carrying ccGetLastError's sentence."""

import threading

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


def comm_error_sentence(comm_handle):
    """The last sentence recorded for a communicator by any thread (a failure found on a thread of the library's,
    such as a device call's, or another thread's call), read on a fresh thread: ccGetLastError(comm) gives the calling
    thread's own last sentence first, which may be an older, unrelated failure."""
    box = []
    reader = threading.Thread(target=lambda: box.append(lib.ccGetLastError(comm_handle) or b""),
                              name="ccoll-error-reader")
    reader.start()
    reader.join()
    return box[0].decode(errors="replace") if box else ""


def check(result, comm_handle=None, message=None):
    """Raises the exception for a non-success ccResult_t, with the sentence the library recorded for it (or message,
    when given).

    Call it right after the failing call, on the same thread: the sentence is per thread (ctypes runs the call on
    the calling thread).
    """
    if result == SUCCESS:
        return
    if message is None:
        message = (lib.ccGetLastError(comm_handle) or b"").decode(errors="replace")
    if not message:
        message = lib.ccGetErrorString(result).decode()
    raise _BY_RESULT.get(result, CcollError)(message, result)
