#include "mpi_group.h"

namespace ccperf {

MpiGroup::MpiGroup(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &nranks_);
}

void MpiGroup::AllGather(const void* mine, size_t bytes, void* all) {
  // The perf tools exchange a few bytes at a time: an int count is plenty.
  MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE, comm_);
}

}  // namespace ccperf
