"""ccoll.group(): ccGroupStart / ccGroupEnd as a context manager.

    with ccoll.group():
        comm.send(x, peer=(rank + 1) % size)
        comm.recv(y, peer=(rank - 1) % size)

Inside the block, this thread's sends, receives and collectives are only recorded; leaving it issues them and returns
when they are done (host buffers) or queued (CUDA tensors). The buffers and compressors passed inside are kept alive
until then (a compressor destroyed inside is freed when the group ends). An exception inside the block, or a send or
receive the binding refuses inside it, leaves it without issuing anything (as a send the library refuses does). A
collective the binding refuses is the exception: the group still ends with the refusing call it recorded (the
other calls of the group run), so that the peers' call check fails them at once, naming this rank, as outside a
group; then the binding's exception is raised.
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


def holds(obj):
    """Whether this thread's open group holds obj (a recorded call of the group will read it)."""
    return any(o is obj for o in getattr(_state, "held", None) or ())


def after(fn):
    """Runs fn when this thread's outermost open group ends (a free that must wait for the group's calls)."""
    _state.after.append(fn)


_REFUSAL = "_ccoll_refusal_recorded"


def mark_refusal_recorded(exc):
    """Marks exc as the binding's refusal of a collective for which a refusing call was recorded in the open group."""
    if depth() > 0:
        setattr(exc, _REFUSAL, True)


def depth():
    return getattr(_state, "depth", 0)


@contextlib.contextmanager
def group():
    _require()
    check(lib.ccGroupStart())
    outer = depth() == 0
    if outer:
        _state.held = []
        _state.after = []
    _state.depth = depth() + 1
    try:
        yield
    except BaseException as e:
        if not getattr(e, _REFUSAL, False):
            fail()
        _end(outer, raise_error=False)
        raise
    _end(outer, raise_error=True)


def fail():
    """Makes this thread's open group (if any) issue nothing at its end, as a send the library refused does: the
    binding refused one itself (or the block raised). The library is told with a send it refuses (NULL comm)."""
    if depth() > 0:
        lib.ccSend(None, 1, -1, 0, None, None)


def _end(outer, raise_error):
    _state.depth = depth() - 1
    late = None  # the first exception of the frees deferred to the group's end (each runs whatever the others did)
    try:
        rc = lib.ccGroupEnd()
    finally:
        if outer:
            _state.held = None
            pending, _state.after = _state.after, []
            for fn in pending:
                try:
                    fn()
                except BaseException as e:  # noqa: B902 -- raised below, after the group's own result
                    late = late or e
    if raise_error:
        check(rc)
        if late is not None:
            raise late
