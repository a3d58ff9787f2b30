#include "compress/lowrank_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace ccoll {
namespace gpu {
namespace {

// A failed cuBLAS call, with the CUDA runtime's error where there is one: cuBLAS's status does not say why a product
// did not run (CUBLAS_STATUS_EXECUTION_FAILED on a lost device, whose cause, a launch failure, is the runtime's).
ccResult_t Check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ccSuccess;
  const cudaError_t e = cudaGetLastError();
  return Fail(ccUnhandledCudaError, "%s failed: %s (%s)%s%s", what, cublasGetStatusName(s), cublasGetStatusString(s),
              e != cudaSuccess ? ": " : "", e != cudaSuccess ? cudaGetErrorString(e) : "");
}

cublasHandle_t H(void* h) { return static_cast<cublasHandle_t>(h); }

// Handles, per device, kept for the life of the process and lent to one LowRankBlas at a time (as PyTorch keeps its
// own). cublasDestroy synchronizes the device (the cuBLAS guide), and ranks that are threads of one process on one
// GPU make that a deadlock: this thread would wait for another rank's stream, held by a stream-wait kernel until this
// thread queues its part of the call. Never destroyed, not even at exit, where the CUDA context may already be gone.
class HandlePool {
 public:
  static HandlePool& Get() {
    static HandlePool* pool = new HandlePool();
    return *pool;
  }
  // A handle of the current device: a kept one, or a new one (cublasCreate) unless `capturing` (cublasCreate
  // allocates device memory, which a CUDA graph capture does not allow: ccInvalidUsage then).
  ccResult_t Take(int device, bool capturing, cublasHandle_t* out) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<cublasHandle_t>& kept = kept_[device];
      if (!kept.empty()) {
        *out = kept.back();
        kept.pop_back();
        return ccSuccess;
      }
    }
    if (capturing) {
      return Fail(ccInvalidUsage, "no spare cuBLAS handle on CUDA device %d for a PowerSGD call that is being captured "
                  "into a CUDA graph (making one is not allowed during a capture): run the call once before capturing "
                  "it, after the last communicator on the device was made", device);
    }
    CC_CHECK(Check(cublasCreate(out), "cublasCreate"));
    std::lock_guard<std::mutex> lock(mutex_);
    ++made_[device];
    return ccSuccess;
  }
  void Give(int device, cublasHandle_t h) {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_[device].push_back(h);
  }
  // Makes handles until `count` have been made for the device (kept or in use). cublasCreate runs without the lock:
  // it may synchronize the device, and a Take or Give meanwhile must not wait for that.
  ccResult_t Reserve(int device, int count) {
    int missing = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      missing = count - made_[device];
      if (missing > 0) made_[device] = count;  // claimed: a concurrent Reserve makes the rest only
    }
    for (int i = 0; i < missing; ++i) {
      cublasHandle_t h = nullptr;
      const ccResult_t r = Check(cublasCreate(&h), "cublasCreate");
      std::lock_guard<std::mutex> lock(mutex_);
      if (r != ccSuccess) {
        made_[device] -= missing - i;  // not made after all
        return r;
      }
      kept_[device].push_back(h);
    }
    return ccSuccess;
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cublasHandle_t>> kept_;
  std::map<int, int> made_;  // by Reserve and by Take, per device
};

}  // namespace

ccResult_t LowRankBlas::Create(cudaStream_t stream, void* workspace, size_t bytes, bool capturing,
                               std::unique_ptr<LowRankBlas>* out) {
  std::unique_ptr<LowRankBlas> b(new LowRankBlas());
  if (cudaGetDevice(&b->device_) != cudaSuccess) {
    cudaGetLastError();
    return Fail(ccUnhandledCudaError, "cudaGetDevice failed before cublasCreate");
  }
  cublasHandle_t h = nullptr;
  CC_CHECK(HandlePool::Get().Take(b->device_, capturing, &h));
  b->handle_ = h;  // from here on the destructor gives it back
  CC_CHECK(Check(cublasSetStream(h, stream), "cublasSetStream"));  // also back to cuBLAS's own workspace
  if (workspace != nullptr) CC_CHECK(Check(cublasSetWorkspace(h, workspace, bytes), "cublasSetWorkspace"));
  // Plain FP32 products (no TF32 tensor cores): what the CPU path computes, to fp32 rounding.
  CC_CHECK(Check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  *out = std::move(b);
  return ccSuccess;
}

LowRankBlas::~LowRankBlas() {
  // Given back as it is, still naming the borrower's stream and workspace, which may be freed after this: the next
  // borrower sets its own (Create) before anything else. Not reset to the legacy stream here: the borrower's stream
  // may still be capturing, and cuBLAS's own workspace for the legacy stream is not to be made during a capture.
  if (handle_ != nullptr) HandlePool::Get().Give(device_, H(handle_));
}

ccResult_t ReserveBlasHandles(int device, int count) { return HandlePool::Get().Reserve(device, count); }

// cuBLAS is column-major: a row-major a x b matrix is the column-major b x a matrix (its transpose) with leading
// dimension b. So each row-major product C = A B is computed as C^T = B^T A^T.

ccResult_t LowRankBlas::ProductMQ(const float* m, int64_t rows, int64_t cols, const float* q, int r, float* p) {
  // p^T (r x rows) = q^T (r x cols) m^T (cols x rows)
  const float one = 1.0f, zero = 0.0f;
  return Check(cublasSgemm(H(handle_), CUBLAS_OP_N, CUBLAS_OP_N, r, static_cast<int>(rows), static_cast<int>(cols),
                           &one, q, r, m, static_cast<int>(cols), &zero, p, r),
               "cublasSgemm (P = M Q)");
}

ccResult_t LowRankBlas::ProductMtP(const float* m, int64_t rows, int64_t cols, const float* p, int r, float* q) {
  // q^T (r x cols) = p^T (r x rows) m (rows x cols); m is stored as m^T (cols x rows), hence OP_T
  const float one = 1.0f, zero = 0.0f;
  return Check(cublasSgemm(H(handle_), CUBLAS_OP_N, CUBLAS_OP_T, r, static_cast<int>(cols), static_cast<int>(rows),
                           &one, p, r, m, static_cast<int>(cols), &zero, q, r),
               "cublasSgemm (Q = M^T P)");
}

ccResult_t LowRankBlas::ProductPQt(const float* p, const float* q, int64_t rows, int64_t cols, int r, float* out) {
  // out^T (cols x rows) = q (cols x r) p^T (r x rows); q is stored as q^T (r x cols), hence OP_T
  const float one = 1.0f, zero = 0.0f;
  return Check(cublasSgemm(H(handle_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cols), static_cast<int>(rows), r,
                           &one, q, r, p, r, &zero, out, static_cast<int>(cols)),
               "cublasSgemm (G = P Q^T)");
}

}  // namespace gpu
}  // namespace ccoll
