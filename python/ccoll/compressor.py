"""Compressor: a codec description plus one gradient bucket's persistent state (error feedback, call counter)."""

import ctypes
import enum

from . import _group, _ints
from ._library import lib
from .errors import INVALID_ARGUMENT, SUCCESS, InvalidArgumentError, InvalidUsageError, check


class Param(enum.IntEnum):
    """ccCompressorParam_t. The lower-case name is the one spec strings and set_param/get_param take."""

    BITS = 100
    MODE = 110
    ROTATION = 120
    BLOCK = 121
    GROUP = 130
    SCALE = 131
    CLIP = 140
    ROUNDING = 150
    GATHER = 160
    DENSITY = 200
    CHUNK = 210
    EF = 220
    DTYPE = 230
    UNBIASED = 240
    RANK = 300
    ROWS = 310
    COLS = 311
    WARM = 320
    START = 330
    EPS = 340
    SEED = 900


QUANT_HOMOMORPHIC = 0  # ccQuantHomomorphic, a value of Param.MODE
QUANT_REQUANT = 1  # ccQuantRequant

# ccCompressorGetSpec's buffer: the first size tried, and the largest (a powersgd spec lists every tensor's shape).
_SPEC_BYTES = 4096
_SPEC_MAX_BYTES = 1 << 24


def _param(param):
    if isinstance(param, str):
        try:
            return Param[param.upper()]
        except KeyError:
            raise InvalidArgumentError("compressor parameter \"%s\" does not exist (%s)" % (
                param, ", ".join(p.name.lower() for p in Param))) from None
    return _ints.integer(param, "compressor parameter")


def _param_name(param):
    try:
        return Param(param).name.lower()
    except ValueError:
        return "parameter %d" % param


def param_bounds(param):
    """ccCompressorGetParamBounds: the inclusive (lo, hi) of a parameter (name, Param or int)."""
    lo, hi = ctypes.c_int64(), ctypes.c_int64()
    check(lib.ccCompressorGetParamBounds(_param(param), ctypes.byref(lo), ctypes.byref(hi)))
    return lo.value, hi.value


class Compressor:
    """ccCompressor_t from a spec string "kind[:name=value,...]", e.g. "quant:bits=4,mode=requant",
    "topk:density=0.1", "cast16". Use one per gradient bucket per rank, with the same spec on every rank: it binds
    to the bucket's element count at its first all_reduce. Not thread-safe."""

    def __init__(self, spec):
        spec = str(spec)
        if "\0" in spec:
            raise InvalidArgumentError("compressor spec %r holds a NUL character, where C would end it" % spec)
        handle = ctypes.c_void_p()
        check(lib.ccCompressorCreateFromString(ctypes.byref(handle), spec.encode()))
        self._handle = handle

    def _live(self):
        if self._handle is None:
            raise InvalidArgumentError("the compressor was destroyed")
        return self._handle

    @property
    def spec(self):
        """ccCompressorGetSpec: every parameter, in canonical form. The buffer grows (4 KiB, 16 KiB, ... up to 16 MiB)
        until the spec fits: the call does not say how much it needs."""
        size = _SPEC_BYTES
        while True:
            buf = ctypes.create_string_buffer(size)
            result = lib.ccCompressorGetSpec(self._live(), buf, size)
            if result == SUCCESS:
                return buf.value.decode()
            if result != INVALID_ARGUMENT or size >= _SPEC_MAX_BYTES:
                check(result)
            size *= 4

    def set_param(self, param, value):
        """ccCompressorSetParam(param, value): param by name ("bits"), Param or int; value is the C integer (e.g.
        clip and density in parts per million). Resets the state if the compressor was used already."""
        param = _param(param)
        check(lib.ccCompressorSetParam(self._live(), param, _ints.int64(value, "value of %s" % _param_name(param))))

    def set_shapes(self, shapes):
        """ccCompressorSetShapes (powersgd): the bucket's tensors in order, each a shape tuple (a matrix of
        shape[0] rows and prod(shape[1:]) columns; a 1-d shape or an int is a vector). [] clears the list."""
        if not hasattr(lib, "ccCompressorSetShapes"):
            raise InvalidUsageError("set_shapes: the loaded libccoll has no ccCompressorSetShapes")
        rows, cols = [], []
        for i, shape in enumerate(shapes):
            what = "set_shapes: shape %d" % i
            try:
                shape = tuple(shape)
            except TypeError:  # an int: a vector
                shape = (shape,)
            shape = tuple(_ints.int64(d, "%s, dimension %d" % (what, k)) for k, d in enumerate(shape))
            n = 1
            for d in shape[1:]:
                n *= d
            rows.append(shape[0] if shape else 1)
            cols.append(_ints.int64(n, "%s: the product of the dimensions after the first" % what))
        count = _ints.integer(len(rows), "set_shapes: the number of shapes")
        check(lib.ccCompressorSetShapes(self._live(), count, (ctypes.c_int64 * count)(*rows),
                                        (ctypes.c_int64 * count)(*cols)))

    def get_param(self, param):
        """ccCompressorGetParam: the parameter's current integer value."""
        value = ctypes.c_int64()
        check(lib.ccCompressorGetParam(self._live(), _param(param), ctypes.byref(value)))
        return value.value

    def destroy(self):
        """ccCompressorDestroy; idempotent from Python's side. Inside a ccoll.group() that recorded a call with it,
        the compressor is unusable at once and freed when the group ends (the call reads it then). The group must be
        this thread's: a group of another thread that holds it is not seen, so destroy it from the group's thread."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        if _group.holds(self):
            _group.after(lambda: check(lib.ccCompressorDestroy(handle)))
            return
        check(lib.ccCompressorDestroy(handle))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.destroy()
        return False

    def __del__(self):
        # Local state only (no peers involved), so freeing it from the garbage collector is safe.
        handle = getattr(self, "_handle", None)
        if handle is not None and lib is not None:
            lib.ccCompressorDestroy(handle)
            self._handle = None

    def __repr__(self):
        if self._handle is None:
            return "<ccoll.Compressor destroyed>"
        return "<ccoll.Compressor %s>" % self.spec
