// PowerSGD's steps between the products on the GPU, for the stream-ordered path (transport nccl), which cannot hand
// P and Q to the host: modified Gram-Schmidt in double precision (compress/lowrank.h: Orthogonalize) and the start of
// Q (the warm start orthonormalized again, or a fresh random one when it is not usable: LowRankStartQ). One thread
// block per matrix; its sums are block reductions in a fixed order, so every rank computes the same bytes, though not
// the host's (its sums are sequential), as the products on cuBLAS are not the CPU BLAS's.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include "compress/lowrank.h"
#include "compress/lowrank_cuda.h"
#include "compress/rng.h"
#include "core/cuda_result.h"

namespace ccoll {
namespace gpu {
namespace {

constexpr int kThreads = 256;
using Reduce = cub::BlockReduce<double, kThreads>;

// The block's sum of f(i) over i in [0, n); every thread gets it.
template <typename F>
__device__ double BlockSum(int64_t n, F f, Reduce::TempStorage& temp, double* shared) {
  double part = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) part += f(i);
  const double total = Reduce(temp).Sum(part);
  if (threadIdx.x == 0) *shared = total;
  __syncthreads();
  const double all = *shared;
  __syncthreads();
  return all;
}

// Orthogonalize's steps on w (rows x r, row-major, double), by the whole block; r <= kMaxRank.
constexpr int kMaxRank = 64;  // ccParamRank's bound
__device__ void GramSchmidt(double* w, int64_t rows, int r, double eps, Reduce::TempStorage& temp, double* shared) {
  __shared__ double before[kMaxRank];  // each column's squared norm before the earlier ones are taken out
  for (int j = 0; j < r; ++j) {
    const double sq = BlockSum(rows, [&](int64_t i) { return w[i * r + j] * w[i * r + j]; }, temp, shared);
    if (threadIdx.x == 0) before[j] = sq;
  }
  __syncthreads();
  for (int j = 0; j < r; ++j) {
    const double sq = BlockSum(rows, [&](int64_t i) { return w[i * r + j] * w[i * r + j]; }, temp, shared);
    const double denom = sqrt(sq) + eps;
    const bool zero = denom == 0.0 || LowRankDependent(sq, before[j]);
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) w[i * r + j] = zero ? 0.0 : w[i * r + j] / denom;
    __syncthreads();
    if (zero) continue;
    const double scale = LowRankProjectionScale(sq, denom, eps);
    for (int k = j + 1; k < r; ++k) {
      const double dot =
          scale * BlockSum(rows, [&](int64_t i) { return w[i * r + j] * w[i * r + k]; }, temp, shared);
      for (int64_t i = threadIdx.x; i < rows; i += kThreads) w[i * r + k] -= dot * w[i * r + j];
      __syncthreads();
    }
  }
}

__device__ void Widen(const float* a, double* w, int64_t elems) {
  for (int64_t i = threadIdx.x; i < elems; i += kThreads) w[i] = a[i];
  __syncthreads();
}

__device__ void Narrow(const double* w, float* a, int64_t elems) {
  for (int64_t i = threadIdx.x; i < elems; i += kThreads) a[i] = static_cast<float>(w[i]);
  __syncthreads();
}

// One block: a (rows x r) orthonormalized in place, through w (rows * r doubles of scratch).
__global__ void OrthogonalizeKernel(float* a, int64_t rows, int r, double eps, double* w) {
  __shared__ Reduce::TempStorage temp;
  __shared__ double shared;
  Widen(a, w, rows * r);
  GramSchmidt(w, rows, r, eps, temp, &shared);
  Narrow(w, a, rows * r);
}

// One block: LowRankStartQ for one matrix's q (cols x r): with `warm`, q orthonormalized again, kept when it is
// usable (finite, no zero column: UsableQ); else RandomQ's values from `key`, orthonormalized with eps 0.
__global__ void StartQKernel(float* q, int64_t cols, int r, uint32_t key, int warm, double eps, double* w) {
  __shared__ Reduce::TempStorage temp;
  __shared__ double shared;
  __shared__ int usable;
  const int64_t elems = cols * r;
  if (warm) {
    Widen(q, w, elems);
    GramSchmidt(w, cols, r, eps, temp, &shared);
    Narrow(w, q, elems);
    if (threadIdx.x == 0) usable = 1;
    __syncthreads();
    for (int j = 0; j < r; ++j) {
      const double bad = BlockSum(cols, [&](int64_t i) { return isfinite(q[i * r + j]) ? 0.0 : 1.0; }, temp, &shared);
      const double nonzero = BlockSum(cols, [&](int64_t i) { return q[i * r + j] != 0.0f ? 1.0 : 0.0; }, temp,
                                      &shared);
      if (threadIdx.x == 0 && (bad != 0.0 || nonzero == 0.0)) usable = 0;
    }
    __syncthreads();
    if (usable) return;
  }
  // RandomQ: a sum of four uniforms per element, in RandomQ's float arithmetic (this file is built without FMA).
  for (int64_t i = threadIdx.x; i < elems; i += kThreads) {
    float sum = 0.0f;
    for (uint32_t k = 0; k < 4; ++k) {
      const uint32_t bits = RandomWord64(key, 4 * static_cast<uint64_t>(i) + k);
      sum += (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f) - 0.5f;
    }
    w[i] = static_cast<double>(sum * 1.7320508f);
  }
  __syncthreads();
  GramSchmidt(w, cols, r, 0.0, temp, &shared);
  Narrow(w, q, elems);
}

}  // namespace

ccResult_t LoadLowRankKernels() {
  CC_CHECK(LoadKernel(OrthogonalizeKernel, "loading OrthogonalizeKernel"));
  return LoadKernel(StartQKernel, "loading StartQKernel");
}

ccResult_t OrthogonalizeOnDevice(float* a, int64_t rows, int r, double eps, double* scratch, cudaStream_t stream) {
  if (rows == 0 || r == 0) return ccSuccess;
  OrthogonalizeKernel<<<1, kThreads, 0, stream>>>(a, rows, r, eps, scratch);
  return Launched("Gram-Schmidt kernel launch");
}

ccResult_t StartQOnDevice(float* q, int64_t cols, int r, uint32_t key, bool warm, double eps, double* scratch,
                          cudaStream_t stream) {
  if (cols == 0 || r == 0) return ccSuccess;
  StartQKernel<<<1, kThreads, 0, stream>>>(q, cols, r, key, warm ? 1 : 0, eps, scratch);
  return Launched("start of Q kernel launch");
}

}  // namespace gpu
}  // namespace ccoll
