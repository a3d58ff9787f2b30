// mpi_allreduce_perf: the peer of allreduce_perf. The same sizes, inputs, timing, check and columns, with
// MPI_Allreduce of the MPI library it is built against (one rank per process: mpirun -np N). MPI does not count the
// bytes it sends, so the wirebits column is the nominal element bits.
// Built with one of these, the peer of another of ccoll's programs, with that program's sizes and check:
//   -DCCOLL_PERF_ALLTOALL (mpi_alltoall_perf): MPI_Alltoall of one block per rank, out of place only.
//   -DCCOLL_PERF_BROADCAST (mpi_broadcast_perf): MPI_Bcast from -r. MPI's broadcast has one buffer: out of place, the
//   root first copies its sendbuff into recvbuff (timed, as part of the call).
//   -DCCOLL_PERF_REDUCESCATTER (mpi_reducescatter_perf): MPI_Reduce_scatter_block into block `rank` of recvbuff, out
//   of place only (MPI's in-place form leaves the result at the start of the buffer, not at block `rank`).
//   -DCCOLL_PERF_ALLGATHER (mpi_allgather_perf): MPI_Allgather of block `rank` of sendbuff (in place: MPI_IN_PLACE).
//   -DCCOLL_PERF_REDUCE (mpi_reduce_perf): MPI_Reduce into -r (in place: MPI_IN_PLACE on the root).
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench.h"
#include "mpi_group.h"
#include "options.h"
#include "report.h"

namespace {

using ccperf::DType;
using ccperf::Op;
using ccperf::Pattern;

#if defined(CCOLL_PERF_ALLTOALL)
constexpr Pattern kPattern = Pattern::kAllToAll;
constexpr const char* kProgram = "mpi_alltoall_perf";
constexpr const char* kCall = "MPI_Alltoall";
constexpr const char* kPeer = "alltoall_perf: one block per rank, the size rounded down to nranks blocks";
#elif defined(CCOLL_PERF_BROADCAST)
constexpr Pattern kPattern = Pattern::kBroadcast;
constexpr const char* kProgram = "mpi_broadcast_perf";
constexpr const char* kCall = "MPI_Bcast";
constexpr const char* kPeer = "broadcast_perf: out of place, the root's copy into recvbuff is timed with it";
#elif defined(CCOLL_PERF_REDUCESCATTER)
constexpr Pattern kPattern = Pattern::kReduceScatter;
constexpr const char* kProgram = "mpi_reducescatter_perf";
constexpr const char* kCall = "MPI_Reduce_scatter_block";
constexpr const char* kPeer = "reducescatter_perf: size = the input, nranks blocks, the result at block `rank`";
#elif defined(CCOLL_PERF_ALLGATHER)
constexpr Pattern kPattern = Pattern::kAllGather;
constexpr const char* kProgram = "mpi_allgather_perf";
constexpr const char* kCall = "MPI_Allgather";
constexpr const char* kPeer = "allgather_perf: size = the output, nranks blocks, block `rank` of sendbuff sent";
#elif defined(CCOLL_PERF_REDUCE)
constexpr Pattern kPattern = Pattern::kReduce;
constexpr const char* kProgram = "mpi_reduce_perf";
constexpr const char* kCall = "MPI_Reduce";
constexpr const char* kPeer = "reduce_perf: into the root -r, whose recvbuff alone holds the result";
#else
constexpr Pattern kPattern = Pattern::kAllReduce;
constexpr const char* kProgram = "mpi_allreduce_perf";
constexpr const char* kCall = "MPI_Allreduce";
constexpr const char* kPeer = "allreduce_perf";
#endif
// The patterns MPI cannot run in place with the layout the check expects.
constexpr bool kOutOfPlaceOnly = kPattern == Pattern::kAllToAll || kPattern == Pattern::kReduceScatter;

// False (with *why) for what MPI cannot express.
bool ToMpi(DType t, MPI_Datatype* out, std::string* why) {
  switch (t) {
    case DType::kFloat32: *out = MPI_FLOAT; return true;
    case DType::kFloat64: *out = MPI_DOUBLE; return true;
    case DType::kInt32: *out = MPI_INT32_T; return true;
    case DType::kInt64: *out = MPI_INT64_T; return true;
    case DType::kInt8: *out = MPI_INT8_T; return true;
    case DType::kUint8: *out = MPI_UINT8_T; return true;
    case DType::kUint32: *out = MPI_UINT32_T; return true;
    case DType::kUint64: *out = MPI_UINT64_T; return true;
    default: break;
  }
  *why = std::string("MPI has no ") + ccperf::Info(t).name + " datatype (use float, double or an integer type)";
  return false;
}

bool ToMpi(Op op, MPI_Op* out, std::string* why) {
  switch (op) {
    case Op::kSum: *out = MPI_SUM; return true;
    case Op::kProd: *out = MPI_PROD; return true;
    case Op::kMax: *out = MPI_MAX; return true;
    case Op::kMin: *out = MPI_MIN; return true;
    default: break;
  }
  *why = "MPI has no avg op (use sum, prod, max or min)";
  return false;
}

class MpiAllReducer : public ccperf::AllReducer {
 public:
  MpiAllReducer(MPI_Datatype dtype, MPI_Op op, const ccperf::Options& o, int rank, int nranks)
      : dtype_(dtype), op_(op), elementBytes_(ccperf::Info(o.dtype).size), root_(o.root), rank_(rank),
        nranks_(nranks) {}

  bool Run(const void* send, void* recv, size_t count) override {
    if (count > static_cast<size_t>(INT_MAX)) {
      error_ = "count " + std::to_string(count) + " does not fit MPI's int count";
      return false;
    }
    const int n = nranks_, block = static_cast<int>(count / static_cast<size_t>(n));  // (the blocked patterns)
    const size_t rankBlockAt = static_cast<size_t>(block) * static_cast<size_t>(rank_) * elementBytes_;  // bytes
    int rc = MPI_SUCCESS;
    switch (kPattern) {
      case Pattern::kAllToAll:  // never in place (Body refuses -I 1)
        rc = MPI_Alltoall(send, block, dtype_, recv, block, dtype_, MPI_COMM_WORLD);
        break;
      case Pattern::kBroadcast:
        if (rank_ == root_ && send != recv) std::memcpy(recv, send, count * elementBytes_);
        rc = MPI_Bcast(recv, static_cast<int>(count), dtype_, root_, MPI_COMM_WORLD);
        break;
      case Pattern::kReduceScatter:  // never in place (Body refuses -I 1)
        rc = MPI_Reduce_scatter_block(send, static_cast<char*>(recv) + rankBlockAt, block, dtype_, op_, MPI_COMM_WORLD);
        break;
      case Pattern::kAllGather:
        rc = send == recv ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, block, dtype_, MPI_COMM_WORLD)
                          : MPI_Allgather(static_cast<const char*>(send) + rankBlockAt, block, dtype_, recv, block,
                                          dtype_, MPI_COMM_WORLD);
        break;
      case Pattern::kReduce: {  // (recvbuff matters on the root only)
        const void* in = send == recv && rank_ == root_ ? MPI_IN_PLACE : send;
        rc = MPI_Reduce(in, recv, static_cast<int>(count), dtype_, op_, root_, MPI_COMM_WORLD);
        break;
      }
      default: {
        const void* in = send == recv ? MPI_IN_PLACE : send;
        rc = MPI_Allreduce(in, recv, static_cast<int>(count), dtype_, op_, MPI_COMM_WORLD);
        break;
      }
    }
    if (rc == MPI_SUCCESS) return true;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    error_ = std::string(kCall) + " failed: " + std::string(text, static_cast<size_t>(len));
    return false;
  }
  std::string LastError() override { return error_; }
  bool BytesSent(uint64_t*, uint64_t*) override { return false; }

 private:
  MPI_Datatype dtype_;
  MPI_Op op_;
  size_t elementBytes_;
  int root_;  // broadcast, reduce
  int rank_, nranks_;
  std::string error_;
};

int Body(const ccperf::Options& o, ccperf::MpiGroup& group, int argc, char** argv) {
  MPI_Datatype dtype;
  MPI_Op op = MPI_SUM;  // (what reduces nothing does not use -o)
  std::string why;
  // What only moves bytes moves 16-bit floats as MPI_UINT16_T (MPI has no bfloat16 or half type).
  const bool reduces = ccperf::Reduces(kPattern);
  const bool asBits16 = !reduces && (o.dtype == DType::kFloat16 || o.dtype == DType::kBfloat16);
  if (asBits16) dtype = MPI_UINT16_T;
  if ((!asBits16 && !ToMpi(o.dtype, &dtype, &why)) || (reduces && !ToMpi(o.op, &op, &why))) {
    if (group.rank() == 0) std::fprintf(stderr, "%s: %s\n", kProgram, why.c_str());
    return 2;
  }
  if (kOutOfPlaceOnly && o.inplace) {
    if (group.rank() == 0) {
      std::fprintf(stderr, "%s: -I 1: %s; %s runs out of place only\n", kProgram,
                   kPattern == Pattern::kAllToAll
                       ? "a send and a receive of one buffer at once would overwrite what is being sent"
                       : "MPI's in-place reduce-scatter leaves the result at the start of the buffer, not at block "
                         "`rank` where the check (and ccReduceScatter) has it",
                   kProgram);
    }
    return 2;
  }
  if (o.root >= group.nranks()) {
    if (group.rank() == 0) std::fprintf(stderr, "%s: -r %d is not a rank (%d ranks)\n", kProgram, o.root,
                                        group.nranks());
    return 2;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  ccperf::Report report(stdout);
  if (group.rank() == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string first(lib, static_cast<size_t>(len));
    first = first.substr(0, first.find_first_of("\n,"));
    report.Line("%s: %s benchmark (the peer of ccoll's %s)", kProgram, kCall, kPeer);
    report.CommandAndArgs(argc, argv, o, "mpi");
    report.Line("nranks: %d (MPI processes)", group.nranks());
    report.Line("library: %s", first.c_str());
    report.Line(
        "time: us per %s, mean of -n iterations, each rank timing its own from a common barrier to "
        "its last call's completion, the slowest rank's, after -w warmup iterations at each size; algbw = "
        "size / time; busbw = %s",
        kCall, ccperf::BusbwRule(kPattern));
    report.Line("wirebits: the element bits (MPI does not count its bytes); %s#wrong: %s",
                ccperf::Reduces(kPattern) ? "error: vNMSE vs the fp64 reference; " : "", ccperf::WrongRule(kPattern));
    report.ColumnHeader();
  }
  ccperf::BenchSetup setup;
  setup.opts = o;
  setup.algoLabel = "mpi";
  setup.codecLabel = "mpi";
  setup.pattern = kPattern;
  setup.ranksShareProcess = false;
  setup.program = kProgram;
  MpiAllReducer reducer(dtype, op, o, group.rank(), group.nranks());
  return ccperf::RunAllReduceBench(setup, group, reducer, group.rank() == 0 ? &report : nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    ccperf::MpiGroup group(MPI_COMM_WORLD);
    const char* notes = ccperf::Reduces(kPattern)
                            ? "Ranks are the MPI processes (mpirun -np N). Types: float, double and the integer "
                              "types; ops: sum, prod, max, min.\n"
                            : "Ranks are the MPI processes (mpirun -np N). Types: every -d type (half and bfloat16 "
                              "travel as MPI_UINT16_T); -o is not used.\n";
    const bool rooted = kPattern == Pattern::kBroadcast || kPattern == Pattern::kReduce;
    const ccperf::ProgramInfo prog{kProgram, rooted ? ccperf::kFlagRoot : 0u, notes};
    ccperf::Options opts;
    ccperf::ParseResult pr = ccperf::ParseOptions(argc, argv, prog, group.rank() == 0, &opts);
    if (pr == ccperf::ParseResult::kRun) {
      code = Body(opts, group, argc, argv);
    } else {
      code = pr == ccperf::ParseResult::kExitOk ? 0 : 2;
    }
  }
  MPI_Finalize();
  return code;
}
