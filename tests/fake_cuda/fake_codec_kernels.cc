// The codec "kernels" of compress/codec_cuda.h for the fake CUDA runtime: each one is queued on its stream and runs
// the CPU driver of the same element math there, on the fake's view of the device memory (FakeHostView); the tile
// kernels of the quantization codec (requant and homomorphic lanes) run their own phases through tile_emulator.h, as
// the GPU would. The device codec's plumbing (copies, scratch, stream order, the schedule around it) is then tested
// without a GPU; that the real kernels write the CPU drivers' bytes is tests/test_gpu.cc's job on a device. Pointer
// arrays are copied at launch, as kernel arguments are. The cuBLAS products go through the fake cuBLAS
// (fake_cublas.cc). The exact reductions (collectives/reduce_cuda.h) are the host loops, counted too.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <cmath>
#include <cstring>
#include <limits>

#include "collectives/reduce.h"
#include "collectives/reduce_cuda.h"
#include "compress/bitpack.h"
#include "compress/codec_cuda.h"
#include "compress/codecs.h"
#include "compress/quant_cpu.h"
#include "compress/sparse.h"
#include "core/cuda_result.h"
#ifdef CCOLL_HAVE_CUBLAS
#include "compress/lowrank.h"
#include "compress/lowrank_cuda.h"
#endif
#include "fake_launch.h"
#include "tile_emulator.h"

namespace cctest {
namespace {

std::atomic<uint64_t> gLaunches{0};

// As the real kernels' launches: the launch's check (gpu::Launched) also reports an error the thread left behind.
ccResult_t Launch(cudaStream_t stream, std::function<void()> op) {
  gLaunches.fetch_add(1);
  FakeLaunch(stream, std::move(op));
  return ccoll::gpu::Launched("a fake codec kernel's launch");
}

}  // namespace

uint64_t FakeCodecKernelLaunches() { return gLaunches.load(); }

}  // namespace cctest

namespace ccoll {
namespace gpu {

using cctest::HostView;
using cctest::Launch;

ccResult_t RotateForward(const float* in, float* out, size_t count, size_t block, uint32_t signKey,
                         cudaStream_t stream) {
  in = HostView(in);
  out = HostView(out);
  return Launch(stream, [=] { ccoll::RotateForward(in, out, count, block, signKey); });
}

ccResult_t RotateInverse(float* x, size_t count, size_t block, uint32_t signKey, float scale, const uint8_t* done,
                         cudaStream_t stream) {
  x = HostView(x);
  done = done != nullptr ? HostView(done) : nullptr;
  return Launch(stream, [=] { cctest::RotateInverseUnmarked(x, count, block, signKey, scale, done); });
}

size_t RequantBytes(size_t len, size_t group, int bits, ScaleFormat format) {
  return ((len + group - 1) / group) * ScaleBytes(format) + PackedBytes(len, bits);
}

ccResult_t HopRequant(const void* const* wiresIn, int nin, const float* local, size_t len, uint64_t index0,
                      size_t group, int bits, ScaleFormat format, float clipK, const DitherRule& rule, float* vals,
                      uint16_t* codes, void* wireOut, cudaStream_t stream) {
  const void* in0 = nin > 0 ? HostView(wiresIn[0]) : nullptr;
  const void* in1 = nin > 1 ? HostView(wiresIn[1]) : nullptr;
  local = HostView(local);
  vals = HostView(vals);
  codes = HostView(codes);
  wireOut = HostView(wireOut);
  if (tile::Covers(group)) {  // as the real HopRequant: the tile kernel
    const void* in[2] = {in0, in1};
    const tile::HopArgs a = tile::HopArgsOf(local, in, nin, index0, len, group, bits, format, clipK, rule, wireOut);
    return Launch(stream, [=] { cctest::TileEmulator().Hop(a); });
  }
  return Launch(stream, [=] {
    if (nin == 0) {
      EncodeRequantSlice(local, len, index0, group, bits, format, clipK, rule, codes, wireOut);
    } else {
      const void* in[2] = {in0, in1};
      HopRequantSlice(in, nin, local, len, index0, group, bits, format, clipK, rule, vals, codes, wireOut);
    }
  });
}

ccResult_t EncodeRequant(const float* v, size_t len, uint64_t index0, size_t group, int bits, ScaleFormat format,
                         float clipK, const DitherRule& rule, uint16_t* codes, void* wireOut, cudaStream_t stream) {
  v = HostView(v);
  codes = HostView(codes);
  wireOut = HostView(wireOut);
  return Launch(stream, [=] { EncodeRequantSlice(v, len, index0, group, bits, format, clipK, rule, codes, wireOut); });
}

ccResult_t DecodeRequant(const void* wire, size_t len, size_t group, int bits, ScaleFormat format, float* out,
                         cudaStream_t stream) {
  wire = HostView(wire);
  out = HostView(out);
  if (tile::Covers(group)) {
    const tile::DecodeArgs a = tile::DecodeArgsOf(wire, 0, len, group, bits, format, out);
    return Launch(stream, [=] { cctest::TileEmulator().Decode(a); });
  }
  return Launch(stream, [=] {
    std::vector<uint16_t> codes(len);
    DecodeRequantSlice(wire, len, group, bits, format, codes.data(), out);
  });
}

ccResult_t HopRequantRotated(const void* const* wiresIn, int nin, const float* input, size_t count, size_t block,
                             uint32_t signKey, bool edgesRotated, size_t off, size_t len, size_t group, int bits,
                             ScaleFormat format, float clipK, const DitherRule& rule, void* wireOut,
                             cudaStream_t stream) {
  if (!tile::Covers(group) || !tile::CoversRotation(block)) return ccInternalError;
  const void* in[2] = {nin > 0 ? HostView(wiresIn[0]) : nullptr, nin > 1 ? HostView(wiresIn[1]) : nullptr};
  const tile::HopArgs a = tile::RotatedFrom(
      tile::HopArgsOf(nullptr, in, nin, off, len, group, bits, format, clipK, rule, HostView(wireOut)),
      HostView(input), count, block, signKey, edgesRotated);
  if (len == 0) return ccSuccess;
  return Launch(stream, [=] { cctest::TileEmulator().Hop(a); });
}

ccResult_t RotateBlockForward(float* x, size_t base, size_t len, uint32_t signKey, cudaStream_t stream) {
  x = HostView(x);
  return Launch(stream, [=] { ccoll::RotateBlockForward(x + base, x + base, len, base, signKey); });
}

ccResult_t DecodeRequantRotated(const void* wire, size_t off, size_t len, size_t group, int bits, ScaleFormat format,
                                size_t count, size_t block, uint32_t signKey, float scale, uint8_t* done, float* out,
                                cudaStream_t stream) {
  if (!tile::Covers(group) || !tile::CoversRotation(block)) return ccInternalError;
  const tile::DecodeArgs a =
      tile::RotatedBack(tile::DecodeArgsOf(HostView(wire), off, len, group, bits, format, HostView(out)), count, block,
                        signKey, scale, done != nullptr ? HostView(done) : nullptr);
  if (len == 0) return ccSuccess;
  return Launch(stream, [=] { cctest::TileEmulator().Decode(a); });
}

ccResult_t CastHop(ccDataType_t wire, const void* const* wiresIn, int nin, const float* local, size_t len,
                   void* wireOut, float* lost, cudaStream_t stream) {
  const void* in0 = nin > 0 ? HostView(wiresIn[0]) : nullptr;
  const void* in1 = nin > 1 ? HostView(wiresIn[1]) : nullptr;
  local = HostView(local);
  wireOut = HostView(wireOut);
  if (lost != nullptr) lost = HostView(lost);
  return Launch(stream, [=] {
    const void* in[2] = {in0, in1};
    MakeCast16Codec(wire, CodecCall(), lost)->Hop(in, nin, local, 0, len, wireOut);
  });
}

ccResult_t CastDecode(ccDataType_t wire, const void* in, size_t len, float* out, cudaStream_t stream) {
  in = HostView(in);
  out = HostView(out);
  return Launch(stream, [=] { MakeCast16Codec(wire, CodecCall())->DecodeGather(in, 0, len, out); });
}

namespace {

// The fake's view of every pointer in a tile kernel's arguments, as the kernel's arguments are copied at launch.
tile::HopArgs HostViews(tile::HopArgs a) {
  a.values = HostView(a.values);
  for (const uint8_t*& in : a.in) in = HostView(in);
  a.out = HostView(a.out);
  return a;
}

tile::DecodeArgs HostViews(tile::DecodeArgs a) {
  a.wire = HostView(a.wire);
  a.out = HostView(a.out);
  a.done = HostView(a.done);
  a.agreed = HostView(a.agreed);
  return a;
}

}  // namespace

// As the real launchers: nothing to do for no values, then the same checks.
ccResult_t LanesTiles(const tile::LanesArgs& args, cudaStream_t stream) {
  if (args.hop.len == 0) return ccSuccess;
  if (!tile::LanesArgsValid(args)) return ccInternalError;
  tile::LanesArgs a = args;
  a.hop = HostViews(a.hop);
  a.scalesOut = HostView(a.scalesOut);
  a.agreed = HostView(a.agreed);
  return Launch(stream, [=] { cctest::TileEmulator().Lanes(a); });
}

ccResult_t DecodeTiles(const tile::DecodeArgs& args, cudaStream_t stream) {
  if (args.len == 0) return ccSuccess;
  if (!tile::DecodeArgsValid(args)) return ccInternalError;
  const tile::DecodeArgs a = HostViews(args);
  return Launch(stream, [=] { cctest::TileEmulator().Decode(a); });
}

ccResult_t GroupScales(const float* v, size_t count, size_t group, float clipK, float* scales, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  if (tile::Covers(group)) return LanesTiles(tile::ScalesArgsOf(v, count, group, clipK, scales), stream);
  v = HostView(v);
  scales = HostView(scales);
  return Launch(stream, [=] {
    for (size_t g = 0, begin = 0; begin < count; ++g, begin += group) {
      scales[g] = GroupScaleOf(v + begin, count - begin < group ? count - begin : group, clipK);
    }
  });
}

ccResult_t EncodeLanes(const float* v, size_t len, uint64_t index0, size_t group, const float* scales, int bits,
                       int laneBits, const DitherRule& rule, void* wireOut, cudaStream_t stream) {
  if (len == 0) return ccSuccess;
  if (tile::Covers(group)) {
    const tile::HopArgs hop =
        tile::HopArgsOf(v, nullptr, 0, index0, len, group, bits, ScaleFormat::kFp32, 0.0f, rule, wireOut);
    return LanesTiles(tile::LanesArgsOf(hop, scales, laneBits, 1, false), stream);
  }
  v = HostView(v);
  scales = HostView(scales);
  wireOut = HostView(wireOut);
  return Launch(stream, [=] {
    std::vector<uint16_t> codes(len);
    EncodeLanesSlice(v, len, index0, group, scales, bits, laneBits, rule, codes.data(), wireOut);
  });
}

ccResult_t AddLanes(void* dst, const void* a, const void* b, size_t len, int laneBits, cudaStream_t stream) {
  dst = HostView(dst);
  a = HostView(a);
  b = HostView(b);
  return Launch(stream, [=] { AddPackedStreams(dst, a, b, PackedBytes(len, laneBits)); });
}

ccResult_t DecodeLanes(const void* wire, size_t len, uint64_t index0, size_t group, const float* scales, int bits,
                       int laneBits, int nranks, float* out, cudaStream_t stream) {
  if (len == 0) return ccSuccess;
  if (tile::Covers(group)) {
    const tile::DecodeArgs a = tile::DecodeArgsOf(wire, index0, len, group, bits, ScaleFormat::kFp32, out);
    return DecodeTiles(tile::LanesFrom(a, scales, laneBits, nranks), stream);
  }
  wire = HostView(wire);
  scales = HostView(scales);
  out = HostView(out);
  return Launch(stream, [=] {
    std::vector<uint16_t> codes(len);
    DecodeLanesSlice(wire, len, index0, group, scales, bits, laneBits, nranks, codes.data(), out);
  });
}

ccResult_t ChunkNorms(const float* x, size_t count, size_t chunk, float* norms, cudaStream_t stream) {
  x = HostView(x);
  norms = HostView(norms);
  return Launch(stream, [=] {
    std::vector<float> n;
    ccoll::ChunkNorms(x, count, chunk, &n);
    std::memcpy(norms, n.data(), n.size() * sizeof(float));
  });
}

ccResult_t GatherChunks(const float* x, size_t count, size_t chunk, const uint32_t* chosen, size_t packed, float* out,
                        cudaStream_t stream) {
  x = HostView(x);
  chosen = HostView(chosen);
  out = HostView(out);
  return Launch(stream, [=] {
    for (size_t p = 0; p < packed; ++p) {
      const size_t at = static_cast<size_t>(chosen[p / chunk]) * chunk + p % chunk;
      out[p] = at < count ? x[at] : 0.0f;
    }
  });
}

ccResult_t ScatterChunks(const float* in, size_t count, size_t chunk, const uint32_t* chosen, size_t packed, float* x,
                         cudaStream_t stream) {
  in = HostView(in);
  chosen = HostView(chosen);
  x = HostView(x);
  return Launch(stream, [=] {
    for (size_t p = 0; p < packed; ++p) {
      const size_t at = static_cast<size_t>(chosen[p / chunk]) * chunk + p % chunk;
      if (at < count) x[at] = in[p];
    }
  });
}

// The chunk choice: the CPU's own, which the CUDA kernels reproduce (test_gpu checks them against it).
size_t ChooseChunksScratchBytes(size_t chunks) { return chunks * sizeof(uint32_t); }

ccResult_t ChooseTopChunks(const float* norms, size_t chunks, size_t k, void* scratch, uint32_t* chosen,
                           cudaStream_t stream) {
  norms = HostView(norms);
  chosen = HostView(chosen);
  return Launch(stream, [=] {
    std::vector<uint32_t> picked;
    ccoll::TopChunks(std::vector<float>(norms, norms + chunks), k, &picked);
    std::copy(picked.begin(), picked.end(), chosen);
  });
}

ccResult_t ChooseRandomChunks(size_t chunks, size_t k, uint32_t key, void* scratch, uint32_t* chosen,
                              cudaStream_t stream) {
  chosen = HostView(chosen);
  return Launch(stream, [=] {
    std::vector<uint32_t> picked;
    ccoll::RandomChunks(chunks, k, key, &picked);
    std::copy(picked.begin(), picked.end(), chosen);
  });
}

ccResult_t MarkNonFinite(const float* x, size_t count, float* mark, cudaStream_t stream) {
  x = HostView(x);
  mark = HostView(mark);
  return Launch(stream, [=] {
    for (size_t i = 0; i < count; ++i) {
      if (!std::isfinite(x[i])) *mark = std::numeric_limits<float>::quiet_NaN();
    }
  });
}

ccResult_t PoisonIfMarked(float* x, size_t count, const float* mark, cudaStream_t stream) {
  x = HostView(x);
  mark = HostView(mark);
  return Launch(stream, [=] {
    if (!std::isfinite(*mark)) std::fill(x, x + count, std::numeric_limits<float>::quiet_NaN());
  });
}

ccResult_t Fill(float* x, size_t count, float value, cudaStream_t stream) {
  x = HostView(x);
  return Launch(stream, [=] { std::fill(x, x + count, value); });
}

ccResult_t AnyNonFinite(const float* x, size_t count, unsigned* flag, cudaStream_t stream) {
  x = HostView(x);
  flag = HostView(flag);
  return Launch(stream, [=] {
    for (size_t i = 0; i < count; ++i) {
      if (!std::isfinite(x[i])) *flag |= 1u;
    }
  });
}

ccResult_t AddIntoChunkNorms(float* e, const float* g, size_t count, size_t chunk, float* norms, cudaStream_t stream) {
  e = HostView(e);
  g = HostView(g);
  norms = HostView(norms);
  return Launch(stream, [=] {
    for (size_t i = 0; i < count; ++i) e[i] += g[i];
    std::vector<float> n;
    ccoll::ChunkNorms(e, count, chunk, &n);
    std::memcpy(norms, n.data(), n.size() * sizeof(float));
  });
}

ccResult_t AddInto(float* acc, const float* x, size_t count, cudaStream_t stream) {
  acc = HostView(acc);
  x = HostView(x);
  return Launch(stream, [=] {
    for (size_t i = 0; i < count; ++i) acc[i] += x[i];
  });
}

ccResult_t KeepResidual(float* e, const float* g, size_t count, cudaStream_t stream) {
  e = HostView(e);
  g = HostView(g);
  return Launch(stream, [=] {
    for (size_t i = 0; i < count; ++i) {
      const float left = e[i] - g[i];
      e[i] = std::isfinite(left) ? left : 0.0f;
    }
  });
}

ccResult_t DropNonFinite(float* e, size_t count, cudaStream_t stream) {
  e = HostView(e);
  return Launch(stream, [=] {
    for (size_t i = 0; i < count; ++i) {
      if (!std::isfinite(e[i])) e[i] = 0.0f;
    }
  });
}

ccResult_t LoadQuantKernels() {
  cctest::FakeKernelsLoaded(cctest::kQuantKernels);
  return ccSuccess;
}

ccResult_t LoadCastKernels() {
  cctest::FakeKernelsLoaded(cctest::kCastKernels);
  return ccSuccess;
}

ccResult_t LoadSparseKernels() {
  cctest::FakeKernelsLoaded(cctest::kSparseKernels);
  return ccSuccess;
}

// The fake loads nothing: its kernels are host functions (cctest::FakeKernelsLoaded records the loaders' calls).
KernelLoads KernelLoadsSoFar() {
  KernelLoads k;
  k.note = "the fake CUDA runtime has no modules";
  return k;
}

ccResult_t LoadReduceKernels() {
  cctest::FakeKernelsLoaded(cctest::kReduceKernels);
  return ccSuccess;
}

#ifdef CCOLL_HAVE_CUBLAS
// The steps between the products: the host's own (the CUDA kernels compute them in another order of sums).
ccResult_t OrthogonalizeOnDevice(float* a, int64_t rows, int r, double eps, double* scratch, cudaStream_t stream) {
  a = HostView(a);
  return Launch(stream, [=] {
    std::vector<double> w;
    ccoll::Orthogonalize(a, rows, r, eps, &w);
  });
}

ccResult_t StartQOnDevice(float* q, int64_t cols, int r, uint32_t key, bool warm, double eps, double* scratch,
                          cudaStream_t stream) {
  q = HostView(q);
  return Launch(stream, [=] {
    std::vector<double> w;
    if (warm) ccoll::Orthogonalize(q, cols, r, eps, &w);
    if (!warm || !ccoll::UsableQ(q, cols, r)) ccoll::RandomQ(q, cols, r, key, &w);
  });
}

ccResult_t LoadLowRankKernels() {
  cctest::FakeKernelsLoaded(cctest::kLowRankKernels);
  return ccSuccess;
}
#endif

ccResult_t Scale(float* x, size_t count, float factor, bool divide, cudaStream_t stream) {
  x = HostView(x);
  return Launch(stream, [=] {
    for (size_t i = 0; i < count; ++i) x[i] = divide ? x[i] / factor : x[i] * factor;
  });
}

ccResult_t Reduce(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype, ccRedOp_t op,
                  cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  dst = HostView(dst);
  a = HostView(a);
  b = HostView(b);
  return Launch(stream, [=] { ReduceHost(dst, a, b, count, dtype, op); });
}

ccResult_t FinishAvg(void* buf, size_t count, ccDataType_t dtype, int nranks, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  buf = HostView(buf);
  return Launch(stream, [=] { FinishAvgHost(buf, count, dtype, nranks); });
}

ccResult_t Premultiply(void* dst, const void* src, size_t count, ccDataType_t dtype, int nranks, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  dst = HostView(dst);
  src = HostView(src);
  return Launch(stream, [=] { PremultiplyHost(dst, src, count, dtype, nranks); });
}

ccResult_t ReducePremultiplied(void* dst, const void* own, const void* other, size_t count, ccDataType_t dtype,
                               int nranks, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  dst = HostView(dst);
  own = HostView(own);
  other = HostView(other);
  return Launch(stream, [=] { ReducePremultipliedHost(dst, own, other, count, dtype, nranks); });
}

}  // namespace gpu
}  // namespace ccoll
