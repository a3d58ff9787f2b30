#include "collectives/device_compressed.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algo.h"
#include "collectives/compressed.h"
#include "collectives/device_buffers.h"
#include "collectives/device_prepare.h"
#include "collectives/sparse.h"
#include "compress/codec_cuda.h"
#include "compress/compressor.h"
#include "compress/device_codec.h"
#include "compress/rng.h"
#include "compress/sparse.h"
#include "core/comm.h"
#include "core/device_memory.h"
#include "core/device_scope.h"
#include "core/error.h"
#include "core/log.h"
#ifdef CCOLL_HAVE_CUBLAS
#include "collectives/lowrank.h"
#include "compress/lowrank.h"
#include "compress/lowrank_cuda.h"
#endif

namespace ccoll {
namespace {

void Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, DeviceCodecState* st, const char* what) {
  if (bytes > 0) CheckCuda(cudaMemcpyAsync(dst, src, bytes, kind, st->stream()), what);
}

#ifdef CCOLL_HAVE_CUBLAS
// The exact float32 all-reduce of the whole buffer (PowerSGD before its start iteration), with the host schedule's
// bytes: on the device buffers between thread ranks (device_buffers.h), else through pinned host memory.
ccResult_t ExactAllReduce(ccComm* comm, const CollArgs& a, DeviceCodecState* st) {
  if (MessagesStayOnDevice(comm)) {
    CC_CHECK(EnsureDeviceBuffers(comm));
    st->Synchronize();  // the exact schedule's streams read what st's may have written (a widened copy)
    CollArgs d = a;
    d.onDevice = true;
    return AllReduce(comm, d);
  }
  float* host = st->hostPacked.Reserve<float>(a.count);
  Copy(host, a.send, a.count * sizeof(float), cudaMemcpyDeviceToHost, st, "cudaMemcpyAsync (input to host)");
  st->Synchronize();
  CollArgs h = a;
  h.send = host;
  h.recv = host;
  h.onDevice = false;
  CC_CHECK(AllReduce(comm, h));
  Copy(a.recv, host, a.count * sizeof(float), cudaMemcpyHostToDevice, st, "cudaMemcpyAsync (result to device)");
  return ccSuccess;
}
#endif

// With error feedback on (ef=1): the memory, which the driver adds the input to and then compresses; else null.
float* MemoryOf(const ccCompressor& c, DeviceCodecState* st, size_t count) {
  return c.Get(ccParamErrorFeedback) != 0 ? st->ErrorFeedback(count) : nullptr;
}

// With error feedback on: the memory *e += input, which the driver then compresses; else the input itself.
const float* WithMemory(const ccCompressor& c, DeviceCodecState* st, const float* input, size_t count, float** e) {
  *e = MemoryOf(c, st, count);
  if (*e == nullptr) return input;
  CheckLaunch(gpu::AddInto(*e, input, count, st->stream()));
  return *e;
}

// cast16 and quant: the codec ring (or tree) with the device codec between transport steps.
ccResult_t CodecAllReduce(ccComm* comm, const CollArgs& a, ccCompressor* c, const CodecCall& call,
                          DeviceCodecState* st) {
  std::unique_ptr<Codec> codec = MakeDeviceCodec(*c, call, st);
  float* work = static_cast<float*>(a.recv);  // as on the host: the output doubles as the working copy
  std::vector<float> meta;
  codec->PipelinePrepareAndFinish(a.op == ccAvg);  // the ring and the tree keep its pointer rules
  codec->Prepare(static_cast<const float*>(a.send), work, a.count, &meta);
  CC_CHECK(AgreeMeta(comm, &meta, codec->MetaOp()));
  codec->SetMeta(meta);
  // Thread ranks: the wire slots are device memory, and the local transport copies device to device.
  st->wireOnDevice = MessagesStayOnDevice(comm);
  if (st->wireOnDevice) CC_CHECK(EnsureDeviceBuffers(comm));
  CC_CHECK(RunCodec(comm, c, *codec, work, a.count, [st](size_t bytes) {
    return static_cast<char*>(st->wireOnDevice ? st->deviceWire.Reserve(bytes) : st->hostWire.Reserve(bytes));
  }));
  codec->Finish(work, a.count, a.op == ccAvg);
  return ccSuccess;
}

// topk and randk, as SparseAllReduce does them: the memory and the chunk norms on the device, the choice on the
// host, the chosen chunks gathered on the device and summed over the ranks through pinned host memory (the host
// schedule and codec), then scattered into the result on the device, where the memory keeps only what 16-bit
// roundings (the sums', the narrowed result's) took at those chunks.
ccResult_t SparseAllReduceOnDevice(ccComm* comm, const CollArgs& a, ccCompressor* c, const CodecCall& call,
                                   DeviceCodecState* st) {
  const size_t count = a.count;
  const size_t chunk = static_cast<size_t>(c->Get(ccParamChunkSize));
  const float* input = static_cast<const float*>(a.send);
  float* e = MemoryOf(*c, st, count);
  const bool ef = e != nullptr;
  const float* x = ef ? e : input;
  const size_t chunks = ChunkCount(count, chunk);
  const size_t keep = KeptChunks(chunks, c->Get(ccParamDensityPpm));
  std::vector<uint32_t> chosen;
  if (c->kind == ccCompressTopkChunk) {
    float* devNorms = st->vals.Reserve<float>(chunks);
    float* hostNorms = st->hostMeta.Reserve<float>(chunks);
    // With error feedback, the memory's add and the norms in one pass.
    CheckLaunch(ef ? gpu::AddIntoChunkNorms(e, input, count, chunk, devNorms, st->stream())
                   : gpu::ChunkNorms(x, count, chunk, devNorms, st->stream()));
    Copy(hostNorms, devNorms, chunks * sizeof(float), cudaMemcpyDeviceToHost, st, "cudaMemcpyAsync (chunk norms)");
    st->Synchronize();
    std::vector<float> norms(hostNorms, hostNorms + chunks);
    CC_CHECK(AgreeMeta(comm, &norms, ccSum));
    TopChunks(norms, keep, &chosen);
  } else {
    if (ef) CheckLaunch(gpu::AddInto(e, input, count, st->stream()));
    RandomChunks(chunks, keep, StreamKey(call.seed, call.call, ~0u, kPurposeChunks), &chosen);
  }
  const size_t packed = PackedCount(count, chunk, chosen);
  // Scratch for the most a call of this shape packs, not for what this one does (a short last chunk may be chosen or
  // not): without memory pools, the later calls of a shape must find what its first call allocated
  // (core/device_proxy.h).
  const size_t mostPacked = std::min(count, keep * chunk);
  // The chosen indices go to the device, followed by one word: randk's "this rank saw a non-finite value" flag
  // (collectives/sparse.h's AgreeNonFinite).
  const bool flag = c->kind == ccCompressRandk;
  uint32_t* hostIndex = st->hostMeta.Reserve<uint32_t>(chosen.size() + 1);
  std::copy(chosen.begin(), chosen.end(), hostIndex);
  hostIndex[chosen.size()] = 0;
  uint32_t* devIndex = st->index.Reserve<uint32_t>(chosen.size() + 1);
  Copy(devIndex, hostIndex, (chosen.size() + 1) * sizeof(uint32_t), cudaMemcpyHostToDevice, st,
       "cudaMemcpyAsync (chosen chunks)");
  float* devPacked = st->packed.Reserve<float>(mostPacked);
  // Pinned: the chosen values, then (with error feedback and 16-bit values or data) what 16-bit roundings take.
  const bool keepRounding = SparseKeepsRounding(*c, a.narrowedTo);
  float* hostPacked = st->hostPacked.Reserve<float>(keepRounding ? 2 * mostPacked : mostPacked);
  float* hostLost = keepRounding ? hostPacked + packed : nullptr;
  CheckLaunch(gpu::GatherChunks(x, count, chunk, devIndex, packed, devPacked, st->stream()));
  Copy(hostPacked, devPacked, packed * sizeof(float), cudaMemcpyDeviceToHost, st, "cudaMemcpyAsync (chunks out)");
  if (flag) {
    unsigned* devFlag = reinterpret_cast<unsigned*>(devIndex + chosen.size());
    CheckLaunch(gpu::AnyNonFinite(input, count, devFlag, st->stream()));
    Copy(hostIndex + chosen.size(), devFlag, sizeof(unsigned), cudaMemcpyDeviceToHost, st,
         "cudaMemcpyAsync (non-finite flag)");
  }
  st->Synchronize();
  CC_CHECK(SumChosenChunks(comm, c, call, hostPacked, packed, chunks, keep, a.op, a.narrowedTo, hostLost));
  bool poisoned = false;
  if (flag) CC_CHECK(AgreeNonFinite(comm, hostIndex[chosen.size()] != 0, &poisoned));
  float* out = static_cast<float*>(a.recv);
  if (poisoned) {
    CheckLaunch(gpu::Fill(out, count, std::numeric_limits<float>::quiet_NaN(), st->stream()));
  } else {
    CheckCuda(cudaMemsetAsync(out, 0, count * sizeof(float), st->stream()), "cudaMemsetAsync (result)");
    Copy(devPacked, hostPacked, packed * sizeof(float), cudaMemcpyHostToDevice, st, "cudaMemcpyAsync (chunks in)");
    CheckLaunch(gpu::ScatterChunks(devPacked, count, chunk, devIndex, packed, out, st->stream()));
  }
  if (ef) {
    // What was sent leaves the memory, but for what 16-bit roundings took (scattered over the chosen chunks; zeros
    // with float32 values and data); non-finite leftovers are dropped.
    if (keepRounding) {
      Copy(devPacked, hostLost, packed * sizeof(float), cudaMemcpyHostToDevice, st, "cudaMemcpyAsync (sums' rounding)");
    } else {
      CheckCuda(cudaMemsetAsync(devPacked, 0, packed * sizeof(float), st->stream()), "cudaMemsetAsync (sent chunks)");
    }
    CheckLaunch(gpu::ScatterChunks(devPacked, count, chunk, devIndex, packed, e, st->stream()));
    CheckLaunch(gpu::DropNonFinite(e, count, st->stream()));
  }
  return ccSuccess;
}

#ifdef CCOLL_HAVE_CUBLAS
// PowerSGD, as LowRankAllReduce does it, with the memory and the three products on the device (cuBLAS) and the
// factors' sums, Gram-Schmidt and Q's warm start on the host (they are small: rows * r and cols * r per matrix).
ccResult_t LowRankAllReduceOnDevice(ccComm* comm, const CollArgs& a, ccCompressor* c, const CodecCall& call,
                                    DeviceCodecState* st) {
  const size_t count = a.count;
  LowRankPlan plan;
  std::string why;
  if (!PlanLowRank(*c, count, &plan, &why)) return Fail(ccInvalidUsage, "powersgd: %s", why.c_str());
  if (call.call < static_cast<uint64_t>(c->Get(ccParamStartIter))) {
    // The exact calls before the start have the shape of the compressed ones after: the memory (zeros until then) is
    // made now, so that without memory pools the first compressed call finds it (core/device_proxy.h).
    MemoryOf(*c, st, count);
    return ExactAllReduce(comm, a, st);
  }

  const float n = static_cast<float>(comm->nranks);
  float* out = static_cast<float*>(a.recv);
  float* e = nullptr;
  const float* m = WithMemory(*c, st, static_cast<const float*>(a.send), count, &e);
  const bool ef = e != nullptr;
  LowRankStartQ(c, plan, call);
  const double eps = static_cast<double>(c->Get(ccParamOrthoEpsilon)) * 1e-12;
  const std::unique_ptr<gpu::LowRankBlas> blas = st->LendBlas(st->stream());

  // Device: P and the exact parts (packed), Q then Q's sum (factors). Host, pinned: the same P and exact parts
  // (hostPacked); Q, Q's sum and the averaged exact parts (hostMeta).
  const size_t pAll = plan.pElems + plan.exactElems;
  float* dP = st->packed.Reserve<float>(pAll);
  float* dQ = st->factors.Reserve<float>(2 * plan.qElems);
  float* dQsum = dQ + plan.qElems;
  float* hP = st->hostPacked.Reserve<float>(pAll);
  float* hQ = st->hostMeta.Reserve<float>(2 * plan.qElems + plan.exactElems);
  float* hQsum = hQ + plan.qElems;
  float* hExactAvg = hQsum + plan.qElems;

  // Round 1: every P, then the exact parts.
  std::copy(c->lowRankQ.begin(), c->lowRankQ.end(), hQ);
  Copy(dQ, hQ, plan.qElems * sizeof(float), cudaMemcpyHostToDevice, st, "cudaMemcpyAsync (Q in)");
  for (const LowRankMatrix& mt : plan.matrices) {
    CheckLaunch(blas->ProductMQ(m + mt.offset, mt.rows, mt.cols, dQ + mt.qOffset, mt.rank, dP + mt.pOffset));
  }
  size_t at = plan.pElems;
  for (const auto& [offset, length] : plan.exact) {
    Copy(dP + at, m + offset, length * sizeof(float), cudaMemcpyDeviceToDevice, st, "cudaMemcpyAsync (exact part)");
    at += length;
  }
  Copy(hP, dP, pAll * sizeof(float), cudaMemcpyDeviceToHost, st, "cudaMemcpyAsync (P out)");
  st->Synchronize();
  const ccDataType_t wire = static_cast<ccDataType_t>(c->Get(ccParamValueType));
  if (wire == ccFloat32) {
    CC_CHECK(LowRankSum(comm, c, call, hP, pAll, ccFloat32));
  } else {
    CC_CHECK(LowRankSum(comm, c, call, hP, plan.pElems, wire));
    CC_CHECK(LowRankSum(comm, c, call, hP + plan.pElems, plan.exactElems, ccFloat32));
  }
  for (const LowRankMatrix& mt : plan.matrices) {
    Orthogonalize(hP + mt.pOffset, mt.rows, mt.rank, eps, &c->lowRankScratch);
  }
  Copy(dP, hP, plan.pElems * sizeof(float), cudaMemcpyHostToDevice, st, "cudaMemcpyAsync (P in)");

  // Round 2: Q = M^T P.
  for (const LowRankMatrix& mt : plan.matrices) {
    CheckLaunch(blas->ProductMtP(m + mt.offset, mt.rows, mt.cols, dP + mt.pOffset, mt.rank, dQsum + mt.qOffset));
  }
  Copy(hQsum, dQsum, plan.qElems * sizeof(float), cudaMemcpyDeviceToHost, st, "cudaMemcpyAsync (Q out)");
  st->Synchronize();
  CC_CHECK(LowRankSum(comm, c, call, hQsum, plan.qElems, wire));
  for (size_t i = 0; i < plan.qElems; ++i) c->lowRankQ[i] = hQsum[i] / n;  // the average; kept for the warm start
  std::copy(c->lowRankQ.begin(), c->lowRankQ.end(), hQ);
  Copy(dQ, hQ, plan.qElems * sizeof(float), cudaMemcpyHostToDevice, st, "cudaMemcpyAsync (Q average in)");

  // The result (M is not read after this point except by the error feedback, so out may be the input).
  for (const LowRankMatrix& mt : plan.matrices) {
    CheckLaunch(blas->ProductPQt(dP + mt.pOffset, dQ + mt.qOffset, mt.rows, mt.cols, mt.rank, out + mt.offset));
  }
  const float* exactSum = hP + plan.pElems;
  for (size_t i = 0; i < plan.exactElems; ++i) hExactAvg[i] = exactSum[i] / n;
  const float* exactOut = a.op == ccSum ? exactSum : hExactAvg;
  at = 0;
  for (const auto& [offset, length] : plan.exact) {
    Copy(out + offset, exactOut + at, length * sizeof(float), cudaMemcpyHostToDevice, st,
         "cudaMemcpyAsync (exact part in)");
    at += length;
  }
  for (const LowRankMatrix& mt : plan.matrices) {
    const size_t elems = static_cast<size_t>(mt.rows) * static_cast<size_t>(mt.cols);
    // What the average did not carry stays for the next call; the exact parts lost nothing. (16-bit data: the
    // caller's NarrowResult adds what narrowing the result rounds away.)
    if (ef) CheckLaunch(gpu::KeepResidual(e + mt.offset, out + mt.offset, elems, st->stream()));
    if (a.op == ccSum) CheckLaunch(gpu::Scale(out + mt.offset, elems, n, false, st->stream()));
  }
  if (ef) {
    for (const auto& [offset, length] : plan.exact) {
      CheckCuda(cudaMemsetAsync(e + offset, 0, length * sizeof(float), st->stream()), "cudaMemsetAsync (exact part)");
    }
  }
  return ccSuccess;
}
#endif

}  // namespace

namespace {
std::atomic<uint64_t> gPrimingWaits{0};
}  // namespace

uint64_t PrimingWaits() { return gPrimingWaits.load(); }

void PrimeDeviceCodec(ccComm* comm, const CollArgs& a, ccCompressor* c) {
#ifdef CCOLL_HAVE_CUBLAS
  // (One rank or no data: the call runs no product.)
  if (c->kind != ccCompressPowerSGD || comm->nranks == 1 || a.count == 0) return;
  // cuBLAS may choose its kernels by their operands' alignment, so the products run once per 256-byte offset of the
  // call's M and result: M is the error-feedback memory where there is one, else the input; the result is recv. For
  // 16-bit data M and the result are ccoll's (`widened` or the memory). ccoll's blocks, as P and Q, start 256-byte
  // aligned: offset 0.
  const bool direct = a.dtype == ccFloat32;
  const bool ef = c->Get(ccParamErrorFeedback) != 0;
  const size_t mShift = direct && !ef ? reinterpret_cast<uintptr_t>(a.send) % 256 : 0;
  const size_t outShift = direct ? reinterpret_cast<uintptr_t>(a.recv) % 256 : 0;
  if (c->devicePrimed.count({mShift, outShift}) != 0) return;
  LowRankPlan plan;
  std::string why;
  if (!PlanLowRank(*c, a.count, &plan, &why)) return;  // the call itself reports it
  // While a call of c is queued, the proxy thread owns c->device: this call waits on the host until it has run (new
  // offsets are rare: a bucket's buffers seldom move), rather than let its products load kernels while its stream
  // waits. (The queued call started its own timeout before this wait did: where it fails, the proxy has failed the
  // communicator by the time this wait ends, and nothing is primed for a call that cannot run.)
  if (c->inFlight.load() != 0) gPrimingWaits.fetch_add(1);
  if (!c->WaitIdleFor(comm->config.timeoutMs)) {
    CC_WARN(
        "rank %d: powersgd's call before on this compressor has not run within %d ms (CC_TIMEOUT_MS); this call, "
        "on buffers at new offsets, goes ahead with cuBLAS not prepared for them",
        comm->rank, comm->config.timeoutMs);
    return;
  }
  if (comm->AsyncError() != ccSuccess) return;
  void* temp = nullptr;
  try {
    DeviceScope scope(comm->config.cudaDev);
    ReserveBlasForCalls(comm->config.cudaDev);  // the handles the proxy will borrow
    if (!c->device) c->device = DeviceCodecState::Create();
    DeviceCodecState* st = c->device.get();
    st->SetTimeout(comm->config.timeoutMs);
    const std::unique_ptr<gpu::LowRankBlas> blas = st->LendBlas(st->stream());
    const size_t pAll = plan.pElems + plan.exactElems;
    float* p = st->packed.Reserve<float>(pAll);
    float* q = st->factors.Reserve<float>(2 * plan.qElems);
    // The pinned host scratch of the call (and of its exact calls before the start iteration, when they are staged).
    st->hostPacked.Reserve<float>(MessagesStayOnDevice(comm) ? pAll : std::max(pAll, a.count));
    st->hostMeta.Reserve<float>(2 * plan.qElems + plan.exactElems);
    // M and the product P Q^T on a block of zeros freed after, each at the 256-byte offset it has in the call: M
    // first, the product from the next 256-byte boundary after it. The block's size is the same whatever the offsets
    // (at most 2 * bytes + 765 used), so that without memory pools a priming for new offsets finds the kept block of
    // the one before.
    const size_t bytes = a.count * sizeof(float);
    const size_t outAt = (mShift + bytes + 255) / 256 * 256;
    const size_t tempBytes = 2 * bytes + 768;
    CheckLaunch(AllocateScratch(comm->config.cudaDev, false, tempBytes, st->stream(), &temp));
    CheckCuda(cudaMemsetAsync(temp, 0, tempBytes, st->stream()), "cudaMemsetAsync (priming)");
    CheckCuda(cudaMemsetAsync(p, 0, pAll * sizeof(float), st->stream()), "cudaMemsetAsync (priming)");
    CheckCuda(cudaMemsetAsync(q, 0, 2 * plan.qElems * sizeof(float), st->stream()), "cudaMemsetAsync (priming)");
    float* m = reinterpret_cast<float*>(static_cast<char*>(temp) + mShift);
    float* out = reinterpret_cast<float*>(static_cast<char*>(temp) + outAt + outShift);
    for (const LowRankMatrix& mt : plan.matrices) {
      CheckLaunch(blas->ProductMQ(m + mt.offset, mt.rows, mt.cols, q + mt.qOffset, mt.rank, p + mt.pOffset));
      CheckLaunch(blas->ProductMtP(m + mt.offset, mt.rows, mt.cols, p + mt.pOffset, mt.rank,
                                   q + plan.qElems + mt.qOffset));
      CheckLaunch(blas->ProductPQt(p + mt.pOffset, q + mt.qOffset, mt.rows, mt.cols, mt.rank, out + mt.offset));
    }
    FreeScratch(comm->config.cudaDev, false, temp, st->stream());
    temp = nullptr;
    st->Synchronize();
    c->devicePrimed.insert({mShift, outShift});
  } catch (const DeviceCodecError& e) {
    // Best effort: the other ranks may have queued the call already, so this one goes ahead too, and the proxy
    // reports what fails there (an async error that aborts the communicator) rather than leave them waiting.
    if (temp != nullptr) FreeScratch(comm->config.cudaDev, false, temp, c->device->stream());
    CC_WARN("rank %d: preparing powersgd on the device failed (%s); the call goes ahead", comm->rank, e.what());
  }
#else
  (void)comm;
  (void)a;
  (void)c;
#endif
}

namespace {

// Waits for the state's stream when the call leaves, also by an error or an exception: the proxy releases the
// caller's stream after this, and the buffers the call's kernels read and write may be reused or freed then.
struct SynchronizedOnExit {
  DeviceCodecState* st;
  ~SynchronizedOnExit() { st->SynchronizeQuietly(); }
};

}  // namespace

ccResult_t DeviceWidenedAllReduce(ccComm* comm, const CollArgs& a, ccCompressor* c) {
  try {
    if (!c->device) c->device = DeviceCodecState::Create();
    DeviceCodecState* st = c->device.get();
    st->SetTimeout(comm->config.timeoutMs);
    SynchronizedOnExit done{st};
    float* w = st->widened.Reserve<float>(a.count);
    CheckLaunch(gpu::CastDecode(a.dtype, a.send, a.count, w, st->stream()));  // widen: exact
    CollArgs f = a;
    f.send = f.recv = w;
    f.dtype = ccFloat32;
    f.eltSize = sizeof(float);
    f.narrowedTo = a.dtype;
    const uint64_t call = c->calls;              // the number CompressedAllReduce gives the call
    CC_CHECK(CompressedAllReduce(comm, f, c));  // on the same stream; it has synchronized it
    // (The sparsifiers' drivers keep what the narrowing rounds away themselves, told by f.narrowedTo.)
    NarrowCallResult(comm, a, *c, call, st, w, st->stream());
    st->Synchronize();
    return ccSuccess;
  } catch (const DeviceTimeoutError& e) {
    return Fail(ccTimeout, "rank %d: %s", comm->rank, e.what());
  } catch (const DeviceCodecError& e) {
    return Fail(ccUnhandledCudaError, "rank %d: %s", comm->rank, e.what());
  }
}

void NarrowCallResult(const ccComm* comm, const CollArgs& a, const ccCompressor& c, uint64_t call,
                      DeviceCodecState* st, float* w, cudaStream_t s) {
  float* e = nullptr;
  float share = 1.0f;
#ifdef CCOLL_HAVE_CUBLAS
  if (LowRankKeepsRounding(c, call, comm->nranks, a.count)) e = st->ErrorFeedback(a.count);
  share = LowRankRoundingShare(a.op == ccAvg, comm->nranks);
#else
  (void)comm;
  (void)c;
  (void)call;
  (void)st;
#endif
  NarrowResult(a.dtype, w, a.count, a.recv, e, share, s);
}

ccResult_t DeviceCompressedAllReduce(ccComm* comm, const CollArgs& a, ccCompressor* c, const CodecCall& call) {
  if (!DeviceCodecCovers(*c)) {
    return Fail(ccInvalidUsage, "rank %d: the compressor's parameters changed while its device call was queued",
                comm->rank);
  }
  try {
    if (!c->device) c->device = DeviceCodecState::Create();
    DeviceCodecState* st = c->device.get();
    st->SetTimeout(comm->config.timeoutMs);
    SynchronizedOnExit done{st};
    ccResult_t r = ccSuccess;
    if (comm->nranks == 1 || a.count == 0) {
      // Nothing to communicate: the exact result (sum or average of one rank is its input).
      Copy(a.recv, a.send, a.send != a.recv ? a.count * sizeof(float) : 0, cudaMemcpyDeviceToDevice, st,
           "cudaMemcpyAsync (one rank)");
    } else if (c->kind == ccCompressTopkChunk || c->kind == ccCompressRandk) {
      r = SparseAllReduceOnDevice(comm, a, c, call, st);
#ifdef CCOLL_HAVE_CUBLAS
    } else if (c->kind == ccCompressPowerSGD) {
      r = LowRankAllReduceOnDevice(comm, a, c, call, st);
#endif
    } else {
      r = CodecAllReduce(comm, a, c, call, st);
    }
    st->Synchronize();  // the result is in recv, and nothing queued still reads the pinned scratch
    return r;
  } catch (const DeviceTimeoutError& e) {
    return Fail(ccTimeout, "rank %d: %s", comm->rank, e.what());
  } catch (const DeviceCodecError& e) {
    return Fail(ccUnhandledCudaError, "rank %d: %s", comm->rank, e.what());
  }
}

}  // namespace ccoll
