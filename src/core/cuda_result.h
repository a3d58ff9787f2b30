// CUDA errors as ccResult_t, for ccoll's CUDA code (CUDA builds only): the error names what failed.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "core/kernel_loading.h"

namespace ccoll {
namespace gpu {

// ccSuccess, or ccUnhandledCudaError with "what: CUDA's sentence" as the last error. The failure is also taken off the
// thread's CUDA error state (see Launched).
inline ccResult_t CudaResult(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ccSuccess;
  cudaGetLastError();
  return Fail(ccUnhandledCudaError, "%s: %s", what, cudaGetErrorString(e));
}

// For a call whose failure ccoll does not report (a free or destroy in a teardown, best effort): its error is taken off
// the thread's CUDA error state, so that the next launch's check (Launched) does not report it.
inline void IgnoreCuda(cudaError_t e) {
  if (e != cudaSuccess) cudaGetLastError();
}

// The result of the kernel launch this thread just made: cudaGetLastError, which is also the error of any earlier
// call on the thread that nobody took off. So every path that turns a CUDA error into ccoll's takes it off
// (cudaGetLastError; a sticky error, which spoils the context, stays and is rightly reported again).
inline ccResult_t Launched(const char* what) { return CudaResult(cudaGetLastError(), what); }

// Loads `kernel` into the current device's context now. CUDA loads kernels lazily, at their first launch, and a load
// may synchronize the context; a kernel the proxy launches while a stream-wait kernel holds a stream (see
// core/device_proxy.h) would then wait for a stream that waits for it. So every kernel is loaded before the first
// stream wait (collectives/device_prepare.h), as the CUDA guide's lazy-loading section advises.
// core/kernel_loading.h says how.
template <typename Kernel>
ccResult_t LoadKernel(Kernel* kernel, const char* name) {
  return LoadKernelAt(reinterpret_cast<const void*>(kernel), name);
}

}  // namespace gpu
}  // namespace ccoll
