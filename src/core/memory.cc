#include "core/memory.h"

#ifdef CCOLL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ccoll {

bool IsDevicePointer(const void* ptr) {
#ifdef CCOLL_HAVE_CUDA
  if (ptr == nullptr) return false;
  cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // no device, or not a CUDA pointer: clear the sticky error and treat it as host memory
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
#else
  (void)ptr;
  return false;
#endif
}

}  // namespace ccoll
