#include "compress/lowrank_cuda.h"

#include <cublas_v2.h>

#include "core/error.h"

namespace ccoll {
namespace gpu {
namespace {

ccResult_t Check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ccSuccess;
  return Fail(ccUnhandledCudaError, "%s failed: %s (%s)", what, cublasGetStatusName(s), cublasGetStatusString(s));
}

cublasHandle_t H(void* h) { return static_cast<cublasHandle_t>(h); }

}  // namespace

ccResult_t LowRankBlas::Create(cudaStream_t stream, std::unique_ptr<LowRankBlas>* out) {
  std::unique_ptr<LowRankBlas> b(new LowRankBlas());
  cublasHandle_t h = nullptr;
  CC_CHECK(Check(cublasCreate(&h), "cublasCreate"));
  b->handle_ = h;
  b->stream_ = stream;
  CC_CHECK(Check(cublasSetStream(h, stream), "cublasSetStream"));
  // Plain FP32 products (no TF32 tensor cores): what the CPU path computes, to fp32 rounding.
  CC_CHECK(Check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  *out = std::move(b);
  return ccSuccess;
}

LowRankBlas::~LowRankBlas() {
  if (handle_ != nullptr) cublasDestroy(H(handle_));
}

ccResult_t LowRankBlas::SetStream(cudaStream_t stream, void* workspace, size_t bytes) {
  if (stream == stream_ && workspace == workspace_) return ccSuccess;
  CC_CHECK(Check(cublasSetStream(H(handle_), stream), "cublasSetStream"));  // back to cuBLAS's own workspace
  if (workspace != nullptr) CC_CHECK(Check(cublasSetWorkspace(H(handle_), workspace, bytes), "cublasSetWorkspace"));
  stream_ = stream;
  workspace_ = workspace;
  return ccSuccess;
}

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
