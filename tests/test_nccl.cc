// [gpu][nccl] Collectives over the NCCL transport (CC_TRANSPORT=nccl): device buffers, stream-ordered, capturable.
//
// Ranks: against tests/fake_cuda (the CPU stand-ins of CUDA and NCCL), threads of this process. Against a real GPU,
// forked processes, each with its own NCCL_HOSTID: NCCL refuses two ranks on one GPU of one host, and takes processes
// with different host ids for hosts of their own (its socket transport over loopback then connects them). That is
// how a one-GPU machine runs it (perf/gpu_check.sh). Processes are forked before this process touches CUDA; what a
// rank found goes back through shared memory, and the assertions run here, after the ranks are done.
//
// Checked: exact all-reduce over datatypes and ops against fp64 references, identical bytes on every rank, in place;
// reduce-scatter, all-gather, broadcast; the compressed all-reduce (cast16, quant requant and homomorphic, float32 and
// bfloat16 data) with the host ring's bytes (same compressor, same call) where the host ring's slices cut no scale
// group, identical bytes on every rank and its error bound elsewhere; stream order (the call returns while the stream
// is held, work after it sees the result); CUDA graph capture and replay; bad usage; a peer that dies, and one that
// never calls: the others get an asynchronous error within the timeout and their streams are released.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ccoll.h"
#include "drift.h"
#include "inputs.h"
#include "rank_harness.h"
#include "stream_hold.h"
#ifdef CCOLL_FAKE_NCCL
#include "core/comm.h"
#include "fake_cuda/fake_launch.h"
#endif

namespace {

using cctest::Bytes;
using cctest::Contains;
using cctest::Drift;
using cctest::FirstDifference;
using cctest::FirstFailure;
using cctest::Inputs;
using cctest::SizeOf;
using cctest::Values;

#ifdef CCOLL_FAKE_NCCL
constexpr bool kProcesses = false;
#else
constexpr bool kProcesses = true;
#endif

// What one rank reports: a result code with its sentence, and its output bytes.
struct RankOut {
  ccResult_t rc = ccSuccess;
  std::string error;
  Bytes data;
  std::vector<Bytes> each;  // NcclAllReduce with keepEach: every call's result
  void Fail(ccResult_t r, const std::string& why) {
    if (rc != ccSuccess) return;  // the first failure is the one to report
    rc = r;
    error = why;
  }
};

using Body = std::function<void(int rank, RankOut* out)>;

// Shared memory of one forked rank: its result code, sentence and output.
struct Slot {
  int32_t rc;
  uint32_t errorBytes;
  uint64_t dataBytes;
  char error[1024];
};
constexpr size_t kMaxOut = size_t{64} << 20;

// Runs body(rank) for every rank: threads (fake runtime) or forked processes (real GPU; see the top of the file).
// A process that does not end within `seconds` is killed and reported.
std::vector<RankOut> RunRanks(int n, const Body& body, int seconds = 180) {
  std::vector<RankOut> outs(static_cast<size_t>(n));
  if (!kProcesses) {
    cctest::RunRanks(n, [&](int r) { body(r, &outs[r]); });
    return outs;
  }
  const size_t stride = sizeof(Slot) + kMaxOut;
  void* shared = mmap(nullptr, stride * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(shared != MAP_FAILED);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::fflush(nullptr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const std::string host = "ccoll-test-rank-" + std::to_string(r);
      setenv("NCCL_HOSTID", host.c_str(), 1);
      setenv("NCCL_SOCKET_IFNAME", "lo", 0);
      RankOut out;
      body(r, &out);
      Slot* slot = reinterpret_cast<Slot*>(static_cast<char*>(shared) + stride * r);
      slot->rc = out.rc;
      slot->errorBytes = static_cast<uint32_t>(std::min(out.error.size(), sizeof(slot->error)));
      std::memcpy(slot->error, out.error.data(), slot->errorBytes);
      slot->dataBytes = std::min<uint64_t>(out.data.size(), kMaxOut);
      std::memcpy(reinterpret_cast<char*>(slot + 1), out.data.data(), slot->dataBytes);
      _exit(0);  // no Catch2 or static teardown in the child
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::vector<int> status(static_cast<size_t>(n), -1);
  for (size_t left = pids.size(); left > 0;) {
    for (int r = 0; r < n; ++r) {
      if (status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (status[r] == -1) kill(pids[r], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < n; ++r) {
    const Slot* slot = reinterpret_cast<const Slot*>(static_cast<char*>(shared) + stride * r);
    RankOut& out = outs[r];
    if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) {
      out.Fail(ccSystemError, "the rank's process ended with status " + std::to_string(status[r]) +
                                  (WIFSIGNALED(status[r]) ? " (signal " + std::to_string(WTERMSIG(status[r])) + ")"
                                                          : ""));
      continue;
    }
    out.rc = static_cast<ccResult_t>(slot->rc);
    out.error.assign(slot->error, slot->errorBytes);
    out.data.assign(reinterpret_cast<const char*>(slot + 1), reinterpret_cast<const char*>(slot + 1) + slot->dataBytes);
  }
  munmap(shared, stride * n);
  return outs;
}

// Whether a CUDA device is there, asked in a child process when ranks are processes (this one must not touch CUDA
// before it forks them).
bool HaveDevice() {
  auto ask = [] {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    cudaGetLastError();
    return ok;
  };
  if (!kProcesses) return ask();
  pid_t pid = fork();
  if (pid == 0) _exit(ask() ? 0 : 1);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

#define SKIP_WITHOUT_NCCL_DEVICE()                                                     \
  do {                                                                                 \
    if (!HaveDevice()) {                                                               \
      std::fprintf(stderr, "no CUDA device: the [gpu] cases are skipped\n");           \
      std::exit(77);                                                                   \
    }                                                                                  \
  } while (0)

// Whether the ranks check each call across ranks before queuing it (collectives/call_check.h): where they have a host
// transport (thread ranks, over the local transport; processes only in a build with UCX, which this test cannot
// tell), unless CC_CHECK_CALLS=0.
[[maybe_unused]] bool CallCheckRuns() {
  const char* v = std::getenv("CC_CHECK_CALLS");
  return !kProcesses && (v == nullptr || std::strcmp(v, "0") != 0);
}

uint64_t FreshSeed() {
  static const uint64_t base = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) | rd();
  }();
  static std::atomic<uint64_t> next{0};
  return base + 0x9e3779b97f4a7c15ull * ++next;
}

// One rank's communicator on transport nccl, device 0, a non-blocking stream and pinned staging for the test's
// copies; torn down with the object (the stream is synchronized first). The staging is made here, once: with thread
// ranks, cudaHostAlloc and cudaFreeHost would wait for the whole device, other ranks' streams included, and those
// may be waiting for this rank's next call.
struct Rank {
  ccComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  char* pinned = nullptr;
  size_t pinnedBytes = 0;
  ccResult_t rc = ccSuccess;
  std::string error;

  Rank(const ccUniqueId& id, int rank, int n, int timeoutMs = CC_CONFIG_UNDEF_INT, size_t staging = size_t{8} << 20) {
    cudaSetDevice(0);
    void* p = nullptr;
    if (cudaHostAlloc(&p, staging, cudaHostAllocDefault) == cudaSuccess) {
      pinned = static_cast<char*>(p);
      pinnedBytes = staging;
    }
    ccConfig_t config = CC_CONFIG_INITIALIZER;
    config.transport = ccTransportNccl;
    config.cudaDev = 0;
    config.timeoutMs = timeoutMs;
    rc = ccCommInitRankConfig(&comm, n, id, rank, &config);
    if (rc != ccSuccess) {
      error = ccGetLastError(nullptr);
      return;
    }
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      rc = ccUnhandledCudaError;
      error = "cudaStreamCreateWithFlags failed";
    }
  }
  ~Rank() {
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    ccCommDestroy(comm);
    cudaFreeHost(pinned);
  }
  ccStream_t s() const { return reinterpret_cast<ccStream_t>(stream); }

  // Copies on the rank's stream through the staging, and waits for it.
  bool ToDevice(void* dst, const Bytes& src) const {
    if (src.empty()) return true;
    if (src.size() > pinnedBytes) return false;
    std::memcpy(pinned, src.data(), src.size());
    return cudaMemcpyAsync(dst, pinned, src.size(), cudaMemcpyHostToDevice, stream) == cudaSuccess &&
           cudaStreamSynchronize(stream) == cudaSuccess;
  }
  bool FromDevice(Bytes* dst, const void* src, size_t bytes) const {
    dst->assign(bytes, 0);
    if (bytes == 0) return true;
    if (bytes > pinnedBytes) return false;
    bool ok = cudaMemcpyAsync(pinned, src, bytes, cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
              cudaStreamSynchronize(stream) == cudaSuccess;
    if (ok) std::memcpy(dst->data(), pinned, bytes);
    return ok;
  }
};

// Device memory of `bytes` bytes, freed with the object.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// After a rank's calls: its stream's completion and the communicator's asynchronous error.
void Settle(const Rank& k, RankOut* out) {
  cudaError_t e = cudaStreamSynchronize(k.stream);
  if (e != cudaSuccess) out->Fail(ccUnhandledCudaError, std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e));
  ccResult_t async = ccSuccess;
  ccCommGetAsyncError(k.comm, &async);
  if (async != ccSuccess) out->Fail(async, std::string("async: ") + ccGetLastError(k.comm));
}

bool IsInt(ccDataType_t t) {
  return t == ccInt8 || t == ccUint8 || t == ccInt32 || t == ccUint32 || t == ccInt64 || t == ccUint64;
}

// The fp64 reduction of the ranks' inputs, and a bound on the error of a correct result element by element.
void Reference(const std::vector<Bytes>& in, ccDataType_t t, ccRedOp_t op, std::vector<double>* ref,
               std::vector<double>* tol) {
  const int n = static_cast<int>(in.size());
  std::vector<std::vector<double>> v;
  for (const Bytes& b : in) v.push_back(Values(b, t));
  const size_t count = v[0].size();
  const double eps = t == ccFloat64 ? 1e-15 : t == ccFloat32 ? 1e-6 : t == ccBfloat16 ? 8e-3 : 1e-3;
  ref->assign(count, 0.0);
  tol->assign(count, 0.0);
  for (size_t i = 0; i < count; ++i) {
    double acc = v[0][i], mag = std::fabs(v[0][i]);
    for (int r = 1; r < n; ++r) {
      const double x = v[r][i];
      mag += std::fabs(x);
      switch (op) {
        case ccProd: acc *= x; break;
        case ccMax: acc = std::max(acc, x); break;
        case ccMin: acc = std::min(acc, x); break;
        default: acc += x; break;
      }
    }
    if (op == ccProd) {
      mag = 1.0;
      for (int r = 0; r < n; ++r) mag *= std::fabs(v[r][i]);
    }
    if (op == ccAvg) {
      acc = IsInt(t) ? std::trunc(acc / n) : acc / n;
      mag /= n;
    }
    (*ref)[i] = acc;
    // Rounding at every step of n (and of the final division), each at most eps of the magnitude so far; exact for
    // integers and for max and min.
    (*tol)[i] = IsInt(t) || op == ccMax || op == ccMin ? 0.0 : eps * (n + 2) * mag;
  }
}

std::string CheckAgainst(const Bytes& out, ccDataType_t t, const std::vector<double>& ref,
                         const std::vector<double>& tol) {
  const std::vector<double> got = Values(out, t);
  if (got.size() != ref.size()) return "size " + std::to_string(got.size()) + " != " + std::to_string(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!(std::fabs(got[i] - ref[i]) <= tol[i])) {
      return "element " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs reference " +
             std::to_string(ref[i]) + " (tolerance " + std::to_string(tol[i]) + ")";
    }
  }
  return "";
}

// "" when every rank has rank 0's bytes.
std::string SameOnAllRanks(const std::vector<RankOut>& outs) {
  for (size_t r = 1; r < outs.size(); ++r) {
    const std::string d = FirstDifference(outs[r].data, outs[0].data);
    if (!d.empty()) return "rank " + std::to_string(r) + " differs from rank 0: " + d;
  }
  return "";
}

// Rank r's all-reduces of inputs[c][r], call c after call c - 1 with one compressor, on transport nccl (compressor
// spec "" = exact), each on freshly copied buffers; the output of the last call (and of each, with keepEach). Rank
// `legacyRank` passes stream NULL (the legacy default stream).
std::vector<RankOut> NcclAllReduceCalls(const std::vector<std::vector<Bytes>>& inputs, ccDataType_t t, ccRedOp_t op,
                                        const std::string& spec, bool inPlace, int legacyRank = -1,
                                        bool keepEach = false) {
  const int n = static_cast<int>(inputs[0].size()), calls = static_cast<int>(inputs.size());
  const size_t bytes = inputs[0][0].size();
  ccUniqueId id;
  REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  return RunRanks(n, [&](int r, RankOut* out) {
    Rank k(id, r, n);
    if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
    ccCompressor_t comp = nullptr;
    if (!spec.empty() && ccCompressorCreateFromString(&comp, spec.c_str()) != ccSuccess) {
      return out->Fail(ccInvalidArgument, ccGetLastError(nullptr));
    }
    DeviceBuffer send(bytes), recv(bytes);
    void* dst = inPlace ? send.p : recv.p;
    for (int c = 0; c < calls && out->rc == ccSuccess; ++c) {
      if (!k.ToDevice(send.p, inputs[static_cast<size_t>(c)][r])) return out->Fail(ccUnhandledCudaError, "copy in");
      cudaMemsetAsync(recv.p, 0x5a, bytes, k.stream);
      const bool legacy = r == legacyRank;
      if (legacy) cudaStreamSynchronize(k.stream);  // the legacy stream does not wait for a non-blocking one
      ccResult_t rc = ccAllReduce(send.p, dst, bytes / SizeOf(t), t, op, comp, k.comm, legacy ? nullptr : k.s());
      if (rc != ccSuccess) out->Fail(rc, ccGetLastError(k.comm));
      const cudaError_t e = legacy ? cudaStreamSynchronize(nullptr) : cudaSuccess;
      if (e != cudaSuccess) out->Fail(ccUnhandledCudaError, std::string("the legacy stream: ") + cudaGetErrorString(e));
      Settle(k, out);
      if (keepEach) {
        out->each.emplace_back();
        if (!k.FromDevice(&out->each.back(), dst, bytes)) out->Fail(ccUnhandledCudaError, "copy out");
      }
    }
    if (!k.FromDevice(&out->data, dst, bytes)) out->Fail(ccUnhandledCudaError, "copy out");
    ccCompressorDestroy(comp);
    // The traffic counters: what NCCL moved for an exact call is computed (nominal), all of it but the call check's
    // records; a compressed call counts the wire slots it moves itself, and computes what it hands to NCCL (the
    // sparsifiers' chosen chunks, PowerSGD's factors, scales and norms).
    ccCommStats_t st;
    st.size = sizeof(st);
    if (ccCommGetStats(k.comm, &st) != ccSuccess) return out->Fail(ccInternalError, ccGetLastError(k.comm));
    const uint64_t collectiveBytes = st.bytesSent - st.callCheckBytesSent;
    const bool counted = spec.empty() ? st.nominalBytesSent == collectiveBytes && (n == 1 || collectiveBytes > 0)
                                      : st.nominalBytesSent <= collectiveBytes;
    if (!counted) {
      out->Fail(ccInternalError, "stats: bytesSent " + std::to_string(st.bytesSent) + ", callCheckBytesSent " +
                                     std::to_string(st.callCheckBytesSent) + ", nominalBytesSent " +
                                     std::to_string(st.nominalBytesSent));
    }
  });
}

// The same inputs `in`, `calls` times in a row.
std::vector<RankOut> NcclAllReduce(const std::vector<Bytes>& in, ccDataType_t t, ccRedOp_t op, const std::string& spec,
                                   bool inPlace, int calls = 1, int legacyRank = -1, bool keepEach = false) {
  return NcclAllReduceCalls(std::vector<std::vector<Bytes>>(static_cast<size_t>(calls), in), t, op, spec, inPlace,
                            legacyRank, keepEach);
}

// The same calls on host buffers over the local transport with the host ring (thread ranks; in a child process when
// ranks are processes, since this one must not touch CUDA): the bytes a compressed call must reproduce. inputs[c][r]
// is rank r's input to call c, and the result the last call's. Empty when the host path refuses the compressor
// (powersgd in a build without a CPU BLAS, as on the GPU machine).
std::vector<Bytes> HostRing(const std::vector<std::vector<Bytes>>& inputs, ccDataType_t t, ccRedOp_t op,
                            const std::string& spec) {
  const int n = static_cast<int>(inputs[0].size()), calls = static_cast<int>(inputs.size());
  const size_t bytes = inputs[0][0].size();
  auto run = [&](std::vector<Bytes>* outs) -> std::string {
    ccConfig_t config = cctest::MakeConfig(ccAlgoRing);
    config.transport = ccTransportLocal;
    cctest::Group g = cctest::Group::InitConfig(n, config);
    if (g.status != ccSuccess) return g.error;
    cctest::Compressors comps(spec, n);
    if (comps.status != ccSuccess) return comps.error;
    outs->assign(static_cast<size_t>(n), Bytes(bytes, 0));
    std::vector<std::string> errors(static_cast<size_t>(n));
    cctest::RunRanks(n, [&](int r) {
      for (int c = 0; c < calls; ++c) {
        if (ccAllReduce(inputs[c][r].data(), (*outs)[r].data(), bytes / SizeOf(t), t, op, comps[r], g[r], nullptr) !=
            ccSuccess) {
          errors[r] = ccGetLastError(g[r]);
        }
      }
    });
    for (const std::string& e : errors) {
      if (Contains(e, "needs a CPU BLAS")) outs->clear();
      if (!e.empty()) return Contains(e, "needs a CPU BLAS") ? "" : e;
    }
    return "";
  };
  if (!kProcesses) {
    std::vector<Bytes> outs;
    const std::string err = run(&outs);
    REQUIRE(err == "");
    return outs;
  }
  std::vector<Bytes> outs;
  std::vector<RankOut> one = RunRanks(1, [&](int, RankOut* out) {
    std::vector<Bytes> mine;
    const std::string err = run(&mine);
    if (!err.empty()) return out->Fail(ccInternalError, err);
    for (const Bytes& b : mine) out->data.insert(out->data.end(), b.begin(), b.end());
  });
  REQUIRE(FirstFailure(one) == "");
  for (int r = 0; r < n && !one[0].data.empty(); ++r) {
    outs.emplace_back(one[0].data.begin() + r * bytes, one[0].data.begin() + (r + 1) * bytes);
  }
  return outs;
}

// The same call `calls` times with the same inputs.
std::vector<Bytes> HostRing(const std::vector<Bytes>& in, ccDataType_t t, ccRedOp_t op, const std::string& spec,
                            int calls) {
  return HostRing(std::vector<std::vector<Bytes>>(static_cast<size_t>(calls), in), t, op, spec);
}

double Vnmse(const Bytes& out, ccDataType_t t, const std::vector<double>& mean) {
  const std::vector<double> got = Values(out, t);
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < mean.size(); ++i) {
    num += (got[i] - mean[i]) * (got[i] - mean[i]);
    den += mean[i] * mean[i];
  }
  return num / den;
}

}  // namespace

// No device needed: the runner itself. Each rank's result comes back; with ranks as processes, a rank that dies or
// hangs is reported as such instead of taking the test binary with it.
TEST_CASE("[nccl] the rank runner hands back each rank's result, and reports ranks that die or hang", "[runner]") {
  std::vector<RankOut> outs = RunRanks(3, [](int r, RankOut* out) {
    out->data.assign(static_cast<size_t>(1000 * (r + 1)), static_cast<char>('a' + r));
    if (r == 1) out->Fail(ccRemoteError, "rank one says so");
  });
  REQUIRE(outs.size() == 3);
  for (int r = 0; r < 3; ++r) {
    const Bytes want(static_cast<size_t>(1000 * (r + 1)), static_cast<char>('a' + r));
    CHECK(FirstDifference(outs[r].data, want) == "");
  }
  CHECK(outs[0].rc == ccSuccess);
  CHECK(outs[1].rc == ccRemoteError);
  CHECK(outs[1].error == "rank one says so");
  if (kProcesses) {
    outs = RunRanks(2, [](int r, RankOut*) {
      if (r == 0) std::abort();
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }, 2);
    CHECK(Contains(outs[0].error, "signal 6"));
    CHECK(Contains(outs[1].error, "signal 9"));  // killed at the deadline
  }
}

TEST_CASE("[nccl] exact collectives against fp64 references, the same bytes on every rank", "[gpu][nccl][exact]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  struct Case {
    ccDataType_t dtype;
    ccRedOp_t op;
  };
  // The 8-bit and unsigned inputs are any bits, so their sums wrap: max and min compare them here (test_collectives
  // checks their wrapping sums and products on the host ring, test_gpu the kernels).
  const Case cases[] = {{ccFloat32, ccSum}, {ccFloat32, ccAvg}, {ccFloat32, ccMax}, {ccFloat64, ccSum},
                        {ccFloat64, ccProd}, {ccInt32, ccSum},  {ccInt32, ccAvg},   {ccInt64, ccMin},
                        {ccBfloat16, ccSum}, {ccFloat16, ccAvg}, {ccInt8, ccMax},   {ccUint8, ccMin},
                        {ccUint32, ccMax},   {ccUint64, ccMin}};
  int variant = 0;
  for (int n : {4, 3}) {
    for (const Case& k : cases) {
      for (size_t count : {size_t{1}, size_t{4099}, size_t{3 * 65537}}) {
        const bool inPlace = ++variant % 2 == 0;  // every case and count both ways over the two group sizes
        const uint64_t seed = FreshSeed();
        INFO(n << " ranks, dtype " << k.dtype << ", op " << k.op << ", count " << count << ", seed " << seed);
        const std::vector<Bytes> in = Inputs(n, count, k.dtype, seed);
        std::vector<RankOut> outs = NcclAllReduce(in, k.dtype, k.op, "", inPlace);
        REQUIRE(FirstFailure(outs) == "");
        std::vector<double> ref, tol;
        Reference(in, k.dtype, k.op, &ref, &tol);
        CHECK(CheckAgainst(outs[0].data, k.dtype, ref, tol) == "");
        CHECK(SameOnAllRanks(outs) == "");
      }
    }
  }
}

TEST_CASE("[nccl] reduce-scatter, all-gather, broadcast and reduce", "[gpu][nccl][exact]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  const int n = 4;
  const size_t count = 5003;  // per rank
  const uint64_t seed = FreshSeed();
  INFO("seed " << seed);
  const std::vector<Bytes> in = Inputs(n, count * n, ccFloat32, seed);
  ccUniqueId id;
  REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  const int root = 2;
  // Each rank returns its reduce-scatter block, then its all-gather result, then what the broadcast gave it, then the
  // reduce's output (only the root's is written).
  std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
    Rank k(id, r, n);
    if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
    DeviceBuffer big(count * n * 4), block(count * 4), gathered(count * n * 4), reduced(count * n * 4);
    if (!k.ToDevice(big.p, in[r])) return out->Fail(ccUnhandledCudaError, "copy in");
    Bytes rs, ag, bc;
    ccResult_t rc = ccReduceScatter(big.p, block.p, count, ccFloat32, ccSum, k.comm, k.s());
    if (rc == ccSuccess) rc = ccAllGather(block.p, gathered.p, count, ccFloat32, k.comm, k.s());
    if (rc != ccSuccess) return out->Fail(rc, ccGetLastError(k.comm));
    k.FromDevice(&rs, block.p, count * 4);
    k.FromDevice(&ag, gathered.p, count * n * 4);
    // In place: the root's own buffer is the source.
    if (!k.ToDevice(big.p, in[r])) return out->Fail(ccUnhandledCudaError, "copy in");
    rc = ccBroadcast(big.p, big.p, count * n, ccFloat32, root, k.comm, k.s());
    if (rc != ccSuccess) return out->Fail(rc, ccGetLastError(k.comm));
    k.FromDevice(&bc, big.p, count * n * 4);
    Bytes rd;
    if (!k.ToDevice(big.p, in[r])) return out->Fail(ccUnhandledCudaError, "copy in");
    rc = ccReduce(big.p, reduced.p, count * n, ccFloat32, ccSum, root, k.comm, k.s());
    if (rc != ccSuccess) return out->Fail(rc, ccGetLastError(k.comm));
    k.FromDevice(&rd, reduced.p, count * n * 4);
    Settle(k, out);
    out->data = rs;
    out->data.insert(out->data.end(), ag.begin(), ag.end());
    out->data.insert(out->data.end(), bc.begin(), bc.end());
    out->data.insert(out->data.end(), rd.begin(), rd.end());
  });
  REQUIRE(FirstFailure(outs) == "");
  std::vector<double> ref, tol;
  Reference(in, ccFloat32, ccSum, &ref, &tol);
  Bytes allBlocks;
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const Bytes rs(outs[r].data.begin(), outs[r].data.begin() + count * 4);
    const std::vector<double> mine(ref.begin() + r * count, ref.begin() + (r + 1) * count);
    const std::vector<double> mineTol(tol.begin() + r * count, tol.begin() + (r + 1) * count);
    CHECK(CheckAgainst(rs, ccFloat32, mine, mineTol) == "");
    allBlocks.insert(allBlocks.end(), rs.begin(), rs.end());
  }
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const Bytes ag(outs[r].data.begin() + count * 4, outs[r].data.begin() + count * 4 * (n + 1));
    CHECK(FirstDifference(ag, allBlocks) == "");
    const Bytes bc(outs[r].data.begin() + count * 4 * (n + 1), outs[r].data.begin() + count * 4 * (2 * n + 1));
    CHECK(FirstDifference(bc, in[root]) == "");
  }
  const Bytes rd(outs[root].data.begin() + count * 4 * (2 * n + 1), outs[root].data.end());
  CHECK(CheckAgainst(rd, ccFloat32, ref, tol) == "");
}

// ccSend and ccRecv over transport nccl: one group per rank with an all-to-all (a different size per pair, the sends
// to the rank itself included) and, between groups, blocking-order sends and receives on the stream.
TEST_CASE("[nccl] point-to-point: an all-to-all group and ordered sends deliver the senders' bytes",
          "[gpu][nccl][p2p]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  const int n = 3;
  const uint64_t seed = FreshSeed();
  INFO("seed " << seed);
  auto countOf = [](int from, int to) { return size_t{1000} + static_cast<size_t>(from * 7 + to); };
  std::vector<std::vector<Bytes>> in(n);
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) in[r].push_back(Inputs(1, countOf(r, p), ccInt32, seed + r * n + p)[0]);
  }
  ccUniqueId id;
  REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  // Each rank returns what it received from ranks 0..n-1, then what rank 0 sent it in two ordered sends.
  std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
    Rank k(id, r, n);
    if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
    std::vector<std::unique_ptr<DeviceBuffer>> send, recv;
    for (int p = 0; p < n; ++p) {
      send.push_back(std::make_unique<DeviceBuffer>(countOf(r, p) * 4));
      recv.push_back(std::make_unique<DeviceBuffer>(countOf(p, r) * 4));
      if (!k.ToDevice(send.back()->p, in[r][p])) return out->Fail(ccUnhandledCudaError, "copy in");
    }
    ccGroupStart();
    for (int p = n - 1; p >= 0; --p) ccRecv(recv[p]->p, countOf(p, r), ccInt32, p, k.comm, k.s());
    for (int p = 0; p < n; ++p) ccSend(send[p]->p, countOf(r, p), ccInt32, p, k.comm, k.s());
    ccResult_t rc = ccGroupEnd();
    if (rc != ccSuccess) return out->Fail(rc, ccGetLastError(nullptr));
    // Ordered: rank 0 sends its two first buffers to every other rank, one call each (stream-ordered, no group).
    DeviceBuffer first(countOf(0, 0) * 4), second(countOf(0, 1) * 4);
    for (int p = 1; p < n && r == 0 && rc == ccSuccess; ++p) {
      rc = ccSend(send[0]->p, countOf(0, 0), ccInt32, p, k.comm, k.s());
      if (rc == ccSuccess) rc = ccSend(send[1]->p, countOf(0, 1), ccInt32, p, k.comm, k.s());
    }
    if (r != 0) {
      rc = ccRecv(first.p, countOf(0, 0), ccInt32, 0, k.comm, k.s());
      if (rc == ccSuccess) rc = ccRecv(second.p, countOf(0, 1), ccInt32, 0, k.comm, k.s());
    }
    if (rc != ccSuccess) return out->Fail(rc, ccGetLastError(k.comm));
    // Host buffers are refused on transport nccl (NCCL orders its messages apart from the host transports'), before
    // anything moves.
    int32_t host[4] = {0, 0, 0, 0};
    if (ccSend(host, 4, ccInt32, (r + 1) % n, k.comm, nullptr) != ccInvalidUsage ||
        std::string(ccGetLastError(k.comm)).find("device buffers only") == std::string::npos) {
      return out->Fail(ccInternalError, std::string("a host send was not refused: ") + ccGetLastError(k.comm));
    }
    for (int p = 0; p < n; ++p) {
      Bytes got;
      k.FromDevice(&got, recv[p]->p, countOf(p, r) * 4);
      out->data.insert(out->data.end(), got.begin(), got.end());
    }
    if (r != 0) {
      Bytes a, b;
      k.FromDevice(&a, first.p, countOf(0, 0) * 4);
      k.FromDevice(&b, second.p, countOf(0, 1) * 4);
      out->data.insert(out->data.end(), a.begin(), a.end());
      out->data.insert(out->data.end(), b.begin(), b.end());
    }
    Settle(k, out);
  });
  REQUIRE(FirstFailure(outs) == "");
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    Bytes expect;
    for (int p = 0; p < n; ++p) expect.insert(expect.end(), in[p][r].begin(), in[p][r].end());
    if (r != 0) {
      expect.insert(expect.end(), in[0][0].begin(), in[0][0].end());
      expect.insert(expect.end(), in[0][1].begin(), in[0][1].end());
    }
    CHECK(FirstDifference(outs[r].data, expect) == "");
  }
}

TEST_CASE("[nccl] compressed all-reduce: the host ring's bytes, the same on every rank, within its error bound",
          "[gpu][nccl][codec]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  struct Case {
    std::string spec;
    double bound;  // vNMSE against the exact mean, i.i.d. normal inputs
  };
  const Case cases[] = {{"cast16", 1e-4},
                        {"cast16:dtype=fp16", 1e-5},
                        {"quant:bits=4,mode=requant", 0.1},
                        {"quant:bits=8,mode=requant", 1e-3},
                        {"quant:bits=2,mode=homomorphic", 2.0},
                        {"quant:bits=4,mode=homomorphic,rotation=none", 0.1}};
  const int n = 4;
  for (const Case& k : cases) {
    for (ccDataType_t t : {ccFloat32, ccBfloat16}) {
      // Aligned: chunks and the host ring's 256 KiB slices are whole scale groups, so the bytes must match the host
      // ring's; odd: they need not, and the bound and the cross-rank identity are checked.
      for (size_t count : {size_t{n} * 65536 * 2, size_t{100003}}) {
        const bool aligned = count % (size_t{n} * 65536) == 0;
        const uint64_t seed = FreshSeed();
        const std::string spec =
            k.spec + (k.spec.find(':') == std::string::npos ? ":" : ",") + "seed=" + std::to_string(seed % 100000);
        INFO(spec << ", dtype " << t << ", count " << count << ", input seed " << seed);
        const std::vector<Bytes> in = Inputs(n, count, t, seed);
        const int calls = 2;  // the second call has fresh randomness (the compressor's call counter)
        std::vector<RankOut> outs = NcclAllReduce(in, t, ccAvg, spec, count % 2 == 1, calls);
        REQUIRE(FirstFailure(outs) == "");
        CHECK(SameOnAllRanks(outs) == "");
        std::vector<double> mean, tol;
        Reference(in, t, ccAvg, &mean, &tol);
        const double err = Vnmse(outs[0].data, t, mean);
        INFO("vNMSE " << err);
        CHECK(err < k.bound);
        if (aligned) {
          const std::vector<Bytes> host = HostRing(in, t, ccAvg, spec, calls);
          CHECK(FirstDifference(outs[0].data, host[0]) == "");
        }
      }
    }
  }
}

// vNMSE of out against the host path's result (both as values of t); non-finite values must sit in the same places.
std::string CloseTo(const Bytes& out, const Bytes& host, ccDataType_t t, double bound) {
  const std::vector<double> a = Values(out, t), b = Values(host, t);
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isfinite(a[i]) != std::isfinite(b[i])) return "finiteness differs at element " + std::to_string(i);
    if (!std::isfinite(a[i])) continue;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (num > bound * den) return "vNMSE against the host path " + std::to_string(num / den);
  return "";
}

TEST_CASE("[nccl] topk, randk and powersgd keep what 16-bit sums and results round away in their error feedback",
          "[gpu][nccl][codec]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  // Every chunk sent, the same input every call: the running sum of the outputs stays within about one call's
  // rounding of the running sum of the means, as on the host path (test_compression "[ef]"); without the rounding
  // kept, every call would round the same way and the drift would grow with the calls (4x in 4x the calls). Float32
  // data with bf16 values (the sums round), and bf16 data (the result rounds; with bf16 values the sums too).
  // PowerSGD: the drift of the vector after its matrix, which travels exactly but for the 16-bit result's rounding
  // (the matrix's rounding stays in the memory too, but its low rank need not carry it: test_lowrank checks it there).
  const int n = 4, calls = 20;
  const size_t count = 5000;
  // A sum keeps 1 / n of the result's rounding on each rank (an average all of it).
  struct Case {
    ccDataType_t data;
    const char* spec;
    ccRedOp_t op;
    size_t from = 0;  // the elements whose drift is measured: [from, count)
  };
  const Case cases[] = {{ccFloat32, "topk:density=1,chunk=256,dtype=bf16", ccAvg},
                        {ccFloat32, "randk:density=1,chunk=256,dtype=bf16", ccAvg},
                        {ccBfloat16, "topk:density=1,chunk=256", ccAvg},
                        {ccBfloat16, "randk:density=1,chunk=256,dtype=bf16", ccAvg},
                        {ccBfloat16, "topk:density=1,chunk=256", ccSum},
                        {ccFloat16, "randk:density=1,chunk=256", ccSum},
                        {ccFloat16, "topk:density=1,chunk=256,dtype=bf16", ccSum},
                        {ccBfloat16, "powersgd:rank=2,shapes=64x64+904", ccAvg, 4096},
                        {ccFloat16, "powersgd:rank=2,shapes=64x64+904,dtype=bf16", ccSum, 4096}};
  for (const Case& k : cases) {
    const char* spec = k.spec;
    const uint64_t seed = FreshSeed();
    INFO(spec << ", data " << k.data << ", op " << k.op << ", input seed " << seed);
    const std::vector<Bytes> in = Inputs(n, count, k.data, seed);
    std::vector<double> mean, tol;
    Reference(in, k.data, k.op, &mean, &tol);
    std::vector<RankOut> outs = NcclAllReduce(in, k.data, k.op, spec, false, calls, -1, true);
    REQUIRE(FirstFailure(outs) == "");
    CHECK(SameOnAllRanks(outs) == "");
    Drift drift(count, k.from);
    std::vector<double> rms;
    for (int c = 0; c < calls; ++c) {
      drift.Add(Values(outs[0].each[static_cast<size_t>(c)], k.data).data(), mean);
      rms.push_back(drift.Relative(mean));  // relative to the mean's norm
    }
    INFO("drift after 5 calls " << rms[4] << ", after 20 " << rms[19] << ", after the first " << rms[0]);
    CHECK(rms[0] > 0.0);  // the first call rounds
    CHECK(rms[19] < 1.5 * rms[4]);
    CHECK(rms[19] < 2.0 * rms[0]);
  }
}

TEST_CASE("[nccl] an fp16 sum past 65504 keeps what its bf16 sums rounded away, as the host path does",
          "[gpu][nccl][codec]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  // Element 7 is 60000 on every rank in the first call: its bf16 sums round (by a total that does not depend on the
  // ring's order, every rank's value being the same) and its float16 result overflows. The rounding of that result
  // is infinite and kept nowhere, but what the sums rounded away stays in the memories and comes out in the second
  // call, whose inputs are small: there, the host path's result and the stream path's agree to the bf16 rounding of
  // the second call (a few units), and without the sums' rounding they would differ by it (hundreds).
  const int n = 3;
  const size_t count = 5000, at = 7;
  const std::string spec = "topk:density=1,chunk=256,dtype=bf16";
  const uint64_t seed = FreshSeed();
  INFO("input seed " << seed);
  std::vector<std::vector<Bytes>> inputs = {Inputs(n, count, ccFloat16, seed), Inputs(n, count, ccFloat16, seed + 1)};
  const uint16_t big = 0x7b53;  // 60000 in float16
  for (Bytes& b : inputs[0]) std::memcpy(&b[at * 2], &big, 2);
  std::vector<RankOut> outs = NcclAllReduceCalls(inputs, ccFloat16, ccSum, spec, false, -1, true);
  REQUIRE(FirstFailure(outs) == "");
  CHECK(SameOnAllRanks(outs) == "");
  CHECK(std::isinf(Values(outs[0].each[0], ccFloat16)[at]));
  const std::vector<Bytes> host = HostRing(inputs, ccFloat16, ccSum, spec);
  if (host.empty()) return;
  const double stream = Values(outs[0].data, ccFloat16)[at], hostValue = Values(host[0], ccFloat16)[at];
  const std::vector<double> second0 = Values(inputs[1][0], ccFloat16), second1 = Values(inputs[1][1], ccFloat16),
                            second2 = Values(inputs[1][2], ccFloat16);
  const double plain = second0[at] + second1[at] + second2[at];  // the second call's own sum
  INFO("element " << at << ": stream path " << stream << ", host path " << hostValue << ", the second call's own sum "
                  << plain);
  CHECK(std::fabs(hostValue - plain) > 50.0);  // the first call's sums' rounding, sent in the second
  CHECK(std::fabs(stream - hostValue) < 8.0);
}

TEST_CASE("[nccl] topk and randk: the host path's chunks and values, call after call, the same on every rank",
          "[gpu][nccl][codec]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  // The chunk choice is the host's byte for byte; the sums are NCCL's (float32 values) or the cast ring's over the
  // chunks padded to whole ones (16-bit values), so the values may differ from the host path's by rounding: 1e-10 of
  // the signal for float32 sums, 1e-4 for bfloat16 ones. Error feedback (on by default) carries what was not sent
  // from call to call on both paths.
  struct Case {
    std::string spec;
    double bound;
  };
  const Case cases[] = {{"topk:density=0.1", 1e-10},
                        {"randk:density=0.25", 1e-10},
                        {"randk:density=0.1,unbiased=1,ef=0", 1e-10},
                        {"topk:density=0.05,dtype=bf16", 1e-4}};
  const int n = 4, calls = 3;
  for (const Case& k : cases) {
    for (ccDataType_t t : {ccFloat32, ccBfloat16}) {
      const size_t count = 100003;  // 98 chunks of 1024, the last one short
      const uint64_t seed = FreshSeed();
      const std::string spec = k.spec + ",seed=" + std::to_string(seed % 100000);
      INFO(spec << ", dtype " << t << ", input seed " << seed);
      const std::vector<Bytes> in = Inputs(n, count, t, seed);
      std::vector<RankOut> outs = NcclAllReduce(in, t, ccAvg, spec, false, calls);
      REQUIRE(FirstFailure(outs) == "");
      CHECK(SameOnAllRanks(outs) == "");
      const std::vector<Bytes> host = HostRing(in, t, ccAvg, spec, calls);
      CHECK(CloseTo(outs[0].data, host[0], t, t == ccBfloat16 ? std::max(k.bound, 1e-4) : k.bound) == "");
    }
  }
  // randk and a rank whose input is not finite: every rank's whole result is NaN, as on the host path.
  std::vector<Bytes> in = Inputs(n, 5000, ccFloat32, FreshSeed());
  const float inf = INFINITY;
  std::memcpy(in[2].data() + 4 * 1234, &inf, 4);
  std::vector<RankOut> outs = NcclAllReduce(in, ccFloat32, ccSum, "randk:density=0.1", true);
  REQUIRE(FirstFailure(outs) == "");
  for (const RankOut& o : outs) {
    const std::vector<double> v = Values(o.data, ccFloat32);
    CHECK(std::all_of(v.begin(), v.end(), [](double x) { return std::isnan(x); }));
  }
}

TEST_CASE("[nccl] powersgd: a rank-2 average recovered, the host path's result call after call, the same on every rank",
          "[gpu][nccl][codec]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  const int n = 4;
  const int64_t rows = 96, cols = 64;
  const size_t count = static_cast<size_t>(rows * cols) + 100;  // a matrix and a vector (sent exactly)
  const std::string shapes = ",shapes=" + std::to_string(rows) + "x" + std::to_string(cols) + "+100";
  // Rank-2 gradients A_r B^T with a shared right factor: their average A B^T has rank 2, which rank 2 recovers in one
  // call. A's and B's columns are orthogonal, A's of norms 1 and 1/2 (a condition number of 2; an ill-conditioned
  // average would lose its weaker direction to the bfloat16 wire's rounding), and A_r = A + D_r with the D_r summing
  // to zero.
  std::mt19937_64 gen(FreshSeed());
  std::normal_distribution<double> normal;
  auto orthogonalColumns = [&](int64_t len, double second) {
    std::vector<double> c(static_cast<size_t>(len) * 2);
    for (double& v : c) v = normal(gen);
    double n0 = 0.0, dot = 0.0, n1 = 0.0;
    for (int64_t i = 0; i < len; ++i) n0 += c[i * 2] * c[i * 2];
    for (int64_t i = 0; i < len; ++i) c[i * 2] /= std::sqrt(n0);
    for (int64_t i = 0; i < len; ++i) dot += c[i * 2] * c[i * 2 + 1];
    for (int64_t i = 0; i < len; ++i) c[i * 2 + 1] -= dot * c[i * 2];
    for (int64_t i = 0; i < len; ++i) n1 += c[i * 2 + 1] * c[i * 2 + 1];
    for (int64_t i = 0; i < len; ++i) c[i * 2 + 1] *= second / std::sqrt(n1);
    return c;
  };
  const std::vector<double> a0 = orthogonalColumns(rows, 0.5), b = orthogonalColumns(cols, 1.0);
  std::vector<std::vector<double>> d(n, std::vector<double>(a0.size()));
  for (size_t i = 0; i < a0.size(); ++i) {
    double mean = 0.0;
    for (int r = 0; r < n; ++r) mean += (d[r][i] = 0.1 * normal(gen)) / n;
    for (int r = 0; r < n; ++r) d[r][i] -= mean;
  }
  std::vector<Bytes> lowRank(n);
  for (int r = 0; r < n; ++r) {
    std::vector<float> g(count);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const double x0 = a0[i * 2] + d[r][i * 2], x1 = a0[i * 2 + 1] + d[r][i * 2 + 1];
        g[i * cols + j] = static_cast<float>(x0 * b[j * 2] + x1 * b[j * 2 + 1]);
      }
    }
    for (size_t i = static_cast<size_t>(rows * cols); i < count; ++i) g[i] = static_cast<float>(normal(gen));
    lowRank[r].assign(reinterpret_cast<char*>(g.data()), reinterpret_cast<char*>(g.data() + count));
  }
  // Three calls: the first recovers the average, the warm start and the (near-zero) error feedback keep it so.
  for (const std::string wire : {"f32", "bf16"}) {
    INFO("wire " << wire);
    std::vector<RankOut> outs = NcclAllReduce(lowRank, ccFloat32, ccAvg, "powersgd:rank=2,dtype=" + wire + shapes,
                                              false, 3);
    REQUIRE(FirstFailure(outs) == "");
    CHECK(SameOnAllRanks(outs) == "");
    std::vector<double> mean, tol;
    Reference(lowRank, ccFloat32, ccAvg, &mean, &tol);
    const double err = Vnmse(outs[0].data, ccFloat32, mean);
    INFO("vNMSE " << err);
    CHECK(err < (wire == "f32" ? 1e-9 : 1e-4));
  }
  // General gradients over three calls (warm start, error feedback): the host path's results, to the rounding of sums
  // taken in another order (and, on a GPU, of cuBLAS's products and Gram-Schmidt's block sums).
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, FreshSeed());
  const std::string spec = "powersgd:rank=4" + shapes;
  std::vector<RankOut> outs = NcclAllReduce(in, ccFloat32, ccAvg, spec, true, 3);
  REQUIRE(FirstFailure(outs) == "");
  CHECK(SameOnAllRanks(outs) == "");
  const std::vector<Bytes> host = HostRing(in, ccFloat32, ccAvg, spec, 3);
  if (!host.empty()) CHECK(CloseTo(outs[0].data, host[0], ccFloat32, 1e-8) == "");
}

TEST_CASE("[nccl] one rank: exact and compressed calls copy", "[gpu][nccl]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  const std::vector<Bytes> in = Inputs(1, 777, ccFloat32, FreshSeed());
  for (const std::string spec : {"", "quant:bits=4"}) {
    std::vector<RankOut> outs = NcclAllReduce(in, ccFloat32, ccAvg, spec, false);
    REQUIRE(FirstFailure(outs) == "");
    CHECK(FirstDifference(outs[0].data, in[0]) == "");
  }
}

TEST_CASE("[nccl] one rank: a compressed call captured before any other holds a copy", "[gpu][nccl][graph]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  // One rank communicates nothing: the call needs no scratch, so a fresh compressor's first call can be captured, and
  // the communicator stays usable.
  const size_t count = 777;
  const std::vector<Bytes> in = Inputs(1, count, ccFloat32, FreshSeed());
  ccUniqueId id;
  REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  std::vector<RankOut> outs = RunRanks(1, [&](int, RankOut* out) {
    Rank k(id, 0, 1);
    if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
    DeviceBuffer x(count * 4), y(count * 4);
    if (!k.ToDevice(x.p, in[0])) return out->Fail(ccUnhandledCudaError, "copy in");
    ccCompressor_t comp = nullptr;
    ccCompressorCreateFromString(&comp, "quant:bits=4");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (cudaStreamBeginCapture(k.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      return out->Fail(ccUnhandledCudaError, "cudaStreamBeginCapture");
    }
    ccResult_t rc = ccAllReduce(x.p, y.p, count, ccFloat32, ccAvg, comp, k.comm, k.s());
    const cudaError_t e = cudaStreamEndCapture(k.stream, &graph);
    if (rc != ccSuccess) out->Fail(rc, "captured: " + std::string(ccGetLastError(k.comm)));
    if (e != cudaSuccess) out->Fail(ccUnhandledCudaError, std::string("capture: ") + cudaGetErrorString(e));
    if (out->rc == ccSuccess && (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess ||
                                 cudaGraphLaunch(exec, k.stream) != cudaSuccess)) {
      out->Fail(ccUnhandledCudaError, "instantiate or launch");
    }
    rc = ccAllReduce(x.p, x.p, count, ccFloat32, ccSum, nullptr, k.comm, k.s());
    if (rc != ccSuccess) out->Fail(rc, "after the capture: " + std::string(ccGetLastError(k.comm)));
    Settle(k, out);
    k.FromDevice(&out->data, y.p, count * 4);
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    ccCompressorDestroy(comp);
  });
  REQUIRE(FirstFailure(outs) == "");
  CHECK(FirstDifference(outs[0].data, in[0]) == "");
}

TEST_CASE("[nccl] the legacy default stream (stream NULL) carries compressed calls too", "[gpu][nccl][stream]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  // Rank 0 passes stream NULL (thread ranks share their process's legacy stream, so only one of them may wait in NCCL
  // on it); the others their own streams. Two calls (error feedback, warm start): the bytes of the same calls with
  // every rank on a stream of its own; where NCCL sums float32 values (topk and randk's values, PowerSGD's factors)
  // to within their rounding, as NCCL keeps its algorithm choice from run to run only as far as it does.
  struct Case {
    std::string spec;
    bool bytes;
  };
  // The codec ring with its scales agreed on the device, the sparsifiers' two ways of summing values, PowerSGD.
  const Case cases[] = {{"quant:bits=4,mode=homomorphic", true},
                        {"topk:density=0.1", false},
                        {"randk:density=0.25,dtype=bf16", true},
                        {"powersgd:rank=2,shapes=200x200", false}};
  const int n = 3;
  const size_t count = 40000;
  for (const Case& k : cases) {
    INFO(k.spec);
    const std::vector<Bytes> in = Inputs(n, count, ccFloat32, FreshSeed());
    std::vector<RankOut> own = NcclAllReduce(in, ccFloat32, ccAvg, k.spec, false, 2);
    REQUIRE(FirstFailure(own) == "");
    std::vector<RankOut> legacy = NcclAllReduce(in, ccFloat32, ccAvg, k.spec, false, 2, 0);
    REQUIRE(FirstFailure(legacy) == "");
    CHECK(SameOnAllRanks(legacy) == "");
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      if (k.bytes) {
        CHECK(FirstDifference(legacy[r].data, own[r].data) == "");
      } else {
        CHECK(CloseTo(legacy[r].data, own[r].data, ccFloat32, 1e-10) == "");
      }
    }
  }
}

// A host function on the stream that waits until `*open` is set: the stream is held while the rank calls.
void CUDART_CB HoldStream(void* open) {
  while (!static_cast<std::atomic<bool>*>(open)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST_CASE("[nccl] stream order: the call returns while its stream is held, and work after it sees the result",
          "[gpu][nccl][stream]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  const int n = 3;
  const size_t count = 70001;
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, FreshSeed());
  ccUniqueId id;
  REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
    Rank k(id, r, n);
    if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
    DeviceBuffer buf(count * 4);
    ccCompressor_t comp = nullptr;
    ccCompressorCreateFromString(&comp, "quant:bits=8");
    for (ccCompressor_t c : {static_cast<ccCompressor_t>(nullptr), comp}) {
      if (!k.ToDevice(buf.p, in[r])) return out->Fail(ccUnhandledCudaError, "copy in");
      std::atomic<bool> open{false};
      cudaLaunchHostFunc(k.stream, HoldStream, &open);
      const auto start = std::chrono::steady_clock::now();
      ccResult_t rc = ccAllReduce(buf.p, buf.p, count, ccFloat32, ccSum, c, k.comm, k.s());
      const double took = cctest::SecondsSince(start);
      const bool held = cudaStreamQuery(k.stream) == cudaErrorNotReady;
      open = true;
      if (rc != ccSuccess) return out->Fail(rc, ccGetLastError(k.comm));
      if (!held) out->Fail(ccInternalError, "the stream was not held when the call returned");
      if (took > 5.0) out->Fail(ccInternalError, "the call waited for its stream (" + std::to_string(took) + " s)");
      Bytes got;
      k.FromDevice(&got, buf.p, count * 4);  // queued after the call on the same stream
      out->data.insert(out->data.end(), got.begin(), got.end());
    }
    Settle(k, out);
    ccCompressorDestroy(comp);
  });
  REQUIRE(FirstFailure(outs) == "");
  CHECK(SameOnAllRanks(outs) == "");
  std::vector<double> ref, tol;
  Reference(in, ccFloat32, ccSum, &ref, &tol);
  const Bytes exact(outs[0].data.begin(), outs[0].data.begin() + count * 4);
  CHECK(CheckAgainst(exact, ccFloat32, ref, tol) == "");
  const Bytes quant(outs[0].data.begin() + count * 4, outs[0].data.end());
  CHECK(Vnmse(quant, ccFloat32, ref) < 1e-3);
}

TEST_CASE("[nccl] one rank's compressor on two communicators and two streams: the second call waits for the first",
          "[gpu][nccl][stream]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  // Each rank makes one call on communicator A, whose stream is held, then one on communicator B with the same
  // compressor on another stream. The compressor (topk with error feedback) carries what the first call did not send
  // into the second, so the second call must run after the first, as the host path runs them: the host path's bytes.
  const int n = 3, calls = 2;
  const size_t count = 50001;
  const uint64_t seed = FreshSeed();
  const std::string spec = "topk:density=0.1,seed=" + std::to_string(seed % 100000);
  INFO(spec);
  std::vector<std::vector<Bytes>> in;
  for (int c = 0; c < calls; ++c) in.push_back(Inputs(n, count, ccFloat32, FreshSeed()));
  ccUniqueId idA, idB;
  REQUIRE(ccGetUniqueId(&idA) == ccSuccess);
  REQUIRE(ccGetUniqueId(&idB) == ccSuccess);
  std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
    Rank a(idA, r, n), b(idB, r, n);
    if (a.rc != ccSuccess) return out->Fail(a.rc, a.error);
    if (b.rc != ccSuccess) return out->Fail(b.rc, b.error);
    ccCompressor_t comp = nullptr;
    if (ccCompressorCreateFromString(&comp, spec.c_str()) != ccSuccess) {
      return out->Fail(ccInvalidArgument, ccGetLastError(nullptr));
    }
    DeviceBuffer x0(count * 4), x1(count * 4), y0(count * 4), y1(count * 4);
    if (!a.ToDevice(x0.p, in[0][r]) || !b.ToDevice(x1.p, in[1][r])) return out->Fail(ccUnhandledCudaError, "copy in");
    std::atomic<bool> open{false};
    cudaLaunchHostFunc(a.stream, HoldStream, &open);
    ccResult_t rc = ccAllReduce(x0.p, y0.p, count, ccFloat32, ccAvg, comp, a.comm, a.s());
    if (rc == ccSuccess) rc = ccAllReduce(x1.p, y1.p, count, ccFloat32, ccAvg, comp, b.comm, b.s());
    // B's call has had time to run, if nothing held it back.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const bool waited = cudaStreamQuery(b.stream) == cudaErrorNotReady;
    open = true;
    if (rc != ccSuccess) out->Fail(rc, ccGetLastError(a.comm));
    if (!waited) out->Fail(ccInternalError, "the call on B's stream did not wait for the held call on A's");
    Settle(a, out);
    Settle(b, out);
    for (const auto& [k, p] : {std::make_pair(&a, y0.p), std::make_pair(&b, y1.p)}) {
      Bytes got;
      if (!k->FromDevice(&got, p, count * 4)) return out->Fail(ccUnhandledCudaError, "copy out");
      out->data.insert(out->data.end(), got.begin(), got.end());
    }
    ccCompressorDestroy(comp);
  });
  REQUIRE(FirstFailure(outs) == "");
  CHECK(SameOnAllRanks(outs) == "");
  // The host path, both calls with one compressor per rank: its second call's result is what B's must be.
  const size_t bytes = count * 4;
  const std::vector<Bytes> first = HostRing({in[0]}, ccFloat32, ccAvg, spec);
  const std::vector<Bytes> second = HostRing(in, ccFloat32, ccAvg, spec);
  CHECK(CloseTo(Bytes(outs[0].data.begin(), outs[0].data.begin() + bytes), first[0], ccFloat32, 1e-10) == "");
  CHECK(CloseTo(Bytes(outs[0].data.begin() + bytes, outs[0].data.end()), second[0], ccFloat32, 1e-10) == "");
}

TEST_CASE("[nccl] CUDA graph capture: captured calls replay with new inputs", "[gpu][nccl][graph]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  const int n = 4, replays = 3;
  const size_t count = 65536;
  // Each captured with an exact sum, and a twin compressor called eagerly after every replay on the same inputs. The
  // first replay is the captured call itself (call 1 of both compressors): the twin's bytes, for every kind. Later
  // replays: topk and powersgd have no randomness after their start, so they still give the twin's bytes; quant and
  // randk repeat the captured call's randomness (the twin draws fresh), so they are held to the same bytes on every
  // rank and (quant) its bound.
  struct Case {
    std::string spec;
    bool twin;
  };
  const Case cases[] = {{"quant:bits=4,mode=requant", false},
                        {"randk:density=0.25", false},
                        {"topk:density=0.25", true},
                        {"powersgd:rank=2,shapes=256x256", true}};
  for (const Case& k : cases) {
    INFO(k.spec);
    std::vector<std::vector<Bytes>> in;
    for (int i = 0; i < replays; ++i) in.push_back(Inputs(n, count, ccFloat32, FreshSeed()));
    ccUniqueId id;
    REQUIRE(ccGetUniqueId(&id) == ccSuccess);
    // Per replay, each rank returns the exact sum, the compressed average, and the twin's eager average; then the
    // status of a capture whose compressor never ran before it.
    std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
      Rank me(id, r, n);
      if (me.rc != ccSuccess) return out->Fail(me.rc, me.error);
      DeviceBuffer x(count * 4), sum(count * 4), avg(count * 4), twinOut(count * 4);
      ccCompressor_t comp = nullptr, twin = nullptr;
      ccCompressorCreateFromString(&comp, k.spec.c_str());
      ccCompressorCreateFromString(&twin, k.spec.c_str());
      // The calls once outside the capture, as a warm-up: the compressed one sizes its scratch (the twin makes the same
      // one), and both let NCCL connect the peers they use before the capture.
      if (!me.ToDevice(x.p, in[0][r])) return out->Fail(ccUnhandledCudaError, "copy in");
      ccResult_t rc = ccAllReduce(x.p, sum.p, count, ccFloat32, ccSum, nullptr, me.comm, me.s());
      if (rc == ccSuccess) rc = ccAllReduce(x.p, avg.p, count, ccFloat32, ccAvg, comp, me.comm, me.s());
      if (rc == ccSuccess) rc = ccAllReduce(x.p, twinOut.p, count, ccFloat32, ccAvg, twin, me.comm, me.s());
      if (rc != ccSuccess) return out->Fail(rc, ccGetLastError(me.comm));
      Settle(me, out);
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (cudaStreamBeginCapture(me.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        return out->Fail(ccUnhandledCudaError, "cudaStreamBeginCapture");
      }
      rc = ccAllReduce(x.p, sum.p, count, ccFloat32, ccSum, nullptr, me.comm, me.s());
      if (rc == ccSuccess) rc = ccAllReduce(x.p, avg.p, count, ccFloat32, ccAvg, comp, me.comm, me.s());
      cudaError_t e = cudaStreamEndCapture(me.stream, &graph);
      if (rc != ccSuccess) return out->Fail(rc, ccGetLastError(me.comm));
      if (e != cudaSuccess) return out->Fail(ccUnhandledCudaError, std::string("capture: ") + cudaGetErrorString(e));
      if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return out->Fail(ccUnhandledCudaError, "instantiate");
      for (int i = 0; i < replays; ++i) {
        if (!me.ToDevice(x.p, in[i][r])) return out->Fail(ccUnhandledCudaError, "copy in");
        if (cudaGraphLaunch(exec, me.stream) != cudaSuccess) return out->Fail(ccUnhandledCudaError, "launch");
        rc = ccAllReduce(x.p, twinOut.p, count, ccFloat32, ccAvg, twin, me.comm, me.s());
        if (rc != ccSuccess) return out->Fail(rc, ccGetLastError(me.comm));
        for (void* p : {sum.p, avg.p, twinOut.p}) {
          Bytes got;
          me.FromDevice(&got, p, count * 4);
          out->data.insert(out->data.end(), got.begin(), got.end());
        }
      }
      Settle(me, out);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      // A compressor whose first call is captured would have to allocate inside the capture: refused, nothing queued,
      // and the communicator still works.
      ccCompressor_t fresh = nullptr;
      ccCompressorCreateFromString(&fresh, k.spec.c_str());
      cudaStreamBeginCapture(me.stream, cudaStreamCaptureModeThreadLocal);
      const ccResult_t refused = ccAllReduce(x.p, avg.p, count, ccFloat32, ccAvg, fresh, me.comm, me.s());
      const std::string why = ccGetLastError(me.comm);
      graph = nullptr;
      cudaStreamEndCapture(me.stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      if (refused != ccInvalidUsage || !Contains(why, "before capturing")) {
        out->Fail(ccInternalError, "a capture that has to allocate returned " + std::to_string(refused) + ": " + why);
      }
      rc = ccAllReduce(x.p, sum.p, count, ccFloat32, ccSum, nullptr, me.comm, me.s());
      if (rc != ccSuccess) out->Fail(rc, "after the refused capture: " + std::string(ccGetLastError(me.comm)));
      Settle(me, out);
      ccCompressorDestroy(fresh);
      ccCompressorDestroy(twin);
      ccCompressorDestroy(comp);
    });
    REQUIRE(FirstFailure(outs) == "");
    const size_t b = count * 4;
    for (int i = 0; i < replays; ++i) {
      INFO("replay " << i);
      std::vector<double> ref, tol;
      Reference(in[i], ccFloat32, ccSum, &ref, &tol);
      const size_t at = static_cast<size_t>(i) * 3 * b;
      auto part = [&](int r, int which) {
        return Bytes(outs[r].data.begin() + at + which * b, outs[r].data.begin() + at + (which + 1) * b);
      };
      for (int r = 0; r < n; ++r) {
        CHECK(CheckAgainst(part(r, 0), ccFloat32, ref, tol) == "");
        CHECK(FirstDifference(part(r, 1), part(0, 1)) == "");
        if (k.twin || i == 0) CHECK(FirstDifference(part(r, 1), part(r, 2)) == "");
      }
      if (k.spec.rfind("quant", 0) == 0) {
        std::vector<double> mean(ref);
        for (double& m : mean) m /= n;
        CHECK(Vnmse(part(0, 1), ccFloat32, mean) < 0.1);
      }
    }
  }
}

TEST_CASE("[nccl] bad usage gets a clear error", "[gpu][nccl][errors]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  const int n = 2;
  const size_t count = 1000;
  ccUniqueId id;
  REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
    Rank k(id, r, n);
    if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
    DeviceBuffer buf(count * 4);
    cudaMemsetAsync(buf.p, 0, count * 4, k.stream);
    // A compressor is one bucket's: a call with another count is refused before anything is queued.
    ccCompressor_t comp = nullptr;
    ccCompressorCreateFromString(&comp, "quant:bits=4");
    ccResult_t rc = ccAllReduce(buf.p, buf.p, count, ccFloat32, ccSum, comp, k.comm, k.s());
    if (rc == ccSuccess) rc = ccAllReduce(buf.p, buf.p, count / 2, ccFloat32, ccSum, comp, k.comm, k.s());
    std::string why = ccGetLastError(k.comm);
    if (rc != ccInvalidUsage || !Contains(why, "bound to a bucket")) {
      out->Fail(ccInternalError, "a compressor on another bucket: " + std::to_string(rc) + ": " + why);
    }
    ccCompressorDestroy(comp);
    // Host buffers: carried by the local transport between threads; between processes this build has no host
    // transport unless UCX is built in.
    std::vector<float> host(count, 1.0f);
    rc = ccAllReduce(host.data(), host.data(), count, ccFloat32, ccSum, nullptr, k.comm, nullptr);
    why = ccGetLastError(k.comm);
    if (rc == ccSuccess) {
      if (host[0] != static_cast<float>(n)) out->Fail(ccInternalError, "host all-reduce on an nccl communicator");
    } else if (rc != ccInvalidUsage || !Contains(why, "host buffers")) {
      out->Fail(ccInternalError, "host buffers: " + std::to_string(rc) + ": " + why);
    }
    // Host buffers on rank 0 and device buffers on rank 1 would travel on transports that never meet (the local one,
    // NCCL): where the call check runs, both ranks are refused instead of waiting for each other until the timeout.
    if (CallCheckRuns()) {
      rc = r == 0 ? ccAllReduce(host.data(), host.data(), count, ccFloat32, ccSum, nullptr, k.comm, nullptr)
                  : ccAllReduce(buf.p, buf.p, count, ccFloat32, ccSum, nullptr, k.comm, k.s());
      why = ccGetLastError(k.comm);
      if (rc != ccInvalidUsage || !Contains(why, "device buffers on the NCCL stream on rank 1")) {
        out->Fail(ccInternalError, "host buffers meeting device buffers: " + std::to_string(rc) + ": " + why);
      }
    }
    // The communicator still works after refused calls.
    rc = ccAllReduce(buf.p, buf.p, count, ccFloat32, ccSum, nullptr, k.comm, k.s());
    if (rc != ccSuccess) out->Fail(rc, ccGetLastError(k.comm));
    Settle(k, out);
  });
  CHECK(FirstFailure(outs) == "");
}

#ifdef CCOLL_FAKE_NCCL
TEST_CASE("[nccl] a scratch allocation that fails on one rank: no rank queues the call, the next call runs",
          "[gpu][nccl][errors]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  // Rank 0's GPU is out of memory when the compressed call sizes its scratch (the fake runtime fails the allocation on
  // its thread). With the call check, rank 0 refuses and the others learn it there: nothing is queued anywhere, and
  // the same call made again runs on every rank. Without the check rank 0 fails its communicator (the others may have
  // queued the call), and the others' calls end with its abort or the timeout.
  const int n = 3, timeoutMs = cctest::ScaledMs(3000);
  const size_t count = 50001;
  const bool checked = CallCheckRuns();
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, FreshSeed());
  ccUniqueId id;
  REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
    Rank k(id, r, n, timeoutMs);
    if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
    DeviceBuffer buf(count * 4);
    // A first compressed call prepares the device (its allocations are the process's, made once); the compressor of
    // the call under test is fresh, so its first allocation is its scratch.
    ccCompressor_t warm = nullptr, comp = nullptr;
    ccCompressorCreateFromString(&warm, "quant:bits=4");
    ccCompressorCreateFromString(&comp, "quant:bits=4");
    cudaMemsetAsync(buf.p, 0, count * 4, k.stream);
    ccResult_t rc = ccAllReduce(buf.p, buf.p, count, ccFloat32, ccAvg, warm, k.comm, k.s());
    Settle(k, out);
    ccCompressorDestroy(warm);
    if (rc != ccSuccess) return out->Fail(rc, "the first call: " + std::string(ccGetLastError(k.comm)));
    if (!k.ToDevice(buf.p, in[r])) return out->Fail(ccUnhandledCudaError, "copy in");
    if (r == 0) cctest::FakeFailAllocations(1);
    rc = ccAllReduce(buf.p, buf.p, count, ccFloat32, ccAvg, comp, k.comm, k.s());
    cctest::FakeFailAllocations(0);
    std::string why = ccGetLastError(k.comm);
    if (r == 0 && (rc != ccUnhandledCudaError || !Contains(why, "cudaMallocFromPoolAsync"))) {
      out->Fail(ccInternalError, "the failed allocation: " + std::to_string(rc) + ": " + why);
    }
    if (!checked) {
      if (r == 0) {  // its peers wait for it in NCCL: its communicator is failed too, not left to take the next call
        ccResult_t async = ccSuccess;
        ccCommGetAsyncError(k.comm, &async);
        if (async != ccUnhandledCudaError) out->Fail(ccInternalError, "rank 0's communicator was not failed");
        ccCompressorDestroy(comp);
        return;
      }
      // Queued, and the wait for rank 0 ends with its communicator's abort or the timeout; or, where rank 0's abort
      // came first, refused at once.
      if (rc != ccSuccess && rc != ccRemoteError) {
        return out->Fail(rc, "without the call check the call is queued, or fails for rank 0's abort: " + why);
      }
      const auto start = std::chrono::steady_clock::now();
      cudaStreamSynchronize(k.stream);
      cudaGetLastError();
      ccResult_t async = ccSuccess;
      while (async == ccSuccess && cctest::SecondsSince(start) < 4.0 * timeoutMs / 1000) {
        ccCommGetAsyncError(k.comm, &async);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (async == ccSuccess) out->Fail(ccInternalError, "no error within the timeout");
      ccCompressorDestroy(comp);
      return;
    }
    if (r != 0 && (rc != ccInvalidUsage || !Contains(why, "rank 0 refused"))) {
      out->Fail(ccInternalError, "a peer of the failed allocation: " + std::to_string(rc) + ": " + why);
    }
    Bytes untouched;
    k.FromDevice(&untouched, buf.p, count * 4);
    if (FirstDifference(untouched, in[r]) != "") out->Fail(ccInternalError, "the refused call wrote its buffer");
    rc = ccAllReduce(buf.p, buf.p, count, ccFloat32, ccAvg, comp, k.comm, k.s());
    if (rc != ccSuccess) out->Fail(rc, "the call made again: " + std::string(ccGetLastError(k.comm)));
    Settle(k, out);
    k.FromDevice(&out->data, buf.p, count * 4);
    ccCompressorDestroy(comp);
  });
  REQUIRE(FirstFailure(outs) == "");
  if (!checked) return;  // checked above: each peer's error within the timeout
  CHECK(SameOnAllRanks(outs) == "");
  std::vector<double> mean, tol;
  Reference(in, ccFloat32, ccAvg, &mean, &tol);
  CHECK(Vnmse(outs[0].data, ccFloat32, mean) < 0.1);
}
#endif

#ifdef CCOLL_FAKE_NCCL
TEST_CASE("[nccl] no elements and no host transport: every collective returns at once, as NCCL's", "[gpu][nccl]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  // Processes in a build without UCX have no host transport between them; thread ranks stand in for them here, with
  // their local transport taken out of use (comm->hostTransports). A call with count 0 names no buffer, so it cannot
  // tell device from host memory: it is a no-op, not a refusal of host buffers.
  const int n = 2;
  ccUniqueId id;
  REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
    Rank k(id, r, n);
    if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
    k.comm->hostTransports = false;
    ccCompressor_t comp = nullptr;
    ccCompressorCreateFromString(&comp, "quant:bits=4");
    const ccResult_t rcs[] = {ccAllReduce(nullptr, nullptr, 0, ccFloat32, ccSum, nullptr, k.comm, k.s()),
                              ccAllReduce(nullptr, nullptr, 0, ccFloat32, ccAvg, comp, k.comm, k.s()),
                              ccReduceScatter(nullptr, nullptr, 0, ccFloat32, ccSum, k.comm, k.s()),
                              ccAllGather(nullptr, nullptr, 0, ccFloat32, k.comm, k.s()),
                              ccBroadcast(nullptr, nullptr, 0, ccFloat32, 0, k.comm, k.s()),
                              ccReduce(nullptr, nullptr, 0, ccFloat32, ccMax, 0, k.comm, k.s())};
    for (ccResult_t rc : rcs) {
      if (rc != ccSuccess) out->Fail(rc, ccGetLastError(k.comm));
    }
    Settle(k, out);
    ccCompressorDestroy(comp);
  });
  CHECK(FirstFailure(outs) == "");
}
#endif

#ifdef CCOLL_FAKE_NCCL
// A device lost during calls, as after a kernel's fault (test_gpu_collectives has the same for the host transports):
// over NCCL too, every rank's call ends in an error well within the timeout, its stream reports the loss, later calls
// fail at once, and the communicators are destroyed. The fake runtime loses its device (all thread ranks share it)
// while every rank's stream is held by a host function queued before its call, so that no call can have run.
TEST_CASE("[nccl] a device lost during calls: every rank fails well within the timeout, nothing hangs",
          "[gpu][nccl][fault][lost]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  // Static: the host functions read it until it is set, which the case does on every way out.
  static std::atomic<bool> release;
  struct GiveBackTheDevice {
    ~GiveBackTheDevice() {
      release = true;
      cctest::FakeLoseDevice(false);
    }
  } giveBack;
  const int n = 3, timeoutMs = cctest::ScaledMs(3000);
  const size_t count = 1 << 14;
  for (const char* spec : {static_cast<const char*>(nullptr), "quant:bits=4,mode=requant"}) {
    INFO((spec ? spec : "exact"));
    ccUniqueId id;
    REQUIRE(ccGetUniqueId(&id) == ccSuccess);
    std::atomic<int> queued{0};
    release = false;
    std::thread loser([&] {
      cctest::WaitUntil([&] { return queued.load() == n; }, 20000);
      cctest::FakeLoseDevice(true);
      release = true;
    });
    const auto start = std::chrono::steady_clock::now();
    std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
      struct Count {  // every rank counts as queued on every way out, so that the others never wait for it
        std::atomic<int>& queued;
        bool done = false;
        ~Count() {
          if (!done) ++queued;
        }
      } count_{queued};
      Rank k(id, r, n, timeoutMs);
      if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
      ccCompressor_t c = nullptr;
      if (spec != nullptr && ccCompressorCreateFromString(&c, spec) != ccSuccess) {
        return out->Fail(ccInternalError, ccGetLastError(nullptr));
      }
      std::unique_ptr<ccCompressor, decltype(&ccCompressorDestroy)> owned(c, ccCompressorDestroy);
      DeviceBuffer buf(count * 4);
      if (buf.p == nullptr) return out->Fail(ccInternalError, "cudaMalloc failed");
      cudaMemsetAsync(buf.p, 0, count * 4, k.stream);
      // A first call that runs; then every rank's second call is queued while kernels are held.
      if (ccAllReduce(buf.p, buf.p, count, ccFloat32, ccSum, c, k.comm, k.s()) != ccSuccess ||
          cudaStreamSynchronize(k.stream) != cudaSuccess) {
        return out->Fail(ccInternalError, std::string("the first call failed: ") + ccGetLastError(k.comm));
      }
      if (cudaLaunchHostFunc(k.stream, cctest::HoldUntil, &release) != cudaSuccess) {
        return out->Fail(ccInternalError, "cudaLaunchHostFunc failed");
      }
      const auto t = std::chrono::steady_clock::now();
      ccResult_t code = ccAllReduce(buf.p, buf.p, count, ccFloat32, ccSum, c, k.comm, k.s());
      count_.done = true;
      ++queued;
      const cudaError_t synced = cudaStreamSynchronize(k.stream);
      ccResult_t async = ccSuccess;
      cctest::WaitUntil([&] { return ccCommGetAsyncError(k.comm, &async) != ccSuccess || async != ccSuccess; },
                        2 * 3000);
      if (code == ccSuccess) code = async;
      const double took = cctest::SecondsSince(t);
      const std::string why = ccGetLastError(k.comm);
      char line[96];
      std::snprintf(line, sizeof(line), "%d %.2f %d ", static_cast<int>(code), took, static_cast<int>(synced));
      out->data.assign(line, line + std::strlen(line));
      out->data.insert(out->data.end(), why.begin(), why.end());
      if (ccAllReduce(buf.p, buf.p, count, ccFloat32, ccSum, c, k.comm, k.s()) == ccSuccess) {
        out->Fail(ccInternalError, "a call after the loss succeeded");
      }
    });
    loser.join();
    const double seconds = cctest::SecondsSince(start);
    cctest::FakeLoseDevice(false);
    for (int r = 0; r < n; ++r) {
      const std::string report(outs[r].data.begin(), outs[r].data.end());
      INFO("rank " << r << ": " << report << outs[r].error);
      REQUIRE(outs[r].rc == ccSuccess);
      int code = 0, synced = 0;
      double took = 0;
      REQUIRE(std::sscanf(report.c_str(), "%d %lf %d", &code, &took, &synced) == 3);
      CHECK((code == ccUnhandledCudaError || code == ccRemoteError));  // CUDA's, or a peer's that met it first
      CHECK(synced == cudaErrorLaunchFailure);
      CHECK(took < 0.5 * timeoutMs / 1000);  // at the next CUDA call, not after a timeout
      CHECK(Contains(report, "launch failure"));
    }
    CHECK(seconds < 1.0 * timeoutMs / 1000);  // the destroys included
  }
}
#endif

TEST_CASE("[nccl] a dead peer or one that never calls: an error within the timeout, streams released",
          "[gpu][nccl][fault]") {
  SKIP_WITHOUT_NCCL_DEVICE();
  const int n = 3, timeoutMs = cctest::ScaledMs(3000);
  const size_t count = 1 << 16;
  for (bool dies : {true, false}) {
    INFO((dies ? "the last rank dies after init" : "the last rank never calls"));
    ccUniqueId id;
    REQUIRE(ccGetUniqueId(&id) == ccSuccess);
    std::atomic<int> settled{0};
    // Each live rank reports "<code> <seconds> <sentence>": how its call ended and when. With host transports
    // (thread ranks) the call check finds the missing rank and the call itself fails; over NCCL alone the call is
    // queued and the error comes asynchronously. Either way within the timeout, and the stream is released.
    std::vector<RankOut> outs = RunRanks(n, [&](int r, RankOut* out) {
      Rank k(id, r, n, timeoutMs);
      if (k.rc != ccSuccess) return out->Fail(k.rc, k.error);
      DeviceBuffer buf(count * 4);
      cudaMemsetAsync(buf.p, 0, count * 4, k.stream);
      cudaStreamSynchronize(k.stream);
      if (r == n - 1) {
        if (dies) {
          if (kProcesses) _exit(0);  // gone without a word, as a crashed process
          ccCommAbort(k.comm);
          k.comm = nullptr;
          return;
        }
        // Alive but silent until the others are done (threads), or for a while (processes).
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(4 * timeoutMs);
        while ((kProcesses || settled.load() < n - 1) && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        ccCommAbort(k.comm);
        k.comm = nullptr;
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      ccResult_t code = ccAllReduce(buf.p, buf.p, count, ccFloat32, ccSum, nullptr, k.comm, k.s());
      if (code == ccSuccess) {
        cudaStreamSynchronize(k.stream);  // must return: the watchdog aborts what waits for the dead peer
        cudaGetLastError();
        while (code == ccSuccess && cctest::SecondsSince(start) < 4.0 * timeoutMs / 1000) {
          ccCommGetAsyncError(k.comm, &code);
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      const double took = cctest::SecondsSince(start);
      settled.fetch_add(1);
      const std::string why = ccGetLastError(k.comm);
      char line[64];
      std::snprintf(line, sizeof(line), "%d %.2f ", static_cast<int>(code), took);
      out->data.assign(line, line + std::strlen(line));
      out->data.insert(out->data.end(), why.begin(), why.end());
      // Later calls report the failure at once.
      if (ccAllReduce(buf.p, buf.p, count, ccFloat32, ccSum, nullptr, k.comm, k.s()) == ccSuccess) {
        out->Fail(ccInternalError, "a call after the failure succeeded");
      }
    });
    // A silent peer: some rank times out (ccTimeout) and aborts, and the others may learn of it from that rank first
    // (ccRemoteError).
    int timedOut = 0;
    for (int r = 0; r < n - 1; ++r) {
      const std::string report(outs[r].data.begin(), outs[r].data.end());
      INFO("rank " << r << ": " << report);
      REQUIRE(outs[r].rc == ccSuccess);
      int code = 0;
      double took = 0;
      REQUIRE(std::sscanf(report.c_str(), "%d %lf", &code, &took) == 2);
      // A dead process may surface through NCCL as a system, internal or CUDA error too.
      const bool asDeath = code == ccSystemError || code == ccInternalError || code == ccUnhandledCudaError;
      CHECK((code == ccRemoteError || code == ccTimeout || (dies && asDeath)));
      timedOut += code == ccTimeout;
      CHECK(took < 3.0 * timeoutMs / 1000);
    }
    if (!dies) CHECK(timedOut > 0);
  }
}
