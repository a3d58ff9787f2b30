// [gpu] test cases start with SKIP_WITHOUT_DEVICE(): without a CUDA device the process exits with 77, which ctest
// reports as skipped (SKIP_RETURN_CODE), not passed. (Catch2 v2 has no SKIP.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace cctest {

inline bool HaveDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return true;
}

}  // namespace cctest

#define SKIP_WITHOUT_DEVICE()                                                \
  do {                                                                       \
    if (!cctest::HaveDevice()) {                                             \
      std::fprintf(stderr, "no CUDA device: the [gpu] cases are skipped\n"); \
      std::exit(77);                                                         \
    }                                                                        \
  } while (0)
