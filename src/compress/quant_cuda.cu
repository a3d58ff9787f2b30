// CUDA kernels of the quantization codec: the randomized Hadamard rotation, the requant encode, decode and hop (by
// tiles, compress/requant_tile.h, with the rotation fused where it applies; one thread per group for groups over
// 1024), and the homomorphic lanes (group scales, encode with the packed add, decode: by tiles too,
// compress/lanes_tile.h; for groups over 1024, one kernel each and a packed add per arriving stream).
// They call the same host/device element math as the CPU drivers (hadamard.h, quant_math.h, rng.h, bitpack.h) in
// the same order of operations, and this file is compiled with --fmad=false, so that the bytes match the CPU path;
// tests/test_gpu.cc checks that on a device (not yet run on one: see perf/gpu_check.sh).
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "compress/bitpack.h"
#include "compress/codec_cuda.h"
#include "compress/float16.h"
#include "compress/hadamard.h"
#include "compress/lanes_tile.h"
#include "compress/requant_tile.h"
#include "compress/rng.h"
#include "core/cuda_result.h"

namespace ccoll {
namespace gpu {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(size_t items) { return static_cast<unsigned>((items + kThreads - 1) / kThreads); }

// One thread block per rotation block of `len` elements starting at base + blockIdx.x * len: signs (forward) or
// UnrotateBlock's prescale, then signs and scale (inverse) around the Walsh-Hadamard butterflies, stage by stage as
// Fwht does them.
// done (full blocks only; may be null): one flag per block of the launch, and a marked block is left as it is.
__global__ void RotateKernel(const float* in, float* out, size_t base, size_t len, uint32_t key, bool inverse,
                             float scale, const uint8_t* done) {
  extern __shared__ float x[];
  if (done != nullptr && done[blockIdx.x] != 0) return;
  const size_t off = base + static_cast<size_t>(blockIdx.x) * len;
  if (!inverse) {
    const float f = 1.0f / sqrtf(static_cast<float>(len));
    for (size_t j = threadIdx.x; j < len; j += blockDim.x) x[j] = in[off + j] * (SignBit(key, off + j) ? -f : f);
  } else {
    const float p = UnrotatePrescale(len);
    for (size_t j = threadIdx.x; j < len; j += blockDim.x) x[j] = in[off + j] * p;
  }
  __syncthreads();
  // len <= kMaxBlock and h a power of two: pair p's first element is (p / h) * 2h + p % h = p + (p & ~(h - 1)),
  // in 32-bit arithmetic (a 64-bit division per butterfly cost more than the butterfly).
  const unsigned n = static_cast<unsigned>(len);
  for (unsigned h = 1; h < n; h <<= 1) {
    for (unsigned p = threadIdx.x; p < n / 2; p += blockDim.x) {
      const unsigned i = p + (p & ~(h - 1));
      const float a = x[i], b = x[i + h];
      x[i] = a + b;
      x[i + h] = a - b;
    }
    __syncthreads();
  }
  if (!inverse) {
    for (size_t j = threadIdx.x; j < len; j += blockDim.x) out[off + j] = x[j];
  } else {
    const float f = UnrotateFactor(len, scale);
    for (size_t j = threadIdx.x; j < len; j += blockDim.x) out[off + j] = x[j] * (SignBit(key, off + j) ? -f : f);
  }
}

constexpr size_t kMaxBlock = 16384;  // floats of shared memory per rotation block: 64 KiB

std::atomic<uint64_t> gRotateReady{0};  // bit d: RotateKernel may take kMaxBlock floats of shared memory on device d

// Lets RotateKernel take a whole block of shared memory on the current device, once per device: LoadQuantKernels
// does it, before a stream waits, since a change of a kernel's shared-memory configuration may synchronize the device.
ccResult_t AllowRotateSharedMemory() {
  int device = 0;
  CC_CHECK(CudaResult(cudaGetDevice(&device), "cudaGetDevice"));
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (gRotateReady.load() & bit) != 0) return ccSuccess;
  CC_CHECK(CudaResult(cudaFuncSetAttribute(RotateKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kMaxBlock * sizeof(float))),
                      "cudaFuncSetAttribute (RotateKernel shared memory)"));
  gRotateReady.fetch_or(bit);
  return ccSuccess;
}

// Threads of a rotation block of len values: one per butterfly, at most 512.
unsigned RotateThreads(size_t len) { return static_cast<unsigned>(len / 2 < 512 ? (len / 2 > 0 ? len / 2 : 1) : 512); }

ccResult_t Rotate(const float* in, float* out, size_t count, size_t block, uint32_t key, bool inverse, float scale,
                  const uint8_t* done, cudaStream_t stream) {
  if (block > kMaxBlock) return Fail(ccInvalidArgument, "gpu rotation: block %zu is over %zu", block, kMaxBlock);
  CC_CHECK(AllowRotateSharedMemory());
  // Full blocks in one launch, then the tail in decreasing powers of two (ForEachRotationBlock's order).
  size_t off = 0;
  while (off < count) {
    size_t len = block;
    while (len > count - off) len >>= 1;
    const size_t n = len == block ? (count - off) / block : 1;
    RotateKernel<<<static_cast<unsigned>(n), RotateThreads(len), len * sizeof(float), stream>>>(
        in, out, off, len, key, inverse, scale, len == block ? done : nullptr);
    CC_CHECK(Launched("rotation kernel launch"));
    off += n * len;
  }
  return ccSuccess;
}

// The scale of a group as GroupScaleOf computes it: max |v| (the unsigned max of the sign-cleared bit patterns), or
// the clip point clipK * rms when smaller (the squares summed in order), flushed to zero when tiny.
__device__ float GroupScaleAt(const float* v, size_t n, float clipK) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = FloatBits(v[i]) & 0x7fffffffu;
    m = u > m ? u : m;
  }
  float sq = 0.0f;
  if (clipK > 0.0f) {
    for (size_t i = 0; i < n; ++i) sq += v[i] * v[i];
  }
  return GroupScaleFromStats(m, sq, n, clipK);
}

// The scale of a group as GroupScaleOf computes it, rounded up to the format, stored, and read back.
__device__ float EncodeScale(const float* v, size_t n, float clipK, ScaleFormat format, uint8_t* dst) {
  return StoreGroupScale(dst, GroupScaleAt(v, n, clipK), format);
}

// Group g of the values v (global index of v[0]: index0): its scale, its codes, and, when groups end on byte
// boundaries, the packed bytes of those codes (else the codes go to `codes` for the packing pass).
__device__ void EncodeGroup(const float* v, size_t len, size_t g, uint64_t index0, size_t group, int bits,
                            ScaleFormat format, float clipK, const DitherRule& rule, uint8_t* scales,
                            uint16_t* codes, uint8_t* packed, bool aligned) {
  const size_t begin = g * group, n = len - begin < group ? len - begin : group;
  const uint32_t levels = Levels(bits);
  const float s = EncodeScale(v + begin, n, clipK, format, scales + g * ScaleBytes(format));
  const float inv = InvStepOf(s, levels);
  const float shift = s * inv;
  BitWriter w(packed + begin * bits / 8);
  tile::DitherStream dither(rule);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t gi = static_cast<uint32_t>(index0 + begin + i);
    const uint32_t code = QuantizeCode(v[begin + i], inv, shift, levels, dither.At(gi, i == 0));
    if (aligned) {
      w.Put(code, bits);
    } else {
      codes[begin + i] = static_cast<uint16_t>(code);
    }
  }
  if (aligned) w.Flush();
}

// One thread per group.
__global__ void EncodeRequantKernel(const float* v, size_t len, uint64_t index0, size_t group, int bits,
                                    ScaleFormat format, float clipK, DitherRule rule, uint8_t* scales,
                                    uint16_t* codes, uint8_t* packed, bool aligned) {
  const size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= (len + group - 1) / group) return;
  EncodeGroup(v, len, g, index0, group, bits, format, clipK, rule, scales, codes, packed, aligned);
}

// One thread per output byte of the little-endian stream of `bits`-bit codes.
__global__ void PackKernel(const uint16_t* codes, size_t n, int bits, uint8_t* out) {
  const size_t b = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= PackedBytes(n, bits)) return;
  out[b] = PackedByteAt([codes](size_t e) { return static_cast<uint32_t>(codes[e]); }, n, bits, b);
}

// Element j of a requant message of len values.
__device__ float DecodeAt(const uint8_t* wire, size_t len, size_t group, int bits, ScaleFormat format, size_t j) {
  const size_t groups = (len + group - 1) / group;
  const int sb = ScaleBytes(format);
  const float s = LoadScale(wire + (j / group) * sb, format);
  float half, inv;
  GridOf(s, Levels(bits), &half, &inv);
  return DequantizeCode(ReadBits(wire + groups * sb, PackedBytes(len, bits), j * bits, bits), half, s);
}

// One thread per element.
__global__ void DecodeRequantKernel(const uint8_t* wire, size_t len, size_t group, int bits, ScaleFormat format,
                                    float* out) {
  const size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < len) out[j] = DecodeAt(wire, len, group, bits, format, j);
}

// The fused hop, one thread per group: vals = local + decode(in0) (+ decode(in1)), then the group encoded as
// EncodeRequantKernel does it.
__global__ void HopRequantKernel(const uint8_t* in0, const uint8_t* in1, int nin, const float* local, size_t len,
                                 uint64_t index0, size_t group, int bits, ScaleFormat format, float clipK,
                                 DitherRule rule, float* vals, uint8_t* scales, uint16_t* codes, uint8_t* packed,
                                 bool aligned) {
  const size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t groups = (len + group - 1) / group;
  if (g >= groups) return;
  const size_t begin = g * group, n = len - begin < group ? len - begin : group;
  // DecodeAt's steps, with each message's scale and grid of this group found once.
  const int sb = ScaleBytes(format);
  const size_t codeBytes = PackedBytes(len, bits);
  // (The loops over the two messages unroll, so that the arrays stay in registers; nin is 0, 1 or 2.)
  const uint8_t* in[2] = {in0, in1};
  float s[2] = {0.0f, 0.0f}, half[2] = {0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (k < nin) {
      float inv;
      s[k] = LoadScale(in[k] + g * sb, format);
      GridOf(s[k], Levels(bits), &half[k], &inv);
    }
  }
  for (size_t i = begin; i < begin + n; ++i) {
    float x = local[i];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (k < nin) x += DequantizeCode(ReadBits(in[k] + groups * sb, codeBytes, i * bits, bits), half[k], s[k]);
    }
    vals[i] = x;
  }
  EncodeGroup(vals, len, g, index0, group, bits, format, clipK, rule, scales, codes, packed, aligned);
}

// Homomorphic lanes. One thread per group of `group` values: its agreed-scale candidate (the metadata).
__global__ void GroupScalesKernel(const float* v, size_t count, size_t group, float clipK, float* scales) {
  const size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= (count + group - 1) / group) return;
  const size_t begin = g * group;
  scales[g] = GroupScaleAt(v + begin, count - begin < group ? count - begin : group, clipK);
}

// One thread per 8 values, whose `laneBits`-bit codes fill exactly laneBits bytes (the last thread: fewer). Each
// value is coded on the grid of its global group's agreed scale, with the dither of its global index.
__global__ void EncodeLanesKernel(const float* v, size_t len, uint64_t index0, size_t group, const float* scales,
                                  int bits, int laneBits, DitherRule rule, uint8_t* out) {
  const size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t begin = 8 * t;
  if (begin >= len) return;
  const size_t end = len - begin < 8 ? len : begin + 8;
  const uint32_t levels = Levels(bits);
  BitWriter w(out + t * static_cast<size_t>(laneBits));
  tile::DitherStream dither(rule);
  for (size_t e = begin; e < end; ++e) {
    const float s = scales[(index0 + e) / group];
    const float inv = InvStepOf(s, levels);
    const float u = dither.At(static_cast<uint32_t>(index0 + e), e == begin);
    w.Put(QuantizeCode(v[e], inv, s * inv, levels, u), laneBits);
  }
  w.Flush();
}

// One thread per value: the lane sum of nranks codes back to the sum of the values, C * step - nranks * s
// (DequantizeSum).
__global__ void DecodeLanesKernel(const uint8_t* wire, size_t len, uint64_t index0, size_t group, const float* scales,
                                  int bits, int laneBits, int nranks, float* out) {
  const size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= len) return;
  const float s = scales[(index0 + j) / group];
  float half, inv;
  GridOf(s, Levels(bits), &half, &inv);
  const uint32_t code = ReadBits(wire, PackedBytes(len, laneBits), j * static_cast<size_t>(laneBits), laneBits);
  out[j] = DequantizeSum(code, half, s, static_cast<float>(nranks));
}

// dst = a + b over a stream of lanes, one thread per 8 lanes (laneBits bytes): as AddPackedStreams' whole-stream
// addition, because no lane overflows, so no carry crosses from one group of 8 lanes into the next.
__global__ void AddLanesKernel(uint8_t* dst, const uint8_t* a, const uint8_t* b, size_t bytes, int laneBits) {
  const size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t begin = t * static_cast<size_t>(laneBits);
  if (begin >= bytes) return;
  const size_t end = bytes - begin < static_cast<size_t>(laneBits) ? bytes : begin + laneBits;
  uint32_t carry = 0;
  for (size_t i = begin; i < end; ++i) {
    const uint32_t sum = static_cast<uint32_t>(a[i]) + b[i] + carry;
    dst[i] = static_cast<uint8_t>(sum);
    carry = sum >> 8;
  }
}

// The tiled requant kernels (compress/requant_tile.h): one thread block per tile, the phases with a barrier between
// them. Every branch around a barrier depends on the tile only, so all threads of a block take it alike.
__global__ void __launch_bounds__(tile::kThreads) HopTileKernel(tile::HopArgs a) {
  extern __shared__ uint32_t words[];
  const tile::HopTile h = tile::HopTileOf(a, blockIdx.x);
  tile::HopLoad(a, h, words, threadIdx.x, blockDim.x);
  __syncthreads();
  const int phases = tile::HopRotatePhases(a, h);
  for (int p = 0; p < phases; ++p) {
    tile::HopRotate(a, h, words, p, threadIdx.x, blockDim.x);
    __syncthreads();
  }
  // HopEncodePhase's sequence spelled out (a loop over the dispatcher made ptxas spill registers here).
  if (tile::GroupThreads(a.group) > 1) {
    tile::HopGroupStats(a, h, words, threadIdx.x, blockDim.x);
    __syncthreads();
    tile::HopGroupScales(a, h, words, threadIdx.x, blockDim.x);
    __syncthreads();
    tile::HopQuantize(a, h, words, threadIdx.x, blockDim.x);
  } else {
    tile::HopEncodeGroups(a, h, words, threadIdx.x, blockDim.x);
  }
  __syncthreads();
  tile::HopPack(a, h, words, threadIdx.x, blockDim.x);
}

// The homomorphic lanes (compress/lanes_tile.h): the hop's load and rotation, then the mode's phases (kRequant
// encodes the decoded lane sums with the requant phases after its own).
__global__ void __launch_bounds__(tile::kThreads) LanesTileKernel(tile::LanesArgs a) {
  extern __shared__ uint32_t words[];
  const tile::HopTile h = tile::HopTileOf(a.hop, blockIdx.x);
  tile::HopLoad(a.hop, h, words, threadIdx.x, blockDim.x);
  __syncthreads();
  const int phases = tile::HopRotatePhases(a.hop, h);
  for (int p = 0; p < phases; ++p) {
    tile::HopRotate(a.hop, h, words, p, threadIdx.x, blockDim.x);
    __syncthreads();
  }
  const int lanes = tile::LanesPhases(a);
  for (int p = 0; p < lanes; ++p) {
    if (p > 0) __syncthreads();
    tile::LanesPhase(a, h, words, p, threadIdx.x, blockDim.x);
  }
}

// kLanes: lane sums (a.agreed set), else a requant message; two kernels, so that each keeps its own registers.
template <bool kLanes>
__global__ void __launch_bounds__(tile::kThreads) DecodeTileKernel(tile::DecodeArgs a) {
  extern __shared__ uint32_t words[];
  const tile::DecodeTile d = tile::DecodeTileOf(a, blockIdx.x);
  if (kLanes) {
    tile::DecodeLaneUnits(a, d, words, threadIdx.x, blockDim.x);
  } else {
    tile::DecodeGroups(a, d, words, threadIdx.x, blockDim.x);
  }
  __syncthreads();
  const int phases = tile::DecodeRotatePhases(a, d);
  for (int p = 0; p < phases; ++p) {
    tile::DecodeRotate(a, d, words, p, threadIdx.x, blockDim.x);
    __syncthreads();
  }
  tile::DecodeStore(a, d, words, threadIdx.x, blockDim.x);
}

ccResult_t LaunchHopTiles(const tile::HopArgs& a, cudaStream_t stream) {
  if (a.len == 0) return ccSuccess;
  HopTileKernel<<<static_cast<unsigned>(tile::HopTiles(a)), tile::kThreads, tile::SharedWords() * 4, stream>>>(a);
  return Launched("requant tile hop kernel launch");
}

ccResult_t LaunchDecodeTiles(const tile::DecodeArgs& a, cudaStream_t stream) {
  if (a.len == 0) return ccSuccess;
  if (!tile::DecodeArgsValid(a)) {
    return Fail(ccInternalError,
                "gpu decode tiles: arguments the kernel cannot take (group %zu, block %zu, %d-bit lanes)", a.group,
                a.block, a.laneBits);
  }
  const unsigned tiles = static_cast<unsigned>(tile::DecodeTiles(a));
  if (a.agreed != nullptr) {
    DecodeTileKernel<true><<<tiles, tile::kThreads, tile::SharedWords() * 4, stream>>>(a);
  } else {
    DecodeTileKernel<false><<<tiles, tile::kThreads, tile::SharedWords() * 4, stream>>>(a);
  }
  return Launched("requant tile decode kernel launch");
}

ccResult_t LaunchLanesTiles(const tile::LanesArgs& a, cudaStream_t stream) {
  if (a.hop.len == 0) return ccSuccess;
  if (!tile::LanesArgsValid(a)) {
    return Fail(ccInternalError,
                "gpu lanes tiles: arguments the kernel cannot take (mode %d, group %zu, block %zu, %d inputs, "
                "%d-bit lanes)",
                static_cast<int>(a.mode), a.hop.group, a.hop.block, a.hop.nin, a.laneBits);
  }
  LanesTileKernel<<<static_cast<unsigned>(tile::HopTiles(a.hop)), tile::kThreads, tile::SharedWords() * 4, stream>>>(
      a);
  return Launched("lanes tile kernel launch");
}

}  // namespace

ccResult_t LanesTiles(const tile::LanesArgs& a, cudaStream_t stream) { return LaunchLanesTiles(a, stream); }

ccResult_t DecodeTiles(const tile::DecodeArgs& a, cudaStream_t stream) { return LaunchDecodeTiles(a, stream); }

ccResult_t LoadQuantKernels() {
  CC_CHECK(LoadKernel(RotateKernel, "loading RotateKernel"));
  CC_CHECK(AllowRotateSharedMemory());
  CC_CHECK(LoadKernel(EncodeRequantKernel, "loading EncodeRequantKernel"));
  CC_CHECK(LoadKernel(PackKernel, "loading PackKernel"));
  CC_CHECK(LoadKernel(DecodeRequantKernel, "loading DecodeRequantKernel"));
  CC_CHECK(LoadKernel(HopTileKernel, "loading HopTileKernel"));
  CC_CHECK(LoadKernel(DecodeTileKernel<false>, "loading DecodeTileKernel"));
  CC_CHECK(LoadKernel(DecodeTileKernel<true>, "loading DecodeTileKernel (lanes)"));
  CC_CHECK(LoadKernel(LanesTileKernel, "loading LanesTileKernel"));
  CC_CHECK(LoadKernel(HopRequantKernel, "loading HopRequantKernel"));
  CC_CHECK(LoadKernel(GroupScalesKernel, "loading GroupScalesKernel"));
  CC_CHECK(LoadKernel(EncodeLanesKernel, "loading EncodeLanesKernel"));
  CC_CHECK(LoadKernel(DecodeLanesKernel, "loading DecodeLanesKernel"));
  return LoadKernel(AddLanesKernel, "loading AddLanesKernel");
}

ccResult_t GroupScales(const float* v, size_t count, size_t group, float clipK, float* scales, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  if (tile::Covers(group)) return LaunchLanesTiles(tile::ScalesArgsOf(v, count, group, clipK, scales), stream);
  GroupScalesKernel<<<Blocks((count + group - 1) / group), kThreads, 0, stream>>>(v, count, group, clipK, scales);
  return Launched("group scales kernel launch");
}

ccResult_t EncodeLanes(const float* v, size_t len, uint64_t index0, size_t group, const float* scales, int bits,
                       int laneBits, const DitherRule& rule, void* wireOut, cudaStream_t stream) {
  if (len == 0) return ccSuccess;
  if (tile::Covers(group)) {
    const tile::HopArgs hop =
        tile::HopArgsOf(v, nullptr, 0, index0, len, group, bits, ScaleFormat::kFp32, 0.0f, rule, wireOut);
    return LaunchLanesTiles(tile::LanesArgsOf(hop, scales, laneBits, 1, false), stream);
  }
  EncodeLanesKernel<<<Blocks((len + 7) / 8), kThreads, 0, stream>>>(v, len, index0, group, scales, bits, laneBits,
                                                                    rule, static_cast<uint8_t*>(wireOut));
  return Launched("lanes encode kernel launch");
}

ccResult_t DecodeLanes(const void* wire, size_t len, uint64_t index0, size_t group, const float* scales, int bits,
                       int laneBits, int nranks, float* out, cudaStream_t stream) {
  if (len == 0) return ccSuccess;
  if (tile::Covers(group)) {
    const tile::DecodeArgs a = tile::DecodeArgsOf(wire, index0, len, group, bits, ScaleFormat::kFp32, out);
    return LaunchDecodeTiles(tile::LanesFrom(a, scales, laneBits, nranks), stream);
  }
  DecodeLanesKernel<<<Blocks(len), kThreads, 0, stream>>>(static_cast<const uint8_t*>(wire), len, index0, group,
                                                          scales, bits, laneBits, nranks, out);
  return Launched("lanes decode kernel launch");
}

ccResult_t AddLanes(void* dst, const void* a, const void* b, size_t len, int laneBits, cudaStream_t stream) {
  const size_t bytes = PackedBytes(len, laneBits);
  if (bytes == 0) return ccSuccess;
  AddLanesKernel<<<Blocks((len + 7) / 8), kThreads, 0, stream>>>(static_cast<uint8_t*>(dst),
                                                                 static_cast<const uint8_t*>(a),
                                                                 static_cast<const uint8_t*>(b), bytes, laneBits);
  return Launched("lanes add kernel launch");
}

ccResult_t RotateForward(const float* in, float* out, size_t count, size_t block, uint32_t signKey,
                         cudaStream_t stream) {
  return Rotate(in, out, count, block, signKey, false, 1.0f, nullptr, stream);
}

ccResult_t RotateInverse(float* x, size_t count, size_t block, uint32_t signKey, float scale, const uint8_t* done,
                         cudaStream_t stream) {
  return Rotate(x, x, count, block, signKey, true, scale, done, stream);
}

size_t RequantBytes(size_t len, size_t group, int bits, ScaleFormat format) {
  return ((len + group - 1) / group) * ScaleBytes(format) + PackedBytes(len, bits);
}

ccResult_t EncodeRequant(const float* v, size_t len, uint64_t index0, size_t group, int bits, ScaleFormat format,
                         float clipK, const DitherRule& rule, uint16_t* codes, void* wireOut, cudaStream_t stream) {
  return HopRequant(nullptr, 0, v, len, index0, group, bits, format, clipK, rule, nullptr, codes, wireOut, stream);
}

ccResult_t DecodeRequant(const void* wire, size_t len, size_t group, int bits, ScaleFormat format, float* out,
                         cudaStream_t stream) {
  if (len == 0) return ccSuccess;
  if (tile::Covers(group)) return LaunchDecodeTiles(tile::DecodeArgsOf(wire, 0, len, group, bits, format, out), stream);
  DecodeRequantKernel<<<Blocks(len), kThreads, 0, stream>>>(static_cast<const uint8_t*>(wire), len, group, bits,
                                                            format, out);
  return Launched("requant decode kernel launch");
}

ccResult_t HopRequant(const void* const* wiresIn, int nin, const float* local, size_t len, uint64_t index0,
                      size_t group, int bits, ScaleFormat format, float clipK, const DitherRule& rule, float* vals,
                      uint16_t* codes, void* wireOut, cudaStream_t stream) {
  if (len == 0) return ccSuccess;
  if (nin < 0 || nin > 2) return Fail(ccInternalError, "gpu requant hop: %d inputs (0..2)", nin);
  if (tile::Covers(group)) {
    return LaunchHopTiles(tile::HopArgsOf(local, wiresIn, nin, index0, len, group, bits, format, clipK, rule, wireOut),
                          stream);
  }
  const size_t groups = (len + group - 1) / group;
  uint8_t* scales = static_cast<uint8_t*>(wireOut);
  uint8_t* packed = scales + groups * ScaleBytes(format);
  const bool aligned = (group * static_cast<size_t>(bits)) % 8 == 0;
  if (nin == 0) {
    EncodeRequantKernel<<<Blocks(groups), kThreads, 0, stream>>>(local, len, index0, group, bits, format, clipK, rule,
                                                                 scales, codes, packed, aligned);
  } else {
    const uint8_t* in0 = static_cast<const uint8_t*>(wiresIn[0]);
    const uint8_t* in1 = nin > 1 ? static_cast<const uint8_t*>(wiresIn[1]) : nullptr;
    HopRequantKernel<<<Blocks(groups), kThreads, 0, stream>>>(in0, in1, nin, local, len, index0, group, bits, format,
                                                              clipK, rule, vals, scales, codes, packed, aligned);
  }
  CC_CHECK(Launched("requant encode kernel launch"));
  if (!aligned) {
    PackKernel<<<Blocks(PackedBytes(len, bits)), kThreads, 0, stream>>>(codes, len, bits, packed);
    CC_CHECK(Launched("pack kernel launch"));
  }
  return ccSuccess;
}

ccResult_t HopRequantRotated(const void* const* wiresIn, int nin, const float* input, size_t count, size_t block,
                             uint32_t signKey, bool edgesRotated, size_t off, size_t len, size_t group, int bits,
                             ScaleFormat format, float clipK, const DitherRule& rule, void* wireOut,
                             cudaStream_t stream) {
  if (nin < 0 || nin > 2) return Fail(ccInternalError, "gpu requant hop: %d inputs (0..2)", nin);
  if (!tile::Covers(group) || !tile::CoversRotation(block)) {
    return Fail(ccInternalError, "gpu requant hop with rotation: group %zu or block %zu not covered", group, block);
  }
  const tile::HopArgs a = tile::HopArgsOf(nullptr, wiresIn, nin, off, len, group, bits, format, clipK, rule, wireOut);
  return LaunchHopTiles(tile::RotatedFrom(a, input, count, block, signKey, edgesRotated), stream);
}

ccResult_t RotateBlockForward(float* x, size_t base, size_t len, uint32_t signKey, cudaStream_t stream) {
  if (len > kMaxBlock || (len & (len - 1)) != 0) return Fail(ccInternalError, "gpu rotation: block of %zu", len);
  CC_CHECK(AllowRotateSharedMemory());
  RotateKernel<<<1, RotateThreads(len), len * sizeof(float), stream>>>(x, x, base, len, signKey, false, 1.0f, nullptr);
  return Launched("rotation kernel launch (one block)");
}

ccResult_t DecodeRequantRotated(const void* wire, size_t off, size_t len, size_t group, int bits, ScaleFormat format,
                                size_t count, size_t block, uint32_t signKey, float scale, uint8_t* done, float* out,
                                cudaStream_t stream) {
  if (!tile::Covers(group) || !tile::CoversRotation(block)) {
    return Fail(ccInternalError, "gpu requant decode with rotation: group %zu or block %zu not covered", group, block);
  }
  const tile::DecodeArgs a = tile::DecodeArgsOf(wire, off, len, group, bits, format, out);
  return LaunchDecodeTiles(tile::RotatedBack(a, count, block, signKey, scale, done), stream);
}

}  // namespace gpu
}  // namespace ccoll
