"""Loads libccoll.so and declares the C API's types and prototypes (include/ccoll.h) for ctypes.

Search order: $CCOLL_LIBRARY (a path to the .so), then the library directory recorded by `cmake --install` next to
this package (_install.py), then the dynamic loader's search path (libccoll.so.0, then libccoll.so).
"""

import ctypes
import ctypes.util
import os

# Mirrors of the header's constants; they never change within an ABI version (SOVERSION 0).
CC_UNIQUE_ID_BYTES = 128
DATATYPE_REFUSED = -1  # CC_DATATYPE_REFUSED: a call its caller refuses (ccoll.h)
CC_CONFIG_MAGIC = 0xCC0C0F16
CC_CONFIG_UNDEF_INT = -2147483647 - 1
# The ccConfig_t layout below is the one of header version 0.1.0; the library copies min(size, its sizeof) bytes.
CC_HEADER_VERSION_CODE = 100


class UniqueId(ctypes.Structure):
    """ccUniqueId: 128 opaque bytes, passed by value."""

    _fields_ = [("internal", ctypes.c_char * CC_UNIQUE_ID_BYTES)]


class Config(ctypes.Structure):
    """ccConfig_t. Build it with new_config(), never field by field from zero: unset fields must be UNDEF."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("transport", ctypes.c_int),
        ("algorithm", ctypes.c_int),
        ("timeoutMs", ctypes.c_int),
        ("blocking", ctypes.c_int),
        ("cudaDev", ctypes.c_int),
    ]


def new_config():
    """The equivalent of CC_CONFIG_INITIALIZER."""
    return Config(ctypes.sizeof(Config), CC_CONFIG_MAGIC, CC_HEADER_VERSION_CODE, *([CC_CONFIG_UNDEF_INT] * 5))


class CommStats(ctypes.Structure):
    """ccCommStats_t."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("bytesSent", ctypes.c_uint64),
        ("bytesReceived", ctypes.c_uint64),
        ("collectives", ctypes.c_uint64),
        ("callCheckBytesSent", ctypes.c_uint64),
        ("nominalBytesSent", ctypes.c_uint64),
    ]


_Result = ctypes.c_int
_Handle = ctypes.c_void_p

# name: (restype, argtypes). Enums are int; handles and buffers are void*.
_PROTOTYPES = {
    "ccGetVersion": (_Result, [ctypes.POINTER(ctypes.c_int)]),
    "ccGetErrorString": (ctypes.c_char_p, [ctypes.c_int]),
    "ccGetLastError": (ctypes.c_char_p, [_Handle]),
    "ccGetUniqueId": (_Result, [ctypes.POINTER(UniqueId)]),
    "ccCommInitRank": (_Result, [ctypes.POINTER(_Handle), ctypes.c_int, UniqueId, ctypes.c_int]),
    "ccCommInitRankConfig": (_Result, [ctypes.POINTER(_Handle), ctypes.c_int, UniqueId, ctypes.c_int,
                                       ctypes.POINTER(Config)]),
    "ccCommInitFromEnv": (_Result, [ctypes.POINTER(_Handle), ctypes.POINTER(Config)]),
    "ccCommDestroy": (_Result, [_Handle]),
    "ccCommAbort": (_Result, [_Handle]),
    "ccCommCount": (_Result, [_Handle, ctypes.POINTER(ctypes.c_int)]),
    "ccCommUserRank": (_Result, [_Handle, ctypes.POINTER(ctypes.c_int)]),
    "ccCommCuDevice": (_Result, [_Handle, ctypes.POINTER(ctypes.c_int)]),
    "ccCommGetAsyncError": (_Result, [_Handle, ctypes.POINTER(ctypes.c_int)]),
    "ccCommGetStats": (_Result, [_Handle, ctypes.POINTER(CommStats)]),
    "ccAllReduce": (_Result, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _Handle,
                              _Handle, ctypes.c_void_p]),
    "ccReduceScatter": (_Result, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  _Handle, ctypes.c_void_p]),
    "ccAllGather": (_Result, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, _Handle,
                              ctypes.c_void_p]),
    "ccBroadcast": (_Result, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _Handle,
                              ctypes.c_void_p]),
    "ccCompressorCreate": (_Result, [ctypes.POINTER(_Handle), ctypes.c_int]),
    "ccCompressorCreateFromString": (_Result, [ctypes.POINTER(_Handle), ctypes.c_char_p]),
    "ccCompressorSetParam": (_Result, [_Handle, ctypes.c_int, ctypes.c_int64]),
    "ccCompressorGetParam": (_Result, [_Handle, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]),
    "ccCompressorGetParamBounds": (_Result, [ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                             ctypes.POINTER(ctypes.c_int64)]),
    "ccCompressorGetSpec": (_Result, [_Handle, ctypes.c_char_p, ctypes.c_size_t]),
    "ccCompressorDestroy": (_Result, [_Handle]),
}
# Newer symbols: bound when the loaded library has them; the binding checks with hasattr(lib, name).
_OPTIONAL_PROTOTYPES = {
    "ccReduce": (_Result, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           _Handle, ctypes.c_void_p]),
    "ccCommSplit": (_Result, [_Handle, ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Handle), ctypes.POINTER(Config)]),
    "ccCompressorSetShapes": (_Result, [_Handle, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                        ctypes.POINTER(ctypes.c_int64)]),
    "ccSend": (_Result, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _Handle, ctypes.c_void_p]),
    "ccRecv": (_Result, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _Handle, ctypes.c_void_p]),
    "ccGroupStart": (_Result, []),
    "ccGroupEnd": (_Result, []),
}


def _candidates():
    env = os.environ.get("CCOLL_LIBRARY")
    if env:
        # An explicit choice: no fallback, so a wrong path is an error instead of a silent other library.
        return [env], True
    paths = []
    try:
        from . import _install  # written by `cmake --install`; absent in the source tree
    except ImportError:
        _install = None
    if _install is not None:
        libdir = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), _install.LIBDIR))
        paths += [os.path.join(libdir, "libccoll.so.0"), os.path.join(libdir, "libccoll.so")]
    paths.append("libccoll.so.0")
    found = ctypes.util.find_library("ccoll")
    if found:
        paths.append(found)
    paths.append("libccoll.so")
    return paths, False


def _load():
    paths, explicit = _candidates()
    errors = []
    for path in paths:
        if os.sep in path and not os.path.exists(path) and not explicit:
            continue
        try:
            lib = ctypes.CDLL(path)  # CDLL, not PyDLL: every call releases the GIL
        except OSError as e:
            errors.append("%s: %s" % (path, e))
            continue
        for name, (restype, argtypes) in list(_PROTOTYPES.items()) + list(_OPTIONAL_PROTOTYPES.items()):
            try:
                fn = getattr(lib, name)
            except AttributeError:
                if name in _OPTIONAL_PROTOTYPES:
                    continue
                raise ImportError("ccoll: %s lacks %s: it is not a libccoll this binding knows" % (path, name))
            fn.restype = restype
            fn.argtypes = argtypes
        return lib, path
    raise ImportError("ccoll: cannot load libccoll.so (set CCOLL_LIBRARY to its path); tried:\n  " +
                      "\n  ".join(errors or paths))


lib, path = _load()

# Whether this libccoll has the CUDA backend: such a build links the CUDA runtime, whose symbols a lookup through the
# library's handle finds among its dependencies. Without it a CUDA tensor would be read as host memory.
has_cuda = hasattr(lib, "cudaPointerGetAttributes")
