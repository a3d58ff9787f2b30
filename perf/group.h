// How the ranks of one benchmark run talk to each other outside the library under test: a barrier and an all-gather
// of small blobs, from which the rest (agreement on success, sums of statistics, the unique id) is built. Ranks that
// are threads of one process implement it with shared memory (thread_group.h), ranks that are processes with MPI
// (mpi_group.h); the rank body is the same code in both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ccperf {

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // Returns once every rank has entered.
  virtual void Barrier() = 0;
  // Every rank passes `bytes` bytes (the same count on all ranks); `all` receives nranks * bytes, rank r's at r * bytes.
  virtual void AllGather(const void* mine, size_t bytes, void* all) = 0;

  // True on every rank when `ok` is true on every rank. Ranks call it at the same points, so one failing rank makes
  // all of them stop together instead of leaving the others waiting.
  virtual bool AllOk(bool ok);
  // Element-wise sum over ranks, added in rank order (the same bits on every rank and every run).
  void SumDoubles(double* values, size_t n);
  void SumU64(uint64_t* values, size_t n);
  // `bytes` bytes of root's buffer are copied into every rank's buffer.
  void Broadcast(void* buf, size_t bytes, int root);
  // rank r's value at index r, on every rank.
  std::vector<uint64_t> GatherU64(uint64_t value);
};

}  // namespace ccperf
