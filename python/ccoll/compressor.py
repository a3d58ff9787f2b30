"""Compressor: a codec description plus one gradient bucket's persistent state (error feedback, call counter)."""

import ctypes
import enum

from ._library import lib
from .errors import InvalidArgumentError, InvalidUsageError, check


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


def _param(param):
    if isinstance(param, str):
        try:
            return Param[param.upper()]
        except KeyError:
            raise InvalidArgumentError("compressor parameter \"%s\" does not exist (%s)" % (
                param, ", ".join(p.name.lower() for p in Param))) from None
    return int(param)


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
        handle = ctypes.c_void_p()
        check(lib.ccCompressorCreateFromString(ctypes.byref(handle), str(spec).encode()))
        self._handle = handle

    def _live(self):
        if self._handle is None:
            raise InvalidArgumentError("the compressor was destroyed")
        return self._handle

    @property
    def spec(self):
        """ccCompressorGetSpec: every parameter, in canonical form."""
        buf = ctypes.create_string_buffer(4096)  # a full spec is a few hundred bytes
        check(lib.ccCompressorGetSpec(self._live(), buf, len(buf)))
        return buf.value.decode()

    def set_param(self, param, value):
        """ccCompressorSetParam(param, value): param by name ("bits"), Param or int; value is the C integer (e.g.
        clip and density in parts per million). Resets the state if the compressor was used already."""
        check(lib.ccCompressorSetParam(self._live(), _param(param), int(value)))

    def set_shapes(self, shapes):
        """ccCompressorSetShapes (powersgd): the bucket's tensors in order, each a shape tuple (a matrix of
        shape[0] rows and prod(shape[1:]) columns; a 1-d shape or an int is a vector). [] clears the list."""
        if not hasattr(lib, "ccCompressorSetShapes"):
            raise InvalidUsageError("set_shapes: the loaded libccoll has no ccCompressorSetShapes")
        rows, cols = [], []
        for shape in shapes:
            shape = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
            n = 1
            for d in shape[1:]:
                n *= d
            rows.append(shape[0] if shape else 1)
            cols.append(n)
        count = len(rows)
        check(lib.ccCompressorSetShapes(self._live(), count, (ctypes.c_int64 * count)(*rows),
                                        (ctypes.c_int64 * count)(*cols)))

    def get_param(self, param):
        """ccCompressorGetParam: the parameter's current integer value."""
        value = ctypes.c_int64()
        check(lib.ccCompressorGetParam(self._live(), _param(param), ctypes.byref(value)))
        return value.value

    def destroy(self):
        """ccCompressorDestroy; idempotent from Python's side."""
        handle, self._handle = self._handle, None
        if handle is not None:
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
