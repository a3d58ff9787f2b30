"""ccoll.group(): ccGroupStart / ccGroupEnd as a context manager.

    with ccoll.group():
        comm.send(x, peer=(rank + 1) % size)
        comm.recv(y, peer=(rank - 1) % size)

Inside the block, this thread's sends, receives and collectives are only recorded; leaving it issues them and returns
when they are done (host buffers) or queued (CUDA tensors). The buffers passed inside are kept alive until then. An
exception inside the block leaves it without issuing anything.
"""

import contextlib
import threading

from ._library import lib
from .errors import InvalidUsageError, check

_state = threading.local()


def _require():
    if not hasattr(lib, "ccGroupStart"):
        raise InvalidUsageError("group: the loaded libccoll has no ccGroupStart (an older library)")


def keep(obj):
    """Holds obj until the outermost open group of this thread ends (the library reads it only then)."""
    held = getattr(_state, "held", None)
    if held is not None:
        held.append(obj)


def depth():
    return getattr(_state, "depth", 0)


@contextlib.contextmanager
def group():
    _require()
    check(lib.ccGroupStart())
    outer = depth() == 0
    if outer:
        _state.held = []
    _state.depth = depth() + 1
    try:
        yield
    except BaseException:
        # A refused call (a NULL communicator) marks the group failed: its end issues nothing.
        lib.ccSend(None, 1, -1, 0, None, None)
        _end(outer, raise_error=False)
        raise
    _end(outer, raise_error=True)


def _end(outer, raise_error):
    _state.depth = depth() - 1
    try:
        rc = lib.ccGroupEnd()
    finally:
        if outer:
            _state.held = None
    if raise_error:
        check(rc)
