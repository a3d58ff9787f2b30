/*
 * mpi_allreduce: one rank per MPI process. Rank 0 makes the unique id, MPI_Bcast hands it to everyone, every rank
 * joins, and each all-reduces a float32 buffer. Between processes the bytes move over UCX (set UCX_TLS to choose
 * shared memory, TCP or InfiniBand).
 *
 *   mpirun -np 4 ./mpi_allreduce [count]
 */
#include <ccoll.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    ccResult_t r_ = (call);                                                                                \
    if (r_ != ccSuccess) {                                                                                 \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, ccGetErrorString(r_), ccGetLastError(NULL));  \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                        \
    }                                                                                                      \
  } while (0)

int main(int argc, char** argv) {
  int rank, nranks;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  size_t count = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 1 << 20;

  ccUniqueId id;
  if (rank == 0) CHECK(ccGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ccComm_t comm;
  CHECK(ccCommInitRank(&comm, nranks, id, rank));

  float* data = malloc(sizeof(float) * count);
  for (size_t i = 0; i < count; ++i) data[i] = (float)(rank + 1) * (float)(i % 16);
  CHECK(ccAllReduce(data, data, count, ccFloat32, ccSum, NULL, comm, NULL));

  size_t wrong = 0;
  float ranksum = (float)nranks * (float)(nranks + 1) / 2.0f;
  for (size_t i = 0; i < count; ++i) wrong += data[i] != ranksum * (float)(i % 16);
  size_t total = 0;
  MPI_Reduce(&wrong, &total, 1, MPI_UNSIGNED_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("mpi_allreduce: %d ranks, %zu floats, %zu wrong\n", nranks, count, total);
  CHECK(ccCommDestroy(comm));
  free(data);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
