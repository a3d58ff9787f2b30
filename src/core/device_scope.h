// Makes a CUDA device current for a scope and restores the caller's device after (CUDA builds only). A failure of
// these calls is left to the CUDA calls in the scope, and taken off the thread's error state (core/cuda_result.h).
#pragma once

#include <cuda_runtime_api.h>

namespace ccoll {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
      saved_ = -1;
      cudaGetLastError();
    }
    if (saved_ != device && cudaSetDevice(device) != cudaSuccess) cudaGetLastError();
  }
  ~DeviceScope() {
    int now = -1;
    if (saved_ < 0) return;
    if (cudaGetDevice(&now) != cudaSuccess || (now != saved_ && cudaSetDevice(saved_) != cudaSuccess)) {
      cudaGetLastError();
    }
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = -1;
};

}  // namespace ccoll
