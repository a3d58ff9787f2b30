#include "core/memory.h"

#ifdef CCOLL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ccoll {

int PointerDevice(const void* ptr) {
#ifdef CCOLL_HAVE_CUDA
  if (ptr == nullptr) return -1;
  cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // no device, or not a CUDA pointer: clear the sticky error and treat it as host memory
    return -1;
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) return -1;
  return attr.device;
#else
  (void)ptr;
  return -1;
#endif
}

}  // namespace ccoll
