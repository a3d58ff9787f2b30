// The all-reduce benchmark loop shared by ccoll's allreduce_perf and the MPI peer: per size, warm up, time the
// iterations between barriers, then check one fresh call against the fp64 reference. It runs on every rank; the
// all-reduce under test is behind AllReducer and the ranks' side channel behind Group.
#pragma once

#include <cstdint>
#include <string>

#include "group.h"
#include "options.h"
#include "report.h"

namespace ccperf {

class AllReducer {
 public:
  virtual ~AllReducer() = default;
  // One blocking all-reduce of count elements (opts' dtype and op); in place when send == recv. False on error.
  virtual bool Run(const void* send, void* recv, size_t count) = 0;
  // The sentence explaining the last failure of Run (called on the thread that called Run).
  virtual std::string LastError() = 0;
  // Payload bytes this rank's all-reduces have sent since it started, if the implementation counts them: *bytes, of
  // which *nominal were computed from the algorithm instead of counted.
  virtual bool BytesSent(uint64_t* bytes, uint64_t* nominal) = 0;

  // Device-memory runs: Run may only queue the call (stream-ordered) and works on device twins of the host buffers.
  // The loop calls Upload after it writes a host buffer, Download before it reads one, and Finish after a batch of
  // Runs, which waits for them and reports a failure that happened after Run returned. Host runs: nothing to do.
  virtual bool Upload(const void* /*host*/, size_t /*bytes*/) { return true; }
  virtual bool Download(void* /*host*/, size_t /*bytes*/) { return true; }
  virtual bool Finish() { return true; }
  // Before the check call: drops the state the earlier calls left (a compressor's error-feedback memory, PowerSGD's
  // warm-started Q), so that the error column is one call's error whatever -n, -w and -I were. False on error.
  virtual bool Reset() { return true; }
};

struct BenchSetup {
  Options opts;
  std::string algoLabel;      // the "algo" column
  std::string codecLabel;     // the "codec" column
  bool exactCheck = true;     // false for lossy codecs: #wrong counts only non-finite elements
  // A reduce into opts.root (reduce_perf): only the root's output is the result, checked whole; the others' recvbuff
  // must stay as it was. busbw = algbw, and each element crosses (n-1)/n links on average (a chain into the root).
  bool rootOnly = false;
  // Point-to-point (sendrecv_perf): each rank's output is the previous rank's input (rank - 1 mod n), byte for byte.
  // Run sends to the next rank and receives from the previous one; busbw = algbw (each element crosses one link).
  bool shift = false;
  // All-to-all (alltoall_perf): every size is rounded down to a multiple of n elements, in n blocks; block p of a
  // rank's output is block `rank` of rank p's input, byte for byte. busbw = algbw * (n-1)/n (nccl-tests' alltoall:
  // every block but the rank's own crosses a link).
  bool exchange = false;
  bool ranksShareProcess = true;  // for the peak RSS line: one process, or one per rank
  const char* program = "";   // prefix of error messages
};

// Runs every size on this rank. Rank 0 passes the report (the other ranks NULL) and prints the footer. Returns 0 when
// every call succeeded and every check passed, 1 otherwise; the same on every rank.
int RunAllReduceBench(const BenchSetup& setup, Group& group, AllReducer& reducer, Report* report);

}  // namespace ccperf
