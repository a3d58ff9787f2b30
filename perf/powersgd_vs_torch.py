#!/usr/bin/python3
"""ccoll's PowerSGD next to PyTorch's own PowerSGD DDP hook, on the same gradients, in one run.

N processes (gloo for torch, ccoll's own communicator for ccoll, both from one FileStore) feed the same
gradient-like matrices, call after call, through
  torch: DistributedDataParallel + powerSGD_hook (torch.distributed.algorithms.ddp_comm_hooks), and
  ccoll: ccAllReduce with a "powersgd:rank=R,rows=..,cols=..,start=S" compressor,
with the same rank, warm start, error feedback and start iteration. Both draw their first Q from their own random
generator, so the outputs are not the same bytes; the algorithm is the same if the error per call and the error of
the running sum (what error feedback is for) track each other. It also reports ccoll's measured wire bits per element
and the time of one ccoll PowerSGD call next to the bf16 all-reduce's wire time on a 1 Gbit/s link.

Gradient-like input: G[t, r] = A + noise * N[t, r], A with singular values 1/j (j = 1..K) on random orthonormal
factors, N[t, r] i.i.d. N(0, 1) scaled to `noise` of A's RMS, fresh per call and rank.

  /usr/bin/python3 perf/powersgd_vs_torch.py --ranks 1 4 16 --rows 4096 --cols 4096 --calls 10
(PYTHONPATH=python and CCOLL_LIBRARY=<build>/src/libccoll.so when ccoll is not installed.)
"""

import argparse
import hashlib
import os
import sys
import tempfile
import time

import numpy as np


def gradient_like(rows, cols, k, seed):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((rows, k)))
    v, _ = np.linalg.qr(rng.standard_normal((cols, k)))
    sigma = 1.0 / np.arange(1, k + 1)
    a = (u * sigma) @ v.T
    return a / np.sqrt(np.mean(a * a))  # RMS 1


def inputs(a, noise, seed, call, rank):
    rng = np.random.default_rng([seed, call, rank])
    return (a + noise * rng.standard_normal(a.shape)).astype(np.float32)


def _collective_bytes(comm):
    """Bytes this rank's collectives sent, less the call check's records (a fixed cost per call)."""
    s = comm.stats()
    return s["bytes_sent"] - s["call_check_bytes_sent"]


def worker(rank, args, store_path, results):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    import ccoll

    torch.set_num_threads(1)
    n = args.nranks
    store = dist.FileStore(store_path, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
    comm = ccoll.Communicator.from_store(store, rank, n)
    a = gradient_like(args.rows, args.cols, args.k, args.seed)

    rows = {}
    for r in args.ranks:
        # PyTorch: a bias-free layer whose loss sum(W * G) has gradient exactly G.
        class Probe(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.zeros(args.rows, args.cols))

            def forward(self, g):
                return (self.weight * g).sum()

        ddp = torch.nn.parallel.DistributedDataParallel(Probe(), bucket_cap_mb=1 << 20)
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r,
                                   start_powerSGD_iter=args.start, use_error_feedback=True, warm_start=True,
                                   min_compression_rate=2, orthogonalization_epsilon=0, random_seed=args.seed)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        comp = ccoll.Compressor("powersgd:rank=%d,rows=%d,cols=%d,start=%d" % (r, args.rows, args.cols, args.start))
        sum_avg = np.zeros(a.shape)
        sum_out = {"torch": np.zeros(a.shape), "ccoll": np.zeros(a.shape)}
        per_call = []
        for call in range(args.calls):
            g = inputs(a, args.noise, args.seed, call, rank)
            # The exact average, in fp64, from every rank's input (regenerated here: same seeds).
            avg = np.zeros(a.shape)
            for q in range(n):
                avg += inputs(a, args.noise, args.seed, call, q)
            avg /= n
            sum_avg += avg

            ddp.zero_grad(set_to_none=False)
            ddp(torch.from_numpy(g)).backward()
            out_t = ddp.module.weight.grad.numpy().astype(np.float64)

            out_c = g.copy()
            before = _collective_bytes(comm)
            dist.barrier()
            t0 = time.perf_counter()
            comm.all_reduce(out_c, op="avg", compressor=comp)
            seconds = time.perf_counter() - t0
            sent = _collective_bytes(comm) - before
            out_c = out_c.astype(np.float64)

            # Same bytes on every rank (ccoll): compare hashes through the store.
            digest = hashlib.blake2b(out_c.astype(np.float32).tobytes(), digest_size=16).hexdigest()
            store.set("digest/%d/%d/%d" % (r, call, rank), digest)
            same = all(store.get("digest/%d/%d/%d" % (r, call, q)).decode() == digest for q in range(n))

            row = {"call": call, "same_bytes": same, "seconds": seconds,
                   "wirebits": 8.0 * sent / a.size / (2.0 * (n - 1) / n) if n > 1 else 0.0}
            for name, out in (("torch", out_t), ("ccoll", out_c)):
                sum_out[name] += out
                row[name] = float(np.sum((out - avg) ** 2) / np.sum(avg ** 2))
                row[name + "_sum"] = float(np.sum((sum_out[name] - sum_avg) ** 2) / np.sum(sum_avg ** 2))
            per_call.append(row)
        rows[r] = per_call
        comp.destroy()
        del ddp
    comm.destroy()
    dist.destroy_process_group()
    if rank == 0:
        results.put(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nranks", type=int, default=4)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 16], help="PowerSGD ranks r")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--k", type=int, default=256, help="singular values 1/j of the shared part, j = 1..k")
    p.add_argument("--noise", type=float, default=0.3, help="per-rank noise RMS relative to the shared part's")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--start", type=int, default=2, help="exact calls before compression (torch wants >= 2)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--link-gbit", type=float, default=1.0)
    args = p.parse_args()

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=worker, args=(r, args, os.path.join(tmp, "store"), results))
                 for r in range(args.nranks)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        if any(proc.exitcode != 0 for proc in procs):
            print("a worker failed: exit codes %s" % [proc.exitcode for proc in procs], file=sys.stderr)
            return 1
        rows = results.get()

    n = args.nranks
    count = args.rows * args.cols
    bf16_wire_s = 2.0 * (n - 1) / n * count * 2 / (args.link_gbit * 1e9 / 8)
    print("# PowerSGD, %d ranks, %dx%d float32 gradient-like matrix (spectrum 1/j, j<=%d, noise %.2f), "
          "start=%d, warm start, error feedback" % (n, args.rows, args.cols, args.k, args.noise, args.start))
    print("# vNMSE of each call's output vs the exact average, and of the running sum of outputs vs the running sum "
          "of averages")
    ok = True
    for r, per_call in rows.items():
        print("\n## rank %d" % r)
        print("| call | torch vNMSE | ccoll vNMSE | torch running-sum vNMSE | ccoll running-sum vNMSE | ccoll wire b/elt "
              "| ccoll time (ms) | same bytes on all ranks |")
        print("|---|---|---|---|---|---|---|---|")
        for row in per_call:
            print("| %d | %.4g | %.4g | %.4g | %.4g | %.4f | %.1f | %s |" % (
                row["call"], row["torch"], row["ccoll"], row["torch_sum"], row["ccoll_sum"], row["wirebits"],
                1e3 * row["seconds"], "yes" if row["same_bytes"] else "NO"))
            ok = ok and row["same_bytes"]
        last = per_call[-1]
        compressed = [row for row in per_call if row["call"] >= args.start]
        if compressed:
            t = float(np.median([row["seconds"] for row in compressed]))
            print("\nrank %d after %d calls: vNMSE torch %.4g, ccoll %.4g; running sum torch %.4g, ccoll %.4g; "
                  "wire %.4f bits/element (bf16: 16); ccoll call %.1f ms vs bf16 wire time %.0f ms at %g Gbit/s "
                  "(%.1f%%)" % (r, len(per_call), last["torch"], last["ccoll"], last["torch_sum"], last["ccoll_sum"],
                                compressed[-1]["wirebits"], 1e3 * t, 1e3 * bf16_wire_s, args.link_gbit,
                                100.0 * t / bf16_wire_s))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
