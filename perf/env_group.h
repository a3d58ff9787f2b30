// Ranks as processes started by a launcher without MPI (perf/launch_local.sh, torchrun-like): CC_RANK, CC_NRANKS and
// CC_ROOT=host:port in every process's environment, the communicator made by ccCommInitFromEnv. There is no other
// channel between the processes, so the harness's Group (barrier, all-gather of a few bytes) is ccoll itself on the
// communicator under test: ccAllReduce of one int64 for the barrier, ccAllGather of int64 words for the all-gather.
//
// Consequences, stated so nobody is surprised:
// - the side channel's traffic goes through the same counters as the benchmark's: the group keeps the bytes its own
//   calls sent (OwnBytesSent) so the benchmark can subtract them from ccCommGetStats;
// - a failure of the side channel leaves no way to agree with the other ranks: the rank says why on stderr, aborts
//   the communicator (which releases peers that can detect it) and exits with status 1.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ccoll.h"
#include "group.h"

namespace ccperf {

class EnvGroup : public Group {
 public:
  // comm: this process's rank of the communicator under test (it stays owned by the caller). program: the prefix of
  // error messages.
  EnvGroup(ccComm_t comm, const char* program);
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  void Barrier() override;
  void AllGather(const void* mine, size_t bytes, void* all) override;

  // Payload bytes this rank's side-channel collectives have sent so far (a part of ccCommGetStats' bytesSent).
  uint64_t OwnBytesSent() const { return ownSent_; }

 private:
  uint64_t SentNow();
  [[noreturn]] void Die(const char* call, ccResult_t r);

  ccComm_t comm_;
  const char* program_;
  int rank_ = 0;
  int nranks_ = 1;
  uint64_t ownSent_ = 0;
};

}  // namespace ccperf
