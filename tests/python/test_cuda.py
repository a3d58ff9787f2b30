"""CUDA tensors through the binding: thread ranks of this process on GPU 0, each on its own torch stream.

Each rank all-reduces the same inputs twice, as CPU tensors and as CUDA tensors (float32 and bfloat16: exact, and
two codecs with a fresh compressor of the same seed each time); the CUDA results must equal the CPU ones bit for bit,
and be identical on every rank. The call is stream-ordered: the input is written on the rank's stream just before
it and the result read just after, without a synchronize in between.

Run as a script, it exits with 77 (ctest's "skipped") when torch, a CUDA device, or a CUDA build of libccoll is
missing, and says which.
"""

import sys
import threading
import unittest

import ccoll
from ccoll import _library

NRANKS = 2
COUNT = 100003
SPECS = [None, "quant:bits=4,mode=requant,seed=5", "topk:density=0.1,seed=5"]


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


def _rank(uid, rank, results, errors):
    import torch
    try:
        torch.cuda.set_device(0)
        comm = ccoll.Communicator(NRANKS, uid, rank)
        stream = torch.cuda.Stream()
        out = {}
        for dtype in (torch.float32, torch.bfloat16):
            for spec in SPECS:
                g = torch.Generator().manual_seed(rank * 17 + (0 if spec is None else len(spec)))
                host = torch.randn(COUNT, generator=g).to(dtype)
                comp = ccoll.Compressor(spec) if spec else None
                ref = comm.all_reduce(host.clone(), op="avg", compressor=comp)
                if comp is not None:
                    comp.destroy()
                comp = ccoll.Compressor(spec) if spec else None
                with torch.cuda.stream(stream):
                    dev = host.to("cuda", non_blocking=False).mul_(1.0)  # written on the rank's stream
                    got = comm.all_reduce(dev, op="avg", compressor=comp)
                    back = got.to("cpu")  # read on the rank's stream, right after the queued call
                if comp is not None:
                    comp.destroy()
                out[(str(dtype), spec)] = (ref.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                                           back.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
        comm.destroy()
        results[rank] = out
    except Exception as e:  # noqa: BLE001 -- reported by the main thread
        errors[rank] = "%s: %s" % (type(e).__name__, e)


class CudaTensors(unittest.TestCase):
    def test_cuda_equals_cpu(self):
        import torch
        uid = ccoll.get_unique_id()
        results, errors = [None] * NRANKS, [None] * NRANKS
        threads = [threading.Thread(target=_rank, args=(uid, r, results, errors)) for r in range(NRANKS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [None] * NRANKS)
        for key in results[0]:
            for r in range(NRANKS):
                ref, got = results[r][key]
                self.assertTrue(torch.equal(ref, got), "%s: rank %d: CUDA result differs from CPU" % (key, r))
                self.assertTrue(torch.equal(got, results[0][key][1]), "%s: rank %d differs from rank 0" % (key, r))


if __name__ == "__main__":
    reason = _skip_reason()
    if reason:
        print("test_cuda: skipped: %s" % reason)
        sys.exit(77)
    unittest.main()
