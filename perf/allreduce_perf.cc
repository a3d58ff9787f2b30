// allreduce_perf: ccoll's all-reduce benchmark, in the shape of nccl-tests' all_reduce_perf.
//
// How ranks start is separate from what a rank does: RankBody runs on every rank against a Group. The default build
// starts -t ranks as threads of this process (ThreadGroup); built with -DCCOLL_PERF_MPI (allreduce_perf_mpi) each MPI
// process is one rank and the unique id travels by MPI (MpiGroup).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "bench.h"
#include "ccoll.h"
#include "group.h"
#include "options.h"
#include "report.h"

#ifdef CCOLL_PERF_MPI
#include <mpi.h>

#include "mpi_group.h"
#else
#include "thread_group.h"
#endif

namespace {

using ccperf::DType;
using ccperf::Op;

#ifdef CCOLL_PERF_MPI
constexpr const char* kProgram = "allreduce_perf_mpi";
constexpr unsigned kFlags = ccperf::kFlagAlgo | ccperf::kFlagCodec;
constexpr const char* kNotes =
    "Ranks are the MPI processes (mpirun -np N); the ccUniqueId is shared with MPI_Bcast.\n";
#else
constexpr const char* kProgram = "allreduce_perf";
constexpr unsigned kFlags = ccperf::kFlagAlgo | ccperf::kFlagCodec | ccperf::kFlagThreads;
constexpr const char* kNotes = nullptr;
#endif

ccDataType_t ToCc(DType t) {
  switch (t) {
    case DType::kFloat32: return ccFloat32;
    case DType::kFloat16: return ccFloat16;
    case DType::kBfloat16: return ccBfloat16;
    case DType::kFloat64: return ccFloat64;
    case DType::kInt32: return ccInt32;
    case DType::kInt64: return ccInt64;
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

class CcollAllReducer : public ccperf::AllReducer {
 public:
  CcollAllReducer(ccComm_t comm, ccCompressor_t comp, const ccperf::Options& o)
      : comm_(comm), comp_(comp), dtype_(ToCc(o.dtype)), op_(ToCc(o.op)) {}

  bool Run(const void* send, void* recv, size_t count) override {
    ccResult_t r = ccAllReduce(send, recv, count, dtype_, op_, comp_, comm_, nullptr);
    if (r == ccSuccess) return true;
    error_ = Failure("ccAllReduce", r, comm_);
    return false;
  }
  std::string LastError() override { return error_; }
  bool BytesSent(uint64_t* bytes) override {
    ccCommStats_t st;
    st.size = sizeof(st);
    if (ccCommGetStats(comm_, &st) != ccSuccess) return false;
    *bytes = st.bytesSent;
    return true;
  }

 private:
  ccComm_t comm_;
  ccCompressor_t comp_;
  ccDataType_t dtype_;
  ccRedOp_t op_;
  std::string error_;
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
  if (!o.algo.empty()) return o.algo;
  const char* env = std::getenv("CC_ALGO");
  return env && *env ? env : "auto";
}

void PrintHeader(ccperf::Report& report, const ccperf::Options& o, int nranks, int argc, char** argv) {
  int version = 0;
  ccGetVersion(&version);
  report.Line("ccoll %s: all-reduce benchmark", kProgram);
  report.CommandAndArgs(argc, argv, o, AlgoLabel(o));
#ifdef CCOLL_PERF_MPI
  report.Line("nranks: %d (MPI processes, one rank each)", nranks);
  const char* defaultTransport = "auto (UCX between processes)";
#else
  report.Line("nranks: %d (threads of one process, -t %d) on %u hardware threads", nranks, o.threads,
              std::thread::hardware_concurrency());
  const char* defaultTransport = "auto (local: ranks are threads of one process)";
#endif
  report.Line("library: ccoll %d.%d.%d (version code %d; built against header %d)", version / 10000,
              version / 100 % 100, version % 100, version, CC_VERSION_CODE);
  const char* transport = std::getenv("CC_TRANSPORT");
  report.Line("transport: %s", transport && *transport ? transport : defaultTransport);
  report.Line("time: us per all-reduce, mean of -n iterations timed on rank 0 between barriers, after -w warmup "
              "iterations at each size; algbw = size / time (logical bytes); busbw = algbw * 2(n-1)/n");
  report.Line("wirebits: bits each rank sent per element (ccCommGetStats bytesSent, mean over ranks); error: vNMSE "
              "vs the fp64 reference; #wrong: elements outside the dtype's rounding tolerance");
}

int RankBody(const ccperf::Options& o, ccperf::Group& group, int argc, char** argv) {
  const int rank = group.rank(), nranks = group.nranks();
  ccUniqueId id;
  ccResult_t r = ccSuccess;
  if (rank == 0) r = ccGetUniqueId(&id);
  if (!Agree(group, r == ccSuccess, Failure("ccGetUniqueId", r, nullptr))) return 1;
  group.Broadcast(&id, sizeof(id), 0);

  ccConfig_t config = CC_CONFIG_INITIALIZER;
  if (o.algo == "ring") config.algorithm = ccAlgoRing;
  if (o.algo == "tree") config.algorithm = ccAlgoTree;
  if (o.algo == "auto") config.algorithm = ccAlgoAuto;
  ccComm_t comm = nullptr;
  r = ccCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (!Agree(group, r == ccSuccess, Failure("ccCommInitRankConfig", r, comm))) {
    ccCommDestroy(comm);
    return 1;
  }

  ccCompressor_t comp = nullptr;
  if (o.codec != "none") {
    r = ccCompressorCreateFromString(&comp, o.codec.c_str());
    if (!Agree(group, r == ccSuccess, Failure("ccCompressorCreateFromString", r, nullptr))) {
      ccCommDestroy(comm);
      return 1;
    }
  }

  ccperf::Report report(stdout);
  if (rank == 0) {
    PrintHeader(report, o, nranks, argc, argv);
    report.ColumnHeader();
  }
  ccperf::BenchSetup setup;
  setup.opts = o;
  setup.algoLabel = AlgoLabel(o);
  setup.codecLabel = o.codec;
  setup.exactCheck = comp == nullptr;
#ifdef CCOLL_PERF_MPI
  setup.ranksShareProcess = false;
#endif
  setup.program = kProgram;
  CcollAllReducer reducer(comm, comp, o);
  int code = ccperf::RunAllReduceBench(setup, group, reducer, rank == 0 ? &report : nullptr);

  r = ccCompressorDestroy(comp);
  if (r != ccSuccess) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProgram, rank, Failure("ccCompressorDestroy", r, nullptr).c_str());
    code = 1;
  }
  r = ccCommDestroy(comm);
  if (r != ccSuccess) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProgram, rank, Failure("ccCommDestroy", r, nullptr).c_str());
    code = 1;
  }
  return code;
}

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
      code = RankBody(opts, group, argc, argv);
    } else {
      code = pr == ccperf::ParseResult::kExitOk ? 0 : 2;
    }
  }
  MPI_Finalize();
  return code;
#else
  ccperf::ParseResult pr = ccperf::ParseOptions(argc, argv, prog, true, &opts);
  if (pr != ccperf::ParseResult::kRun) return pr == ccperf::ParseResult::kExitOk ? 0 : 2;
  return ccperf::RunThreadRanks(opts.threads, [&](ccperf::Group& group) { return RankBody(opts, group, argc, argv); });
#endif
}
