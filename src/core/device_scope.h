// Makes a CUDA device current for a scope and restores the caller's device after (CUDA builds only).
#pragma once

#include <cuda_runtime_api.h>

namespace ccoll {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    int now = -1;
    if (saved_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != saved_) cudaSetDevice(saved_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = -1;
};

}  // namespace ccoll
