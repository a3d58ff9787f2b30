// ccoll_info: the library version, what this build contains, and every CC_* parameter (--params).
#include <cstdio>
#include <cstring>

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
  if (params) {
    std::printf("\n");
    ccoll::PrintParams(stdout);
  }
  return 0;
}
