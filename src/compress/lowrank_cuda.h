// PowerSGD's three products on the GPU (cuBLAS), with the row-major layouts of compress/lowrank.h: m is rows x cols,
// p rows x r, q cols x r, out rows x cols. Work goes on the stream the object was made with; nothing waits for it.
// cuBLAS's SGEMM is deterministic on one GPU model and library version, so ranks on the same kind of GPU compute the
// same bytes from the same factors; they are not the CPU BLAS's bytes. Default math mode: no TF32.
//
// CUDA builds with cuBLAS only (CCOLL_HAVE_CUBLAS).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "ccoll.h"

namespace ccoll {
namespace gpu {

class LowRankBlas {
 public:
  // ccUnhandledCudaError (with the last-error sentence) when cuBLAS cannot make a handle. The handle is of the current
  // device; a handle of an object destroyed before is used again (cublasDestroy would synchronize the device).
  static ccResult_t Create(cudaStream_t stream, std::unique_ptr<LowRankBlas>* out);
  ~LowRankBlas();
  LowRankBlas(const LowRankBlas&) = delete;
  LowRankBlas& operator=(const LowRankBlas&) = delete;

  // p = m q
  ccResult_t ProductMQ(const float* m, int64_t rows, int64_t cols, const float* q, int r, float* p);
  // q = m^T p
  ccResult_t ProductMtP(const float* m, int64_t rows, int64_t cols, const float* p, int r, float* q);
  // out = p q^T
  ccResult_t ProductPQt(const float* p, const float* q, int64_t rows, int64_t cols, int r, float* out);
  // Later products go on `stream` (a stream-ordered call's: the caller's), with `workspace` (bytes of device memory,
  // 256-byte aligned) as cuBLAS's workspace, or cuBLAS's own when it is null. A stream-ordered call passes its own:
  // cublasSetStream drops a workspace set before, and cuBLAS's own may be allocated per stream, which a CUDA graph
  // capture does not allow.
  ccResult_t SetStream(cudaStream_t stream, void* workspace, size_t bytes);
  // The workspace a stream-ordered call gives it (cuBLAS's recommendation for Hopper).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

 private:
  LowRankBlas() = default;
  int device_ = 0;
  void* handle_ = nullptr;  // cublasHandle_t, from a pool per device (lowrank_cuda.cc): never destroyed
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;  // set by SetStream (null: cuBLAS's own)
};

// Makes cuBLAS handles for CUDA device `device` (the current device) until `count` have been made in all, for
// LowRankBlas::Create to take later without cublasCreate (collectives/device_prepare.h says when).
ccResult_t ReserveBlasHandles(int device, int count);

// The steps between the products, for the stream-ordered path (lowrank_cuda.cu), queued on `stream`; scratch: rows * r
// (cols * r) doubles of device memory. OrthogonalizeOnDevice: compress/lowrank.h's Orthogonalize. StartQOnDevice:
// LowRankStartQ for one matrix: with `warm`, q (the previous call's Q) orthonormalized again, kept when UsableQ;
// else RandomQ(q, cols, r, key). Deterministic (the same bytes on every rank), not the host's bytes.
ccResult_t OrthogonalizeOnDevice(float* a, int64_t rows, int r, double eps, double* scratch, cudaStream_t stream);
ccResult_t StartQOnDevice(float* q, int64_t cols, int r, uint32_t key, bool warm, double eps, double* scratch,
                          cudaStream_t stream);
// Loads lowrank_cuda.cu's kernels (collectives/device_prepare.h).
ccResult_t LoadLowRankKernels();

}  // namespace gpu
}  // namespace ccoll
