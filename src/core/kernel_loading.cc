#include "core/kernel_loading.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "core/error.h"
#include "core/log.h"

namespace ccoll {
namespace gpu {
namespace {

std::mutex gMutex;
KernelLoads gLoads;  // under gMutex

void Note(const std::string& why) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (gLoads.note.empty()) gLoads.note = why;
}

// The runtime's reference to the kernel, which loads it lazily.
ccResult_t Reference(const void* kernel, const char* name) {
  cudaFuncAttributes attributes;
  const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel);
  if (e == cudaSuccess) return ccSuccess;
  cudaGetLastError();
  return Fail(ccUnhandledCudaError, "%s: %s", name, cudaGetErrorString(e));
}

#if CUDART_VERSION >= 12040
void* DriverEntry(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &fn, 12040, cudaEnableDefault, &found);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess) cudaGetLastError();
  return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? fn : nullptr;
}

// The driver's cuFuncIsLoaded and cuFuncLoad, looked up through the runtime once (libccoll.so does not link libcuda,
// so that a CUDA build runs where there is no driver); null where the driver is older than 12.4.
struct Driver {
  PFN_cuFuncIsLoaded_v12040 isLoaded = nullptr;
  PFN_cuFuncLoad_v12040 load = nullptr;
};

const Driver& TheDriver() {
  static const Driver driver = [] {
    Driver d;
    d.isLoaded = reinterpret_cast<PFN_cuFuncIsLoaded_v12040>(DriverEntry("cuFuncIsLoaded"));
    d.load = reinterpret_cast<PFN_cuFuncLoad_v12040>(DriverEntry("cuFuncLoad"));
    return d;
  }();
  return driver;
}

// The reference, then the kernel's state, and cuFuncLoad where it is still unloaded. Only the reference's failure
// fails: the check is on top of what was done before it (a failed check is noted for the probe, and a warning).
ccResult_t LoadChecked(const void* kernel, const char* name, const Driver& driver) {
  CC_CHECK(Reference(kernel, name));
  cudaFunction_t f = nullptr;
  const cudaError_t e = cudaGetFuncBySymbol(&f, kernel);
  if (e != cudaSuccess) {
    cudaGetLastError();
    Note(std::string("cudaGetFuncBySymbol(") + name + "): " + cudaGetErrorString(e));
    return ccSuccess;
  }
  const CUfunction function = reinterpret_cast<CUfunction>(f);
  CUfunctionLoadingState state;
  if (driver.isLoaded(&state, function) != CUDA_SUCCESS) {
    Note(std::string("cuFuncIsLoaded(") + name + ") failed");
    return ccSuccess;
  }
  const bool unloaded = state != CU_FUNCTION_LOADING_STATE_LOADED;
  if (unloaded) {
    const CUresult r = driver.load(function);
    if (r != CUDA_SUCCESS) {
      CC_WARN("%s: the kernel is not loaded after cudaFuncGetAttributes, and cuFuncLoad failed (CUresult %d): its "
              "first launch will load it", name, static_cast<int>(r));
      Note(std::string("cuFuncLoad(") + name + ") failed: CUresult " + std::to_string(static_cast<int>(r)));
      return ccSuccess;
    }
    CC_INFO(kLogInit, "%s: not loaded after cudaFuncGetAttributes; cuFuncLoad loaded it", name);
  }
  std::lock_guard<std::mutex> lock(gMutex);
  ++gLoads.checked;
  ++(unloaded ? gLoads.loadedExplicitly : gLoads.loadedByReference);
  return ccSuccess;
}
#endif

}  // namespace

ccResult_t LoadKernelAt(const void* kernel, const char* name) {
#if CUDART_VERSION >= 12040
  const Driver& driver = TheDriver();
  if (driver.isLoaded != nullptr && driver.load != nullptr) return LoadChecked(kernel, name, driver);
  Note("the driver has no cuFuncIsLoaded and cuFuncLoad (before CUDA 12.4)");
#else
  Note("built with a CUDA runtime before 12.4 (no cuFuncIsLoaded)");
#endif
  return Reference(kernel, name);
}

KernelLoads KernelLoadsSoFar() {
  std::lock_guard<std::mutex> lock(gMutex);
  return gLoads;
}

}  // namespace gpu
}  // namespace ccoll
