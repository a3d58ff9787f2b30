// CUDA errors as ccResult_t, for the kernel files (*.cu; CUDA builds only): the error names what failed.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace ccoll {
namespace gpu {

// ccSuccess, or ccUnhandledCudaError with "what: CUDA's sentence" as the last error.
inline ccResult_t CudaResult(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ccSuccess;
  return Fail(ccUnhandledCudaError, "%s: %s", what, cudaGetErrorString(e));
}

// The result of the kernel launch this thread just made.
inline ccResult_t Launched(const char* what) { return CudaResult(cudaGetLastError(), what); }

}  // namespace gpu
}  // namespace ccoll
