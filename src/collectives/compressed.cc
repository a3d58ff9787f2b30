#include "collectives/compressed.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <vector>

#include "collectives/algo.h"
#include "collectives/btree.h"
#ifdef CCOLL_HAVE_LOWRANK
#include "collectives/lowrank.h"
#endif
#include "collectives/ring.h"
#include "collectives/sparse.h"
#include "compress/codecs.h"
#ifdef CCOLL_HAVE_CUDA
#include "collectives/device_compressed.h"
#endif
#include "compress/compressor.h"
#include "compress/quant_cpu.h"
#include "compress/rng.h"
#include "compress/sparse.h"
#include "compress/widen.h"
#include "core/comm.h"
#include "core/error.h"

namespace ccoll {
namespace {

// The ring with a codec. `work` holds this rank's (prepared) data and ends holding the decoded result, identical
// on every rank. Up to `depth` lanes carry slices round; a lane is one slice's whole ring (n - 1 reduce-scatter
// steps, then n - 1 all-gather steps) and has four slots of `slot` bytes in `wire` (two for arriving messages, two
// for leaving ones). The lanes take turns, one step each, every lane posting its next transfer as soon as its codec
// work is done, so the codec work on one lane overlaps the transfers of the others; a lane that finishes its slice
// starts the next one at once (a sliding window, no barrier between groups of slices). Every rank takes the steps
// in the same order, and each step waits only for a message its predecessor posted at an earlier step: no
// deadlock.
ccResult_t CompressedRing(ccComm* comm, Codec& codec, WireKind kind, float* work, size_t count, char* wire,
                          size_t slot, int depth) {
  const int n = comm->nranks, r = comm->rank;
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const uint64_t seq = ++comm->seq;
  const size_t sliceElems = std::max<size_t>(1, comm->config.sliceBytes / sizeof(float));
  const size_t rounds = (PartSize(count, n, 0) + sliceElems - 1) / sliceElems;
  const uint64_t steps = 2 * static_cast<uint64_t>(n - 1);  // messages per slice: reduce-scatter, then all-gather
  struct Lane {
    size_t k = 0;  // the slice
    int step = 0;  // 0 .. n-2: reduce-scatter step in flight; n-1 .. 2n-3: all-gather step; 2n-2: idle
    char* in[2];
    char* out[2];
    Request* sent[2] = {nullptr, nullptr};       // the send that reads out[i]
    Request* forwarded[2] = {nullptr, nullptr};  // the send that reads in[i]
    Request* recv = nullptr;
    size_t outBytes = 0, payloadBytes = 0;
    int payloadSlot = 0;
  };
  Lane lanes[64];  // CC_RING_DEPTH is at most 64; no allocation per call
  for (int j = 0; j < depth; ++j) {
    char* base = wire + 4 * static_cast<size_t>(j) * slot;
    lanes[j].in[0] = base;
    lanes[j].in[1] = base + slot;
    lanes[j].out[0] = base + 2 * slot;
    lanes[j].out[1] = base + 3 * slot;
    lanes[j].step = 2 * (n - 1);  // idle until started
  }
  Inflight io(comm, kind);
  // Reduce-scatter step s of lane L: send chunk r-s (encoded at s = 0, the previous hop's result after) from
  // out[s % 2]; receive chunk r-s-1 into in[s % 2].
  auto postReduce = [&](Lane& L, int s) -> ccResult_t {
    Slice o = ChunkSlice(count, n, Mod(r - s, n), L.k, sliceElems);
    Slice i = ChunkSlice(count, n, Mod(r - s - 1, n), L.k, sliceElems);
    const uint64_t tag = Tag(seq, L.k * steps + static_cast<uint64_t>(s));
    if (i.count > 0) CC_CHECK(io.Recv(prev, L.in[s % 2], codec.HopBytes(i.offset, i.count), tag, &L.recv));
    if (o.count > 0) CC_CHECK(io.Send(next, L.out[s % 2], L.outBytes, tag, &L.sent[s % 2]));
    return ccSuccess;
  };
  // All-gather step t of lane L: send chunk r+1-t (the owner's payload at t = 0, then the one received at t-1,
  // forwarded unchanged); receive chunk r-t into in[t % 2].
  auto gatherTag = [&](const Lane& L, int t) { return Tag(seq, L.k * steps + static_cast<uint64_t>(n - 1 + t)); };
  auto postGatherRecv = [&](Lane& L, int t) -> ccResult_t {
    Slice i = ChunkSlice(count, n, Mod(r - t, n), L.k, sliceElems);
    CC_CHECK(io.Wait(&L.forwarded[t % 2]));  // in[t % 2] is being forwarded from step t - 2
    if (i.count > 0) {
      CC_CHECK(io.Recv(prev, L.in[t % 2], codec.GatherBytes(i.offset, i.count), gatherTag(L, t), &L.recv));
    }
    return ccSuccess;
  };
  auto postGatherSend = [&](Lane& L, int t) -> ccResult_t {
    Slice o = ChunkSlice(count, n, Mod(r + 1 - t, n), L.k, sliceElems);
    if (o.count == 0) return ccSuccess;
    if (t == 0) return io.Send(next, L.out[L.payloadSlot], L.payloadBytes, gatherTag(L, 0), &L.sent[L.payloadSlot]);
    return io.Send(next, L.in[(t - 1) % 2], codec.GatherBytes(o.offset, o.count), gatherTag(L, t),
                   &L.forwarded[(t - 1) % 2]);
  };
  // Starts slice k on lane L once the sends still reading its slots (from its previous slice) are gone.
  auto start = [&](Lane& L, size_t k) -> ccResult_t {
    for (Request** q : {&L.sent[0], &L.sent[1], &L.forwarded[0], &L.forwarded[1]}) CC_CHECK(io.Wait(q));
    L.k = k;
    L.step = 0;
    L.outBytes = 0;
    Slice first = ChunkSlice(count, n, r, L.k, sliceElems);
    if (first.count > 0) L.outBytes = codec.Hop(nullptr, 0, work + first.offset, first.offset, first.count, L.out[0]);
    return postReduce(L, 0);
  };
  // Finishes lane L's current step (its receive arrived) and posts the next one.
  auto advance = [&](Lane& L) -> ccResult_t {
    if (L.step < n - 1) {
      const int s = L.step;
      Slice i = ChunkSlice(count, n, Mod(r - s - 1, n), L.k, sliceElems);
      CC_CHECK(io.Wait(&L.recv));
      const int dst = (s + 1) % 2;
      CC_CHECK(io.Wait(&L.sent[dst]));  // out[dst] was sent two steps ago; it must be gone before it is rewritten
      const void* arrived = L.in[s % 2];
      if (i.count == 0) {
        L.outBytes = 0;
      } else if (s < n - 2) {
        L.outBytes = codec.Hop(&arrived, 1, work + i.offset, i.offset, i.count, L.out[dst]);
      } else {
        // The last step's result is the owner's all-gather payload of chunk r+1; the owner decodes it too.
        L.payloadBytes = codec.ReduceFinal(&arrived, 1, work + i.offset, i.offset, i.count, L.out[dst]);
        codec.DecodeGather(L.out[dst], i.offset, i.count, work + i.offset);
      }
      L.payloadSlot = dst;
      if (s < n - 2) {
        CC_CHECK(postReduce(L, s + 1));
      } else {
        CC_CHECK(postGatherRecv(L, 0));
        CC_CHECK(postGatherSend(L, 0));
      }
    } else {
      const int t = L.step - (n - 1);
      Slice i = ChunkSlice(count, n, Mod(r - t, n), L.k, sliceElems);
      CC_CHECK(io.Wait(&L.recv));
      const bool more = t + 1 < n - 1;
      if (more) CC_CHECK(postGatherSend(L, t + 1));  // forward in[t % 2] at once; decoding only reads it
      if (i.count > 0) codec.DecodeGather(L.in[t % 2], i.offset, i.count, work + i.offset);
      if (more) CC_CHECK(postGatherRecv(L, t + 1));
    }
    ++L.step;
    return ccSuccess;
  };
  const int lastStep = 2 * (n - 1);
  size_t nextSlice = 0;
  int busy = 0;
  for (int j = 0; j < depth && nextSlice < rounds; ++j, ++busy) CC_CHECK(start(lanes[j], nextSlice++));
  while (busy > 0) {
    for (int j = 0; j < depth; ++j) {
      Lane& L = lanes[j];
      if (L.step == lastStep) continue;  // idle: no slice left for it
      CC_CHECK(advance(L));
      if (L.step < lastStep) continue;
      if (nextSlice < rounds) {
        CC_CHECK(start(L, nextSlice++));
      } else {
        --busy;
      }
    }
  }
  return io.WaitAll();
}

// The double binary tree with a codec. Per slice and tree: children's partial results come up (Hop at every node,
// ReduceFinal at the root, which decodes its own payload), then the root's payload goes down unchanged and every
// rank decodes it. Slices run one after the other (the tree serves small messages; the ring pipelines large ones).
// `wire` has eight slots: per tree two for the children, one for the message up, one for the payload.
ccResult_t CompressedTree(ccComm* comm, Codec& codec, WireKind kind, float* work, size_t count, char* wire,
                          size_t slot) {
  const int n = comm->nranks;
  const uint64_t seq = ++comm->seq;
  const size_t sliceElems = std::max<size_t>(1, comm->config.sliceBytes / sizeof(float));
  TreeNode nodes[2];
  DoubleBinaryTree(n, comm->rank, nodes);
  size_t off[2], cnt[2], slices[2];
  for (int t = 0; t < 2; ++t) {
    off[t] = PartOffset(count, 2, t);
    cnt[t] = PartSize(count, 2, t);
    slices[t] = (cnt[t] + sliceElems - 1) / sliceElems;
  }
  auto at = [&](int t, int i) { return wire + (4 * t + i) * slot; };  // i: 0,1 children, 2 up, 3 payload
  Inflight io(comm, kind);
  for (size_t k = 0; k < std::max(slices[0], slices[1]); ++k) {
    size_t o[2], len[2];
    for (int t = 0; t < 2; ++t) {
      o[t] = off[t] + k * sliceElems;
      len[t] = k < slices[t] ? std::min(sliceElems, cnt[t] - k * sliceElems) : 0;
    }
    for (int t = 0; t < 2; ++t) {  // up
      if (len[t] == 0) continue;
      const TreeNode& node = nodes[t];
      Request* recv[2] = {nullptr, nullptr};
      const void* arrived[2];
      int nin = 0;
      for (int c = 0; c < 2; ++c) {
        if (node.children[c] < 0) continue;
        CC_CHECK(io.Recv(node.children[c], at(t, c), codec.HopBytes(o[t], len[t]), Tag(seq, k * 4 + t * 2), &recv[c]));
        arrived[nin++] = at(t, c);
      }
      for (int c = 0; c < 2; ++c) CC_CHECK(io.Wait(&recv[c]));
      if (node.parent >= 0) {
        size_t bytes = codec.Hop(arrived, nin, work + o[t], o[t], len[t], at(t, 2));
        Request* up = nullptr;
        CC_CHECK(io.Send(node.parent, at(t, 2), bytes, Tag(seq, k * 4 + t * 2), &up));
      } else {
        codec.ReduceFinal(arrived, nin, work + o[t], o[t], len[t], at(t, 3));
        codec.DecodeGather(at(t, 3), o[t], len[t], work + o[t]);
      }
    }
    for (int t = 0; t < 2; ++t) {  // down
      if (len[t] == 0) continue;
      const TreeNode& node = nodes[t];
      const size_t bytes = codec.GatherBytes(o[t], len[t]);
      if (node.parent >= 0) {
        Request* recv = nullptr;
        CC_CHECK(io.Recv(node.parent, at(t, 3), bytes, Tag(seq, k * 4 + t * 2 + 1), &recv));
        CC_CHECK(io.Wait(&recv));
        codec.DecodeGather(at(t, 3), o[t], len[t], work + o[t]);
      }
      for (int c = 0; c < 2; ++c) {
        if (node.children[c] < 0) continue;
        Request* down = nullptr;
        CC_CHECK(io.Send(node.children[c], at(t, 3), bytes, Tag(seq, k * 4 + t * 2 + 1), &down));
      }
    }
    CC_CHECK(io.WaitAll());  // every slot is free for the next slice
  }
  return io.WaitAll();
}

}  // namespace

ccResult_t AgreeMeta(ccComm* comm, std::vector<float>* meta, ccRedOp_t op) {
  if (meta->empty()) return ccSuccess;
  CollArgs m;
  m.send = meta->data();
  m.recv = meta->data();
  m.count = meta->size();
  m.dtype = ccFloat32;
  m.op = op;
  m.eltSize = sizeof(float);
  return RingAllReduce(comm, m);
}

// Runs the codec over `work` with the communicator's all-reduce algorithm, sizing the compressor's wire scratch
// once for this communicator's slices.
ccResult_t RunCodec(ccComm* comm, ccCompressor* c, Codec& codec, float* work, size_t count,
                    const std::function<char*(size_t bytes)>& hostWire) {
  const size_t sliceElems = std::max<size_t>(1, comm->config.sliceBytes / sizeof(float));
  const size_t slot = (codec.MaxWireBytes(sliceElems) + 63) & ~size_t{63};
  // The ring's lanes take four slots each (at most as many lanes as slices); the tree takes eight.
  const size_t rounds = (PartSize(count, comm->nranks, 0) + sliceElems - 1) / sliceElems;
  const int depth = static_cast<int>(std::max<size_t>(1, std::min<size_t>(comm->config.ringDepth, rounds)));
  const size_t slots = std::max<size_t>(8, 4 * static_cast<size_t>(depth));
  char* wire = nullptr;
  if (hostWire) {
    wire = hostWire(slots * slot);
  } else {
    if (c->wire.size() < slots * slot) c->wire.assign(slots * slot, 0);
    wire = c->wire.data();
  }
  CollArgs shape;
  shape.count = count;
  shape.eltSize = sizeof(float);
  const WireKind kind = static_cast<WireKind>(kWireCodecBase + c->kind);
  if (ChooseAllReduceAlgo(comm, shape) == ccAlgoTree) {
    return CompressedTree(comm, codec, kind, work, count, wire, slot);
  }
  return CompressedRing(comm, codec, kind, work, count, wire, slot, depth);
}

namespace {

// bfloat16 and float16 data: the float32 call on a widened copy, narrowed into recv (compress/widen.h).
ccResult_t WidenedAllReduce(ccComm* comm, const CollArgs& a, ccCompressor* c) {
#ifdef CCOLL_HAVE_CUDA
  if (a.onDevice) return DeviceWidenedAllReduce(comm, a, c);
#endif
  c->widened.resize(a.count);  // grows to the bucket once, then is reused
  Widen(a.dtype, a.send, a.count, c->widened.data());
  CollArgs w = a;
  w.send = w.recv = c->widened.data();
  w.dtype = ccFloat32;
  w.eltSize = sizeof(float);
  CC_CHECK(CompressedAllReduce(comm, w, c));
  Narrow(a.dtype, c->widened.data(), a.count, a.recv);
  return ccSuccess;
}

}  // namespace

ccResult_t CompressedAllReduce(ccComm* comm, const CollArgs& a, ccCompressor* c) {
  // 16-bit data: the host codec ring below widens and narrows itself (quant's lazy rotation does it block by block
  // inside the ring), and so do the sparsifiers (SparseAllReduce) and PowerSGD (LowRankAllReduce); the device codecs
  // run the float32 call on a widened copy.
  const bool half = a.dtype != ccFloat32;
  const bool sends = comm->nranks > 1 && a.count > 0;
  const bool codecRing = (c->kind == ccCompressQuant || c->kind == ccCompressCast16) && sends;
  const bool sparse = (c->kind == ccCompressTopkChunk || c->kind == ccCompressRandk) && sends;
  const bool lowRank = c->kind == ccCompressPowerSGD && sends;
  if (half && (a.onDevice || !(codecRing || sparse || lowRank))) return WidenedAllReduce(comm, a, c);
  c->boundCount = a.count;  // the entry point refused any other count once bound
  CodecCall call;
  call.rank = comm->rank;
  call.nranks = comm->nranks;
  call.seed = static_cast<uint64_t>(c->Get(ccParamSeed));
  call.call = c->calls++;
#ifdef CCOLL_HAVE_CUDA
  if (a.onDevice) return DeviceCompressedAllReduce(comm, a, c, call);
#endif
  if (comm->nranks == 1 || a.count == 0) {
    // Nothing to communicate: the exact result (sum or average of one rank is its input).
    if (a.recv != a.send) std::memmove(a.recv, a.send, a.count * sizeof(float));
    return ccSuccess;
  }
  if (c->kind == ccCompressTopkChunk || c->kind == ccCompressRandk) return SparseAllReduce(comm, a, c, call);
#ifdef CCOLL_HAVE_LOWRANK
  if (c->kind == ccCompressPowerSGD) return LowRankAllReduce(comm, a, c, call);
#endif
  std::unique_ptr<Codec> codec = c->kind == ccCompressQuant
                                     ? MakeQuantCodec(*c, call)
                                     : MakeCast16Codec(static_cast<ccDataType_t>(c->Get(ccParamValueType)), call);
  // The user's output doubles as the rotated working copy; 16-bit data has a float32 one of its own.
  float* work = static_cast<float*>(a.recv);
  const float* input = static_cast<const float*>(a.send);
  if (half) {
    c->widened.resize(a.count);  // grows to the bucket once, then is reused
    work = c->widened.data();
  }
  std::vector<float> meta;
  codec->PipelinePrepareAndFinish(a.op == ccAvg);  // the ring and the tree keep its pointer rules
  const bool halfInside = half && codec->PipelineHalfData(a.dtype, a.send, a.recv);
  if (half && !halfInside) {
    Widen(a.dtype, a.send, a.count, work);
    input = work;
  }
  codec->Prepare(input, work, a.count, &meta);
  CC_CHECK(AgreeMeta(comm, &meta, codec->MetaOp()));
  codec->SetMeta(meta);
  CC_CHECK(RunCodec(comm, c, *codec, work, a.count));
  codec->Finish(work, a.count, a.op == ccAvg);
  if (half && !halfInside) Narrow(a.dtype, work, a.count, a.recv);
  return ccSuccess;
}

}  // namespace ccoll
