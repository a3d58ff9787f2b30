// Ranks as MPI processes: a Group over MPI_COMM_WORLD. Built only when MPI is found.
#pragma once

#include <mpi.h>

#include "group.h"

namespace ccperf {

class MpiGroup : public Group {
 public:
  explicit MpiGroup(MPI_Comm comm);
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  void Barrier() override { MPI_Barrier(comm_); }
  void AllGather(const void* mine, size_t bytes, void* all) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int nranks_ = 1;
};

}  // namespace ccperf
