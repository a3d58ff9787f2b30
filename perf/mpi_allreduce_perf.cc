// mpi_allreduce_perf: the peer of allreduce_perf. The same sizes, inputs, timing, check and columns, with
// MPI_Allreduce of the MPI library it is built against (one rank per process: mpirun -np N). MPI does not count the
// bytes it sends, so the wirebits column is the nominal 2(n-1)/n * element bits of a ring.
// With -DCCOLL_PERF_ALLTOALL (mpi_alltoall_perf): the peer of alltoall_perf, MPI_Alltoall of one block per rank (the
// size rounded down to nranks blocks), out of place only, with alltoall_perf's byte-for-byte check.
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <string>

#include "bench.h"
#include "mpi_group.h"
#include "options.h"
#include "report.h"

namespace {

using ccperf::DType;
using ccperf::Op;

#ifdef CCOLL_PERF_ALLTOALL
constexpr bool kAllToAll = true;
constexpr const char* kProgram = "mpi_alltoall_perf";
constexpr const char* kCall = "MPI_Alltoall";
#else
constexpr bool kAllToAll = false;
constexpr const char* kProgram = "mpi_allreduce_perf";
constexpr const char* kCall = "MPI_Allreduce";
#endif

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
  MpiAllReducer(MPI_Datatype dtype, MPI_Op op, int nranks) : dtype_(dtype), op_(op), nranks_(nranks) {}

  bool Run(const void* send, void* recv, size_t count) override {
    if (count > static_cast<size_t>(INT_MAX)) {
      error_ = "count " + std::to_string(count) + " does not fit MPI's int count";
      return false;
    }
    int rc;
    if (kAllToAll) {  // count is a multiple of nranks (BenchSetup::exchange); never in place (Body refuses -I 1)
      const int block = static_cast<int>(count / static_cast<size_t>(nranks_));
      rc = MPI_Alltoall(send, block, dtype_, recv, block, dtype_, MPI_COMM_WORLD);
    } else {
      const void* in = send == recv ? MPI_IN_PLACE : send;
      rc = MPI_Allreduce(in, recv, static_cast<int>(count), dtype_, op_, MPI_COMM_WORLD);
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
  int nranks_;
  std::string error_;
};

int Body(const ccperf::Options& o, ccperf::MpiGroup& group, int argc, char** argv) {
  MPI_Datatype dtype;
  MPI_Op op = MPI_SUM;  // (an all-to-all reduces nothing: -o is not used)
  std::string why;
  // An all-to-all only moves bytes: 16-bit floats travel as MPI_UINT16_T (MPI has no bfloat16 or half type).
  const bool asBits16 = kAllToAll && (o.dtype == DType::kFloat16 || o.dtype == DType::kBfloat16);
  if (asBits16) dtype = MPI_UINT16_T;
  if ((!asBits16 && !ToMpi(o.dtype, &dtype, &why)) || (!kAllToAll && !ToMpi(o.op, &op, &why))) {
    if (group.rank() == 0) std::fprintf(stderr, "%s: %s\n", kProgram, why.c_str());
    return 2;
  }
  if (kAllToAll && o.inplace) {
    if (group.rank() == 0) {
      std::fprintf(stderr, "%s: -I 1: a send and a receive of one buffer at once would overwrite what is being sent; "
                   "%s runs out of place only\n", kProgram, kProgram);
    }
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
    report.Line("%s: %s benchmark (the peer of ccoll's %s)", kProgram, kCall,
                kAllToAll ? "alltoall_perf: one block per rank, the size rounded down to nranks blocks"
                          : "allreduce_perf");
    report.CommandAndArgs(argc, argv, o, "mpi");
    report.Line("nranks: %d (MPI processes)", group.nranks());
    report.Line("library: %s", first.c_str());
    report.Line("time: us per %s, mean of -n iterations, each rank timing its own from a common barrier to "
                "its last call's completion, the slowest rank's, after -w warmup iterations at each size; algbw = "
                "size / time; busbw = %s", kAllToAll ? "all-to-all" : "all-reduce",
                kAllToAll ? "algbw * (n-1)/n (every block but the rank's own)" : "algbw * 2(n-1)/n");
    if (kAllToAll) {
      report.Line("wirebits: the element bits (MPI does not count its bytes); #wrong: elements of block p not "
                  "bitwise equal to block `rank` of rank p's input");
    } else {
      report.Line("wirebits: nominal 2(n-1)/n * element bits (MPI does not count its bytes); error: vNMSE vs the "
                  "fp64 reference; #wrong: elements outside the dtype's rounding tolerance");
    }
    report.ColumnHeader();
  }
  ccperf::BenchSetup setup;
  setup.opts = o;
  setup.algoLabel = "mpi";
  setup.codecLabel = "mpi";
  setup.exchange = kAllToAll;
  setup.ranksShareProcess = false;
  setup.program = kProgram;
  MpiAllReducer reducer(dtype, op, group.nranks());
  return ccperf::RunAllReduceBench(setup, group, reducer, group.rank() == 0 ? &report : nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    ccperf::MpiGroup group(MPI_COMM_WORLD);
    const ccperf::ProgramInfo prog{kProgram, 0,
                                   kAllToAll ? "Ranks are the MPI processes (mpirun -np N). Types: every -d type "
                                               "(half and bfloat16 travel as MPI_UINT16_T); -o is not used.\n"
                                             : "Ranks are the MPI processes (mpirun -np N). Types: float, double, "
                                               "int32, int64; ops: sum, prod, max, min.\n"};
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
