"""CUDA tensors through the binding: thread ranks of this process on GPU 0, each on its own torch stream.

Each rank all-reduces the same inputs twice, as CPU tensors and as CUDA tensors (float32 and bfloat16: exact, and
two codecs with a fresh compressor of the same seed each time); the CUDA results must equal the CPU ones bit for bit,
and be identical on every rank. The call is stream-ordered: the input is written on the rank's stream just before
it and the result read just after, without a synchronize in between. Then the DDP hook (ccoll.torch) on CUDA
buckets: queued on its side stream, its future's wait() orders the caller's stream after it.

Every device buffer and pinned host buffer is made before the first collective, and the copies in between are
stream-ordered (non_blocking, pinned): a cudaMalloc or a pageable copy while another rank's stream waits for this
rank may wait for that stream (tests/test_gpu_collectives.cc says why). A rank that fails aborts its communicator, so
the other rank fails too instead of waiting, and prints its traceback at once; faulthandler dumps every thread's
stack if the test still hangs.

Run as a script, it exits with 77 (ctest's "skipped") when torch, a CUDA device, or a CUDA build of libccoll is
missing, and says which.
"""

import faulthandler
import sys
import threading
import traceback
import unittest

import ccoll
from ccoll import _library

NRANKS = 2
COUNT = 100003
SPECS = [None, "quant:bits=4,mode=requant,seed=5", "topk:density=0.1,seed=5"]
TIMEOUT_MS = 20000  # a peer that failed is an error well before gpu_check.sh's limit for this test (120 s)


def _skip_reason():
    try:
        import torch
    except Exception as e:  # noqa: BLE001 -- any import failure means "no torch here"
        return "torch cannot be imported: %s" % e
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if not _library.has_cuda:
        return "%s was built without CUDA" % _library.path
    return None


def _run_ranks(body):
    """Runs body(rank, comm, barrier) on NRANKS threads with a communicator each; returns (results, errors)."""
    uid = ccoll.get_unique_id()
    results, errors = [None] * NRANKS, [None] * NRANKS
    barrier = threading.Barrier(NRANKS, timeout=TIMEOUT_MS / 1000.0)

    def rank_main(rank):
        import torch
        comm = None
        try:
            torch.cuda.set_device(0)
            comm = ccoll.Communicator(NRANKS, uid, rank, timeout_ms=TIMEOUT_MS, cuda_device=0)
            results[rank] = body(rank, comm, barrier)
            comm.destroy()
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            errors[rank] = "%s: %s" % (type(e).__name__, e)
            sys.stderr.write("rank %d failed:\n%s" % (rank, traceback.format_exc()))
            sys.stderr.flush()
            barrier.abort()
            if comm is not None:
                comm.abort()  # the peer's pending call fails instead of waiting for this rank

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(NRANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def _bits(t):
    import torch
    return t.view(torch.int16 if t.dtype in (torch.bfloat16, torch.float16) else torch.int32)


def _cpu_vs_cuda(rank, comm, barrier):
    import torch
    if comm.cuda_device != 0:
        raise AssertionError("cuda_device is %r, not 0" % comm.cuda_device)
    stream = torch.cuda.Stream()
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for spec in SPECS:
            g = torch.Generator().manual_seed(rank * 17 + (0 if spec is None else len(spec)))
            host = torch.randn(COUNT, generator=g).to(dtype).pin_memory()
            cases.append((dtype, spec, host, torch.empty(COUNT, dtype=dtype, device="cuda"),
                          torch.empty(COUNT, dtype=dtype).pin_memory()))
    torch.cuda.synchronize()
    barrier.wait()  # no rank allocates from here on
    out = {}
    for dtype, spec, host, dev, back in cases:
        comp = ccoll.Compressor(spec) if spec else None
        ref = comm.all_reduce(host.clone(), op="avg", compressor=comp)
        if comp is not None:
            comp.destroy()
        comp = ccoll.Compressor(spec) if spec else None
        with torch.cuda.stream(stream):
            dev.copy_(host, non_blocking=True)
            dev.mul_(1.0)  # written by a kernel on the rank's stream
            comm.all_reduce(dev, op="avg", compressor=comp)
            back.copy_(dev, non_blocking=True)  # read on the rank's stream, right after the queued call
        stream.synchronize()
        if comp is not None:
            comp.destroy()
        if comm.async_error() != 0:
            raise RuntimeError("%s %s: async error %d: %s" % (dtype, spec, comm.async_error(), ccoll.last_error()))
        out[(str(dtype), spec)] = (_bits(ref), _bits(back.clone()))
    return out


class _Bucket:
    """The parts of DDP's GradBucket the hook reads."""

    def __init__(self, tensor, index=0):
        self._tensor, self._index = tensor, index

    def buffer(self):
        return self._tensor

    def index(self):
        return self._index

    def gradients(self):
        return [self._tensor]


def _hook(rank, comm, barrier):
    import torch
    import ccoll.torch
    state = ccoll.torch.CcollHookState(comm, spec="quant:bits=4,mode=requant,seed=5")
    g = torch.Generator().manual_seed(100 + rank)
    host = torch.randn(COUNT, generator=g).pin_memory()
    dev = torch.empty(COUNT, device="cuda")
    back = torch.empty(COUNT).pin_memory()
    caller = torch.cuda.Stream()
    torch.cuda.synchronize()
    barrier.wait()
    with torch.cuda.stream(caller):
        dev.copy_(host, non_blocking=True)
        dev.mul_(1.0)  # the bucket written on the caller's stream, as the backward pass writes it
        fut = ccoll.torch.allreduce_hook(state, _Bucket(dev))
        result = fut.wait()  # the caller's stream now waits for the hook's side stream
        back.copy_(result, non_blocking=True)
    caller.synchronize()
    state.close()
    if comm.async_error() != 0:
        raise RuntimeError("hook: async error %d: %s" % (comm.async_error(), ccoll.last_error()))
    # The same call on CPU tensors, with a fresh compressor of the same seed.
    comp = ccoll.Compressor("quant:bits=4,mode=requant,seed=5")
    ref = comm.all_reduce(host.clone(), op="avg", compressor=comp)
    comp.destroy()
    return {("hook", "quant:bits=4,mode=requant,seed=5"): (_bits(ref), _bits(back.clone()))}


@unittest.skipIf(_skip_reason() is not None, "CUDA tensors need torch's CUDA and a CUDA build of libccoll")
class CudaTensors(unittest.TestCase):
    def check(self, results, errors):
        import torch
        self.assertEqual(errors, [None] * NRANKS)
        for key in results[0]:
            for r in range(NRANKS):
                ref, got = results[r][key]
                diff = (ref != got).nonzero()
                self.assertEqual(diff.numel(), 0, "%s: rank %d: CUDA result differs from CPU at %d elements, first "
                                 "%s" % (key, r, diff.numel(), diff[:1].tolist()))
                self.assertTrue(torch.equal(got, results[0][key][1]), "%s: rank %d differs from rank 0" % (key, r))

    def test_cuda_equals_cpu(self):
        self.check(*_run_ranks(_cpu_vs_cuda))

    def test_ddp_hook_on_cuda_buckets(self):
        self.check(*_run_ranks(_hook))


if __name__ == "__main__":
    reason = _skip_reason()
    if reason:
        print("test_cuda: skipped: %s" % reason)
        sys.exit(77)
    import torch
    print("torch %s (CUDA %s), %s" % (torch.__version__, torch.version.cuda, _library.path), flush=True)
    faulthandler.dump_traceback_later(100, exit=True)  # before gpu_check.sh's 120 s limit: where it hangs
    unittest.main()
