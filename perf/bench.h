// The benchmark loop shared by ccoll's perf programs (allreduce_perf and the other collectives) and the MPI peers: per
// size, warm up, time the iterations between barriers, then check one fresh call against the fp64 reference or the
// inputs it moves. It runs on every rank; the collective under test is behind AllReducer and the ranks' side channel
// behind Group.
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
  // One blocking call of the collective on count elements (opts' dtype and op); in place when send == recv. For the
  // patterns in n blocks count is the whole buffer's, and Run offsets the side that holds one block by rank blocks
  // (Pattern). False on error.
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

// The collective the loop times. It decides the elements a size runs, busbw, the wire traffic per element and what the
// check compares. Sizes are nccl-tests': the bytes of the whole buffer (a reduce-scatter's input, an all-gather's
// output), so that algbw = size / time compares across collectives.
enum class Pattern {
  // Every rank's output is the reduction of all inputs: rank r checks the r-th part of its own, and every rank's bytes
  // must be the same. busbw = algbw * 2(n-1)/n.
  kAllReduce,
  // Into opts.root (reduce_perf): only the root's output is the result, checked whole; the others' recvbuff must stay
  // as it was. busbw = algbw, and each element crosses (n-1)/n links on average (a chain into the root).
  kReduce,
  // From opts.root (broadcast_perf): every rank's output is the root's input, byte for byte. busbw = algbw, (n-1)/n
  // links per element (a chain from the root).
  kBroadcast,
  // The size is rounded down to n blocks of the input (reducescatter_perf); rank r's result is the reduction of block
  // r, written at block r of its recvbuff (the in-place place, recvbuff = sendbuff + r blocks, and out of place the
  // same offset into the receive buffer, whose other blocks must stay as they were). busbw = algbw * (n-1)/n.
  kReduceScatter,
  // The size is rounded down to n blocks of the output (allgather_perf); rank r sends block r of its input (in place:
  // sendbuff = recvbuff + r blocks), and block p of every rank's output is block p of rank p's input, byte for byte.
  // busbw = algbw * (n-1)/n.
  kAllGather,
  // Point-to-point (sendrecv_perf): each rank's output is the previous rank's input (rank - 1 mod n), byte for byte.
  // Run sends to the next rank and receives from the previous one; busbw = algbw (each element crosses one link).
  kSendRecv,
  // All-to-all (alltoall_perf): the size is rounded down to n blocks; block p of a rank's output is block `rank` of
  // rank p's input, byte for byte. busbw = algbw * (n-1)/n (nccl-tests' alltoall: every block but the rank's own
  // crosses a link).
  kAllToAll,
};

// Whether a pattern's sizes are rounded down to n blocks, and whether it reduces (the redop column, the error).
bool Blocked(Pattern p);
bool Reduces(Pattern p);
// For the programs' headers: how busbw follows from algbw, and which elements the #wrong column counts (for an
// all-reduce, of an exact call).
const char* BusbwRule(Pattern p);
const char* WrongRule(Pattern p);

struct BenchSetup {
  Options opts;
  std::string algoLabel;      // the "algo" column
  std::string codecLabel;     // the "codec" column
  bool exactCheck = true;     // false for lossy codecs: #wrong counts only non-finite elements
  Pattern pattern = Pattern::kAllReduce;
  bool ranksShareProcess = true;  // for the peak RSS line: one process, or one per rank
  const char* program = "";   // prefix of error messages
};

// Runs every size on this rank. Rank 0 passes the report (the other ranks NULL) and prints the footer. Returns 0 when
// every call succeeded and every check passed, 1 otherwise; the same on every rank.
int RunAllReduceBench(const BenchSetup& setup, Group& group, AllReducer& reducer, Report* report);

}  // namespace ccperf
