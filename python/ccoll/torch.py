"""PyTorch DistributedDataParallel communication hook that all-reduces gradient buckets through ccoll.

    comm = ccoll.Communicator.from_store(store, rank, world_size)     # the store of torch.distributed
    state = ccoll.torch.CcollHookState(comm, spec="quant:bits=4,mode=requant")
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(state, ccoll.torch.allreduce_hook)

The hook averages each bucket over the ranks (op avg) in place and returns a completed future. float32 buckets go
through the bucket's own compressor (it keeps that bucket's error feedback); other dtypes, and every bucket when
spec is None, take the exact all-reduce. With spec "powersgd:..." each bucket's compressor is told the shapes of the
bucket's gradients (a matrix per weight; vectors go exactly), unless the spec gives shapes, rows or cols itself.
Works with torch 1.13 and current torch (GradBucket.buffer(); the older name get_tensor() is accepted too).
"""

import torch

from .compressor import Compressor


def _bucket_tensor(bucket):
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


class CcollHookState:
    """The hook's state: the communicator and one compressor per bucket index, created at the bucket's first use.

    DDP rebuilds its buckets once, after the first iteration; a bucket index whose element count changes gets a new
    compressor (its error feedback starts again). Every rank sees the same rebuild, so the ranks stay in step.
    """

    def __init__(self, comm, spec="quant:bits=4,mode=requant"):
        self.comm = comm
        self.spec = spec
        self._compressors = {}  # bucket index -> ((element count, shapes), Compressor)
        # PowerSGD needs the bucket's matrix shapes; unless the spec gives a shape, they come from the bucket.
        self.wants_shapes = False
        if spec is not None:
            Compressor(spec).destroy()  # a bad spec fails here, on every rank, not in the middle of backward
            kind, _, params = spec.partition(":")
            names = {item.split("=")[0].strip() for item in params.split(",")}
            self.wants_shapes = kind.strip() == "powersgd" and not names & {"shapes", "rows", "cols"}

    def compressor(self, index, numel, shapes=None):
        """The compressor of bucket `index` holding `numel` elements (None when spec is None). shapes: the shapes of
        the bucket's gradients in order, for PowerSGD (see wants_shapes)."""
        if self.spec is None:
            return None
        layout = (numel, tuple(shapes) if self.wants_shapes and shapes is not None else None)
        entry = self._compressors.get(index)
        if entry is not None and entry[0] == layout:
            return entry[1]
        if entry is not None:
            entry[1].destroy()
        comp = Compressor(self.spec)
        if layout[1] is not None:
            comp.set_shapes(layout[1])
        self._compressors[index] = (layout, comp)
        return comp

    def close(self):
        """Frees the compressors (not the communicator, which the caller owns)."""
        for _, comp in self._compressors.values():
            comp.destroy()
        self._compressors.clear()


def allreduce_hook(state, bucket):
    """DDP comm hook: bucket average over the ranks through ccoll; returns a completed Future of the bucket tensor."""
    tensor = _bucket_tensor(bucket)
    comp = None
    if tensor.dtype == torch.float32:
        shapes = [tuple(g.shape) for g in bucket.gradients()] if state.wants_shapes else None
        comp = state.compressor(bucket.index(), tensor.numel(), shapes)
    state.comm.all_reduce(tensor, op="avg", compressor=comp)
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut
