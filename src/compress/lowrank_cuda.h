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

// A cuBLAS handle of the current device, lent for the products of one call. Handles come from a pool per device
// (lowrank_cuda.cc) and go back to it when the object is destroyed, right after the products are queued, not when they
// are done: the next borrower points the handle at its own stream and workspace, and nothing of the handle's is read
// by products in flight (the scalars are read at the call), as PyTorch shares its handles between streams.
class LowRankBlas {
 public:
  // Products go on `stream`, with `workspace` (bytes of device memory, 256-byte aligned) as cuBLAS's workspace, or
  // cuBLAS's own when it is null (only for a handle no other stream uses meanwhile: tests). A caller passes one
  // workspace of its own, because a lent handle moves between streams and cuBLAS's own would be shared by products
  // in flight on two of them, and a CUDA graph capture does not allow cuBLAS to allocate one per stream.
  // `capturing`: the stream is being captured into a CUDA graph, so only a kept handle will do (ccInvalidUsage when
  // the pool has none). ccUnhandledCudaError (with the last-error sentence) when cuBLAS cannot make a handle.
  static ccResult_t Create(cudaStream_t stream, void* workspace, size_t bytes, bool capturing,
                           std::unique_ptr<LowRankBlas>* out);
  ~LowRankBlas();
  LowRankBlas(const LowRankBlas&) = delete;
  LowRankBlas& operator=(const LowRankBlas&) = delete;

  // p = m q
  ccResult_t ProductMQ(const float* m, int64_t rows, int64_t cols, const float* q, int r, float* p);
  // q = m^T p
  ccResult_t ProductMtP(const float* m, int64_t rows, int64_t cols, const float* p, int r, float* q);
  // out = p q^T
  ccResult_t ProductPQt(const float* p, const float* q, int64_t rows, int64_t cols, int r, float* out);
  // The workspace a call gives it (cuBLAS's recommendation for Hopper).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

 private:
  LowRankBlas() = default;
  int device_ = 0;
  void* handle_ = nullptr;  // cublasHandle_t, from the pool: never destroyed
};

// Makes cuBLAS handles for CUDA device `device` (the current device) until `count` have been made in all, for
// LowRankBlas::Create to take later without cublasCreate (collectives/device_prepare.h says when and how many).
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
