#include "collectives/ring.h"

#include <algorithm>
#include <vector>

#include "collectives/average.h"
#include "collectives/buffers.h"
#include "core/comm.h"
#include "core/error.h"

namespace ccoll {

// A chain of n ranks (broadcast, reduce) cut in S slices takes S + n - 2 slice times: its pipeline fills for n - 2 of
// them, where a ring keeps every link busy from its first step. So where some rank runs in another process, a chain's
// slice shrinks with the call until the call has 32 (n - 2) slices (filling is then at most 1/33 of the time), but
// not below 64 KiB, where each message's fixed cost starts to tell, nor above CC_SLICE_BYTES. Every input is agreed
// by all ranks, so all cut alike. On 4 ranks at 1 Gbit/s (perf/netbench/results/2026-12-07_chain_slices.md) this
// rule, with the broadcast's receive ahead, took 0.44-0.47x the former time at 256 KiB, 0.74-0.76x at 1 MiB and
// 0.91-0.92x at 4 MiB, level from 16 MiB; between processes over shared memory the broadcast was level, the reduce
// 0.88-1.01x. A communicator whose ranks all share one process keeps CC_SLICE_BYTES: between its threads a slice is
// a memory copy and its hand-off, and 64 KiB slices took 1.14-1.25x the time at 1-4 MiB.
size_t ChainSliceElems(size_t sliceBytes, int nranks, bool acrossProcesses, size_t count, size_t eltSize) {
  const size_t configured = std::max<size_t>(1, sliceBytes / eltSize);
  if (nranks <= 2 || !acrossProcesses) return configured;
  const size_t floor = std::max<size_t>(1, std::min(configured, (size_t{64} << 10) / eltSize));
  const size_t wanted = count / (32 * static_cast<size_t>(nranks - 2));
  return std::clamp(wanted, floor, configured);
}

ccResult_t RingAllReduce(ccComm* comm, const CollArgs& args) {
  const int n = comm->nranks, r = comm->rank;
  const size_t es = args.eltSize;
  CallBuffers mem(comm, args);
  if (n == 1) return OneRankReduction(mem, args, args.count);
  CollArgs a = args;
  // A premultiplied average (average.h) without a pass of its own: the rank's own chunk is scaled into recv, whence
  // it is sent at step 0, and the other chunks' own elements are scaled where they are added.
  const bool premultiply = PremultipliesAverage(a.op, a.dtype);
  if (premultiply) a.op = ccSum;
  const uint64_t seq = comm->NextSeq();
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const size_t sliceElems = std::max<size_t>(1, comm->config.sliceBytes / es);
  const size_t rounds = (PartSize(a.count, n, 0) + sliceElems - 1) / sliceElems;
  Inflight io(comm);
  Request* send = nullptr;
  Request* recv = nullptr;
  uint64_t msg = 0;
  for (size_t k = 0; k < rounds; ++k) {
    // Reduce-scatter: at step s, send chunk r-s (own data at s = 0, a partial sum after), receive chunk r-s-1 and
    // add the local contribution. After n-1 steps chunk r+1 holds the full reduction. The receive of step s+1 is
    // posted before the reduction of step s, into the other scratch slot, so the transfer overlaps the arithmetic.
    auto postRecv = [&](int s) -> ccResult_t {
      Slice in = ChunkSlice(a.count, n, Mod(r - s - 1, n), k, sliceElems);
      if (in.count == 0) return ccSuccess;
      return io.Recv(prev, mem->Scratch(s % 2), in.count * es, Tag(seq, msg + s), &recv);
    };
    CC_CHECK(postRecv(0));
    const Slice mine = ChunkSlice(a.count, n, r, k, sliceElems);
    if (premultiply && mine.count > 0) {
      CC_CHECK(mem->Premultiply(At(a.recv, mine.offset, es), At(a.send, mine.offset, es), mine.count, a.dtype, n));
    }
    for (int s = 0; s < n - 1; ++s) {
      Slice out = ChunkSlice(a.count, n, Mod(r - s, n), k, sliceElems);
      Slice in = ChunkSlice(a.count, n, Mod(r - s - 1, n), k, sliceElems);
      const void* src = s == 0 && !premultiply ? At(a.send, out.offset, es) : At(a.recv, out.offset, es);
      CC_CHECK(io.Wait(&send));
      if (out.count > 0) CC_CHECK(io.Send(next, src, out.count * es, Tag(seq, msg + s), &send));
      CC_CHECK(io.Wait(&recv));
      if (s + 1 < n - 1) CC_CHECK(postRecv(s + 1));
      if (in.count > 0 && premultiply) {
        CC_CHECK(mem->ReducePremultiplied(At(a.recv, in.offset, es), At(a.send, in.offset, es), mem->Scratch(s % 2),
                                          in.count, a.dtype, n));
      } else if (in.count > 0) {
        CC_CHECK(mem->Reduce(At(a.recv, in.offset, es), At(a.send, in.offset, es), mem->Scratch(s % 2), in.count,
                             a.dtype, a.op));
      }
    }
    msg += n - 1;
    Slice owned = ChunkSlice(a.count, n, Mod(r + 1, n), k, sliceElems);
    if (a.op == ccAvg && owned.count > 0) {
      CC_CHECK(mem->FinishAvg(At(a.recv, owned.offset, es), owned.count, a.dtype, n));
    }
    // All-gather: at step s, send chunk r+1-s (finished), receive chunk r-s straight into place.
    for (int s = 0; s < n - 1; ++s, ++msg) {
      Slice out = ChunkSlice(a.count, n, Mod(r + 1 - s, n), k, sliceElems);
      Slice in = ChunkSlice(a.count, n, Mod(r - s, n), k, sliceElems);
      CC_CHECK(io.Wait(&send));
      if (in.count > 0) CC_CHECK(io.Recv(prev, At(a.recv, in.offset, es), in.count * es, Tag(seq, msg), &recv));
      if (out.count > 0) CC_CHECK(io.Send(next, At(a.recv, out.offset, es), out.count * es, Tag(seq, msg), &send));
      CC_CHECK(io.Wait(&recv));
    }
  }
  return io.WaitAll();
}

ccResult_t RingReduceScatter(ccComm* comm, const CollArgs& args) {
  const int n = comm->nranks, r = comm->rank;
  const size_t es = args.eltSize;
  const size_t block = args.count;  // elements each rank ends with
  CallBuffers mem(comm, args);
  if (n == 1) return OneRankReduction(mem, args, block);
  CollArgs a = args;
  AverageInput average(mem.get());
  CC_CHECK(average.Prepare(&a, block * static_cast<size_t>(n), false, n));
  const uint64_t seq = comm->NextSeq();
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const size_t sliceElems = std::max<size_t>(1, comm->config.sliceBytes / es);
  const size_t rounds = (block + sliceElems - 1) / sliceElems;
  Inflight io(comm);
  Request* send = nullptr;
  Request* recv = nullptr;
  uint64_t msg = 0;
  for (size_t k = 0; k < rounds; ++k) {
    const size_t off = k * sliceElems;
    const size_t cnt = std::min(sliceElems, block - off);
    // At step s, send block r-s-1 (own data at s = 0, a partial sum in scratch after) and receive block r-s-2;
    // after n-1 steps block r is complete. Partial sums alternate between the two scratch slots.
    for (int s = 0; s < n - 1; ++s, ++msg) {
      int outBlock = Mod(r - s - 1, n), inBlock = Mod(r - s - 2, n);
      const void* src = s == 0 ? At(a.send, outBlock * block + off, es) : mem->Scratch((s - 1) % 2);
      bool last = s == n - 2;
      char* land = mem->Scratch(s % 2);
      CC_CHECK(io.Wait(&send));
      CC_CHECK(io.Recv(prev, land, cnt * es, Tag(seq, msg), &recv));
      CC_CHECK(io.Send(next, src, cnt * es, Tag(seq, msg), &send));
      CC_CHECK(io.Wait(&recv));
      // The send above may still read the other slot; the partial sum stays in `land` (or goes to recv at the end).
      void* dst = last ? static_cast<void*>(At(a.recv, off, es)) : static_cast<void*>(land);
      CC_CHECK(mem->Reduce(dst, At(a.send, inBlock * block + off, es), land, cnt, a.dtype, a.op));
    }
    if (a.op == ccAvg) CC_CHECK(mem->FinishAvg(At(a.recv, off, es), cnt, a.dtype, n));
  }
  return io.WaitAll();
}

ccResult_t RingAllGather(ccComm* comm, const CollArgs& a) {
  const int n = comm->nranks, r = comm->rank;
  const size_t es = a.eltSize;
  const size_t block = a.count;
  CallBuffers mem(comm, a);
  CC_CHECK(mem->Copy(At(a.recv, r * block, es), a.send, block * es));
  if (n == 1) return ccSuccess;
  const uint64_t seq = comm->NextSeq();
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const size_t sliceElems = std::max<size_t>(1, comm->config.sliceBytes / es);
  const size_t rounds = (block + sliceElems - 1) / sliceElems;
  Inflight io(comm);
  Request* send = nullptr;
  Request* recv = nullptr;
  uint64_t msg = 0;
  for (size_t k = 0; k < rounds; ++k) {
    const size_t off = k * sliceElems;
    const size_t cnt = std::min(sliceElems, block - off);
    for (int s = 0; s < n - 1; ++s, ++msg) {
      int outBlock = Mod(r - s, n), inBlock = Mod(r - s - 1, n);
      CC_CHECK(io.Recv(prev, At(a.recv, inBlock * block + off, es), cnt * es, Tag(seq, msg), &recv));
      CC_CHECK(io.Send(next, At(a.recv, outBlock * block + off, es), cnt * es, Tag(seq, msg), &send));
      CC_CHECK(io.Wait(&recv));
      CC_CHECK(io.Wait(&send));
    }
  }
  return io.WaitAll();
}

ccResult_t RingBroadcast(ccComm* comm, const CollArgs& a) {
  const int n = comm->nranks, r = comm->rank;
  const size_t es = a.eltSize;
  CallBuffers mem(comm, a);
  if (r == a.root) CC_CHECK(mem->Copy(a.recv, a.send, a.count * es));
  if (n == 1 || a.count == 0) return ccSuccess;
  const uint64_t seq = comm->NextSeq();
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const bool last = next == a.root;
  const size_t sliceElems = ChainSliceElems(comm->config.sliceBytes, n, comm->acrossProcesses, a.count, es);
  const size_t rounds = (a.count + sliceElems - 1) / sliceElems;
  Inflight io(comm);
  const size_t kWindow = 8;  // sends in flight before this rank waits for the oldest
  std::vector<Request*> sends(kWindow, nullptr);
  // The receive of slice k + 1 is posted before slice k is waited for (8 ahead measured no faster).
  Request* recvs[2] = {nullptr, nullptr};
  auto postRecv = [&](size_t k) -> ccResult_t {
    const size_t off = k * sliceElems;
    return io.Recv(prev, At(a.recv, off, es), std::min(sliceElems, a.count - off) * es, Tag(seq, k), &recvs[k % 2]);
  };
  if (r != a.root) CC_CHECK(postRecv(0));
  for (size_t k = 0; k < rounds; ++k) {
    const size_t off = k * sliceElems;
    const size_t cnt = std::min(sliceElems, a.count - off);
    if (r != a.root) {
      if (k + 1 < rounds) CC_CHECK(postRecv(k + 1));
      CC_CHECK(io.Wait(&recvs[k % 2]));
    }
    if (!last) {
      CC_CHECK(io.Wait(&sends[k % kWindow]));
      CC_CHECK(io.Send(next, At(a.recv, off, es), cnt * es, Tag(seq, k), &sends[k % kWindow]));
    }
  }
  return io.WaitAll();
}

ccResult_t RingReduce(ccComm* comm, const CollArgs& args) {
  const int n = comm->nranks, r = comm->rank;
  const size_t es = args.eltSize;
  CallBuffers mem(comm, args);
  if (n == 1) return OneRankReduction(mem, args, args.count);
  if (args.count == 0) return ccSuccess;
  CollArgs a = args;
  AverageInput average(mem.get());
  CC_CHECK(average.Prepare(&a, a.count, r == a.root, n));
  const uint64_t seq = comm->NextSeq();
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const bool first = prev == a.root, isRoot = r == a.root;
  const size_t sliceElems = ChainSliceElems(comm->config.sliceBytes, n, comm->acrossProcesses, a.count, es);
  const size_t rounds = (a.count + sliceElems - 1) / sliceElems;
  auto countOf = [&](size_t k) { return std::min(sliceElems, a.count - k * sliceElems); };
  Inflight io(comm);
  // Slice k lands in scratch slot k % 2 and is forwarded from there; the receive of slice k + 1 is posted before
  // slice k is reduced, once the send of slice k - 1 (from that slot) is done.
  Request* sends[2] = {nullptr, nullptr};
  Request* recvs[2] = {nullptr, nullptr};
  auto postRecv = [&](size_t k) -> ccResult_t {
    CC_CHECK(io.Wait(&sends[k % 2]));
    return io.Recv(prev, mem->Scratch(static_cast<int>(k % 2)), countOf(k) * es, Tag(seq, k), &recvs[k % 2]);
  };
  if (!first) CC_CHECK(postRecv(0));
  for (size_t k = 0; k < rounds; ++k) {
    const size_t off = k * sliceElems, cnt = countOf(k);
    if (first) {  // the chain's start sends its own slices, up to two in flight
      CC_CHECK(io.Wait(&sends[k % 2]));
      CC_CHECK(io.Send(next, At(a.send, off, es), cnt * es, Tag(seq, k), &sends[k % 2]));
      continue;
    }
    char* land = mem->Scratch(static_cast<int>(k % 2));
    CC_CHECK(io.Wait(&recvs[k % 2]));
    if (k + 1 < rounds) CC_CHECK(postRecv(k + 1));
    if (isRoot) {
      CC_CHECK(mem->Reduce(At(a.recv, off, es), land, At(a.send, off, es), cnt, a.dtype, a.op));
      if (a.op == ccAvg) CC_CHECK(mem->FinishAvg(At(a.recv, off, es), cnt, a.dtype, n));
    } else {
      CC_CHECK(mem->Reduce(land, land, At(a.send, off, es), cnt, a.dtype, a.op));
      CC_CHECK(io.Send(next, land, cnt * es, Tag(seq, k), &sends[k % 2]));
    }
  }
  return io.WaitAll();
}

}  // namespace ccoll
