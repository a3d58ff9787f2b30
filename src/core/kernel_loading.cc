#include "core/kernel_loading.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>

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
using IsLoadedFn = CUresult (*)(CUfunctionLoadingState*, CUfunction);
using LoadFn = CUresult (*)(CUfunction);

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
  IsLoadedFn isLoaded = nullptr;
  LoadFn load = nullptr;
};

const Driver& TheDriver() {
  static const Driver driver = [] {
    Driver d;
    d.isLoaded = reinterpret_cast<IsLoadedFn>(DriverEntry("cuFuncIsLoaded"));
    d.load = reinterpret_cast<LoadFn>(DriverEntry("cuFuncLoad"));
    return d;
  }();
  return driver;
}

// The reference, with the kernel's state read before and after it, and cuFuncLoad where it left the kernel unloaded.
ccResult_t LoadChecked(const void* kernel, const char* name, const Driver& driver) {
  cudaFunction_t f = nullptr;
  const cudaError_t e = cudaGetFuncBySymbol(&f, kernel);
  if (e != cudaSuccess) {
    cudaGetLastError();
    Note(std::string("cudaGetFuncBySymbol(") + name + "): " + cudaGetErrorString(e));
    return Reference(kernel, name);
  }
  const CUfunction function = reinterpret_cast<CUfunction>(f);
  CUfunctionLoadingState before, after;
  const bool knownBefore = driver.isLoaded(&before, function) == CUDA_SUCCESS;
  CC_CHECK(Reference(kernel, name));
  if (!knownBefore || driver.isLoaded(&after, function) != CUDA_SUCCESS) {
    Note(std::string("cuFuncIsLoaded(") + name + ") failed");
    return ccSuccess;  // the reference has to do
  }
  const bool loadHere = after != CU_FUNCTION_LOADING_STATE_LOADED;
  if (loadHere) {
    const CUresult r = driver.load(function);
    if (r != CUDA_SUCCESS) return Fail(ccUnhandledCudaError, "%s: cuFuncLoad failed (CUresult %d)", name, int(r));
    CC_INFO(kLogInit, "%s: cudaFuncGetAttributes left the kernel unloaded; cuFuncLoad loaded it", name);
  }
  std::lock_guard<std::mutex> lock(gMutex);
  ++gLoads.checked;
  if (before == CU_FUNCTION_LOADING_STATE_LOADED) ++gLoads.loadedBefore;
  if (after == CU_FUNCTION_LOADING_STATE_LOADED) ++gLoads.loadedByAttributes;
  if (loadHere) ++gLoads.loadedExplicitly;
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
