// allreduce_perf: ccoll's all-reduce benchmark, in the shape of nccl-tests' all_reduce_perf.
//
// How ranks start is separate from what a rank does: RunOnComm runs on every rank against a Group and the rank's
// communicator. The default build starts -t ranks as threads of this process (ThreadGroup); when a launcher set
// CC_RANK, CC_NRANKS and CC_ROOT and -t is not given, this process is one rank, made with ccCommInitFromEnv, and the
// side channel is ccoll itself on that communicator (EnvGroup). Built with -DCCOLL_PERF_MPI (allreduce_perf_mpi,
// reduce_perf_mpi) each MPI process is one rank and the unique id travels by MPI (MpiGroup).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "ccoll.h"
#include "group.h"
#include "options.h"
#include "report.h"
#include "split_group.h"

#ifdef CCOLL_PERF_CUDA
#include "device_twins.h"
#endif
#ifdef CCOLL_PERF_MPI
#include <mpi.h>

#include "mpi_group.h"
#else
#include "env_group.h"
#include "thread_group.h"
#endif

namespace {

using ccperf::DType;
using ccperf::Op;

// How this process's ranks were started; decides the header and the peak-RSS line.
enum class Launch { kThreads, kMpi, kEnv };

// The collective this program times, chosen when it is built (perf/CMakeLists.txt): none, ccAllReduce
// (allreduce_perf); -DCCOLL_PERF_REDUCE, ccReduce into -r (default 0), as nccl-tests' reduce_perf;
// -DCCOLL_PERF_BROADCAST, ccBroadcast from -r (broadcast_perf); -DCCOLL_PERF_REDUCESCATTER, ccReduceScatter
// (reducescatter_perf); -DCCOLL_PERF_ALLGATHER, ccAllGather (allgather_perf); -DCCOLL_PERF_SENDRECV, in one group
// ccSend to rank + 1 and ccRecv from rank - 1 (sendrecv_perf); -DCCOLL_PERF_ALLTOALL, in one group a ccSend of block p
// to rank p and a ccRecv of block p from rank p for every rank p (alltoall_perf). Only allreduce_perf takes an
// algorithm (-a) and a codec (-z): the other collectives are exact, and have one schedule each.
#if defined(CCOLL_PERF_REDUCE)
constexpr ccperf::Pattern kPattern = ccperf::Pattern::kReduce;
#define CCOLL_PERF_NAME "reduce_perf"
#elif defined(CCOLL_PERF_BROADCAST)
constexpr ccperf::Pattern kPattern = ccperf::Pattern::kBroadcast;
#define CCOLL_PERF_NAME "broadcast_perf"
#elif defined(CCOLL_PERF_REDUCESCATTER)
constexpr ccperf::Pattern kPattern = ccperf::Pattern::kReduceScatter;
#define CCOLL_PERF_NAME "reducescatter_perf"
#elif defined(CCOLL_PERF_ALLGATHER)
constexpr ccperf::Pattern kPattern = ccperf::Pattern::kAllGather;
#define CCOLL_PERF_NAME "allgather_perf"
#elif defined(CCOLL_PERF_SENDRECV)
constexpr ccperf::Pattern kPattern = ccperf::Pattern::kSendRecv;
#define CCOLL_PERF_NAME "sendrecv_perf"
#elif defined(CCOLL_PERF_ALLTOALL)
constexpr ccperf::Pattern kPattern = ccperf::Pattern::kAllToAll;
#define CCOLL_PERF_NAME "alltoall_perf"
#else
constexpr ccperf::Pattern kPattern = ccperf::Pattern::kAllReduce;
#define CCOLL_PERF_NAME "allreduce_perf"
#endif
constexpr bool kAllReduce = kPattern == ccperf::Pattern::kAllReduce;
constexpr bool kRooted = kPattern == ccperf::Pattern::kReduce || kPattern == ccperf::Pattern::kBroadcast;
constexpr bool kPointToPoint = kPattern == ccperf::Pattern::kSendRecv || kPattern == ccperf::Pattern::kAllToAll;
constexpr unsigned kPatternFlags = ccperf::kFlagDevice | ccperf::kFlagSplit |
                                   (kAllReduce ? ccperf::kFlagAlgo | ccperf::kFlagCodec : 0u) |
                                   (kRooted ? ccperf::kFlagRoot : 0u);

#ifdef CCOLL_PERF_MPI
constexpr const char* kProgram = CCOLL_PERF_NAME "_mpi";
constexpr unsigned kFlags = kPatternFlags;
constexpr const char* kNotes =
    "Ranks are the MPI processes (mpirun -np N); the ccUniqueId is shared with MPI_Bcast.\n";
#else
constexpr const char* kProgram = CCOLL_PERF_NAME;
constexpr unsigned kFlags = kPatternFlags | ccperf::kFlagThreads;
constexpr const char* kNotes =
    "Launch modes:\n"
    "  threads    (default, and whenever -t is given): -t ranks, each a thread of this process (local transport).\n"
    "  processes  (CC_RANK, CC_NRANKS and CC_ROOT=host:port all set in the environment, and no -t): this process\n"
    "             is ONE rank, made with ccCommInitFromEnv (UCX between processes: UCX_TLS=sysv,self for shared\n"
    "             memory, tcp,self for TCP). Start every rank with the same arguments, for example\n"
    "               perf/launch_local.sh -n 4 build/perf/<this program> -b 1M -e 64M\n"
    "             The harness's own barriers and all-gathers run on the communicator under test (ccAllReduce and\n"
    "             ccAllGather of a few bytes, left out of wirebits); only rank 0 prints. A failure there makes the\n"
    "             rank abort the communicator and exit 1. CC_SECRET (the same string on every rank) is the\n"
    "             credential a joining rank presents; launch_local.sh sets a random one.\n";
#endif

ccDataType_t ToCc(DType t) {
  switch (t) {
    case DType::kFloat32: return ccFloat32;
    case DType::kFloat16: return ccFloat16;
    case DType::kBfloat16: return ccBfloat16;
    case DType::kFloat64: return ccFloat64;
    case DType::kInt32: return ccInt32;
    case DType::kInt64: return ccInt64;
    case DType::kInt8: return ccInt8;
    case DType::kUint8: return ccUint8;
    case DType::kUint32: return ccUint32;
    case DType::kUint64: return ccUint64;
  }
  return ccFloat32;
}

ccRedOp_t ToCc(Op op) {
  switch (op) {
    case Op::kSum: return ccSum;
    case Op::kProd: return ccProd;
    case Op::kMax: return ccMax;
    case Op::kMin: return ccMin;
    case Op::kAvg: return ccAvg;
  }
  return ccSum;
}

std::string Failure(const char* call, ccResult_t r, ccComm_t comm) {
  return std::string(call) + " failed: " + ccGetErrorString(r) + ": " + ccGetLastError(comm);
}

// What the harness's side channel sent on the communicator under test (EnvGroup's counters).
struct SideBytes {
  uint64_t sent = 0;
  uint64_t nominal = 0;
};

class CcollAllReducer : public ccperf::AllReducer {
 public:
  // side, when set, returns the part of ccCommGetStats' counters that is not the benchmark's own (the side
  // channel's, when it runs on the same communicator): bytes sent (less call-check records) and nominal bytes.
  // comp: a compressor made from the -z spec (null: exact). A compressor is one bucket's state, so every size gets a
  // fresh one, made at its first (warmup) call, and so does the check call (Reset).
  CcollAllReducer(ccComm_t comm, ccCompressor_t comp, const ccperf::Options& o, std::function<SideBytes()> side)
      : comm_(comm),
        comp_(comp),
        spec_(o.codec),
        dtype_(ToCc(o.dtype)),
        es_(ccperf::Info(o.dtype).size),
        op_(ToCc(o.op)),
        root_(o.root),
        side_(std::move(side)) {
    ccCommCount(comm_, &nranks_);  // (a live communicator: they only read it)
    ccCommUserRank(comm_, &rank_);
  }
  ~CcollAllReducer() override {
    Finish();
    ccCompressorDestroy(comp_);
  }

  // -G 1: device twins of the buffers and a stream; false (with LastError) when that is not possible.
  bool UseDevice() {
#ifdef CCOLL_PERF_CUDA
    twins_ = std::make_unique<ccperf::DeviceTwins>();
    if (twins_->Init(&error_)) return true;
    error_ = "-G 1: " + error_;
    return false;
#else
    error_ = std::string("-G 1: this ") + kProgram + " was built without CUDA (CCOLL_ENABLE_CUDA=OFF)";
    return false;
#endif
  }

  bool Run(const void* send, void* recv, size_t count) override {
    if (comp_ != nullptr && count != bucket_) {
      if (bucket_ != 0 && !Recreate()) return false;
      bucket_ = count;
    }
    ccStream_t stream = nullptr;
#ifdef CCOLL_PERF_CUDA
    if (twins_) {
      send = twins_->Twin(send);
      recv = twins_->Twin(recv);
      stream = static_cast<ccStream_t>(twins_->stream());
    }
#endif
    ccResult_t r = ccSuccess;
    const char* call = "";
    switch (kPattern) {
      case ccperf::Pattern::kSendRecv:
        return SendRecv(send, recv, count, stream);
      case ccperf::Pattern::kAllToAll:
        return AllToAll(send, recv, count, stream);
      case ccperf::Pattern::kAllReduce:
        call = "ccAllReduce";
        r = ccAllReduce(send, recv, count, dtype_, op_, comp_, comm_, stream);
        break;
      case ccperf::Pattern::kReduce:
        call = "ccReduce";
        r = ccReduce(send, recv, count, dtype_, op_, root_, comm_, stream);
        break;
      case ccperf::Pattern::kBroadcast:
        call = "ccBroadcast";
        r = ccBroadcast(send, recv, count, dtype_, root_, comm_, stream);
        break;
      case ccperf::Pattern::kReduceScatter:  // block `rank` of recv (in place: of send), as Pattern says
        call = "ccReduceScatter";
        r = ccReduceScatter(send, static_cast<char*>(recv) + RankBlockBytes(count), count / Ranks(), dtype_, op_, comm_,
                            stream);
        break;
      case ccperf::Pattern::kAllGather:  // block `rank` of send (in place: of recv)
        call = "ccAllGather";
        r = ccAllGather(static_cast<const char*>(send) + RankBlockBytes(count), recv, count / Ranks(), dtype_, comm_,
                        stream);
        break;
    }
    if (r == ccSuccess) return true;
    error_ = Failure(call, r, comm_);
    return false;
  }
  // The check call's compressor is a fresh one, bound to the same count at its first call.
  bool Reset() override { return comp_ == nullptr || Recreate(); }

#ifdef CCOLL_PERF_CUDA
  bool Upload(const void* host, size_t bytes) override { return !twins_ || twins_->Upload(host, bytes, &error_); }
  bool Download(void* host, size_t bytes) override { return !twins_ || twins_->Download(host, bytes, &error_); }
  bool Finish() override {
    if (!twins_) return true;
    if (!twins_->Sync(&error_)) return false;
    ccResult_t async = ccSuccess;
    ccCommGetAsyncError(comm_, &async);
    if (async == ccSuccess) return true;
    error_ = Failure("a queued call", async, comm_);
    return false;
  }
#endif
  std::string LastError() override { return error_; }
  size_t Ranks() const { return static_cast<size_t>(nranks_); }
  // The byte offset of this rank's block when count elements make n blocks.
  size_t RankBlockBytes(size_t count) const { return count / Ranks() * static_cast<size_t>(rank_) * es_; }
  // sendrecv_perf: send to the next rank, receive from the previous one, in one group.
  bool SendRecv(const void* send, void* recv, size_t count, ccStream_t stream) {
    const int n = nranks_, rank = rank_;
    transfers_.clear();
    transfers_.push_back(Transfer{true, const_cast<void*>(send), count, (rank + 1) % n});
    transfers_.push_back(Transfer{false, recv, count, (rank + n - 1) % n});
    return RunGroup(stream);
  }
  // alltoall_perf: count / n elements to and from every rank, block p of send to rank p and block p of recv from it,
  // in one group.
  bool AllToAll(const void* send, void* recv, size_t count, ccStream_t stream) {
    const int n = nranks_;
    const size_t block = count / static_cast<size_t>(n), step = block * es_;
    transfers_.clear();
    for (int p = 0; p < n; ++p) {
      transfers_.push_back(Transfer{true, const_cast<char*>(static_cast<const char*>(send)) + p * step, block, p});
      transfers_.push_back(Transfer{false, static_cast<char*>(recv) + p * step, block, p});
    }
    return RunGroup(stream);
  }
  // Issues transfers_ in one group, in order; false (with LastError) when one is refused (the group then issues
  // nothing) or the group fails.
  bool RunGroup(ccStream_t stream) {
    ccGroupStart();
    for (const Transfer& t : transfers_) {
      const ccResult_t r = t.send ? ccSend(t.buf, t.count, dtype_, t.peer, comm_, stream)
                                  : ccRecv(t.buf, t.count, dtype_, t.peer, comm_, stream);
      if (r != ccSuccess) {
        error_ = Failure(t.send ? "ccSend" : "ccRecv", r, comm_);
        ccGroupEnd();  // issues nothing after a refused call
        return false;
      }
    }
    const ccResult_t r = ccGroupEnd();
    if (r == ccSuccess) return true;
    error_ = Failure("ccGroupEnd", r, nullptr);
    return false;
  }
  // The call check's messages (CC_CHECK_CALLS) are a fixed cost per call, not the collective's: left out (the data of
  // a small all-reduce that rode in them counts as its own).
  bool BytesSent(uint64_t* bytes, uint64_t* nominal) override {
    ccCommStats_t st;
    st.size = sizeof(st);
    if (ccCommGetStats(comm_, &st) != ccSuccess) return false;
    const SideBytes side = side_ ? side_() : SideBytes{};
    *bytes = st.bytesSent - st.callCheckBytesSent - side.sent;
    *nominal = st.nominalBytesSent - side.nominal;
    return true;
  }

 private:
  // Replaces comp_ with a fresh compressor of the same spec.
  bool Recreate() {
    ccCompressorDestroy(comp_);
    comp_ = nullptr;
    ccResult_t c = ccCompressorCreateFromString(&comp_, spec_.c_str());
    if (c == ccSuccess) return true;
    error_ = Failure("ccCompressorCreateFromString", c, nullptr);
    return false;
  }

  ccComm_t comm_;
  ccCompressor_t comp_;
  std::string spec_;
  size_t bucket_ = 0;  // the count comp_ serves (0: not used yet)
  ccDataType_t dtype_;
  size_t es_;  // bytes per element
  // The sends and receives of one call of sendrecv_perf or alltoall_perf (kept: the timed loop reuses it).
  struct Transfer {
    bool send;
    void* buf;
    size_t count;
    int peer;
  };
  std::vector<Transfer> transfers_;
  ccRedOp_t op_;
  int root_;  // reduce_perf, broadcast_perf
  int nranks_ = 1, rank_ = 0;  // of comm_
  std::function<SideBytes()> side_;
  std::string error_;
#ifdef CCOLL_PERF_CUDA
  std::unique_ptr<ccperf::DeviceTwins> twins_;
#endif
};

// Every rank passes whether its step succeeded; the lowest failing rank prints its message (all ranks usually fail
// the same way, and one copy is enough). True when all succeeded.
bool Agree(ccperf::Group& group, bool ok, const std::string& message) {
  std::vector<uint64_t> flags = group.GatherU64(ok ? 1 : 0);
  for (int r = 0; r < group.nranks(); ++r) {
    if (flags[static_cast<size_t>(r)] != 0) continue;
    if (r == group.rank()) std::fprintf(stderr, "%s: rank %d: %s\n", kProgram, r, message.c_str());
    return false;
  }
  return true;
}

std::string AlgoLabel(const ccperf::Options& o) {
  if (kRooted) return "chain";
  if (kPointToPoint) return "p2p";
  if (!kAllReduce) return "ring";
  if (!o.algo.empty()) return o.algo;
  const char* env = std::getenv("CC_ALGO");
  return env && *env ? env : "auto";
}

ccConfig_t MakeConfig(const ccperf::Options& o) {
  ccConfig_t config = CC_CONFIG_INITIALIZER;
  if (o.algo == "ring") config.algorithm = ccAlgoRing;
  if (o.algo == "tree") config.algorithm = ccAlgoTree;
  if (o.algo == "auto") config.algorithm = ccAlgoAuto;
  return config;
}

const char* EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

void PrintHeader(ccperf::Report& report, const ccperf::Options& o, Launch launch, int nranks, int argc,
                 char** argv) {
  int version = 0;
  ccGetVersion(&version);
  switch (kPattern) {
    case ccperf::Pattern::kAllReduce:
      report.Line("ccoll %s: all-reduce benchmark", kProgram);
      break;
    case ccperf::Pattern::kReduce:
      report.Line(
          "ccoll %s: reduce benchmark (ccReduce into rank %d, -r: a pipelined chain along the ring, or "
          "ncclReduce on transport nccl)",
          kProgram, o.root);
      break;
    case ccperf::Pattern::kBroadcast:
      report.Line(
          "ccoll %s: broadcast benchmark (ccBroadcast from rank %d, -r: a pipelined chain along the ring, or "
          "ncclBroadcast on transport nccl)",
          kProgram, o.root);
      break;
    case ccperf::Pattern::kReduceScatter:
      report.Line(
          "ccoll %s: reduce-scatter benchmark (ccReduceScatter: size = the input, nranks blocks, the size "
          "rounded down to them; rank r's result lands at block r of its recvbuff; a ring, or "
          "ncclReduceScatter on transport nccl)",
          kProgram);
      break;
    case ccperf::Pattern::kAllGather:
      report.Line(
          "ccoll %s: all-gather benchmark (ccAllGather: size = the output, nranks blocks, the size rounded "
          "down to them; rank r sends block r of its sendbuff; a ring, or ncclAllGather on transport nccl)",
          kProgram);
      break;
    case ccperf::Pattern::kSendRecv:
      report.Line(
          "ccoll %s: point-to-point benchmark (in one group, ccSend to rank + 1 and ccRecv from rank - 1; "
          "ncclSend and ncclRecv on transport nccl)",
          kProgram);
      break;
    case ccperf::Pattern::kAllToAll:
      report.Line(
          "ccoll %s: all-to-all benchmark (in one group, a ccSend and a ccRecv of one block per rank, the "
          "size rounded down to nranks blocks; ncclSend and ncclRecv on transport nccl)",
          kProgram);
      break;
  }
  report.CommandAndArgs(argc, argv, o, AlgoLabel(o));
  const char* defaultTransport = "auto (UCX between processes)";
  switch (launch) {
    case Launch::kMpi:
      report.Line("nranks: %d (MPI processes, one rank each) on %u hardware threads", nranks,
                  std::thread::hardware_concurrency());
      break;
    case Launch::kEnv:
      report.Line("nranks: %d (processes from a launcher, one rank each: ccCommInitFromEnv, CC_ROOT=%s) on %u "
                  "hardware threads", nranks, EnvOr("CC_ROOT", "?"), std::thread::hardware_concurrency());
      break;
    case Launch::kThreads:
      report.Line("nranks: %d (threads of one process, -t %d) on %u hardware threads", nranks, o.threads,
                  std::thread::hardware_concurrency());
      defaultTransport = "auto (local: ranks are threads of one process)";
      break;
  }
  report.Line("library: ccoll %d.%d.%d (version code %d; built against header %d)", version / 10000,
              version / 100 % 100, version % 100, version, CC_VERSION_CODE);
  report.Line("transport: %s", EnvOr("CC_TRANSPORT", defaultTransport));
  report.Line("buffers: %s", o.device ? "GPU memory (-G 1: device 0, one non-blocking stream per rank; time includes "
                                        "the wait for the stream after the -n calls)"
                                      : "host memory");
  if (launch != Launch::kThreads) report.Line("UCX_TLS: %s", EnvOr("UCX_TLS", "(unset: UCX's default)"));
  report.Line(
      "time: us per call, mean of -n iterations each rank timed from a common barrier to its last "
      "call's completion, the slowest rank's, after -w warmup iterations at each size; algbw = size / time "
      "(logical bytes); busbw = %s",
      ccperf::BusbwRule(kPattern));
  report.Line(
      "wirebits: bits on the wire per element and transmission = bytes each rank sent (ccCommGetStats less "
      "the call check's messages, mean over ranks) * 8 / (count * %s): 32 for the exact float ring, the "
      "compressed width for a codec; on NCCL the library computes (as a ring's) the bytes of the exact calls "
      "it hands to NCCL, and the JSON rows say wirebits_measured false",
      kAllReduce                               ? "2(n-1)/n"
      : kPattern == ccperf::Pattern::kSendRecv ? "1"
                                               : "(n-1)/n");
  if (!ccperf::Reduces(kPattern)) {
    report.Line("#wrong: %s; inputs: -D %s", ccperf::WrongRule(kPattern), o.dist.c_str());
  } else if (!kAllReduce) {
    report.Line("error: vNMSE vs the fp64 reference; #wrong: %s; inputs: -D %s", ccperf::WrongRule(kPattern),
                o.dist.c_str());
  } else {
    report.Line("error: vNMSE vs the fp64 reference, of one checked call with a fresh compressor (no error-feedback "
                "memory or warm start from the timed calls); #wrong: elements outside the dtype's rounding tolerance "
                "(exact), or non-finite (codecs); inputs: -D %s", o.dist.c_str());
  }
}

// -M: this rank's communicator of color rank & mask, split from comm (which stays the side channel's, for EnvGroup).
// *sub is null when there is no split. False (said by the lowest failing rank) when the split failed.
// *seconds: the slowest rank's time in ccCommSplit, from a common barrier.
bool SplitForBench(const ccperf::Options& o, ccperf::Group& group, ccComm_t comm, ccComm_t* sub, double* seconds) {
  *sub = nullptr;
  *seconds = 0;
  if (o.splitMask == 0) return true;
  const int color = static_cast<int>(static_cast<unsigned>(group.rank()) & o.splitMask);
  group.Barrier();
  const auto start = std::chrono::steady_clock::now();
  ccResult_t r = ccCommSplit(comm, color, group.rank(), sub, nullptr);
  const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!Agree(group, r == ccSuccess, Failure("ccCommSplit", r, comm))) return false;
  std::vector<double> all(static_cast<size_t>(group.nranks()));
  group.AllGather(&mine, sizeof(mine), all.data());
  *seconds = *std::max_element(all.begin(), all.end());
  return true;
}

// Everything after the communicator exists: split (-M), codec, header, the benchmark, teardown. Takes ownership of
// comm.
int RunOnComm(const ccperf::Options& o, Launch launch, ccperf::Group& group, ccComm_t comm,
              std::function<SideBytes()> side, int argc, char** argv) {
  const int rank = group.rank();
  ccComm_t sub = nullptr;
  double splitSeconds = 0;
  if (!SplitForBench(o, group, comm, &sub, &splitSeconds)) {
    ccCommDestroy(comm);
    return 1;
  }
  std::unique_ptr<ccperf::SplitGroup> split;
  if (sub != nullptr) split = std::make_unique<ccperf::SplitGroup>(group, o.splitMask);
  ccperf::Group& benchGroup = split ? *split : group;  // the side channel of the communicator under test
  ccComm_t tested = sub != nullptr ? sub : comm;
  if (sub != nullptr) side = nullptr;  // the side channel's bytes are on comm, not on the communicator under test

  ccCompressor_t comp = nullptr;
  if (o.codec != "none") {
    ccResult_t r = ccCompressorCreateFromString(&comp, o.codec.c_str());
    if (!Agree(group, r == ccSuccess, Failure("ccCompressorCreateFromString", r, nullptr))) {
      ccCommDestroy(sub);
      ccCommDestroy(comm);
      return 1;
    }
  }

  // Rank 0 prints. With -M the first rank of every other communicator judges its own rows too, silently (its failures
  // end the run with exit 1 and a line on stderr).
  FILE* quiet = nullptr;
  if (split && rank != 0 && split->rank() == 0) quiet = std::fopen("/dev/null", "w");
  ccperf::Report report(quiet != nullptr ? quiet : stdout);
  if (rank == 0) {
    PrintHeader(report, o, launch, group.nranks(), argc, argv);
    if (split) {
      report.Line("split: -M 0x%x: %d communicators made by ccCommSplit in %.2f ms (color = rank & mask, key = "
                  "rank), all running the benchmark at once; rows, nranks and bus bandwidth are those of rank 0's "
                  "communicator (%d ranks); peak RSS counts its processes (with -t: the one process, every "
                  "communicator); the exit status is every communicator's",
                  o.splitMask, split->colors(), splitSeconds * 1e3, split->nranks());
    }
    report.ColumnHeader();
  }
  ccperf::BenchSetup setup;
  setup.opts = o;
  if (rank != 0) setup.opts.jsonPath.clear();  // rank 0's communicator's rows only
  setup.algoLabel = AlgoLabel(o);
  setup.codecLabel = o.codec;
  setup.exactCheck = comp == nullptr;
  setup.pattern = kPattern;
  setup.ranksShareProcess = launch == Launch::kThreads;
  setup.program = kProgram;
  const bool reports = rank == 0 || quiet != nullptr;
  int code;
  {
    CcollAllReducer reducer(tested, comp, o, std::move(side));  // owns comp (and each size's successor) from here
    const bool usable = !o.device || reducer.UseDevice();
    const std::string rootError = "-r " + std::to_string(o.root) + " is not a rank of the communicator under test (" +
                                  std::to_string(benchGroup.nranks()) + " ranks)";
    if (!Agree(group, o.root < benchGroup.nranks(), rootError)) {
      code = 2;
    } else if (!Agree(group, !(kPointToPoint && o.inplace),
                      std::string("-I 1: a send and a receive of one buffer at once would overwrite what is being "
                                  "sent; ") +
                          kProgram + " runs out of place only")) {
      code = 2;
    } else if (!Agree(group, usable, reducer.LastError())) {
      code = 1;
    } else {
      code = ccperf::RunAllReduceBench(setup, benchGroup, reducer, reports ? &report : nullptr);
    }
  }
  if (quiet != nullptr) std::fclose(quiet);
  if (split && code != 0 && split->rank() == 0 && rank != 0) {
    std::fprintf(stderr, "%s: rank %d: the communicator of color %u failed its run or its checks (run it alone to see "
                 "its rows)\n", kProgram, rank, split->color());
  }
  if (split) {
    const bool mine = code == 0;
    code = group.AllOk(mine) ? 0 : 1;
    if (rank == 0 && mine && code != 0) {
      report.Line("FAILED: another communicator of the split failed (stderr says which)");
    }
  }
  ccResult_t r = ccCommDestroy(sub);
  if (r == ccSuccess) r = ccCommDestroy(comm);
  if (r != ccSuccess) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProgram, rank, Failure("ccCommDestroy", r, nullptr).c_str());
    code = 1;
  }
  return code;
}

// A rank whose group exists before the communicator (threads, MPI): the unique id travels over the group.
int RankBody(const ccperf::Options& o, Launch launch, ccperf::Group& group, int argc, char** argv) {
  const int rank = group.rank(), nranks = group.nranks();
  ccUniqueId id;
  ccResult_t r = ccSuccess;
  if (rank == 0) r = ccGetUniqueId(&id);
  if (!Agree(group, r == ccSuccess, Failure("ccGetUniqueId", r, nullptr))) return 1;
  group.Broadcast(&id, sizeof(id), 0);

  ccConfig_t config = MakeConfig(o);
  ccComm_t comm = nullptr;
  r = ccCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (!Agree(group, r == ccSuccess, Failure("ccCommInitRankConfig", r, comm))) {
    ccCommDestroy(comm);
    return 1;
  }
  return RunOnComm(o, launch, group, comm, nullptr, argc, argv);
}

#ifndef CCOLL_PERF_MPI
// Which of CC_RANK, CC_NRANKS, CC_ROOT are set (non-empty): 0 none, 3 all.
int EnvLaunchVars(std::string* missing) {
  int set = 0;
  for (const char* name : {"CC_RANK", "CC_NRANKS", "CC_ROOT"}) {
    const char* v = std::getenv(name);
    if (v && *v) {
      ++set;
    } else {
      *missing += *missing == "" ? name : std::string(", ") + name;
    }
  }
  return set;
}

// One rank in this process, from the launcher's environment. Until the communicator exists there is no channel to
// the other ranks: an init failure is reported by every rank that sees it.
int EnvRank(const ccperf::Options& o, int argc, char** argv) {
  ccConfig_t config = MakeConfig(o);
  ccComm_t comm = nullptr;
  ccResult_t r = ccCommInitFromEnv(&comm, &config);
  if (r != ccSuccess) {
    std::fprintf(stderr, "%s: CC_RANK=%s: %s\n", kProgram, EnvOr("CC_RANK", "?"),
                 Failure("ccCommInitFromEnv", r, comm).c_str());
    ccCommDestroy(comm);
    return 1;
  }
  ccperf::EnvGroup group(comm, kProgram);
  return RunOnComm(o, Launch::kEnv, group, comm,
                   [&group] { return SideBytes{group.OwnBytesSent(), group.OwnNominalBytes()}; }, argc, argv);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const ccperf::ProgramInfo prog{kProgram, kFlags, kNotes};
  ccperf::Options opts;
#ifdef CCOLL_PERF_MPI
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    ccperf::MpiGroup group(MPI_COMM_WORLD);
    ccperf::ParseResult pr = ccperf::ParseOptions(argc, argv, prog, group.rank() == 0, &opts);
    if (pr == ccperf::ParseResult::kRun) {
      code = RankBody(opts, Launch::kMpi, group, argc, argv);
    } else {
      code = pr == ccperf::ParseResult::kExitOk ? 0 : 2;
    }
  }
  MPI_Finalize();
  return code;
#else
  // Under a launcher every rank parses the same arguments: only rank 0 speaks (a quiet first pass finds -t).
  std::string missing;
  const int envVars = EnvLaunchVars(&missing);
  ccperf::Options probe;
  const bool threadsGiven = ccperf::ParseOptions(argc, argv, prog, false, &probe) == ccperf::ParseResult::kRun &&
                            probe.threadsGiven;
  const Launch launch = envVars == 3 && !threadsGiven ? Launch::kEnv : Launch::kThreads;
  const char* envRank = std::getenv("CC_RANK");
  const bool speak = launch == Launch::kThreads || (envRank != nullptr && std::string(envRank) == "0");
  ccperf::ParseResult pr = ccperf::ParseOptions(argc, argv, prog, speak, &opts);
  if (pr != ccperf::ParseResult::kRun) return pr == ccperf::ParseResult::kExitOk ? 0 : 2;
  if (envVars != 0 && envVars != 3 && !opts.threadsGiven) {
    std::fprintf(stderr, "%s: some of CC_RANK, CC_NRANKS, CC_ROOT are set but not %s: set all three to run one rank "
                 "per process, or none (or pass -t) for thread ranks\n", kProgram, missing.c_str());
    return 2;
  }
  if (launch == Launch::kEnv) return EnvRank(opts, argc, argv);
  return ccperf::RunThreadRanks(opts.threads, [&](ccperf::Group& group) {
    return RankBody(opts, Launch::kThreads, group, argc, argv);
  });
#endif
}
