"""Turns a numpy array or a torch tensor into what a ccoll collective takes: pointer, element count, ccDataType_t.

No copies: the collective reads and writes the caller's memory, so buffers must be C-contiguous (and writable
where they receive). torch is never imported here; a tensor can only exist if the caller imported torch.

A tensor must be dense (strided) and on the CPU or a CUDA device. An input that is a lazily negated or conjugated
view (is_neg(), is_conj()) is resolved into a new tensor first; an output cannot be one (the library would write its
storage, which holds the negated values). Before the library writes into a tensor, an in-place torch op on an empty
view of it tells autograd, as torch's own in-place ops do: with grad mode on, a leaf that requires grad raises
torch's error, and the version counter moves on, so a backward pass that saved the tensor raises instead of using
the overwritten values.
"""

import sys

import numpy as np

from . import _group
from .errors import InvalidArgumentError

INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9

_NUMPY_DTYPES = {
    np.dtype(np.int8): INT8,
    np.dtype(np.uint8): UINT8,
    np.dtype(np.int32): INT32,
    np.dtype(np.uint32): UINT32,
    np.dtype(np.int64): INT64,
    np.dtype(np.uint64): UINT64,
    np.dtype(np.float16): FLOAT16,
    np.dtype(np.float32): FLOAT32,
    np.dtype(np.float64): FLOAT64,
}

ITEMSIZE = {INT8: 1, UINT8: 1, INT32: 4, UINT32: 4, INT64: 8, UINT64: 8, FLOAT16: 2, FLOAT32: 4, FLOAT64: 8, BFLOAT16: 2}

DTYPE_NAMES = {INT8: "int8", UINT8: "uint8", INT32: "int32", UINT32: "uint32", INT64: "int64", UINT64: "uint64",
               FLOAT16: "float16", FLOAT32: "float32", FLOAT64: "float64", BFLOAT16: "bfloat16"}


class Buffer:
    """A view of the caller's memory: ptr (int), count (elements), dtype (ccDataType_t), the object itself."""

    __slots__ = ("obj", "ptr", "count", "dtype", "is_torch", "stream")

    def __init__(self, obj, ptr, count, dtype, is_torch, stream):
        self.obj, self.ptr, self.count, self.dtype, self.is_torch, self.stream = obj, ptr, count, dtype, is_torch, stream


def _torch_dtypes(torch):
    types = {torch.int8: INT8, torch.uint8: UINT8, torch.int32: INT32, torch.int64: INT64, torch.float16: FLOAT16,
             torch.float32: FLOAT32, torch.float64: FLOAT64, torch.bfloat16: BFLOAT16}
    for name, dtype in (("uint32", UINT32), ("uint64", UINT64)):  # torch 2.3 and later
        if hasattr(torch, name):
            types[getattr(torch, name)] = dtype
    return types


def _torch_module():
    return sys.modules.get("torch")


def is_tensor(obj):
    torch = _torch_module()
    return torch is not None and isinstance(obj, torch.Tensor)


def _lazy_views(obj):
    """The names of the lazy views (neg, conj) obj is, where this torch has them."""
    return [name for name in ("neg", "conj") if getattr(obj, "is_" + name, lambda: False)()]


def _written_by_library(obj):
    """Tells autograd that obj is about to be overwritten: an in-place op on an empty view (nothing is computed)
    raises torch's error for a leaf that requires grad (with grad mode on) and bumps obj's version counter.
    Inference tensors have no version counter and are skipped."""
    if getattr(obj, "is_inference", lambda: False)():
        return
    obj.view(-1)[:0].zero_()


def _check_storage(obj, what):
    """Refuses a tensor without memory of its own for ccoll to read and write, before anything dispatches on it: a
    wrapper subclass such as DTensor (its data are the local shard tensors) or a tensor being traced (FakeTensor).
    Current torch raises from data_ptr() there; torch 1.13 returns 0."""
    try:
        address = obj.data_ptr()
    except RuntimeError:
        address = 0
    if address == 0 and obj.numel() > 0:
        raise InvalidArgumentError("%s: a %s without memory of its own that ccoll can address (a wrapper subclass "
                                   "such as DTensor, or a fake tensor being traced); pass the plain tensor that holds "
                                   "the data (DTensor: x.to_local())" % (what, type(obj).__name__))


def view(obj, what, writable):
    """Describes obj (numpy.ndarray or torch.Tensor) for a collective; `what` names it in error messages.
    writable: the library writes into obj. Inside ccoll.group() the buffer is held until the group ends."""
    buf = _view(obj, what, writable)
    _group.keep(buf.obj)
    return buf


def _view(obj, what, writable):
    if isinstance(obj, np.ndarray):
        dtype = _NUMPY_DTYPES.get(obj.dtype)
        if dtype is None:
            raise InvalidArgumentError("%s: numpy dtype %s is not supported by ccoll (int8, uint8, int32, uint32, int64, "
                                       "uint64, float16, float32, float64)" % (what, obj.dtype))
        if not obj.flags.c_contiguous:
            raise InvalidArgumentError("%s: the array is not C-contiguous (ccoll reads and writes it in place; pass "
                                       "numpy.ascontiguousarray(x))" % what)
        if writable and not obj.flags.writeable:
            raise InvalidArgumentError("%s: the array is read-only but receives the result" % what)
        return Buffer(obj, obj.ctypes.data, obj.size, dtype, False, None)
    torch = _torch_module()
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            raise InvalidArgumentError("%s: a tensor of layout %s; ccoll takes dense (strided) tensors (pass "
                                       "x.to_dense())" % (what, obj.layout))
        if obj.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError("%s: a tensor on device %s; ccoll takes CPU and CUDA tensors only" % (
                what, obj.device))
        dtype = _torch_dtypes(torch).get(obj.dtype)
        if dtype is None:
            raise InvalidArgumentError("%s: torch dtype %s is not supported by ccoll (int8, uint8, int32, int64, "
                                       "float16, bfloat16, float32, float64; uint32 and uint64 where torch has them)"
                                       % (what, obj.dtype))
        _check_storage(obj, what)
        lazy = _lazy_views(obj)
        if lazy and writable:
            raise InvalidArgumentError("%s: a lazy %s view (x.is_%s()) cannot receive the result: ccoll would write "
                                       "its storage, which holds the values before the %s; pass x.resolve_%s()" % (
                                           what, lazy[0], lazy[0], lazy[0], lazy[0]))
        if "neg" in lazy:
            obj = obj.resolve_neg()
        if "conj" in lazy:
            obj = obj.resolve_conj()
        if not obj.is_contiguous():
            raise InvalidArgumentError("%s: the tensor is not contiguous (ccoll reads and writes it in place; pass "
                                       "x.contiguous())" % what)
        stream = None
        if obj.device.type == "cuda":
            from . import _library
            if not _library.has_cuda:
                raise InvalidArgumentError("%s: a CUDA tensor, but %s was built without CUDA (CCOLL_ENABLE_CUDA=OFF)"
                                           % (what, _library.path))
            # Stream-ordered like NCCL: the collective runs after the work already queued on the current stream.
            stream = torch.cuda.current_stream(obj.device).cuda_stream
        if writable:
            _written_by_library(obj)
        return Buffer(obj, obj.data_ptr(), obj.numel(), dtype, True, stream)
    raise InvalidArgumentError("%s: expected a numpy.ndarray or a torch.Tensor, got %s" % (what, type(obj).__name__))


def empty_like(buf, shape):
    """A new, uninitialized buffer of buf's kind, dtype and device with the given shape."""
    if buf.is_torch:
        return _torch_module().empty(shape, dtype=buf.obj.dtype, device=buf.obj.device)
    return np.empty(shape, dtype=buf.obj.dtype)
