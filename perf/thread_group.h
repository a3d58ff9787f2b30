// Ranks as threads of one process: a Group over shared memory, and the launcher that runs one rank body per thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "group.h"

namespace ccperf {

// A reusable barrier (std::barrier is C++20). Sleeps on a condition variable: rank threads may outnumber cores.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int count) : count_(count) {}
  void ArriveAndWait();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  const int count_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// State shared by the ranks of one process.
class ThreadShared {
 public:
  explicit ThreadShared(int nranks) : nranks_(nranks), barrier_(nranks), slots_(nranks) {}

 private:
  friend class ThreadGroup;
  const int nranks_;
  ThreadBarrier barrier_;
  std::vector<std::vector<char>> slots_;  // rank r's contribution to the all-gather in progress
};

class ThreadGroup : public Group {
 public:
  ThreadGroup(ThreadShared* shared, int rank) : shared_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int nranks() const override { return shared_->nranks_; }
  void Barrier() override { shared_->barrier_.ArriveAndWait(); }
  void AllGather(const void* mine, size_t bytes, void* all) override;

 private:
  ThreadShared* shared_;
  int rank_;
};

// Runs body(group) on nranks threads, rank r on thread r, and returns the largest exit code any rank returned.
int RunThreadRanks(int nranks, const std::function<int(Group&)>& body);

}  // namespace ccperf
