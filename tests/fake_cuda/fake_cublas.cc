// A CPU stand-in for the part of cuBLAS that ccoll calls (compress/lowrank_cuda.cc), on the fake CUDA runtime, so that
// the real handle management and the real column-major argument mapping of PowerSGD's products run where there is no
// GPU. cublasSgemm checks its arguments as cuBLAS documents (CUBLAS_STATUS_INVALID_VALUE for a negative size, an
// unknown operation, or a leading dimension below the stored matrix's rows) and queues a column-major product on the
// handle's stream, computed by the CPU BLAS (cblas_sgemm), reading device memory through the fake's view of it.
//
// What cuBLAS does to the device, modelled:
//   - cublasDestroy synchronizes the device (the cuBLAS guide: destroying a handle implicitly calls
//     cublasDeviceSynchronize);
//   - cublasCreate allocates device memory, so with "cublascreate" in FAKE_CUDA_STRICT it synchronizes the device, as
//     cudaMalloc does with "malloc" (collectives/device_prepare.h: PrepareNewComm);
//   - a product's kernels load lazily at the first product of a shape in the process (FAKE_CUDA_STRICT "cublas"), the
//     shape being the operations, the sizes and whether each operand is 16-byte aligned (cuBLAS chooses its kernels
//     by alignment too: vectorized loads need it);
//   - cublasSetStream drops a workspace set before (the guide says so).
// A call on a destroyed handle aborts (undefined on a GPU), and so does a product on a handle made on another device
// than the current one. ccoll's own rule, checked here too (compress/lowrank_cuda.h): a product queued on a stream
// that is being captured uses a workspace ccoll set (cublasSetWorkspace), never cuBLAS's own.
#include <cblas.h>
#include <cublas_v2.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <tuple>

#include "fake_launch.h"

struct cublasContext {
  bool live = true;
  int device = 0;  // current at cublasCreate
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;  // a user workspace (cublasSetWorkspace), or null: cuBLAS's own
  size_t workspaceBytes = 0;
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

namespace {

std::atomic<uint64_t> gCreates{0}, gDestroys{0};

cublasContext* Live(cublasHandle_t h, const char* fn) {
  if (h != nullptr && !h->live) {
    std::fprintf(stderr, "fake cuBLAS: %s on a destroyed handle\n", fn);
    std::abort();
  }
  return h;
}

bool KnownOp(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

CBLAS_TRANSPOSE Cblas(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

// cuBLAS loads a product's kernels at its first use in the process, whichever handle runs it; a thread that runs the
// same product meanwhile waits for that load.
void FirstProduct(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a, const void* b,
                  const void* c) {
  static std::mutex mutex;
  static auto* loaded = new std::set<std::tuple<int, int, int, int, int, int>>();
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 ? 1 : 0; };
  const int alignment = aligned(a) | aligned(b) << 1 | aligned(c) << 2;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded->insert(std::make_tuple(static_cast<int>(ta), static_cast<int>(tb), m, n, k, alignment)).second) {
    cctest::FakeLazyLibraryCall("cuBLAS's first product of a shape (its kernels load lazily)");
  }
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  cctest::FakeStrictCall("cublascreate", "cublasCreate (it allocates device memory)");
  auto* h = new cublasContext();
  if (cudaGetDevice(&h->device) != cudaSuccess) {
    delete h;
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  *handle = h;
  gCreates.fetch_add(1);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Live(handle, "cublasDestroy");
  cctest::FakeSynchronizeDevice("cublasDestroy (cuBLAS synchronizes the device when it frees a handle)");
  handle->live = false;  // kept, so that a later use of it is caught
  gDestroys.fetch_add(1);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Live(handle, "cublasSetStream")->stream = stream;
  handle->workspace = nullptr;
  handle->workspaceBytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  cudaPointerAttributes attr{};
  if (workspace != nullptr &&
      (cudaPointerGetAttributes(&attr, workspace) != cudaSuccess || attr.type != cudaMemoryTypeDevice)) {
    std::fprintf(stderr, "fake cuBLAS: cublasSetWorkspace with %p, which is not device memory\n", workspace);
    std::abort();
  }
  Live(handle, "cublasSetWorkspace")->workspace = workspace;
  handle->workspaceBytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Live(handle, "cublasSetMathMode")->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_<other>";
  }
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "an error (fake cuBLAS)";
  }
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                              const float* beta, float* C, int ldc) {
  cctest::FakeKeepLastError keep;
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Live(handle, "cublasSgemm");
  // The stored A is m x k (N) or k x m (T), column-major; B is k x n or n x k; C is m x n.
  const int rowsA = transa == CUBLAS_OP_N ? m : k, rowsB = transb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || !KnownOp(transa) || !KnownOp(transb) || alpha == nullptr || beta == nullptr ||
      lda < (rowsA > 1 ? rowsA : 1) || ldb < (rowsB > 1 ? rowsB : 1) || ldc < (m > 1 ? m : 1)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  int device = -1;
  cudaGetDevice(&device);
  if (device != handle->device) {
    std::fprintf(stderr, "fake cuBLAS: cublasSgemm on device %d with a handle made on device %d\n", device,
                 handle->device);
    std::abort();
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (handle->stream != nullptr && cudaStreamIsCapturing(handle->stream, &capture) == cudaSuccess &&
      capture != cudaStreamCaptureStatusNone && handle->workspace == nullptr) {
    std::fprintf(stderr, "fake cuBLAS: cublasSgemm captured into a graph with cuBLAS's own workspace (ccoll sets its "
                 "own for stream-ordered calls: compress/lowrank_cuda.h)\n");
    std::abort();
  }
  FirstProduct(transa, transb, m, n, k, A, B, C);
  const float a = *alpha, b = *beta;  // host pointer mode: read at the call
  const float* va = cctest::HostView(A);
  const float* vb = cctest::HostView(B);
  float* vc = cctest::HostView(C);
  const cudaError_t queued = cctest::FakePush(handle->stream, [=] {
    cblas_sgemm(CblasColMajor, Cblas(transa), Cblas(transb), m, n, k, a, va, lda, vb, ldb, b, vc, ldc);
  });
  return queued == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"

namespace cctest {

uint64_t FakeCublasCreates() { return gCreates.load(); }
uint64_t FakeCublasDestroys() { return gDestroys.load(); }

}  // namespace cctest
