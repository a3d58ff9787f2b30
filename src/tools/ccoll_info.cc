// ccoll_info: the library version, what this build contains, the CUDA devices it sees (with what ccoll's device
// calls rely on), and every CC_* parameter (--params).
#include <cstdio>
#include <cstring>

#ifdef CCOLL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "ccoll.h"
#include "core/params.h"

namespace {

// What this build contains.
#ifdef CCOLL_HAVE_CUDA
constexpr bool kCuda = true;
#else
constexpr bool kCuda = false;
#endif
#ifdef CCOLL_HAVE_UCX
constexpr bool kUcx = true;
#else
constexpr bool kUcx = false;
#endif
#ifdef CCOLL_HAVE_NCCL
constexpr bool kNccl = true;
#else
constexpr bool kNccl = false;
#endif
#ifdef CCOLL_HAVE_BLAS
constexpr bool kBlas = true;
#else
constexpr bool kBlas = false;
#endif
#ifdef CCOLL_HAVE_CUBLAS
constexpr bool kCublas = true;
#else
constexpr bool kCublas = false;
#endif

const char* YesNo(bool b) { return b ? "yes" : "no"; }

#ifdef CCOLL_HAVE_CUDA
// An attribute of `device` as yes/no, or "?" when it cannot be read.
const char* Attribute(cudaDeviceAttr attr, int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) {
    cudaGetLastError();
    return "?";
  }
  return YesNo(v != 0);
}

// One line per CUDA device: what it is, and whether it has the memory pools ccoll takes its scratch from (without
// them, cudaMalloc and cudaHostAlloc: core/device_memory.h) and maps pinned host memory (the words streams wait on).
void PrintDevices() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("cuda devices: none (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount: 0");
    cudaGetLastError();
    return;
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("cuda devices: %d (driver %d.%d, runtime %d.%d)\n", n, driver / 1000, driver % 1000 / 10,
              runtime / 1000, runtime % 1000 / 10);
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      cudaGetLastError();
      std::printf("  %d: properties cannot be read\n", d);
      continue;
    }
    std::printf("  %d: %s, sm_%d%d, %.0f GiB; memory pools %s, host memory pools %s, maps host memory %s\n", d,
                prop.name, prop.major, prop.minor, static_cast<double>(prop.totalGlobalMem) / (1 << 30),
                Attribute(cudaDevAttrMemoryPoolsSupported, d), Attribute(cudaDevAttrHostMemoryPoolsSupported, d),
                Attribute(cudaDevAttrCanMapHostMemory, d));
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  bool params = argc > 1 && std::strcmp(argv[1], "--params") == 0;
  if (argc > 1 && !params) {
    std::fprintf(stderr, "usage: %s [--params]\n", argv[0]);
    return 2;
  }
  int version = 0;
  ccGetVersion(&version);
  std::printf("ccoll %s (version code %d)\n", CCOLL_VERSION_STRING, version);
  std::printf("backends: cpu yes, cuda %s; transports: local yes, ucx %s, nccl %s; powersgd: cpu blas %s, cublas %s\n",
              YesNo(kCuda), YesNo(kUcx), YesNo(kNccl), YesNo(kBlas), YesNo(kCublas));
#ifdef CCOLL_HAVE_CUDA
  PrintDevices();
#endif
  if (params) {
    std::printf("\n");
    ccoll::PrintParams(stdout);
  }
  return 0;
}
