// ccoll_info: the library version, what this build contains, and every CC_* parameter (--params).
#include <cstdio>
#include <cstring>

#include "ccoll.h"
#include "core/params.h"

int main(int argc, char** argv) {
  bool params = argc > 1 && std::strcmp(argv[1], "--params") == 0;
  if (argc > 1 && !params) {
    std::fprintf(stderr, "usage: %s [--params]\n", argv[0]);
    return 2;
  }
  int version = 0;
  ccGetVersion(&version);
  std::printf("ccoll %s (version code %d)\n", CCOLL_VERSION_STRING, version);
#ifdef CCOLL_HAVE_CUDA
  const char* cuda = "yes";
#else
  const char* cuda = "no";
#endif
#ifdef CCOLL_HAVE_UCX
  const char* ucx = "built (transport not implemented yet)";
#else
  const char* ucx = "no";
#endif
  std::printf("backends: cpu yes, cuda %s; transports: local yes, ucx %s\n", cuda, ucx);
  if (params) {
    std::printf("\n");
    ccoll::PrintParams(stdout);
  }
  return 0;
}
