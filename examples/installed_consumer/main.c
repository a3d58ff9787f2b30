/* Links the installed libccoll (through find_package(ccoll) or pkg-config) and runs a one-rank all-reduce. */
#include <ccoll.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  ccComm_t comms[1];
  float x = 3.0f;
  if (ccGetVersion(&version) != ccSuccess || version != CC_VERSION_CODE) {
    fprintf(stderr, "header version %d, library version %d\n", CC_VERSION_CODE, version);
    return 1;
  }
  /* One rank: the all-reduce is a copy, which is enough to prove the installed library links and runs. */
  if (ccCommInitAll(comms, 1, NULL) != ccSuccess ||
      ccAllReduce(&x, &x, 1, ccFloat32, ccSum, NULL, comms[0], NULL) != ccSuccess || x != 3.0f) {
    fprintf(stderr, "ccoll failed: %s\n", ccGetLastError(NULL));
    return 1;
  }
  ccCommDestroy(comms[0]);
  printf("installed ccoll %d works\n", version);
  return 0;
}
