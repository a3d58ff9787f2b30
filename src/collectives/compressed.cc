#include "collectives/compressed.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
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
  const uint64_t seq = comm->NextSeq();
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
  const uint64_t seq = comm->NextSeq();
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

std::atomic<int> gSegmentsForTesting{0};
std::atomic<uint64_t> gSegmentedCalls{0};

// A codec's view of one segment of the buffer, for a schedule that runs over the segment alone: the offsets the
// schedule passes are the segment's, the codec's are the buffer's.
class SegmentView : public Codec {
 public:
  SegmentView(Codec& codec, size_t base) : codec_(codec), base_(base) {}
  size_t MaxWireBytes(size_t len) const override { return codec_.MaxWireBytes(len); }
  size_t HopBytes(size_t off, size_t len) const override { return codec_.HopBytes(base_ + off, len); }
  size_t GatherBytes(size_t off, size_t len) const override { return codec_.GatherBytes(base_ + off, len); }
  void Prepare(const float*, float*, size_t, std::vector<float>*) override {}  // done by segments, by the caller
  size_t Hop(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
             void* wireOut) override {
    return codec_.Hop(wiresIn, nin, local, base_ + off, len, wireOut);
  }
  size_t ReduceFinal(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                     void* wireOut) override {
    return codec_.ReduceFinal(wiresIn, nin, local, base_ + off, len, wireOut);
  }
  void DecodeGather(const void* wire, size_t off, size_t len, float* out) override {
    codec_.DecodeGather(wire, base_ + off, len, out);
  }
  void Finish(float*, size_t, bool) override {}  // done by the caller, once

 private:
  Codec& codec_;
  const size_t base_;
};

// One segment's pre-pass (Codec::PrepareRange), piece by piece: run in the waits for the network of the segment
// before it (core/comm.h's IdleScope), then finished by the caller.
class SegmentPrepare : public IdleWork {
 public:
  SegmentPrepare(Codec& codec, size_t begin, size_t end, size_t piece)
      : codec_(codec), begin_(begin), end_(end), piece_(piece), at_(begin), meta_(codec.MetaCount(begin, end)) {}

  bool RunPiece() override {
    if (at_ == end_) return false;
    const size_t to = std::min(end_, at_ + piece_);
    codec_.PrepareRange(at_, to, meta_.data() + codec_.MetaCount(begin_, at_));
    at_ = to;
    return at_ < end_;
  }
  void Finish() {
    while (RunPiece()) {
    }
  }
  std::vector<float>& meta() { return meta_; }

 private:
  Codec& codec_;
  const size_t begin_, end_, piece_;
  size_t at_;
  std::vector<float> meta_;
};

// The call in segments, each its own schedule after the agreement of its metadata, with the next segment's pre-pass
// in this one's waits for the network: of the pre-pass, only the first segment's holds up the transfers. The bytes
// are those of one schedule over the whole buffer (Codec::SegmentAlign).
ccResult_t RunInSegments(ccComm* comm, ccCompressor* c, Codec& codec, const float* input, float* work, size_t count,
                         size_t align, int segments) {
  codec.BeginSegments(input, work, count);
  std::vector<size_t> bounds = {0};
  for (int k = 1; k < segments; ++k) {
    const size_t b = count / static_cast<size_t>(segments) * static_cast<size_t>(k) / align * align;
    if (b > bounds.back()) bounds.push_back(b);
  }
  bounds.push_back(count);
  const size_t piece = std::max<size_t>(1, 16384 / align) * align;  // tens of microseconds of rotation
  auto prepare = std::make_unique<SegmentPrepare>(codec, bounds[0], bounds[1], piece);
  prepare->Finish();
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    std::vector<float> meta = std::move(prepare->meta());
    CC_CHECK(AgreeMeta(comm, &meta, codec.MetaOp()));
    codec.SetMetaRange(bounds[s], bounds[s + 1], meta.data());
    const bool last = s + 2 == bounds.size();
    prepare = std::make_unique<SegmentPrepare>(codec, bounds[s + 1], last ? bounds[s + 1] : bounds[s + 2], piece);
    {
      IdleScope whileWaiting(comm, prepare.get());
      SegmentView view(codec, bounds[s]);
      CC_CHECK(RunCodec(comm, c, view, work + bounds[s], bounds[s + 1] - bounds[s]));
    }
    prepare->Finish();
  }
  return ccSuccess;
}

// How many segments a call of `count` elements runs in when its codec's pre-pass splits: over a network, one per
// 8 Mi elements, at least 2 from 1 Mi elements and at most 8; between thread ranks nothing waits for a network to hide
// a pre-pass behind, so one. Device codecs run one ring, and the ranks must exchange the same messages whatever their
// buffers: so one also where a rank may run this call in one. The call check tells (a.everyRankOnHost); without it,
// one wherever any rank may make device calls (ccComm::anyRankOnDevice).
// Each segment hides all but the first segment's pre-pass, and costs a metadata agreement and the schedule's start
// and end once more, during which the links idle. On 4 ranks at 1 Gbit/s (perf/netbench, burst 64kb: at most 0.52
// ms of an idle gap forgiven), 4-bit homomorphic codes took, median of 3: 16 MiB 48.0, 47.2, 50.7 and 49.9 ms in 1,
// 2, 4 and 8 segments; 64 MiB 191, 186, 189, 193, 203 and 200 ms in 1, 2, 4, 8, 16 and 32; 256 MiB 724, 721, 740,
// 765 and 774 ms in 4, 8, 16, 32 and 64 (perf/netbench/results/2026-12-07_burst.md). The earlier rule, one per
// 512 Ki elements up to 64, was chosen where the shaper forgave up to 2.1 ms of each idle gap.
int SegmentsOf(const ccComm& comm, const CollArgs& a) {
  const int forced = gSegmentsForTesting.load();
  if (forced > 0) return forced;
  if (!WaitsRunIdleWork(comm) || (comm.anyRankOnDevice && !a.everyRankOnHost)) return 1;
  if (a.count < (size_t{1} << 20)) return 1;
  return static_cast<int>(std::clamp<size_t>(a.count >> 23, 2, 8));
}

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
  w.narrowedTo = a.dtype;
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
  const size_t align = codec->SegmentAlign();
  const int segments = align != 0 ? SegmentsOf(*comm, a) : 1;
  if (segments > 1) {
    gSegmentedCalls.fetch_add(1, std::memory_order_relaxed);
    CC_CHECK(RunInSegments(comm, c, *codec, input, work, a.count, align, segments));
  } else {
    codec->Prepare(input, work, a.count, &meta);
    CC_CHECK(AgreeMeta(comm, &meta, codec->MetaOp()));
    codec->SetMeta(meta);
    CC_CHECK(RunCodec(comm, c, *codec, work, a.count));
  }
  codec->Finish(work, a.count, a.op == ccAvg);
  if (half && !halfInside) Narrow(a.dtype, work, a.count, a.recv);
  return ccSuccess;
}

void SetCodecSegmentsForTesting(int segments) { gSegmentsForTesting = segments; }

uint64_t SegmentedCallsForTesting() { return gSegmentedCalls.load(); }

}  // namespace ccoll
