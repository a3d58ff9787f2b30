#include "collectives/stream_compressed.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "collectives/device_compressed.h"
#include "collectives/device_prepare.h"
#include "collectives/sparse.h"
#include "collectives/stream_collectives.h"
#include "compress/codec_cuda.h"
#include "compress/compressor.h"
#include "compress/device_codec.h"
#ifdef CCOLL_HAVE_CUBLAS
#include "compress/lowrank.h"
#include "compress/lowrank_cuda.h"
#endif
#include "compress/rng.h"
#include "compress/sparse.h"
#include "compress/widen.h"
#include "core/comm.h"
#include "core/device_scope.h"
#include "core/error.h"

namespace ccoll {
namespace {

// One step's group of transfers, counted in the communicator's traffic.
ccResult_t Exchange(ccComm* comm, const StreamTransfer* x, size_t k, ccStream_t stream) {
  CC_CHECK(comm->streamTransport->Group(x, k, stream));
  for (size_t i = 0; i < k; ++i) {
    (x[i].send ? comm->bytesSent : comm->bytesReceived).fetch_add(x[i].bytes, std::memory_order_relaxed);
  }
  return ccSuccess;
}

// The codec ring of the file comment, queued on `stream`. `wire` holds four slots of `slot` bytes: two for arriving
// messages, two for leaving ones. Stream order makes every slot's reuse safe: a step's transfers finish before its
// kernels start, and those before the next step's transfers.
ccResult_t StreamRing(ccComm* comm, DeviceCodec& codec, float* work, size_t count, char* wire, size_t slot,
                      ccStream_t stream) {
  const int n = comm->nranks, r = comm->rank;
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  auto chunk = [&](int c) {
    const int i = Mod(c, n);
    return Slice{PartOffset(count, n, i), PartSize(count, n, i)};
  };
  char* in[2] = {wire, wire + slot};
  char* out[2] = {wire + 2 * slot, wire + 3 * slot};
  // Reduce-scatter step s: send chunk r-s (this rank's own, encoded, at s = 0; the previous hop's result after),
  // receive chunk r-s-1 and add this rank's part of it.
  Slice own = chunk(r);
  size_t outBytes = own.count > 0 ? codec.Hop(nullptr, 0, work + own.offset, own.offset, own.count, out[0]) : 0;
  int payloadSlot = 0;
  size_t payloadBytes = 0;
  for (int s = 0; s < n - 1; ++s) {
    const Slice o = chunk(r - s), i = chunk(r - s - 1);
    StreamTransfer x[2];
    size_t k = 0;
    if (o.count > 0) x[k++] = StreamTransfer{true, next, out[s % 2], outBytes};
    if (i.count > 0) x[k++] = StreamTransfer{false, prev, in[s % 2], codec.HopBytes(i.offset, i.count)};
    CC_CHECK(Exchange(comm, x, k, stream));
    const void* arrived = in[s % 2];
    const int dst = (s + 1) % 2;
    if (i.count == 0) {
      outBytes = 0;
    } else if (s < n - 2) {
      outBytes = codec.Hop(&arrived, 1, work + i.offset, i.offset, i.count, out[dst]);
    } else {
      // The last addition: chunk r+1 is complete here; its payload is what every rank decodes, this one included.
      payloadBytes = codec.ReduceFinal(&arrived, 1, work + i.offset, i.offset, i.count, out[dst]);
      codec.DecodeGather(out[dst], i.offset, i.count, work + i.offset);
      payloadSlot = dst;
    }
  }
  // All-gather step t: send chunk r+1-t (the payload at t = 0, then what arrived at t-1, unchanged), receive chunk r-t.
  for (int s = 0; s < n - 1; ++s) {
    const Slice o = chunk(r + 1 - s), i = chunk(r - s);
    StreamTransfer x[2];
    size_t k = 0;
    if (o.count > 0) {
      char* src = s == 0 ? out[payloadSlot] : in[(s - 1) % 2];
      x[k++] = StreamTransfer{true, next, src, s == 0 ? payloadBytes : codec.GatherBytes(o.offset, o.count)};
    }
    if (i.count > 0) x[k++] = StreamTransfer{false, prev, in[s % 2], codec.GatherBytes(i.offset, i.count)};
    CC_CHECK(Exchange(comm, x, k, stream));
    if (i.count > 0) codec.DecodeGather(in[s % 2], i.offset, i.count, work + i.offset);
  }
  return ccSuccess;
}

// Wire slots: four of the largest chunk's message (chunk 0 is the largest).
size_t SlotBytes(const DeviceCodec& codec, size_t count, int nranks) {
  return (codec.MaxWireBytes(PartSize(count, nranks, 0)) + 255) & ~size_t{255};
}

// The float32 call: work (the output) holds the prepared input, then the sum, then the result.
ccResult_t Float32Call(ccComm* comm, const float* input, float* work, size_t count, bool average, ccCompressor* c,
                       const CodecCall& call, DeviceCodecState* st, ccStream_t stream) {
  std::unique_ptr<DeviceCodec> codec = MakeDeviceCodec(*c, call, st);
  std::vector<float> unused;
  codec->PipelinePrepareAndFinish(average);  // StreamRing keeps its pointer rules
  codec->Prepare(input, work, count, &unused);
  size_t metaCount = 0;
  float* meta = codec->DeviceMeta(&metaCount);
  if (metaCount > 0) {
    CC_CHECK(StreamExactCall(comm, StreamKind::kAllReduce, meta, meta, metaCount, ccFloat32, codec->MetaOp(), 0,
                             stream));
  }
  const size_t slot = SlotBytes(*codec, count, comm->nranks);
  char* wire = static_cast<char*>(st->deviceWire.Reserve(4 * slot));
  CC_CHECK(StreamRing(comm, *codec, work, count, wire, slot, stream));
  codec->Finish(work, count, average);
  return ccSuccess;
}

// The sparsifiers' sizes for one call: chunks, the kept ones, and the packed values rounded up to whole chunks (a short
// last chunk, if chosen, is padded with zeros, so that the size is known before the choice is), plus randk's mark;
// whether the scratch after them keeps what 16-bit roundings take (error feedback with 16-bit values or data); and,
// for 16-bit data (resultType), room for the result's rounding: what it rounds away, and the narrowed values.
struct SparsePlan {
  size_t chunk, chunks, keep, padded, values;
  bool mark, keepRounding, outRounding;
  // Floats of DeviceCodecState::packed: the values, what is lost, what the result's narrowing loses, its 16-bit
  // values (two to a float).
  size_t Scratch() const {
    return values + (keepRounding ? values : 0) + (outRounding ? values + (values + 1) / 2 : 0);
  }
};

SparsePlan PlanSparse(const ccCompressor& c, size_t count, ccDataType_t resultType) {
  SparsePlan p;
  p.chunk = static_cast<size_t>(c.Get(ccParamChunkSize));
  p.chunks = ChunkCount(count, p.chunk);
  p.keep = KeptChunks(p.chunks, c.Get(ccParamDensityPpm));
  p.padded = p.keep * p.chunk;
  p.mark = c.kind == ccCompressRandk;
  p.values = p.padded + (p.mark ? 1 : 0);
  p.keepRounding = SparseKeepsRounding(c, resultType);
  p.outRounding = p.keepRounding && resultType != ccFloat32;
  return p;
}

// topk and randk, as SparseAllReduce does them, with every step on the device and on the stream: the error feedback,
// the chunk norms summed with the transport's all-reduce (topk), the choice (CUB's radix sort: the bytes of the host's
// TopChunks and RandomChunks), the gather, the sum of the chosen chunks over the ranks (the transport's exact
// all-reduce for float32 values, the cast codec ring for 16-bit ones), the scaling, the scatter, and what leaves the
// memory. randk's mark: one element more that is NaN where a rank's input was not finite, so every rank poisons its
// whole result alike. The sum's order is NCCL's (float32) or the ring's over the padded values, so the bytes are not
// the host path's, but they are the same on every rank.
ccResult_t SparseCall(ccComm* comm, const float* input, float* out, size_t count, bool average,
                      ccDataType_t resultType, ccCompressor* c, const CodecCall& call, DeviceCodecState* st,
                      ccStream_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const SparsePlan p = PlanSparse(*c, count, resultType);
  const bool ef = c->Get(ccParamErrorFeedback) != 0;
  const float* x = input;
  float* e = nullptr;
  if (ef) {
    e = st->ErrorFeedback(count);
    x = e;
  }
  uint32_t* chosen = st->index.Reserve<uint32_t>(p.keep);
  void* scratch = st->choice.Reserve(gpu::ChooseChunksScratchBytes(p.chunks));
  if (c->kind == ccCompressTopkChunk) {
    float* norms = st->vals.Reserve<float>(p.chunks);
    // With error feedback, the memory's add and the norms in one pass.
    CheckLaunch(ef ? gpu::AddIntoChunkNorms(e, input, count, p.chunk, norms, s)
                   : gpu::ChunkNorms(x, count, p.chunk, norms, s));
    CC_CHECK(StreamExactCall(comm, StreamKind::kAllReduce, norms, norms, p.chunks, ccFloat32, ccSum, 0, stream));
    CheckLaunch(gpu::ChooseTopChunks(norms, p.chunks, p.keep, scratch, chosen, s));
  } else {
    if (ef) CheckLaunch(gpu::AddInto(e, input, count, s));
    const uint32_t key = StreamKey(call.seed, call.call, ~0u, kPurposeChunks);
    CheckLaunch(gpu::ChooseRandomChunks(p.chunks, p.keep, key, scratch, chosen, s));
  }
  const ccDataType_t valueType = static_cast<ccDataType_t>(c->Get(ccParamValueType));
  // The chosen values; then, with error feedback and 16-bit values or data, what 16-bit roundings take on this rank.
  float* packed = st->packed.Reserve<float>(p.Scratch());
  float* lost = p.keepRounding ? packed + p.values : nullptr;
  CheckLaunch(gpu::GatherChunks(x, count, p.chunk, chosen, p.padded, packed, s));
  if (p.mark) {
    CheckCuda(cudaMemsetAsync(packed + p.padded, 0, sizeof(float), s), "cudaMemsetAsync (non-finite mark)");
    CheckLaunch(gpu::MarkNonFinite(input, count, packed + p.padded, s));
  }
  if (valueType == ccFloat32) {
    CC_CHECK(StreamExactCall(comm, StreamKind::kAllReduce, packed, packed, p.values, ccFloat32, ccSum, 0, stream));
  } else {
    std::unique_ptr<DeviceCodec> codec = MakeDeviceCodec(*c, call, st, lost);  // the cast codec, the values' type
    const size_t slot = SlotBytes(*codec, p.values, comm->nranks);
    char* wire = static_cast<char*>(st->deviceWire.Reserve(4 * slot));
    CC_CHECK(StreamRing(comm, *codec, packed, p.values, wire, slot, stream));
  }
  float scale = 1.0f;
  if (c->kind == ccCompressRandk && c->Get(ccParamUnbiased) != 0) {
    scale = static_cast<float>(static_cast<double>(p.chunks) / static_cast<double>(p.keep));
  }
  if (average) scale /= static_cast<float>(comm->nranks);
  if (scale != 1.0f) CheckLaunch(gpu::Scale(packed, p.padded, scale, false, s));
  if (p.outRounding) {
    // What the result's narrowing to 16 bits (below, by the caller) rounds away, each rank its share, as
    // SumChosenChunks keeps it on the host: the cast codec's hop without arriving messages is that narrowing. Added
    // to what the 16-bit sums rounded away, or alone after float32 sums (which lose nothing).
    const bool add = valueType != ccFloat32;
    float* outLost = add ? lost + p.values : lost;
    void* narrowed = lost + 2 * p.values;
    CheckLaunch(gpu::CastHop(resultType, nullptr, 0, packed, p.padded, narrowed, outLost, s));
    const float share = OutputRoundingShare(*c, p.chunks, p.keep, average, comm->nranks);
    if (share != 1.0f) CheckLaunch(gpu::Scale(outLost, p.padded, share, false, s));
    CheckLaunch(gpu::DropNonFinite(outLost, p.padded, s));  // a result that overflows 16 bits: nothing to keep
    if (add) CheckLaunch(gpu::AddInto(lost, outLost, p.padded, s));
  }
  CheckCuda(cudaMemsetAsync(out, 0, count * sizeof(float), s), "cudaMemsetAsync (result)");
  CheckLaunch(gpu::ScatterChunks(packed, count, p.chunk, chosen, p.padded, out, s));
  if (p.mark) CheckLaunch(gpu::PoisonIfMarked(out, count, packed + p.padded, s));
  if (ef) {
    // What was sent leaves the memory, but for what 16-bit roundings took (scattered over the chosen chunks; zeros
    // with float32 values and data); non-finite leftovers are dropped.
    if (!p.keepRounding) {
      CheckCuda(cudaMemsetAsync(packed, 0, p.padded * sizeof(float), s), "cudaMemsetAsync (sent chunks)");
    }
    CheckLaunch(gpu::ScatterChunks(p.keepRounding ? lost : packed, count, p.chunk, chosen, p.padded, e, s));
    CheckLaunch(gpu::DropNonFinite(e, count, s));
  }
  return ccSuccess;
}

#ifdef CCOLL_HAVE_CUBLAS
// Doubles of Gram-Schmidt's scratch: the largest factor (rows x r for P, cols x r for Q) of the plan.
size_t OrthoScratch(const LowRankPlan& plan) {
  size_t most = 1;
  for (const LowRankMatrix& mt : plan.matrices) {
    most = std::max(most, static_cast<size_t>(std::max(mt.rows, mt.cols)) * static_cast<size_t>(mt.rank));
  }
  return most;
}

// The factors' sum over the ranks, in place: the transport's exact all-reduce (float32 wire), or the cast codec ring
// with a 16-bit wire (float32 accumulation), as LowRankSum does on the host.
ccResult_t FactorSum(ccComm* comm, ccCompressor* c, const CodecCall& call, DeviceCodecState* st, float* data,
                     size_t count, ccDataType_t wire, ccStream_t stream) {
  if (count == 0) return ccSuccess;
  if (wire == ccFloat32) {
    return StreamExactCall(comm, StreamKind::kAllReduce, data, data, count, ccFloat32, ccSum, 0, stream);
  }
  std::unique_ptr<DeviceCodec> codec = MakeDeviceCodec(*c, call, st);  // the cast codec with the factors' wire type
  const size_t slot = SlotBytes(*codec, count, comm->nranks);
  return StreamRing(comm, *codec, data, count, static_cast<char*>(st->deviceWire.Reserve(4 * slot)), slot, stream);
}

// PowerSGD, as LowRankAllReduce does it, with every step on the device and on the stream: the products on cuBLAS, the
// factors summed by the transport (or the cast ring), Gram-Schmidt and the start of Q in kernels (lowrank_cuda.h),
// and Q kept in device memory for the warm start. Before the start iteration: the exact all-reduce.
ccResult_t LowRankCall(ccComm* comm, const float* input, float* out, size_t count, ccRedOp_t op, ccCompressor* c,
                       const CodecCall& call, DeviceCodecState* st, ccStream_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  LowRankPlan plan;
  std::string why;
  if (!PlanLowRank(*c, count, &plan, &why)) return Fail(ccInvalidUsage, "powersgd: %s", why.c_str());
  if (call.call < static_cast<uint64_t>(c->Get(ccParamStartIter))) {
    return StreamExactCall(comm, StreamKind::kAllReduce, input, out, count, ccFloat32, op, 0, stream);
  }
  const float n = static_cast<float>(comm->nranks);
  const double eps = static_cast<double>(c->Get(ccParamOrthoEpsilon)) * 1e-12;
  const ccDataType_t wire = static_cast<ccDataType_t>(c->Get(ccParamValueType));
  const float* m = input;
  float* e = nullptr;
  if (c->Get(ccParamErrorFeedback) != 0) {
    e = st->ErrorFeedback(count);
    CheckLaunch(gpu::AddInto(e, input, count, s));
    m = e;
  }
  const std::unique_ptr<gpu::LowRankBlas> blas = st->LendBlas(s);
  float* dP = st->packed.Reserve<float>(plan.pElems + plan.exactElems);
  float* dQ = st->factors.Reserve<float>(2 * plan.qElems);
  float* dQsum = dQ + plan.qElems;
  double* w = st->ortho.Reserve<double>(OrthoScratch(plan));

  // Q: the previous call's, orthonormalized again, when it is usable; else a fresh random one.
  const bool warm = c->Get(ccParamWarmStart) != 0 && st->deviceQElems == plan.qElems;
  for (size_t t = 0; t < plan.matrices.size(); ++t) {
    const LowRankMatrix& mt = plan.matrices[t];
    const uint32_t key = StreamKey(call.seed, call.call, ~0u, kPurposeLowRank + static_cast<uint32_t>(t << 8));
    CheckLaunch(gpu::StartQOnDevice(dQ + mt.qOffset, mt.cols, mt.rank, key, warm, eps, w, s));
  }
  // Round 1: every P, then the exact parts, summed; P orthonormalized.
  for (const LowRankMatrix& mt : plan.matrices) {
    CheckLaunch(blas->ProductMQ(m + mt.offset, mt.rows, mt.cols, dQ + mt.qOffset, mt.rank, dP + mt.pOffset));
  }
  size_t at = plan.pElems;
  for (const auto& [offset, length] : plan.exact) {
    CheckCuda(cudaMemcpyAsync(dP + at, m + offset, length * sizeof(float), cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync (exact part)");
    at += length;
  }
  if (wire == ccFloat32) {
    CC_CHECK(FactorSum(comm, c, call, st, dP, plan.pElems + plan.exactElems, ccFloat32, stream));
  } else {
    CC_CHECK(FactorSum(comm, c, call, st, dP, plan.pElems, wire, stream));
    CC_CHECK(FactorSum(comm, c, call, st, dP + plan.pElems, plan.exactElems, ccFloat32, stream));
  }
  for (const LowRankMatrix& mt : plan.matrices) {
    CheckLaunch(gpu::OrthogonalizeOnDevice(dP + mt.pOffset, mt.rows, mt.rank, eps, w, s));
  }
  // Round 2: Q = M^T P, summed; its average is the result's Q and the next call's warm start.
  for (const LowRankMatrix& mt : plan.matrices) {
    CheckLaunch(blas->ProductMtP(m + mt.offset, mt.rows, mt.cols, dP + mt.pOffset, mt.rank, dQsum + mt.qOffset));
  }
  CC_CHECK(FactorSum(comm, c, call, st, dQsum, plan.qElems, wire, stream));
  if (plan.qElems > 0) {
    CheckCuda(cudaMemcpyAsync(dQ, dQsum, plan.qElems * sizeof(float), cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync (Q)");
    CheckLaunch(gpu::Scale(dQ, plan.qElems, n, true, s));
  }
  st->deviceQElems = plan.qElems;

  // The result (M is not read after this point except by the error feedback, so out may be the input).
  for (const LowRankMatrix& mt : plan.matrices) {
    CheckLaunch(blas->ProductPQt(dP + mt.pOffset, dQ + mt.qOffset, mt.rows, mt.cols, mt.rank, out + mt.offset));
  }
  at = plan.pElems;
  for (const auto& [offset, length] : plan.exact) {
    CheckCuda(cudaMemcpyAsync(out + offset, dP + at, length * sizeof(float), cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync (exact part out)");
    if (op == ccAvg) CheckLaunch(gpu::Scale(out + offset, length, n, true, s));
    at += length;
  }
  for (const LowRankMatrix& mt : plan.matrices) {
    const size_t elems = static_cast<size_t>(mt.rows) * static_cast<size_t>(mt.cols);
    // What the average did not carry stays for the next call; the exact parts lost nothing. (16-bit data: the
    // caller's NarrowResult adds what narrowing the result rounds away.)
    if (e != nullptr) CheckLaunch(gpu::KeepResidual(e + mt.offset, out + mt.offset, elems, s));
    if (op == ccSum) CheckLaunch(gpu::Scale(out + mt.offset, elems, n, false, s));
  }
  if (e != nullptr) {
    for (const auto& [offset, length] : plan.exact) {
      CheckCuda(cudaMemsetAsync(e + offset, 0, length * sizeof(float), s), "cudaMemsetAsync (exact part)");
    }
  }
  return ccSuccess;
}
#endif

// Whether `stream` is being captured into a CUDA graph.
ccResult_t Capturing(const ccComm* comm, cudaStream_t stream, bool* capturing) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(stream, &status);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Fail(ccUnhandledCudaError, "rank %d: cudaStreamIsCapturing failed: %s", comm->rank, cudaGetErrorString(e));
  }
  *capturing = status != cudaStreamCaptureStatusNone;
  return ccSuccess;
}

CodecCall CallOf(const ccComm* comm, const ccCompressor& c) {
  CodecCall call;
  call.rank = comm->rank;
  call.nranks = comm->nranks;
  call.seed = static_cast<uint64_t>(c.Get(ccParamSeed));
  call.call = c.calls;
  return call;
}

// Ends a call that threw part way: what it queued on the caller's stream may still run, so the state's own stream,
// where its scratch is freed, still waits for it (EndCallOnStream); if even that fails, the state is back on its own
// stream.
void EndAfterFailure(DeviceCodecState* st) {
  if (st == nullptr) return;
  try {
    st->EndCallOnStream();
  } catch (const DeviceCodecError&) {
    // EndCallOnStream has left the call before it failed
  }
}

// Runs `work` on the compressor's device state in a stream-ordered call on `stream`: DeviceCodecError becomes
// ccUnhandledCudaError, ScratchFrozenError ccInvalidUsage, and any other exception ccSystemError.
template <typename Work>
ccResult_t OnState(ccComm* comm, ccCompressor* c, ccStream_t stream, Work&& work) {
  DeviceScope scope(comm->config.cudaDev);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  bool capturing = false;
  CC_CHECK(Capturing(comm, s, &capturing));
  if (capturing && !DevicePrepared(comm->config.cudaDev)) {
    return Fail(ccInvalidUsage, "rank %d: the first compressed call on CUDA device %d is being captured into a CUDA "
                "graph, but it prepares the device (memory pools, kernel modules), which a capture does not allow: "
                "run the same call once before capturing it", comm->rank, comm->config.cudaDev);
  }
  CC_CHECK(PrepareDevice(comm->config.cudaDev));
  DeviceCodecState* st = nullptr;
  try {
    if (!c->device) c->device = DeviceCodecState::Create();
    st = c->device.get();
    st->BeginCallOnStream(s, capturing);
    st->SetTimeout(comm->config.timeoutMs);
    const ccResult_t r = work(st, s);
    st->EndCallOnStream();
    return r;
  } catch (const ScratchFrozenError& err) {
    EndAfterFailure(st);
    return Fail(ccInvalidUsage, "rank %d: %s", comm->rank, err.what());
  } catch (const DeviceTimeoutError& err) {
    EndAfterFailure(st);
    return Fail(ccTimeout, "rank %d: %s", comm->rank, err.what());
  } catch (const DeviceCodecError& err) {
    EndAfterFailure(st);
    return Fail(ccUnhandledCudaError, "rank %d: %s", comm->rank, err.what());
  } catch (const std::exception& err) {  // std::bad_alloc of host memory, say: the state must leave the call too
    EndAfterFailure(st);
    return Fail(ccSystemError, "rank %d: %s", comm->rank, err.what());
  }
}

}  // namespace

bool StreamCodecCovers(const ccCompressor& c) { return DeviceCodecCovers(c); }

ccResult_t StreamCompressedReserve(ccComm* comm, const CollArgs& a, ccCompressor* c, ccStream_t stream) {
  if (!StreamCodecCovers(*c)) {
    return Fail(ccInvalidUsage, "rank %d: compressor %s does not run on the nccl transport (powersgd needs a build "
                "with cuBLAS; quant rotation blocks of at most 16384)", comm->rank, CompressorSpec(*c).c_str());
  }
  if (comm->nranks == 1 || a.count == 0) return ccSuccess;
  return OnState(comm, c, stream, [&](DeviceCodecState* st, cudaStream_t) {
    std::unique_ptr<DeviceCodec> codec = MakeDeviceCodec(*c, CallOf(comm, *c), st);
    if (a.dtype != ccFloat32) st->widened.Reserve<float>(a.count);
#ifdef CCOLL_HAVE_CUBLAS
    if (c->kind == ccCompressPowerSGD) {
      LowRankPlan plan;
      std::string why;
      if (!PlanLowRank(*c, a.count, &plan, &why)) return Fail(ccInvalidUsage, "powersgd: %s", why.c_str());
      if (c->Get(ccParamErrorFeedback) != 0) st->ErrorFeedback(a.count);
      st->packed.Reserve<float>(plan.pElems + plan.exactElems);
      st->factors.Reserve<float>(2 * plan.qElems);
      st->ortho.Reserve<double>(OrthoScratch(plan));
      st->deviceWire.Reserve(4 * SlotBytes(*codec, std::max(plan.pElems, plan.qElems), comm->nranks));
      st->blasWorkspace.Reserve(gpu::LowRankBlas::kWorkspaceBytes);
      // cuBLAS's handles, outside any capture (cublasCreate allocates); a captured call takes a kept one (LendBlas).
      if (!st->capturing()) ReserveBlasForCalls(comm->config.cudaDev);
      return ccSuccess;
    }
#endif
    if (c->kind == ccCompressTopkChunk || c->kind == ccCompressRandk) {
      const SparsePlan p = PlanSparse(*c, a.count, a.dtype);  // at most 2^31 - 1 chunks, as CUB counts (ChunksFit)
      if (c->Get(ccParamErrorFeedback) != 0) st->ErrorFeedback(a.count);
      st->index.Reserve<uint32_t>(p.keep);
      st->choice.Reserve(gpu::ChooseChunksScratchBytes(p.chunks));
      if (c->kind == ccCompressTopkChunk) st->vals.Reserve<float>(p.chunks);
      st->packed.Reserve<float>(p.Scratch());
      st->deviceWire.Reserve(4 * SlotBytes(*codec, p.values, comm->nranks));  // 16-bit values: the cast ring's
      return ccSuccess;
    }
    st->deviceWire.Reserve(4 * SlotBytes(*codec, a.count, comm->nranks));
    codec->ReserveScratch(a.count, PartSize(a.count, comm->nranks, 0));
    return ccSuccess;
  });
}

ccResult_t StreamCompressedAllReduce(ccComm* comm, const CollArgs& a, ccCompressor* c, ccStream_t stream) {
  c->boundCount = a.count;
  const CodecCall call = CallOf(comm, *c);
  ++c->calls;
  if (comm->nranks == 1 || a.count == 0) {
    // Nothing to communicate: the exact result (the sum or average of one rank is its input). No device state, so a
    // capture may hold it before any compressed call has run (StreamCompressedReserve does nothing either).
    if (a.send == a.recv || a.count == 0) return ccSuccess;
    DeviceScope scope(comm->config.cudaDev);
    const cudaError_t e = cudaMemcpyAsync(a.recv, a.send, a.count * a.eltSize, cudaMemcpyDeviceToDevice,
                                          reinterpret_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Fail(ccUnhandledCudaError, "rank %d: cudaMemcpyAsync (one rank): %s", comm->rank, cudaGetErrorString(e));
    }
    return ccSuccess;
  }
  return OnState(comm, c, stream, [&](DeviceCodecState* st, cudaStream_t s) -> ccResult_t {
    auto float32Call = [&](const float* input, float* out) -> ccResult_t {
      switch (c->kind) {
        case ccCompressTopkChunk:
        case ccCompressRandk:
          return SparseCall(comm, input, out, a.count, a.op == ccAvg, a.dtype, c, call, st, stream);
#ifdef CCOLL_HAVE_CUBLAS
        case ccCompressPowerSGD: return LowRankCall(comm, input, out, a.count, a.op, c, call, st, stream);
#endif
        default: return Float32Call(comm, input, out, a.count, a.op == ccAvg, c, call, st, stream);
      }
    };
    if (a.dtype == ccFloat32) return float32Call(static_cast<const float*>(a.send), static_cast<float*>(a.recv));
    // 16-bit data: widened exactly into a float32 working copy, narrowed back to nearest-even (compress/widen.h);
    // PowerSGD's memory keeps what that rounds away (the sparsifiers' keep it in SparseCall).
    float* w = st->widened.Reserve<float>(a.count);
    CheckLaunch(gpu::CastDecode(a.dtype, a.send, a.count, w, s));
    CC_CHECK(float32Call(w, w));
    NarrowCallResult(comm, a, *c, call.call, st, w, s);
    return ccSuccess;
  });
}

}  // namespace ccoll
