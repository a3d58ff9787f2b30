// Ranks as processes started by a launcher without MPI (perf/launch_local.sh, torchrun-like): CC_RANK, CC_NRANKS and
// CC_ROOT=host:port in every process's environment, the communicator made by ccCommInitFromEnv. There is no other
// channel between the processes, so the harness's Group (barrier, all-gather of a few bytes) is ccoll itself on the
// communicator under test: ccAllReduce of one int64 for the barrier, ccAllGather of int64 words for the all-gather.
//
// Consequences, stated so nobody is surprised:
// - the side channel's traffic goes through the same counters as the benchmark's: the group keeps the bytes its own
//   calls sent (OwnBytesSent, OwnNominalBytes) so the benchmark can subtract them from ccCommGetStats;
// - a failure of the side channel leaves no way to agree with the other ranks: the rank says why on stderr, aborts
//   the communicator (which releases peers that can detect it) and exits with status 1;
// - with CC_TRANSPORT=nccl the communicator may carry only device buffers between the processes (no UCX): the side
//   channel's words then go through a small device buffer and a stream of its own (builds with CUDA).
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
  ~EnvGroup() override;
  EnvGroup(const EnvGroup&) = delete;
  EnvGroup& operator=(const EnvGroup&) = delete;
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  void Barrier() override;
  void AllGather(const void* mine, size_t bytes, void* all) override;

  // Payload bytes this rank's side-channel collectives have sent so far: a part of ccCommGetStats' bytesSent less its
  // callCheckBytesSent, and of those the part computed, not counted (a part of nominalBytesSent).
  uint64_t OwnBytesSent() const { return ownSent_; }
  uint64_t OwnNominalBytes() const { return ownNominal_; }

 private:
  // Runs one side-channel collective, adding what it sent to ownSent_ and ownNominal_.
  ccResult_t Counted(bool gather, const int64_t* in, size_t words, int64_t* out);
  [[noreturn]] void Die(const char* call, ccResult_t r);
  // ccAllReduce (sum) of `words` int64 words, or ccAllGather of them, on host buffers or through device memory.
  ccResult_t Collective(bool gather, const int64_t* in, size_t words, int64_t* out);

  ccComm_t comm_;
  const char* program_;
  int rank_ = 0;
  int nranks_ = 1;
  uint64_t ownSent_ = 0;
  uint64_t ownNominal_ = 0;
  bool device_ = false;       // the side channel goes through device memory (see the top of the file)
  void* deviceWords_ = nullptr;
  size_t deviceCapacity_ = 0;  // int64 words at deviceWords_
  void* stream_ = nullptr;
};

}  // namespace ccperf
