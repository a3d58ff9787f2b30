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
cuda_device=local_rank. float32, bfloat16 and float16 buckets go through the bucket's own compressor (it keeps that
bucket's error feedback, in float32); other dtypes, and every bucket when spec is None, take the exact all-reduce.
With spec "powersgd:..." each bucket's compressor is told the shapes of the bucket's gradients (a matrix per weight;
vectors go exactly), unless the spec gives shapes, or rows or cols other than 0 (auto), itself.

A failed hook call ends the communicator, as NCCL's abort does: when a hook call raises, or with async_op one of the
worker's calls fails, the communicator is aborted (with async_op after the calls submitted before the failure), so
the peers' calls fail at once (RemoteError, or InvalidUsageError naming this rank where the binding refused the call
before the library ran it) instead of waiting CC_TIMEOUT_MS, and every later call on this rank fails too, naming the
first failure; a bucket is never reduced with another rank's other bucket. Make a new communicator and state to go
on. Every hook call first checks the communicator's async error (a CUDA call's failure found after
the call returned, ccCommGetAsyncError) and raises it: a bucket whose all-reduce failed on the device is used for at
most the step in which it failed.

Buckets are dense: DDP with sparse gradients (nn.Embedding(sparse=True)) needs DDP's own all-reduce, and the hook
refuses such a bucket. Tested with torch 1.13; written against torch 2.x's API too, not tested with it
(GradBucket.buffer(), index() and gradients(), whose names torch 2.x keeps; the older names get_tensor(), get_index()
and get_per_parameter_tensors() of torch 1.8 and 1.9 are accepted too). Not with DDP's Python reducer (torch 2.3 and
later, torch._dynamo.config.optimize_ddp = "python_reducer" under compiled autograd), which calls a hook per
parameter instead of per bucket: the hook refuses such a call with InvalidUsageError.
"""

import queue
import threading

import torch

from .compressor import Compressor
from .errors import SUCCESS, CcollError, InvalidUsageError, check, comm_error_sentence


def _bucket_tensor(bucket):
    if hasattr(bucket, "buffer"):
        return bucket.buffer()
    if hasattr(bucket, "get_tensor"):
        return bucket.get_tensor()
    raise InvalidUsageError("the ccoll DDP hook takes a GradBucket, and was given a %s: DDP's Python reducer "
                            "(torch._dynamo.config.optimize_ddp = 'python_reducer', torch 2.3 and later) calls a comm "
                            "hook once per parameter with (grad, param); the hook needs DDP's C++ reducer (the default)"
                            % type(bucket).__name__)


def _bucket_index(bucket):
    return bucket.index() if hasattr(bucket, "index") else bucket.get_index()


def _bucket_gradients(bucket):
    return bucket.gradients() if hasattr(bucket, "gradients") else bucket.get_per_parameter_tensors()


def _bucket_parameters(bucket):
    """The ids of the bucket's parameters in order; () where the GradBucket does not list them."""
    return tuple(id(p) for p in bucket.parameters()) if hasattr(bucket, "parameters") else ()


def _abort(comm):
    """Aborts comm (nothing if it is freed already). A failure to abort is not raised: the caller is raising the
    failure that made it abort."""
    try:
        comm.abort()
    except CcollError:
        pass


def _check_async_error(comm):
    """Raises comm's async error, if it has one, with the communicator's sentence (comm_error_sentence): this
    thread's last sentence may be another failure's."""
    result = comm.async_error()
    if result != SUCCESS:
        check(result, comm.handle, comm_error_sentence(comm.handle))


def _raise_earlier_failure(state):
    """A hook call after a failed one: raises InvalidUsageError naming the first failure (its __cause__), instead of
    the aborted communicator's "destroyed or aborted"."""
    failure = state.failure
    if failure is None:
        return
    error = InvalidUsageError("not run: an earlier call of this rank's ccoll hook failed (%s: %s), and the "
                              "communicator was aborted; make a new communicator and state to go on"
                              % (type(failure).__name__, failure))
    error.__cause__ = failure
    raise error


class CommWorker:
    """Runs communicator calls one after the other on a background thread, in the order they were submitted.

    submit(fn) returns a torch Future that receives fn()'s result, or the exception fn raised. Every rank submits
    its collectives in the same order (DDP's bucket order), so they match across ranks as they would in the calling
    thread. The library's calls drop the GIL while they run, so Python and torch keep computing meanwhile. While
    calls are pending, the communicator must not be used from another thread (but for async_error() and abort(),
    which the library allows from any thread); after DDP's backward pass returns, every bucket's future is done.
    close() waits for the pending calls and stops the thread.

    The first call that raises ends the worker: it aborts comm (when given), so the peers fail instead of pairing
    this rank's next call with their current one, and every call pending or submitted later fails without running,
    with an InvalidUsageError that names the first failure (its __cause__). fail(exc) does the same for a failure
    outside the worker, after the calls already submitted.
    """

    def __init__(self, comm=None):
        self._comm = comm
        self._failure = None  # the first exception a call raised; set on the worker thread (see failure)
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ccoll-comm-worker", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut, always = item
            if self._failure is not None and not always:
                error = InvalidUsageError("not run: an earlier call of this rank's ccoll CommWorker failed (%s: %s)%s"
                                          % (type(self._failure).__name__, self._failure,
                                             ", and the communicator was aborted" if self._comm is not None else ""))
                error.__cause__ = self._failure
                fut.set_exception(error)
                continue
            try:
                result = fn()
            except BaseException as e:  # the Future carries it to whoever waits
                self._failure = e
                if self._comm is not None:
                    _abort(self._comm)
                # torch's Future takes an Exception only: a KeyboardInterrupt or SystemExit goes as a RuntimeError
                # that names it (its __cause__), so that this thread lives on to fail the calls after it.
                if not isinstance(e, Exception):
                    wrapped = RuntimeError("%s in a ccoll CommWorker call" % type(e).__name__)
                    wrapped.__cause__ = e
                    e = wrapped
                fut.set_exception(e)
            else:
                fut.set_result(result)

    @property
    def failure(self):
        """The first exception a call raised (None so far); read from any thread, it may lag the worker."""
        return self._failure

    def submit(self, fn, always=False):
        """always: fn runs even after a failure (a cleanup, such as freeing a compressor)."""
        if self._thread is None:
            raise RuntimeError("CommWorker.submit after close()")
        fut = torch.futures.Future()
        self._queue.put((fn, fut, always))
        return fut

    def fail(self, exc):
        """Fails the worker with exc once the calls submitted so far have run (see the class's text)."""
        def raise_exc():
            raise exc

        if self._thread is None:
            if self._comm is not None:
                _abort(self._comm)
            return
        self.submit(raise_exc)

    def close(self):
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


def _value(fut):
    return fut.wait()  # raises the exception the Future carries


def future_of(worker, fn):
    """A hook's Future of fn(): fn runs on the CommWorker when worker is set (the Future completes later), else now.
    The worker's Future is chained through then(): a Future completed by set_exception holds the exception as its
    value, which DDP would try to read as the bucket's tensor; the chained one fails with it."""
    if worker is not None:
        return worker.submit(fn).then(_value)
    fut = torch.futures.Future()
    fut.set_result(fn())
    return fut


class CcollHookState:
    """The hook's state: the communicator and one compressor per bucket index, created at the bucket's first use.

    A compressor's state (error feedback, PowerSGD's Q) belongs to the bucket's layout: its element count, its
    parameters in order (the ids of bucket.parameters()) and their shapes. DDP rebuilds its buckets once, after the
    first iteration, in the order the gradients became ready; a bucket index whose layout changes, even with the same
    element count (the same parameters in another order), gets a new compressor, whose error feedback starts again,
    instead of adding one parameter's residual to another's gradient. Every rank sees the same rebuild, so the ranks
    stay in step. The old compressor is freed after the calls already queued with it (on the worker with async_op).
    async_op=True: the all-reduces run on a CommWorker (see the module's text); the results are bitwise the same.
    After a failed hook call the communicator is aborted (see the module's text).
    """

    def __init__(self, comm, spec="quant:bits=4,mode=requant", async_op=False):
        self.comm = comm
        self.spec = spec
        self.worker = None  # made last, once the spec is known to be good (a refused spec leaves no thread behind)
        self._failure = None  # the first exception of a hook call (sync), see fail()
        self._compressors = {}  # bucket index -> ((element count, parameter ids, shapes), Compressor)
        self._side_streams = {}  # CUDA device -> the stream CUDA buckets are all-reduced on
        # PowerSGD needs the bucket's matrix shapes; unless the spec gives shapes, or rows or cols other than 0 (auto),
        # they come from the bucket. The compressor's canonical spec says what the spec set.
        self.wants_shapes = False
        if spec is not None:
            comp = Compressor(spec)  # a bad spec fails here, on every rank, not in the middle of backward
            kind, _, params = comp.spec.partition(":")
            comp.destroy()
            values = dict(item.split("=", 1) for item in params.split(",") if "=" in item)
            self.wants_shapes = (kind == "powersgd" and "shapes" not in values and values.get("rows", "0") == "0" and
                                 values.get("cols", "0") == "0")
        if async_op:
            self.worker = CommWorker(comm)

    def __del__(self):
        # A state dropped without close(): its worker thread ends after the calls already submitted (not joined here,
        # which may run on that very thread). The compressors free themselves (Compressor.__del__).
        worker = getattr(self, "worker", None)
        if worker is not None and worker._thread is not None:
            worker._queue.put(None)

    def compressor(self, index, numel, shapes=None, parameters=()):
        """The compressor of bucket `index` holding `numel` elements (None when spec is None). shapes: the shapes of
        the bucket's gradients in order; parameters: the ids of its parameters in order (see the class's text)."""
        if self.spec is None:
            return None
        layout = (numel, tuple(parameters), tuple(shapes) if shapes is not None else None)
        entry = self._compressors.get(index)
        if entry is not None and entry[0] == layout:
            return entry[1]
        if entry is not None:
            self._free(entry[1])
        comp = Compressor(self.spec)
        if self.wants_shapes and shapes:  # (a bucket of zero-size gradients only has no matrix)
            comp.set_shapes(shapes)
        self._compressors[index] = (layout, comp)
        return comp

    def _free(self, comp):
        """Destroys a replaced compressor once the calls queued with it are done: on the worker, after them."""
        if self.worker is not None:
            self.worker.submit(comp.destroy, always=True)
        else:
            comp.destroy()  # sync: its calls are done; CUDA calls queued with it finish first (ccCompressorDestroy)

    @property
    def failure(self):
        """The first failure of this state's hook calls (with async_op, of its worker's calls too), or None."""
        if self._failure is None and self.worker is not None:
            return self.worker.failure
        return self._failure

    def fail(self, exc):
        """Aborts the communicator after a failed hook call (with async_op, after the calls already submitted)."""
        if self.failure is None:  # the first one (with async_op the worker's may come first)
            self._failure = exc
        if self.worker is not None:
            self.worker.fail(exc)
        else:
            _abort(self.comm)

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
    or completed by the state's worker with async_op). Raises the communicator's async error if it has one; when it
    raises, the communicator is aborted (see the module's text)."""
    try:
        return _allreduce(state, bucket)
    except BaseException as e:
        state.fail(e)
        raise


def _allreduce(state, bucket):
    """allreduce_hook without the abort on failure."""
    _raise_earlier_failure(state)
    _check_async_error(state.comm)
    tensor = _bucket_tensor(bucket)
    if tensor.layout != torch.strided:
        raise InvalidUsageError("the ccoll DDP hook takes dense gradient buckets, and this one is %s: a model with "
                                "sparse gradients (nn.Embedding(sparse=True)) needs DDP's own all-reduce, or dense "
                                "gradients (sparse=False)" % tensor.layout)
    comp = None
    if tensor.dtype in (torch.float32, torch.bfloat16, torch.float16) and state.spec is not None:
        # Zero-size gradients hold no elements of the bucket: no matrix of PowerSGD's.
        shapes = [tuple(g.shape) for g in _bucket_gradients(bucket) if g.numel() > 0]
        comp = state.compressor(_bucket_index(bucket), tensor.numel(), shapes, _bucket_parameters(bucket))

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
