#include "core/device_pool.h"

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace ccoll {
namespace {

ccResult_t CudaFail(cudaError_t e, const char* what, int device) {
  return Fail(ccUnhandledCudaError, "CUDA device %d: %s failed: %s", device, what, cudaGetErrorString(e));
}

}  // namespace

ccResult_t DevicePool(int device, cudaMemPool_t* pool) {
  static std::mutex mutex;
  static auto* pools = new std::unordered_map<int, cudaMemPool_t>();  // never destroyed: the memory lives as long
  std::lock_guard<std::mutex> lock(mutex);
  auto it = pools->find(device);
  if (it != pools->end()) {
    *pool = it->second;
    return ccSuccess;
  }
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t made = nullptr;
  cudaError_t e = cudaMemPoolCreate(&made, &props);
  if (e != cudaSuccess) return CudaFail(e, "cudaMemPoolCreate", device);
  int no = 0;
  e = cudaMemPoolSetAttribute(made, cudaMemPoolReuseAllowInternalDependencies, &no);
  if (e != cudaSuccess) return CudaFail(e, "cudaMemPoolSetAttribute (no internal dependencies)", device);
  uint64_t keepAll = UINT64_MAX;
  e = cudaMemPoolSetAttribute(made, cudaMemPoolAttrReleaseThreshold, &keepAll);
  if (e != cudaSuccess) return CudaFail(e, "cudaMemPoolSetAttribute (release threshold)", device);
  pools->emplace(device, made);
  *pool = made;
  return ccSuccess;
}

}  // namespace ccoll
