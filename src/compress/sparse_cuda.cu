// CUDA kernels of the chunk sparsifiers (sparse.cc) and of the error feedback of every codec that keeps one: chunk
// norms in the CPU's order (so every rank, and the host path, picks the same chunks), gather and scatter of the
// chosen chunks, and the memory's passes (add the gradient in, keep what was not sent).
#include <cuda_runtime.h>

#include <cmath>

#include "compress/codec_cuda.h"
#include "core/cuda_result.h"

namespace ccoll {
namespace gpu {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(size_t items) { return static_cast<unsigned>((items + kThreads - 1) / kThreads); }

// One thread per chunk: the squared norm summed in double in index order, as ChunkNorms does; +inf when not finite.
__global__ void ChunkNormsKernel(const float* x, size_t count, size_t chunk, float* norms) {
  const size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t begin = c * chunk;
  if (begin >= count) return;
  const size_t end = count - begin < chunk ? count : begin + chunk;
  double sq = 0.0;
  for (size_t i = begin; i < end; ++i) sq += static_cast<double>(x[i]) * x[i];
  norms[c] = isfinite(sq) ? static_cast<float>(sq) : INFINITY;
}

// One thread per packed element. chosen is increasing, so only the last chosen chunk can be short and packed chunk
// k starts at k * chunk.
__global__ void GatherChunksKernel(const float* x, size_t chunk, const uint32_t* chosen, size_t packed, float* out) {
  const size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p < packed) out[p] = x[static_cast<size_t>(chosen[p / chunk]) * chunk + p % chunk];
}

__global__ void ScatterChunksKernel(const float* in, size_t chunk, const uint32_t* chosen, size_t packed, float* x) {
  const size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p < packed) x[static_cast<size_t>(chosen[p / chunk]) * chunk + p % chunk] = in[p];
}

__global__ void FillKernel(float* x, size_t count, float value) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = value;
}

__global__ void AnyNonFiniteKernel(const float* x, size_t count, unsigned* flag) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && !isfinite(x[i])) atomicOr(flag, 1u);
}

__global__ void AddIntoKernel(float* acc, const float* x, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) acc[i] += x[i];
}

__global__ void KeepResidualKernel(float* e, const float* g, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float left = e[i] - g[i];
  e[i] = isfinite(left) ? left : 0.0f;
}

__global__ void DropNonFiniteKernel(float* e, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && !isfinite(e[i])) e[i] = 0.0f;
}

}  // namespace

ccResult_t LoadSparseKernels() {
  CC_CHECK(LoadKernel(ChunkNormsKernel, "loading ChunkNormsKernel"));
  CC_CHECK(LoadKernel(GatherChunksKernel, "loading GatherChunksKernel"));
  CC_CHECK(LoadKernel(ScatterChunksKernel, "loading ScatterChunksKernel"));
  CC_CHECK(LoadKernel(FillKernel, "loading FillKernel"));
  CC_CHECK(LoadKernel(AnyNonFiniteKernel, "loading AnyNonFiniteKernel"));
  CC_CHECK(LoadKernel(AddIntoKernel, "loading AddIntoKernel"));
  CC_CHECK(LoadKernel(KeepResidualKernel, "loading KeepResidualKernel"));
  return LoadKernel(DropNonFiniteKernel, "loading DropNonFiniteKernel");
}

ccResult_t ChunkNorms(const float* x, size_t count, size_t chunk, float* norms, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  ChunkNormsKernel<<<Blocks((count + chunk - 1) / chunk), kThreads, 0, stream>>>(x, count, chunk, norms);
  return Launched("chunk norms kernel launch");
}

ccResult_t GatherChunks(const float* x, size_t chunk, const uint32_t* chosen, size_t packed, float* out,
                        cudaStream_t stream) {
  if (packed == 0) return ccSuccess;
  GatherChunksKernel<<<Blocks(packed), kThreads, 0, stream>>>(x, chunk, chosen, packed, out);
  return Launched("gather chunks kernel launch");
}

ccResult_t ScatterChunks(const float* in, size_t chunk, const uint32_t* chosen, size_t packed, float* x,
                         cudaStream_t stream) {
  if (packed == 0) return ccSuccess;
  ScatterChunksKernel<<<Blocks(packed), kThreads, 0, stream>>>(in, chunk, chosen, packed, x);
  return Launched("scatter chunks kernel launch");
}

ccResult_t Fill(float* x, size_t count, float value, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  FillKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, value);
  return Launched("fill kernel launch");
}

ccResult_t AnyNonFinite(const float* x, size_t count, unsigned* flag, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  AnyNonFiniteKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, flag);
  return Launched("non-finite check kernel launch");
}

ccResult_t AddInto(float* acc, const float* x, size_t count, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  AddIntoKernel<<<Blocks(count), kThreads, 0, stream>>>(acc, x, count);
  return Launched("error feedback add kernel launch");
}

ccResult_t KeepResidual(float* e, const float* g, size_t count, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  KeepResidualKernel<<<Blocks(count), kThreads, 0, stream>>>(e, g, count);
  return Launched("error feedback residual kernel launch");
}

ccResult_t DropNonFinite(float* e, size_t count, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  DropNonFiniteKernel<<<Blocks(count), kThreads, 0, stream>>>(e, count);
  return Launched("error feedback cleanup kernel launch");
}

}  // namespace gpu
}  // namespace ccoll
