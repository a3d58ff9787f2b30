// CUDA kernels of the 16-bit cast codec: the same round-to-nearest-even conversions (float16.h) and the same fp32
// sum order as cast16.cc (local, then the arriving messages in order), one thread per element, with what the
// rounding took away when asked; and the average.
#include <cuda_runtime.h>

#include "compress/codec_cuda.h"
#include "compress/float16.h"
#include "core/cuda_result.h"

namespace ccoll {
namespace gpu {
namespace {

constexpr int kThreads = 256;

template <typename W>
struct Wire;
template <>
struct Wire<Bf16> {
  __device__ static float Load(Bf16 v) { return Bf16ToFloat(v); }
  __device__ static Bf16 Store(float v) { return FloatToBf16(v); }
};
template <>
struct Wire<Half> {
  __device__ static float Load(Half v) { return HalfToFloat(v); }
  __device__ static Half Store(float v) { return FloatToHalf(v); }
};

template <typename W>
__global__ void HopKernel(const W* a, const W* b, int nin, const float* local, size_t len, W* out, float* lost) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= len) return;
  float v = local[i];
  if (nin > 0) v += Wire<W>::Load(a[i]);
  if (nin > 1) v += Wire<W>::Load(b[i]);
  const W w = Wire<W>::Store(v);
  out[i] = w;
  if (lost != nullptr) lost[i] = v - Wire<W>::Load(w);  // exact: a float minus its own 16-bit rounding
}

template <typename W>
__global__ void DecodeKernel(const W* in, size_t len, float* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < len) out[i] = Wire<W>::Load(in[i]);
}

__global__ void ScaleKernel(float* x, size_t count, float factor, bool divide) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = divide ? x[i] / factor : x[i] * factor;
}

template <typename W>
ccResult_t Hop(const void* const* wiresIn, int nin, const float* local, size_t len, void* wireOut, float* lost,
               cudaStream_t stream) {
  const W* a = nin > 0 ? static_cast<const W*>(wiresIn[0]) : nullptr;
  const W* b = nin > 1 ? static_cast<const W*>(wiresIn[1]) : nullptr;
  const unsigned blocks = static_cast<unsigned>((len + kThreads - 1) / kThreads);
  HopKernel<W><<<blocks, kThreads, 0, stream>>>(a, b, nin, local, len, static_cast<W*>(wireOut), lost);
  return ccSuccess;
}

}  // namespace

ccResult_t LoadCastKernels() {
  CC_CHECK(LoadKernel(HopKernel<Bf16>, "loading HopKernel<Bf16>"));
  CC_CHECK(LoadKernel(HopKernel<Half>, "loading HopKernel<Half>"));
  CC_CHECK(LoadKernel(DecodeKernel<Bf16>, "loading DecodeKernel<Bf16>"));
  CC_CHECK(LoadKernel(DecodeKernel<Half>, "loading DecodeKernel<Half>"));
  return LoadKernel(ScaleKernel, "loading ScaleKernel");
}

ccResult_t CastHop(ccDataType_t wire, const void* const* wiresIn, int nin, const float* local, size_t len,
                   void* wireOut, float* lost, cudaStream_t stream) {
  if (len == 0) return ccSuccess;
  if (nin < 0 || nin > 2) return Fail(ccInternalError, "gpu cast hop: %d inputs (0..2)", nin);
  if (wire == ccFloat16) {
    Hop<Half>(wiresIn, nin, local, len, wireOut, lost, stream);
  } else {
    Hop<Bf16>(wiresIn, nin, local, len, wireOut, lost, stream);
  }
  return Launched("cast hop kernel launch");
}

ccResult_t CastDecode(ccDataType_t wire, const void* in, size_t len, float* out, cudaStream_t stream) {
  if (len == 0) return ccSuccess;
  const unsigned blocks = static_cast<unsigned>((len + kThreads - 1) / kThreads);
  if (wire == ccFloat16) {
    DecodeKernel<Half><<<blocks, kThreads, 0, stream>>>(static_cast<const Half*>(in), len, out);
  } else {
    DecodeKernel<Bf16><<<blocks, kThreads, 0, stream>>>(static_cast<const Bf16*>(in), len, out);
  }
  return Launched("cast decode kernel launch");
}

ccResult_t Scale(float* x, size_t count, float factor, bool divide, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  const unsigned blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  ScaleKernel<<<blocks, kThreads, 0, stream>>>(x, count, factor, divide);
  return Launched("scale kernel launch");
}

}  // namespace gpu
}  // namespace ccoll
