"""PyTorch DistributedDataParallel communication hook that all-reduces gradient buckets through ccoll.

    comm = ccoll.Communicator.from_store(store, rank, world_size)     # the store of torch.distributed
    state = ccoll.torch.CcollHookState(comm, spec="quant:bits=4,mode=requant")
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(state, ccoll.torch.allreduce_hook)

The hook averages each bucket over the ranks (op avg) in place. By default it returns a completed future: the
backward pass waits for every bucket's all-reduce. With CcollHookState(..., async_op=True) the all-reduces run in
order on one background thread (a CommWorker) and the hook returns at once, so a bucket's all-reduce overlaps the
backward computation of the buckets after it, as DDP's own NCCL and gloo all-reduces do; DDP waits for the futures
at the end of the backward pass. CUDA buckets (a library built with CUDA) are queued, with or without async_op, on a
side stream of the state's per device, after the work already queued on torch's current stream (which wrote the
bucket), so the backward kernels queued after the hook do not wait for the all-reduce; the hook returns a CUDA-aware
future (torch.futures.Future(devices=...)), whose wait() makes DDP's stream wait for the side stream. The
communicator must be bound to the bucket's GPU: call torch.cuda.set_device(local_rank) before making it, or pass
cuda_device=local_rank. float32, bfloat16 and float16 buckets go
through the bucket's own compressor (it keeps that bucket's error feedback, in float32); other dtypes, and every
bucket when spec is None, take the exact all-reduce. With spec "powersgd:..." each bucket's compressor is told the shapes of the
bucket's gradients (a matrix per weight; vectors go exactly), unless the spec gives shapes, rows or cols itself.
Works with torch 1.13 and current torch (GradBucket.buffer(); the older name get_tensor() is accepted too).
"""

import queue
import threading

import torch

from .compressor import Compressor


def _bucket_tensor(bucket):
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


class CommWorker:
    """Runs communicator calls one after the other on a background thread, in the order they were submitted.

    submit(fn) returns a torch Future that receives fn()'s result, or the exception fn raised. Every rank submits
    its collectives in the same order (DDP's bucket order), so they match across ranks as they would in the calling
    thread. The library's calls drop the GIL while they run, so Python and torch keep computing meanwhile. While
    calls are pending, the communicator must not be used from another thread; after DDP's backward pass returns,
    every bucket's future is done. close() waits for the pending calls and stops the thread.
    """

    def __init__(self):
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ccoll-comm-worker", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut = item
            try:
                result = fn()
            except BaseException as e:  # the Future carries it to whoever waits
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def submit(self, fn):
        if self._thread is None:
            raise RuntimeError("CommWorker.submit after close()")
        fut = torch.futures.Future()
        self._queue.put((fn, fut))
        return fut

    def close(self):
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


def future_of(worker, fn):
    """A hook's Future of fn(): fn runs on the CommWorker when worker is set (the Future completes later), else now."""
    if worker is not None:
        return worker.submit(fn)
    fut = torch.futures.Future()
    fut.set_result(fn())
    return fut


class CcollHookState:
    """The hook's state: the communicator and one compressor per bucket index, created at the bucket's first use.

    DDP rebuilds its buckets once, after the first iteration; a bucket index whose element count changes gets a new
    compressor (its error feedback starts again). Every rank sees the same rebuild, so the ranks stay in step.
    async_op=True: the all-reduces run on a CommWorker (see the module's text); the results are bitwise the same.
    """

    def __init__(self, comm, spec="quant:bits=4,mode=requant", async_op=False):
        self.comm = comm
        self.spec = spec
        self.worker = CommWorker() if async_op else None
        self._compressors = {}  # bucket index -> ((element count, shapes), Compressor)
        self._side_streams = {}  # CUDA device -> the stream CUDA buckets are all-reduced on
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

    def side_stream(self, device):
        """The stream this state's all-reduces of CUDA buckets on `device` are queued on (made at first use)."""
        stream = self._side_streams.get(device)
        if stream is None:
            stream = torch.cuda.Stream(device=device)
            self._side_streams[device] = stream
        return stream

    def close(self):
        """Waits for pending all-reduces and frees the compressors (not the communicator, which the caller owns)."""
        if self.worker is not None:
            self.worker.close()
        for stream in self._side_streams.values():
            stream.synchronize()  # the compressors' queued calls are done before they are freed
        for _, comp in self._compressors.values():
            comp.destroy()
        self._compressors.clear()


def allreduce_hook(state, bucket):
    """DDP comm hook: bucket average over the ranks through ccoll; returns a Future of the bucket tensor (completed,
    or completed by the state's worker with async_op)."""
    tensor = _bucket_tensor(bucket)
    comp = None
    if tensor.dtype in (torch.float32, torch.bfloat16, torch.float16):
        shapes = [tuple(g.shape) for g in bucket.gradients()] if state.wants_shapes else None
        comp = state.compressor(bucket.index(), tensor.numel(), shapes)

    if tensor.is_cuda:
        return _cuda_allreduce(state, tensor, comp)

    def reduce():
        state.comm.all_reduce(tensor, op="avg", compressor=comp)
        return tensor

    return future_of(state.worker, reduce)


def _cuda_allreduce(state, tensor, comp):
    """A CUDA bucket's all-reduce, queued (on this thread) on the state's side stream after what torch's current
    stream holds; the future's wait() orders the waiter's current stream after it."""
    device = tensor.device
    side = state.side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))  # the bucket was written there
    with torch.cuda.stream(side):
        state.comm.all_reduce(tensor, op="avg", compressor=comp)  # the binding takes the current stream: side
        tensor.record_stream(side)  # the caching allocator must not reuse the bucket before side is done with it
        fut = torch.futures.Future(devices=[device])
        fut.set_result(tensor)  # records an event on side, the current stream here
    return fut
