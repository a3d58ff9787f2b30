// Loading a kernel into the current device's context before its first launch (core/cuda_result.h, LoadKernel), and
// what the loads saw, for perf/gpu_probe. Only built with CUDA (the real runtime; the fake's loaders are its own).
#pragma once

#include <string>

#include "ccoll.h"

namespace ccoll {
namespace gpu {

// Loads the kernel whose host stub is at `kernel` into the current device's context: cudaFuncGetAttributes, which
// references it (the CUDA runtime loads a kernel lazily, at its first reference). Where the driver has
// cuFuncIsLoaded and cuFuncLoad (CUDA 12.4), the kernel's state is then read, and a kernel still not loaded is loaded
// with cuFuncLoad, so that no later launch loads it (a load may synchronize the context). ccSuccess, or
// ccUnhandledCudaError naming `name` when cudaFuncGetAttributes fails; a failure of the check after it is noted
// (KernelLoadsSoFar) and left to the first launch, as before the check.
ccResult_t LoadKernelAt(const void* kernel, const char* name);

// What LoadKernelAt saw in this process: kernels whose state it read (cuFuncIsLoaded), how many of them were loaded
// after cudaFuncGetAttributes (or already before: the handle's lookup, cudaGetFuncBySymbol, is a reference too), and
// how many cuFuncLoad had to load; `note` says why a state could not be read or a load failed (a driver before 12.4,
// a failed lookup), empty when nothing went wrong.
struct KernelLoads {
  int checked = 0;
  int loadedByReference = 0;
  int loadedExplicitly = 0;
  std::string note;
};
KernelLoads KernelLoadsSoFar();

}  // namespace gpu
}  // namespace ccoll
