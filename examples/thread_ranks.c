/*
 * thread_ranks: the smallest complete ccoll program. It creates N ranks as threads of this process with
 * ccCommInitAll, all-reduces a float32 buffer on each, checks the sum, and tears down.
 *
 *   ./thread_ranks [nranks] [count]
 */
#include <ccoll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    ccResult_t r_ = (call);                                                                      \
    if (r_ != ccSuccess) {                                                                       \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, ccGetErrorString(r_), ccGetLastError(NULL)); \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

struct RankArgs {
  ccComm_t comm;
  float* data;
  size_t count;
};

static void* RankMain(void* p) {
  struct RankArgs* a = (struct RankArgs*)p;
  /* In place: the sum of every rank's buffer replaces this rank's buffer. Host buffers take a NULL stream. */
  CHECK(ccAllReduce(a->data, a->data, a->count, ccFloat32, ccSum, NULL, a->comm, NULL));
  return NULL;
}

int main(int argc, char** argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 4;
  size_t count = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 1 << 20;
  ccComm_t* comms = malloc(sizeof(ccComm_t) * nranks);
  struct RankArgs* args = malloc(sizeof(struct RankArgs) * nranks);
  pthread_t* threads = malloc(sizeof(pthread_t) * nranks);
  CHECK(ccCommInitAll(comms, nranks, NULL));
  for (int r = 0; r < nranks; ++r) {
    args[r].comm = comms[r];
    args[r].count = count;
    args[r].data = malloc(sizeof(float) * count);
    for (size_t i = 0; i < count; ++i) args[r].data[i] = (float)(r + 1) * (float)(i % 16);
  }
  for (int r = 0; r < nranks; ++r) pthread_create(&threads[r], NULL, RankMain, &args[r]);
  for (int r = 0; r < nranks; ++r) pthread_join(threads[r], NULL);
  size_t wrong = 0;
  float ranksum = (float)nranks * (float)(nranks + 1) / 2.0f;
  for (int r = 0; r < nranks; ++r) {
    for (size_t i = 0; i < count; ++i) wrong += args[r].data[i] != ranksum * (float)(i % 16);
    free(args[r].data);
    CHECK(ccCommDestroy(comms[r]));
  }
  printf("thread_ranks: %d ranks, %zu floats, %zu wrong\n", nranks, count, wrong);
  free(comms);
  free(args);
  free(threads);
  return wrong == 0 ? 0 : 1;
}
