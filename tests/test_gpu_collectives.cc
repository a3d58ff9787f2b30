// [gpu] Collectives on device buffers (core/device_proxy.h): thread ranks share one GPU, each with its own stream.
// Every result is compared byte for byte with the same call on host buffers (itself checked against fp64 references
// in test_collectives and test_compression): exact all-reduce over datatypes, ops, counts, 1/2/4 ranks, in place;
// reduce-scatter, all-gather, broadcast; every codec over successive calls (error feedback, warm start). Stream
// semantics: the call returns before the stream has run it, work queued before and after is ordered, a host call
// waits for the device calls before it. Errors: mixed host/device buffers, a device the communicator is not bound
// to, graph capture; a peer that aborts releases the waiting stream with an async error instead of hanging it.
// Without a CUDA device the binary exits 77 and ctest reports the cases as skipped.
#include <cuda_runtime_api.h>

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
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ccoll.h"
#include "drift.h"
#include "gpu_skip.h"
#include "inputs.h"
#include "rank_harness.h"
#include "stream_hold.h"
#ifdef CCOLL_FAKE_CUDA
#include "collectives/compressed.h"
#include "collectives/device_buffers.h"
#include "collectives/device_compressed.h"
#include "core/device_memory.h"
#include "fake_cuda/fake_launch.h"
#endif

namespace {

using cctest::Compressors;
using cctest::Contains;
using cctest::Drift;
using cctest::Group;
using cctest::RankResult;
using cctest::Record;
using cctest::RunRanks;
using cctest::Bytes;
using cctest::FirstDifference;
using cctest::Inputs;
using cctest::SizeOf;
using cctest::Values;

// Whether the first device call of each shape on device 0 returns only once it has run (core/device_proxy.h): where
// some of ccoll's scratch does not come from memory pools. (On a GPU, from the device's attributes and
// CC_MEMORY_POOLS; pools that fail their first allocation are not seen there.)
bool FirstCallsWaitOnHost() {
#ifdef CCOLL_FAKE_CUDA
  cudaMemPool_t device = nullptr, host = nullptr;
  REQUIRE(ccoll::DevicePool(0, &device) == ccSuccess);
  REQUIRE(ccoll::PinnedHostPool(0, &host) == ccSuccess);
  return device == nullptr || host == nullptr;
#else
  int pools = 0, hostPools = 0;
  REQUIRE(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&hostPools, cudaDevAttrHostMemoryPoolsSupported, 0) == cudaSuccess);
  const char* wanted = std::getenv("CC_MEMORY_POOLS");
  return pools == 0 || hostPools == 0 || (wanted != nullptr && std::strtol(wanted, nullptr, 10) == 0);
#endif
}

// nranks thread ranks bound to device 0 (ccCommInitAll with a device list).
Group DeviceGroup(int nranks, int device = 0) {
  Group g;
  g.comms.assign(static_cast<size_t>(nranks), nullptr);
  std::vector<int> devs(static_cast<size_t>(nranks), device);
  g.status = ccCommInitAll(g.comms.data(), nranks, devs.data());
  if (g.status != ccSuccess) {
    g.error = ccGetLastError(nullptr);
    g.comms.clear();
  }
  return g;
}

// One non-blocking stream per rank (the legacy default stream would serialize the ranks' waits).
struct Streams {
  std::vector<cudaStream_t> s;
  explicit Streams(int n) : s(static_cast<size_t>(n), nullptr) {
    for (auto& st : s) REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  }
  ~Streams() {
    for (auto st : s) cudaStreamDestroy(st);
  }
  ccStream_t operator[](int r) const { return reinterpret_cast<ccStream_t>(s[static_cast<size_t>(r)]); }
};

// Issues rank r's collective with the given buffers (host: stream NULL).
using Issue = std::function<ccResult_t(int r, const void* send, void* recv, ccStream_t stream)>;

struct Outcome {
  std::vector<Bytes> out;
  std::vector<RankResult> rc;
  std::string Failure() const { return cctest::FirstFailure(rc); }
};

Outcome OnHost(const Group& g, const std::vector<Bytes>& in, size_t outBytes, const Issue& issue) {
  const int n = g.size();
  Outcome o;
  o.out.assign(static_cast<size_t>(n), Bytes(outBytes, '\x5a'));
  o.rc.resize(static_cast<size_t>(n));
  RunRanks(n, [&](int r) { o.rc[r] = Record(issue(r, in[r].data(), o.out[r].data(), nullptr), g[r]); });
  return o;
}

// Pinned host memory, freed with the object. The tests copy to and from device buffers through it: a copy from or
// to pageable memory can block the calling thread until its stream gets there, and the stream may be waiting for a
// collective that needs another rank's thread.
struct Pinned {
  char* p = nullptr;
  explicit Pinned(size_t bytes) {
    void* raw = nullptr;
    REQUIRE(cudaHostAlloc(&raw, std::max<size_t>(bytes, 1), cudaHostAllocDefault) == cudaSuccess);
    p = static_cast<char*>(raw);
  }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  ~Pinned() { cudaFreeHost(p); }
};

// Each rank's device buffers for OnDevice (send, and recv unless in place; rank r's start r * shift bytes into their
// allocations) and the pinned host memory its copies go through, for inputs of up to inBytes[r] and outputs of up to
// outBytes. Allocated before any rank calls and freed after every rank is done: cudaFree (and maybe cudaMalloc) can
// wait for the whole device, including the other ranks' streams that wait for their collectives.
struct RankBuffers {
  bool inPlace;
  std::vector<size_t> inBytes;
  size_t outBytes;
  std::vector<void*> send, recv, sendBase, recvBase;
  std::vector<std::unique_ptr<Pinned>> pinIn, pinOut, pinSent;
  RankBuffers(const std::vector<size_t>& inBytes_, size_t outBytes_, bool inPlace_, size_t shift = 0)
      : inPlace(inPlace_),
        inBytes(inBytes_),
        outBytes(outBytes_),
        send(inBytes_.size()),
        recv(inBytes_.size()),
        sendBase(inBytes_.size()),
        recvBase(inBytes_.size()) {
    for (size_t r = 0; r < inBytes.size(); ++r) {
      const size_t at = r * shift;
      REQUIRE(cudaMalloc(&sendBase[r], at + std::max<size_t>(inBytes[r], inPlace ? outBytes : 1)) == cudaSuccess);
      send[r] = static_cast<char*>(sendBase[r]) + at;
      if (inPlace) {
        recv[r] = send[r];
      } else {
        REQUIRE(cudaMalloc(&recvBase[r], at + std::max<size_t>(outBytes, 1)) == cudaSuccess);
        recv[r] = static_cast<char*>(recvBase[r]) + at;
      }
      pinIn.push_back(std::make_unique<Pinned>(inBytes[r]));
      pinOut.push_back(std::make_unique<Pinned>(outBytes));
      pinSent.push_back(std::make_unique<Pinned>(inBytes[r]));
    }
  }
  RankBuffers(const RankBuffers&) = delete;
  RankBuffers& operator=(const RankBuffers&) = delete;
  ~RankBuffers() {
    for (size_t r = 0; r < send.size(); ++r) {
      cudaFree(sendBase[r]);
      if (!inPlace) cudaFree(recvBase[r]);
    }
  }
};

// The same on device buffers: the input copied in and the output poisoned on the rank's stream before the call, the
// result copied back on it after; one synchronize at the end. inPlace: recv is the send buffer. The buffers are
// allocated for this call, each rank's the size of its input (RankBuffers), or are `buffers` (at least as large, and
// in place or not as the call).
// Ranks below hostRanks call with their host buffers instead, as OnHost does, in the same group call. shift: rank r's
// buffers start r * shift bytes into their allocations (ranks whose buffers are aligned differently).
Outcome OnDevice(const Group& g, const Streams& st, const std::vector<Bytes>& in, size_t outBytes, const Issue& issue,
                 bool inPlace = false, int hostRanks = 0, size_t shift = 0, RankBuffers* buffers = nullptr) {
  const int n = g.size();
  std::unique_ptr<RankBuffers> own;
  if (buffers == nullptr) {
    std::vector<size_t> inBytes;
    for (const Bytes& b : in) inBytes.push_back(b.size());
    own = std::make_unique<RankBuffers>(inBytes, outBytes, inPlace, shift);
    buffers = own.get();
  }
  REQUIRE(buffers->inPlace == inPlace);
  REQUIRE(buffers->outBytes >= outBytes);
  for (int r = 0; r < n; ++r) REQUIRE(buffers->inBytes[r] >= in[r].size());
  const std::vector<void*>&send = buffers->send, &recv = buffers->recv;
  Outcome o;
  o.out.assign(static_cast<size_t>(n), Bytes(outBytes, '\x5a'));
  o.rc.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (!in[r].empty()) std::memcpy(buffers->pinIn[r]->p, in[r].data(), in[r].size());
  }
  RunRanks(n, [&](int r) {
    if (r < hostRanks) {  // a blocking call on this thread
      o.rc[r] = Record(issue(r, in[r].data(), o.out[r].data(), nullptr), g[r]);
      return;
    }
    cudaSetDevice(0);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(st[r]);
    if (!inPlace) cudaMemsetAsync(recv[r], 0x5a, outBytes, s);
    cudaMemcpyAsync(send[r], buffers->pinIn[r]->p, in[r].size(), cudaMemcpyHostToDevice, s);
    o.rc[r] = Record(issue(r, send[r], recv[r], st[r]), g[r]);
    cudaMemcpyAsync(buffers->pinOut[r]->p, recv[r], outBytes, cudaMemcpyDeviceToHost, s);
    if (!inPlace) cudaMemcpyAsync(buffers->pinSent[r]->p, send[r], in[r].size(), cudaMemcpyDeviceToHost, s);
    cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess && o.rc[r].rc == ccSuccess) o.rc[r] = RankResult{ccUnhandledCudaError, cudaGetErrorString(e)};
    ccResult_t async = ccSuccess;
    ccCommGetAsyncError(g[r], &async);
    if (async != ccSuccess && o.rc[r].rc == ccSuccess) o.rc[r] = RankResult{async, ccGetLastError(g[r])};
    // A separate sendbuff is only read (ccoll.h), whatever the call's path.
    if (!inPlace && !in[r].empty() && std::memcmp(buffers->pinSent[r]->p, in[r].data(), in[r].size()) != 0 &&
        o.rc[r].rc == ccSuccess) {
      o.rc[r] = RankResult{ccInternalError, "the call wrote into its sendbuff (a device buffer of its own)"};
    }
  });
  for (int r = hostRanks; r < n; ++r) {
    if (outBytes > 0) std::memcpy(o.out[r].data(), buffers->pinOut[r]->p, outBytes);
  }
  return o;
}

// Where the device path may differ from the host path: PowerSGD's products run on cuBLAS on a GPU, so there it is held
// to the same bytes on every rank and to the host result within fp32 product rounding (vNMSE <= 1e-8 between the two).
// Staged calls use the CPU BLAS, and so does the fake cuBLAS: its column-major product is the row-major one the host
// asks for, the same computation, so a wrong argument mapping in compress/lowrank_cuda.cc shows here as other bytes.
bool SameBytesAsHost(const std::string& spec) {
#ifdef CCOLL_FAKE_CUDA
  return true;
#else
  const char* k = std::getenv("CC_DEVICE_KERNELS");
  return spec.rfind("powersgd", 0) != 0 || (k != nullptr && std::string(k) == "0");
#endif
}

// The communicator's last error, read on a fresh thread (the calling thread's own last error would come first).
std::string CommLastError(ccComm_t comm) {
  std::string e;
  std::thread([&] { e = ccGetLastError(comm); }).join();
  return e;
}

// A host PowerSGD call in a build with cuBLAS but no CPU BLAS (the GPU machine) is refused: there is no host result.
bool NoCpuBlas(const Outcome& host) {
  return !host.rc.empty() && host.rc[0].rc == ccInvalidUsage && Contains(host.rc[0].error, "needs a CPU BLAS");
}

// "" when the device results agree with the host results: byte for byte (exact), or (not exact) identical on every
// rank and close to the host's. Non-finite values must sit at the same places; their bit patterns may differ between
// a GPU and a CPU, so only finite values are compared byte for byte then.
std::string Agrees(const std::vector<Bytes>& dev, const std::vector<Bytes>& host, bool exact, bool nonFinite = false) {
  for (size_t r = 0; r < dev.size(); ++r) {
    const std::string where = "rank " + std::to_string(r) + ": ";
    if (dev[r].size() != host[r].size()) return where + "sizes differ";
    if (!exact && dev[r] != dev[0]) return where + "device results differ from rank 0's";
    const size_t n = dev[r].size() / 4;
    std::vector<float> d(n), h(n);
    std::memcpy(d.data(), dev[r].data(), n * 4);
    std::memcpy(h.data(), host[r].data(), n * 4);
    if (exact && !nonFinite) {
      const std::string diff = FirstDifference(dev[r], host[r]);
      if (!diff.empty()) return where + diff;
      continue;
    }
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (std::isfinite(d[i]) != std::isfinite(h[i])) return where + "finiteness differs at " + std::to_string(i);
      if (!std::isfinite(d[i])) continue;
      if (exact && std::memcmp(&d[i], &h[i], 4) != 0) return where + "first difference at element " + std::to_string(i);
      err += (static_cast<double>(d[i]) - h[i]) * (static_cast<double>(d[i]) - h[i]);
      ref += static_cast<double>(h[i]) * h[i];
    }
    if (!exact && err > 1e-8 * ref) return where + "vNMSE against the host result " + std::to_string(err / ref);
  }
  return "";
}

// Where the test can count them (the fake runtime, linked statically), so far: the codec and reduction kernels
// launched, and the messages the local transport moved with a device copy. -1 on a real device.
#ifdef CCOLL_FAKE_CUDA
int64_t CodecLaunches() { return static_cast<int64_t>(cctest::FakeCodecKernelLaunches()); }
int64_t DeviceCopies() { return static_cast<int64_t>(ccoll::DeviceMessagesCopied()); }
#else
int64_t CodecLaunches() { return -1; }
int64_t DeviceCopies() { return -1; }
#endif

// Exact calls on device buffers stay on the device (thread ranks: the local transport carries device memory) unless
// CC_DEVICE_KERNELS=0, which stages them through host memory (ctest runs the [exact] cases both ways).
bool ExactOnDevice() {
  const char* k = std::getenv("CC_DEVICE_KERNELS");
  return k == nullptr || std::string(k) != "0";
}

// Device codecs run unless CC_DEVICE_KERNELS=0 (ctest runs this binary both ways); PowerSGD's need cuBLAS.
bool DeviceCodecsOn(const std::string& spec) {
  const char* k = std::getenv("CC_DEVICE_KERNELS");
  if (k != nullptr && std::string(k) == "0") return false;
#ifndef CCOLL_HAVE_CUBLAS
  if (spec.rfind("powersgd", 0) == 0) return false;
#endif
  return true;
}

// Checks, where the fake runtime counts them, that a device call with peers moved its messages device to device
// (and, when it reduces, launched reduction kernels) exactly when exact calls stay on the device.
// Exact all-reduces of at most CC_CHECK_INLINE_BYTES (default 16384) ride in the call check on a power-of-two number
// of ranks with CC_ALGO=auto (collectives/call_check.h).
bool RidesInCheck(int nranks, size_t bytes) {
  const char* algo = std::getenv("CC_ALGO");
  if (algo != nullptr && *algo != '\0' && std::string(algo) != "auto") return false;
  const char* v = std::getenv("CC_CHECK_INLINE_BYTES");
  const size_t room = v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : 16384;
  return cctest::CallCheckOn() && nranks > 1 && (nranks & (nranks - 1)) == 0 && bytes <= room;
}

// staged: an exact all-reduce small enough to ride in the call check, which runs from host memory
// (collectives/call_check.h), so its device call is staged whatever CC_DEVICE_KERNELS says.
void CheckStayedOnDevice(int64_t copiesBefore, int64_t launchesBefore, int nranks, bool reduces, bool staged = false) {
  if (copiesBefore < 0 || nranks == 1) return;
  if (ExactOnDevice() && !staged) {
    CHECK(DeviceCopies() > copiesBefore);
    if (reduces) CHECK(CodecLaunches() > launchesBefore);
  } else {
    CHECK(DeviceCopies() == copiesBefore);
    CHECK(CodecLaunches() == launchesBefore);
  }
}

}  // namespace

TEST_CASE("[gpu] exact all-reduce on device buffers equals the host call byte for byte", "[gpu][device][exact]") {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    ccDataType_t dtype;
    ccRedOp_t op;
  };
  const Case cases[] = {{ccFloat32, ccSum}, {ccFloat32, ccAvg}, {ccFloat32, ccMax}, {ccFloat32, ccProd},
                        {ccFloat64, ccSum}, {ccFloat64, ccMin}, {ccInt32, ccSum},   {ccInt32, ccMin},
                        {ccInt64, ccProd},  {ccBfloat16, ccSum}, {ccBfloat16, ccAvg}, {ccFloat16, ccSum},
                        {ccFloat16, ccMax}, {ccFloat16, ccAvg}, {ccInt8, ccSum},     {ccUint8, ccProd},
                        {ccUint32, ccAvg},
                        {ccUint64, ccMax}};
  for (int n : {1, 2, 4}) {
    Group g = DeviceGroup(n);
    REQUIRE(g.status == ccSuccess);
    for (int r = 0; r < n; ++r) {
      int device = -1;
      CHECK(ccCommCuDevice(g[r], &device) == ccSuccess);
      CHECK(device == 0);
    }
    Streams st(n);
    for (const Case& k : cases) {
      // 1 and 1000 elements ride in the call check (staged, on 2 and 4 ranks), about 40 KB take the tree (on 4 ranks;
      // 2 ranks always run the ring), the last the ring.
      const size_t tree = 40000 / SizeOf(k.dtype) + 1;
      for (size_t count : {size_t{1}, size_t{1000}, tree, size_t{3 * 65537}}) {
        for (bool inPlace : {false, true}) {
          INFO(n << " ranks, dtype " << k.dtype << ", op " << k.op << ", count " << count
                 << (inPlace ? ", in place" : ""));
          const std::vector<Bytes> in = Inputs(n, count, k.dtype, count * 31 + n);
          Issue issue = [&](int r, const void* s, void* d, ccStream_t stream) {
            return ccAllReduce(s, d, count, k.dtype, k.op, nullptr, g[r], stream);
          };
          const size_t bytes = count * SizeOf(k.dtype);
          Outcome host = OnHost(g, in, bytes, issue);
          REQUIRE(host.Failure() == "");
          const int64_t copies = DeviceCopies(), launches = CodecLaunches();
          Outcome dev = OnDevice(g, st, in, bytes, issue, inPlace);
          REQUIRE(dev.Failure() == "");
          for (int r = 0; r < n; ++r) CHECK(FirstDifference(dev.out[r], host.out[r]) == "");
          CheckStayedOnDevice(copies, launches, n, true, RidesInCheck(n, bytes));
        }
      }
    }
  }
}

TEST_CASE("[gpu] communicators split from device-bound ones take device buffers: exact and compressed calls equal "
          "the host calls", "[gpu][device][split]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 4;
  Group parent = DeviceGroup(n);
  REQUIRE(parent.status == ccSuccess);
  Group pair[2];  // parent ranks 0 and 2, then 1 and 3
  for (auto& p : pair) p.comms.assign(2, nullptr);
  std::vector<RankResult> rc(n);
  RunRanks(n, [&](int r) { rc[r] = Record(ccCommSplit(parent[r], r % 2, r, &pair[r % 2].comms[r / 2], nullptr),
                                          parent[r]); });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << rc[r].error);
    REQUIRE(rc[r].rc == ccSuccess);
  }
  const size_t count = 3 * 65537;
  for (const Group& g : pair) {
    Streams st(2);
    const std::vector<Bytes> in = Inputs(2, count, ccFloat32, 17);
    for (const char* spec : {"", "quant:bits=4,mode=requant"}) {
      INFO("spec \"" << spec << "\"");
      Compressors hostComps(*spec ? spec : "cast16", 2), devComps(*spec ? spec : "cast16", 2);
      Issue onHost = [&](int r, const void* s, void* d, ccStream_t stream) {
        return ccAllReduce(s, d, count, ccFloat32, ccAvg, *spec ? hostComps[r] : nullptr, g[r], stream);
      };
      Issue onDev = [&](int r, const void* s, void* d, ccStream_t stream) {
        return ccAllReduce(s, d, count, ccFloat32, ccAvg, *spec ? devComps[r] : nullptr, g[r], stream);
      };
      Outcome host = OnHost(g, in, count * sizeof(float), onHost);
      REQUIRE(host.Failure() == "");
      Outcome dev = OnDevice(g, st, in, count * sizeof(float), onDev);
      REQUIRE(dev.Failure() == "");
      for (int r = 0; r < 2; ++r) CHECK(FirstDifference(dev.out[r], host.out[r]) == "");
    }
  }
}

TEST_CASE("[gpu] reduce-scatter, all-gather, broadcast and reduce on device buffers equal the host calls",
          "[gpu][device][exact]") {
  SKIP_WITHOUT_DEVICE();
  for (int n : {2, 4}) {
    Group g = DeviceGroup(n);
    REQUIRE(g.status == ccSuccess);
    Streams st(n);
    const size_t count = 12345;
    const std::vector<Bytes> big = Inputs(n, count * n, ccFloat32, 7 + n);
    const std::vector<Bytes> small = Inputs(n, count, ccFloat32, 9 + n);
    const std::vector<Bytes> big16 = Inputs(n, count * n, ccFloat16, 11 + n);
    Issue rs = [&](int r, const void* s, void* d, ccStream_t stream) {
      return ccReduceScatter(s, d, count, ccFloat32, ccSum, g[r], stream);
    };
    Issue rsAvg = [&](int r, const void* s, void* d, ccStream_t stream) {  // premultiplied into device scratch
      return ccReduceScatter(s, d, count, ccFloat16, ccAvg, g[r], stream);
    };
    Issue ag = [&](int r, const void* s, void* d, ccStream_t stream) {
      return ccAllGather(s, d, count, ccFloat32, g[r], stream);
    };
    Issue bc = [&](int r, const void* s, void* d, ccStream_t stream) {
      return ccBroadcast(s, d, count, ccFloat32, n - 1, g[r], stream);
    };
    Issue rd = [&](int r, const void* s, void* d, ccStream_t stream) {  // non-roots' recvbuff must stay poisoned
      return ccReduce(s, d, count, ccFloat32, ccAvg, 1, g[r], stream);
    };
    struct {
      const char* name;
      const Issue* issue;
      const std::vector<Bytes>* in;
      size_t outBytes;
    } calls[] = {{"reduce-scatter", &rs, &big, count * 4},
                 {"reduce-scatter float16 avg", &rsAvg, &big16, count * 2},
                 {"all-gather", &ag, &small, count * n * 4},
                 {"broadcast", &bc, &small, count * 4},
                 {"reduce", &rd, &small, count * 4}};
    for (const auto& c : calls) {
      INFO(c.name << ", " << n << " ranks");
      Outcome host = OnHost(g, *c.in, c.outBytes, *c.issue);
      REQUIRE(host.Failure() == "");
      const int64_t copies = DeviceCopies(), launches = CodecLaunches();
      Outcome dev = OnDevice(g, st, *c.in, c.outBytes, *c.issue);
      REQUIRE(dev.Failure() == "");
      for (int r = 0; r < n; ++r) CHECK(FirstDifference(dev.out[r], host.out[r]) == "");
      CheckStayedOnDevice(copies, launches, n, c.issue == &rs || c.issue == &rsAvg || c.issue == &rd);
    }
  }
}

// ccSend and ccRecv on device buffers, staged by the proxy: a ring exchange and a send to the rank itself in one group,
// equal to the same group on host buffers (itself checked against the senders' bytes in test_p2p).
TEST_CASE("[gpu] point-to-point in a group on device buffers equals the host group", "[gpu][device][p2p]") {
  SKIP_WITHOUT_DEVICE();
  for (int n : {1, 2, 4}) {
    Group g = DeviceGroup(n);
    REQUIRE(g.status == ccSuccess);
    Streams st(n);
    const size_t count = 30011, half = count / 2;
    const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 31 + n);
    Issue p2p = [&](int r, const void* s, void* d, ccStream_t stream) {
      char* out = static_cast<char*>(d);
      ccGroupStart();
      ccRecv(out, count, ccFloat32, (r + n - 1) % n, g[r], stream);
      ccSend(s, count, ccFloat32, (r + 1) % n, g[r], stream);
      ccSend(static_cast<const char*>(s) + 4, half, ccFloat32, r, g[r], stream);
      ccRecv(out + count * 4, half, ccFloat32, r, g[r], stream);
      return ccGroupEnd();
    };
    INFO(n << " ranks");
    Outcome host = OnHost(g, in, (count + half) * 4, p2p);
    REQUIRE(host.Failure() == "");
    for (int r = 0; r < n; ++r) {
      REQUIRE(std::memcmp(host.out[r].data(), in[(r + n - 1) % n].data(), count * 4) == 0);
      REQUIRE(std::memcmp(host.out[r].data() + count * 4, in[r].data() + 4, half * 4) == 0);
    }
    Outcome dev = OnDevice(g, st, in, (count + half) * 4, p2p);
    REQUIRE(dev.Failure() == "");
    for (int r = 0; r < n; ++r) CHECK(FirstDifference(dev.out[r], host.out[r]) == "");
  }
}

TEST_CASE("[gpu] point-to-point on device buffers: bad calls are refused before anything moves", "[gpu][device][p2p]") {
  SKIP_WITHOUT_DEVICE();
  Group g = DeviceGroup(2);
  REQUIRE(g.status == ccSuccess);
  Streams st(2);
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, 64) == cudaSuccess);
  float host[16] = {};
  // Host and device buffers of one communicator in one group.
  REQUIRE(ccGroupStart() == ccSuccess);
  REQUIRE(ccSend(dev, 16, ccFloat32, 0, g[0], st[0]) == ccSuccess);
  REQUIRE(ccRecv(host, 16, ccFloat32, 0, g[0], nullptr) == ccSuccess);
  REQUIRE(ccGroupEnd() == ccInvalidUsage);
  CHECK(Contains(ccGetLastError(nullptr), "mixes host and device buffers"));
  // Two streams.
  REQUIRE(ccGroupStart() == ccSuccess);
  REQUIRE(ccSend(dev, 16, ccFloat32, 0, g[0], st[0]) == ccSuccess);
  REQUIRE(ccRecv(dev, 16, ccFloat32, 0, g[0], st[1]) == ccSuccess);
  REQUIRE(ccGroupEnd() == ccInvalidUsage);
  CHECK(Contains(ccGetLastError(nullptr), "mixes streams"));
  ccResult_t async = ccSuccess;
  REQUIRE(ccCommGetAsyncError(g[0], &async) == ccSuccess);
  CHECK(async == ccSuccess);
  // A device send to the rank itself outside a group.
  CHECK(ccSend(dev, 16, ccFloat32, 0, g[0], st[0]) == ccInvalidUsage);
  CHECK(Contains(ccGetLastError(g[0]), "both must be in one ccGroupStart/ccGroupEnd"));
  cudaFree(dev);
}

// Thread ranks sharing a GPU each wait on their stream for the others' calls; with the legacy default stream, which
// serializes with every blocking stream of the device, they would wait for one another for ever (README, "Device
// buffers"). So such a call is refused, on every rank at once; a rank alone on its device may take that stream.
TEST_CASE("[gpu] thread ranks sharing a GPU are refused the legacy default stream, and a rank alone on it takes it",
          "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 2;
  const size_t count = 1000;
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  std::vector<float*> d(n, nullptr);
  const std::vector<float> ones(count, 1.0f);
  for (int r = 0; r < n; ++r) {  // before any call: a cudaMalloc may wait for the device
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d[r]), count * 4) == cudaSuccess);
    REQUIRE(cudaMemcpy(d[r], ones.data(), count * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  for (ccStream_t legacy : {static_cast<ccStream_t>(nullptr), reinterpret_cast<ccStream_t>(cudaStreamLegacy)}) {
    INFO("stream " << legacy);
    std::vector<RankResult> rc(n), p2p(n);
    RunRanks(n, [&](int r) {
      cudaSetDevice(0);
      rc[r] = Record(ccAllReduce(d[r], d[r], count, ccFloat32, ccSum, nullptr, g[r], legacy), g[r]);
      p2p[r] = Record(ccSend(d[r], count, ccFloat32, 1 - r, g[r], legacy), g[r]);
    });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << rc[r].error << " / " << p2p[r].error);
      CHECK(rc[r].rc == ccInvalidUsage);
      CHECK(Contains(rc[r].error, "legacy default stream"));
      CHECK(p2p[r].rc == ccInvalidUsage);
      CHECK(Contains(p2p[r].error, "legacy default stream"));
      std::vector<float> back(count, 0.0f);
      REQUIRE(cudaMemcpy(back.data(), d[r], count * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
      CHECK(FirstDifference(back, ones) == "");  // nothing was written
    }
  }
  {  // streams of their own: the same call works
    Streams st(n);
    std::vector<RankResult> rc(n);
    RunRanks(n, [&](int r) {
      cudaSetDevice(0);
      rc[r] = Record(ccAllReduce(d[r], d[r], count, ccFloat32, ccSum, nullptr, g[r], st[r]), g[r]);
      if (rc[r].rc == ccSuccess && cudaStreamSynchronize(st.s[r]) != cudaSuccess) rc[r].rc = ccUnhandledCudaError;
    });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << rc[r].error);
      CHECK(rc[r].rc == ccSuccess);
      std::vector<float> back(count, 0.0f);
      REQUIRE(cudaMemcpy(back.data(), d[r], count * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
      CHECK(FirstDifference(back, std::vector<float>(count, 2.0f)) == "");
    }
  }
  Group one = DeviceGroup(1);  // alone on the device in its communicator: the legacy stream is fine
  REQUIRE(one.status == ccSuccess);
  CHECK(ccAllReduce(d[0], d[0], count, ccFloat32, ccSum, nullptr, one[0], nullptr) == ccSuccess);
  CHECK(cudaStreamSynchronize(nullptr) == cudaSuccess);
  for (float* p : d) cudaFree(p);
}

// Ranks 0 and 1 on host buffers, 2 and 3 on device buffers: the local transport copies between the two kinds with
// the device side's copier, and within each kind (with CC_CHECKSUM=1, the messages from 0 to 1 carry a CRC that is
// checked, those with a device side none). The result is the all-host call's, byte for byte, on every rank.
TEST_CASE("[gpu] an exact all-reduce with host buffers on two ranks and device buffers on the others",
          "[gpu][device][exact]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 4;
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  // In the call check, the tree, and the ring in several slices.
  for (size_t count : {size_t{1000}, size_t{10001}, size_t{3 * 65537}}) {
    for (ccRedOp_t op : {ccSum, ccAvg}) {
      INFO("count " << count << ", op " << op);
      const std::vector<Bytes> in = Inputs(n, count, ccFloat32, count + op);
      const size_t bytes = count * 4;
      Issue issue = [&](int r, const void* s, void* d, ccStream_t stream) {
        return ccAllReduce(s, d, count, ccFloat32, op, nullptr, g[r], stream);
      };
      Outcome host = OnHost(g, in, bytes, issue);
      REQUIRE(host.Failure() == "");
      Outcome mixed = OnDevice(g, st, in, bytes, issue, true, 2);  // ranks 0 and 1 on host buffers
      REQUIRE(mixed.Failure() == "");
      for (int r = 0; r < n; ++r) CHECK(FirstDifference(mixed.out[r], host.out[r]) == "");
    }
  }
}

#ifdef CCOLL_HAVE_UCX
TEST_CASE("[gpu] homomorphic quant over UCX with host buffers on one rank and device buffers on the other",
          "[gpu][device][codec][segments]") {
  SKIP_WITHOUT_DEVICE();
  // Over a network the host path runs a homomorphic call in segments (a ring each) and the device codec in one ring;
  // the ranks of one call must exchange the same messages whatever their buffers. 3 Mi elements are 2 segments. With
  // the call check, the ranks learn whether any of them runs this call on the device: calls on host buffers on every
  // rank are segmented, the mixed call is not. Without it (ctest runs this case again with CC_CHECK_CALLS=0), no call
  // is segmented where any rank is bound to a device.
  const int n = 2;
  const size_t count = size_t{3} << 20;
  ccConfig_t config = cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 20000);
  config.transport = ccTransportUcx;
  config.cudaDev = 0;
  Group g = Group::InitConfig(n, config);
  INFO(g.error);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 17);
  for (const char* spec : {"quant:bits=4,mode=homomorphic", "quant:bits=2,mode=homomorphic,rotation=none"}) {
    INFO(spec);
    Compressors host(spec, n), mixed(spec, n);
    REQUIRE(host.status == ccSuccess);
    REQUIRE(mixed.status == ccSuccess);
    auto issue = [&](Compressors& comps) -> Issue {
      return [&](int r, const void* s, void* d, ccStream_t stream) {
        return ccAllReduce(s, d, count, ccFloat32, ccAvg, comps[r], g[r], stream);
      };
    };
#ifdef CCOLL_FAKE_CUDA
    const uint64_t segmented = ccoll::SegmentedCallsForTesting();
#endif
    Outcome onHost = OnHost(g, in, count * 4, issue(host));
    REQUIRE(onHost.Failure() == "");
#ifdef CCOLL_FAKE_CUDA
    CHECK(ccoll::SegmentedCallsForTesting() - segmented == (cctest::CallCheckOn() ? n : 0u));
#endif
    Outcome oneOnDevice = OnDevice(g, st, in, count * 4, issue(mixed), false, 1);  // rank 0 on host buffers
    REQUIRE(oneOnDevice.Failure() == "");
#ifdef CCOLL_FAKE_CUDA
    // With CC_DEVICE_KERNELS=0 rank 1's call is staged: the host schedule on every rank again.
    const uint64_t mixedSegmented = DeviceCodecsOn(spec) ? 0 : n;
    CHECK(ccoll::SegmentedCallsForTesting() - segmented == (cctest::CallCheckOn() ? n + mixedSegmented : 0u));
#endif
    for (int r = 0; r < n; ++r) CHECK(FirstDifference(oneOnDevice.out[r], onHost.out[r]) == "");
  }
}
#endif

TEST_CASE("[gpu] every codec on device buffers equals the host call, call after call", "[gpu][device][codec]") {
  SKIP_WITHOUT_DEVICE();
  const char* specs[] = {"cast16",
                         "quant:bits=4,mode=requant",
                         "quant:bits=8,mode=homomorphic",
                         "quant:bits=2,mode=requant",
                         "topk:density=0.1,ef=1",
                         "randk:density=0.1,ef=1",
                         "powersgd:rank=2,rows=300,cols=333"};
  const size_t count = 300 * 333;
  for (int n : {1, 2, 4}) {
    Group g = DeviceGroup(n);
    REQUIRE(g.status == ccSuccess);
    Streams st(n);
    for (const char* spec : specs) {
      Compressors hostComps(spec, n, 42), devComps(spec, n, 42);
      if (hostComps.status != ccSuccess && std::string(spec).rfind("powersgd", 0) == 0) continue;  // built without BLAS
      REQUIRE(hostComps.status == ccSuccess);
      REQUIRE(devComps.status == ccSuccess);
      for (int call = 0; call < 3; ++call) {
        INFO(spec << ", " << n << " ranks, call " << call);
        const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 100 + call);
        Outcome host = OnHost(g, in, count * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
          return ccAllReduce(s, d, count, ccFloat32, ccAvg, hostComps[r], g[r], stream);
        });
        if (NoCpuBlas(host)) break;  // nothing to compare with; "[gpu] powersgd ... recovers" runs it
        REQUIRE(host.Failure() == "");
        Outcome dev = OnDevice(g, st, in, count * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
          return ccAllReduce(s, d, count, ccFloat32, ccAvg, devComps[r], g[r], stream);
        });
        REQUIRE(dev.Failure() == "");
        CHECK(Agrees(dev.out, host.out, SameBytesAsHost(spec)) == "");
      }
    }
  }
}

TEST_CASE("[gpu] device codecs run on the device buffers and equal the host call", "[gpu][device][codec]") {
  SKIP_WITHOUT_DEVICE();
  const char* specs[] = {
      "cast16",
      "cast16:dtype=fp16",
      "quant:bits=4,mode=requant",
      "quant:bits=3,mode=requant,group=48,scale=bf16",  // codes end mid-byte: the packing pass
      "quant:bits=8,mode=requant,rotation=none,clip=0.001,scale=fp16",
      "quant:bits=2,mode=requant,block=16384,rounding=nearest",
      "quant:bits=4,mode=homomorphic",
      "quant:bits=2,mode=homomorphic,rounding=correlated,gather=requant",  // lane sums requantized for the all-gather
      "quant:bits=8,mode=homomorphic,rotation=none,clip=0.001,group=100",
      "topk:density=0.25",
      "topk:density=0.1,dtype=bf16,chunk=100",
      "topk:density=1,dtype=bf16,chunk=100",  // error feedback keeps only what the bf16 sums round away
      "randk:density=0.2,unbiased=1,ef=0",
      "randk:density=0.1,ef=0,chunk=7",
      "powersgd:rank=2",
      "powersgd:rank=3,dtype=bf16,start=1",  // the first call exact
  };
  // 1 and 1000 elements take the tree (at most CC_TREE_THRESHOLD bytes); the last the ring with three slices per
  // chunk on 4 ranks (lanes overlap) and a ragged tail: with the default 256 KiB slices on a GPU; against the fake
  // runtime (slow under the sanitizers) ctest runs this case again with CC_SLICE_BYTES=4096 instead.
#ifdef CCOLL_FAKE_CUDA
  const size_t slice = 1024;
#else
  const size_t slice = 65536;
#endif
  const size_t counts[] = {1, 1000, 4 * 3 * slice + 17};
  for (int n : {1, 2, 4}) {
    Group g = DeviceGroup(n);
    REQUIRE(g.status == ccSuccess);
    Streams st(n);
    for (const char* spec : specs) {
      for (size_t count : counts) {
        Compressors hostComps(spec, n, 7), devComps(spec, n, 7);  // a compressor is bound to one count
        if (hostComps.status != ccSuccess && std::string(spec).rfind("powersgd", 0) == 0) continue;  // no BLAS
        REQUIRE(hostComps.status == ccSuccess);
        REQUIRE(devComps.status == ccSuccess);
        // Sum, then average in place, then average with a NaN and an infinity on rank 0, then a clean average (the
        // error feedback carries what the calls before left, and must have dropped the non-finite values).
        for (int call = 0; call < 4; ++call) {
          const ccRedOp_t op = call == 0 ? ccSum : ccAvg;
          const bool inPlace = call == 1;
          INFO(spec << ", " << n << " ranks, count " << count << ", call " << call);
          std::vector<Bytes> in = Inputs(n, count, ccFloat32, count + 10 * call + n);
          if (call == 2) {
            const float bad[2] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
            std::memcpy(&in[0][count / 2 * 4], &bad[0], 4);
            std::memcpy(&in[0][(count - 1) * 4], &bad[1], 4);
          }
          Outcome host = OnHost(g, in, count * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
            return ccAllReduce(s, d, count, ccFloat32, op, hostComps[r], g[r], stream);
          });
          if (NoCpuBlas(host)) break;  // nothing to compare with; "[gpu] powersgd ... recovers" runs it
          REQUIRE(host.Failure() == "");
          const int64_t before = CodecLaunches(), copies = DeviceCopies();
          Outcome dev = OnDevice(
              g, st, in, count * 4,
              [&](int r, const void* s, void* d, ccStream_t stream) {
                return ccAllReduce(s, d, count, ccFloat32, op, devComps[r], g[r], stream);
              },
              inPlace);
          REQUIRE(dev.Failure() == "");
          CHECK(Agrees(dev.out, host.out, SameBytesAsHost(spec), call == 2) == "");
          if (before >= 0) {
            // Device kernels ran, or nothing but staging; PowerSGD's exact first call (start=1) reduces with the
            // exact schedule's kernels.
            CHECK((CodecLaunches() > before) == (DeviceCodecsOn(spec) && n > 1));
            // The ring and tree codecs' messages, and that exact call's, stay in device memory (thread ranks),
            // copied device to device.
            const std::string kind = std::string(spec).substr(0, std::string(spec).find(':'));
            const bool exactCall = call == 0 && std::string(spec).find("start=1") != std::string::npos;
            if ((kind == "cast16" || kind == "quant" || exactCall) && n > 1) {
              CHECK((DeviceCopies() > copies) == DeviceCodecsOn(spec));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("[gpu] a compressor keeps its error feedback on one kind of buffer", "[gpu][device][codec]") {
  SKIP_WITHOUT_DEVICE();
  if (!DeviceCodecsOn("topk")) return;  // staged device calls keep it in host memory too: nothing to refuse
  const int n = 2;
  const size_t count = 5000;
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  Compressors comps("topk:density=0.1", n, 3), stateless("quant:bits=4,mode=requant", n, 3);
  REQUIRE(comps.status == ccSuccess);
  REQUIRE(stateless.status == ccSuccess);
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 5);
  auto with = [&](const Compressors& c) {
    return [&](int r, const void* s, void* d, ccStream_t stream) {
      return ccAllReduce(s, d, count, ccFloat32, ccSum, c[r], g[r], stream);
    };
  };
  REQUIRE(OnDevice(g, st, in, count * 4, with(comps)).Failure() == "");
  Outcome host = OnHost(g, in, count * 4, with(comps));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(host.rc[r].rc == ccInvalidUsage);
    CHECK(Contains(host.rc[r].error, "error-feedback memory is in device memory"));
    CHECK(FirstDifference(host.out[r], Bytes(count * 4, '\x5a')) == "");  // nothing written
  }
  REQUIRE(OnDevice(g, st, in, count * 4, with(comps)).Failure() == "");  // the device calls go on
  // A codec without memory takes both kinds of buffer.
  REQUIRE(OnDevice(g, st, in, count * 4, with(stateless)).Failure() == "");
  REQUIRE(OnHost(g, in, count * 4, with(stateless)).Failure() == "");
}

TEST_CASE("[gpu] 16-bit gradients through the device codecs equal the host call", "[gpu][device][codec]") {
  SKIP_WITHOUT_DEVICE();
  const char* specs[] = {"cast16",           "quant:bits=4,mode=requant", "quant:bits=4,mode=homomorphic",
                         "topk:density=0.1", "randk:density=0.2",         "powersgd:rank=2",
                         "powersgd:rank=2,start=1"};
  const size_t count = 4 * 3 * 1024 + 5;
  for (int n : {1, 3}) {
    Group g = DeviceGroup(n);
    REQUIRE(g.status == ccSuccess);
    Streams st(n);
    for (ccDataType_t dtype : {ccBfloat16, ccFloat16}) {
      for (const char* spec : specs) {
        if (!SameBytesAsHost(spec)) continue;  // PowerSGD's cuBLAS bytes: the float32 cases compare those
        Compressors hostComps(spec, n, 5), devComps(spec, n, 5);
        REQUIRE(hostComps.status == ccSuccess);
        REQUIRE(devComps.status == ccSuccess);
        // Average, sum in place, average: the error feedback memory carries each call's share of its result's
        // rounding (all of it for an average, 1 / n for a sum) into the next.
        for (int call = 0; call < 3; ++call) {
          INFO(spec << ", " << (dtype == ccBfloat16 ? "bf16" : "fp16") << ", " << n << " ranks, call " << call);
          std::vector<Bytes> in = Inputs(n, count, dtype, 60 + call);
          const ccRedOp_t op = call == 1 ? ccSum : ccAvg;
          if (op == ccSum && dtype == ccFloat16 && std::string(spec).rfind("powersgd", 0) == 0) {
            // 60000 on every rank: the float32 sum is finite, its float16 rounding infinite, and nothing of that
            // rounding may enter the memory (the element's residual stays; the next call shows it).
            const uint16_t big = 0x7b53;
            for (Bytes& b : in) std::memcpy(&b[5 * 2], &big, 2);
          }
          auto issue = [&](const Compressors& c) {
            return [&](int r, const void* s, void* d, ccStream_t stream) {
              return ccAllReduce(s, d, count, dtype, op, c[r], g[r], stream);
            };
          };
          Outcome host = OnHost(g, in, count * 2, issue(hostComps));
          if (NoCpuBlas(host)) break;
          REQUIRE(host.Failure() == "");
          Outcome dev = OnDevice(g, st, in, count * 2, issue(devComps), call == 1);
          REQUIRE(dev.Failure() == "");
          for (int r = 0; r < n; ++r) CHECK(FirstDifference(dev.out[r], host.out[r]) == "");
        }
      }
    }
  }
}

// vNMSE of the floats in x against the reference m.
double Vnmse(const Bytes& x, const std::vector<double>& m) {
  std::vector<float> v(m.size());
  std::memcpy(v.data(), x.data(), m.size() * 4);
  return cctest::Vnmse(v, m);
}

// Needs no host result (so it runs where there is no CPU BLAS): one power-iteration step at rank >= the average's
// rank recovers the average, so PowerSGD's first call on a rank-2 average returns it almost exactly (as
// test_lowrank checks on host buffers), and every rank the same bytes.
TEST_CASE("[gpu] powersgd on device buffers recovers a rank-2 average, the same on every rank", "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  const int64_t rows = 300, cols = 200;
  const size_t count = static_cast<size_t>(rows * cols);
  for (int n : {2, 4}) {
    for (const char* spec : {"powersgd:rank=3,rows=300,cols=200", "powersgd:rank=2,rows=300,cols=200,dtype=bf16"}) {
      INFO(spec << ", " << n << " ranks");
      Compressors comps(spec, n, 11);
      if (comps.status != ccSuccess) return;  // a build without any BLAS refuses powersgd
      Group g = DeviceGroup(n);
      REQUIRE(g.status == ccSuccess);
      Streams st(n);
      // Rank r: a_r x1 y1^T + b_r x2 y2^T, so the average is rank 2.
      std::mt19937_64 gen(n);
      std::normal_distribution<double> normal;
      std::vector<double> x1(rows), x2(rows), y1(cols), y2(cols), mean(count, 0.0);
      for (auto* v : {&x1, &x2}) for (auto& e : *v) e = normal(gen);
      for (auto* v : {&y1, &y2}) for (auto& e : *v) e = normal(gen);
      std::vector<Bytes> in(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        const double a = 1.0 + r, b = 0.5 - 0.25 * r;
        std::vector<float> v(count);
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            v[i * cols + j] = static_cast<float>(a * x1[i] * y1[j] + b * x2[i] * y2[j]);
            mean[i * cols + j] += static_cast<double>(v[i * cols + j]) / n;
          }
        }
        in[r].assign(reinterpret_cast<char*>(v.data()), reinterpret_cast<char*>(v.data() + count));
      }
      // Twice: the second call starts from the first's Q and error feedback. The second time rank r's buffers are
      // r floats into their allocations: cuBLAS may choose its kernels by alignment, and the ranks must still agree.
      // Only with 2 ranks, rank 1 calling first and rank 0 once rank 1's call has returned: rank 1 runs the products
      // on its new alignment once before any stream waits (the fake cuBLAS loads kernels per alignment). A rank that
      // does so while another rank's stream on the GPU waits is not covered (README, "Device buffers").
      for (size_t shift : {size_t{0}, sizeof(float)}) {
        if (shift > 0 && n > 2) continue;
        INFO("buffers " << shift << " bytes apart in alignment");
        std::atomic<bool> lastReturned{false};
        Outcome dev = OnDevice(
            g, st, in, count * 4,
            [&](int r, const void* s, void* d, ccStream_t stream) {
              if (shift > 0 && r != n - 1) cctest::WaitUntil([&] { return lastReturned.load(); }, 10000);
              const ccResult_t rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, comps[r], g[r], stream);
              if (r == n - 1) lastReturned = true;
              return rc;
            },
            false, 0, shift);
        if (NoCpuBlas(dev)) return;  // staged (no cuBLAS here, or CC_DEVICE_KERNELS=0) and no CPU BLAS either
        REQUIRE(dev.Failure() == "");
        for (int r = 1; r < n; ++r) CHECK(FirstDifference(dev.out[r], dev.out[0]) == "");
        // fp32 products: ~1e-13; the bf16 wire of P and Q rounds each factor to 2^-9: ~1e-5.
        CHECK(Vnmse(dev.out[0], mean) < (std::string(spec).find("bf16") != std::string::npos ? 1e-4 : 1e-9));
      }
    }
  }
}

// Needs no host result either. 16-bit data, the same input every call: the vector after the matrix travels exactly
// but for the result's rounding to 16 bits, which the error feedback keeps (each rank all of it for an average, 1 / n
// for a sum), so the running sum of the vector's outputs stays within about one call's rounding of the running sum of
// exact results; without that, every call rounds the same way and the drift grows with the calls (4x in 4x the calls).
// test_lowrank checks the identity on the host, test_nccl the stream-ordered path.
TEST_CASE("[gpu] powersgd on 16-bit device buffers keeps the result's rounding in its error feedback",
          "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 3, calls = 20;
  const size_t matrix = 64 * 64, count = matrix + 904;
  for (ccDataType_t dtype : {ccBfloat16, ccFloat16}) {
    const ccRedOp_t op = dtype == ccBfloat16 ? ccAvg : ccSum;
    INFO((dtype == ccBfloat16 ? "bf16 data, avg" : "fp16 data, sum"));
    Compressors comps("powersgd:rank=2,shapes=64x64+904", n, 3);
    if (comps.status != ccSuccess) return;  // a build without any BLAS refuses powersgd
    Group g = DeviceGroup(n);
    REQUIRE(g.status == ccSuccess);
    Streams st(n);
    const std::vector<Bytes> in = Inputs(n, count, dtype, 70);
    std::vector<double> exact(count, 0.0);
    for (int r = 0; r < n; ++r) {
      const std::vector<double> v = Values(in[r], dtype);
      for (size_t i = 0; i < count; ++i) exact[i] += op == ccAvg ? v[i] / n : v[i];
    }
    Drift drift(count, matrix);  // the vector's
    std::vector<double> rms;
    for (int c = 0; c < calls; ++c) {
      Outcome dev = OnDevice(g, st, in, count * 2, [&](int r, const void* s, void* d, ccStream_t stream) {
        return ccAllReduce(s, d, count, dtype, op, comps[r], g[r], stream);
      });
      if (NoCpuBlas(dev)) return;  // staged (no cuBLAS here, or CC_DEVICE_KERNELS=0) and no CPU BLAS either
      REQUIRE(dev.Failure() == "");
      for (int r = 1; r < n; ++r) CHECK(FirstDifference(dev.out[r], dev.out[0]) == "");
      drift.Add(Values(dev.out[0], dtype).data(), exact);
      rms.push_back(drift.Relative(exact));
    }
    INFO("the vector's drift after the first call " << rms[0] << ", after 5 " << rms[4] << ", after 20 " << rms[19]);
    CHECK(rms[0] > 0.0);  // the first call rounds
    CHECK(rms[19] < 1.5 * rms[4]);
    CHECK(rms[19] < 2.0 * rms[0]);
  }
}

TEST_CASE("[gpu] powersgd with host buffers on one rank and device buffers on the other: the same bytes or refused",
          "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  if (!cctest::CallCheckOn()) return;  // the refusal travels in the call check
  // Where the device rank's products run on cuBLAS and the host rank's on the CPU BLAS, the results would differ by
  // rank: the call check refuses the call on both. Where both run on the CPU BLAS (the device call staged), they
  // agree byte for byte.
  const int n = 2;
  const size_t count = 300 * 200;
  Compressors comps("powersgd:rank=3,rows=300,cols=200", n, 11);
  if (comps.status != ccSuccess) return;  // a build without any BLAS refuses powersgd
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 23);
  Outcome mixed = OnDevice(
      g, st, in, count * 4,
      [&](int r, const void* s, void* d, ccStream_t stream) {
        return ccAllReduce(s, d, count, ccFloat32, ccAvg, comps[r], g[r], stream);
      },
      false, 1);  // rank 0 on host buffers
  if (NoCpuBlas(mixed)) return;
  INFO(mixed.Failure());
#ifdef CCOLL_FAKE_CUDA
  // Here cuBLAS is the fake's (the CPU BLAS itself), so the bytes would agree: the device call must be resident (its
  // products on "cuBLAS") and refused, unless CC_DEVICE_KERNELS=0 stages it.
  const char* kernels = std::getenv("CC_DEVICE_KERNELS");
  if (kernels == nullptr || std::string(kernels) != "0") CHECK(mixed.rc[1].rc == ccInvalidUsage);
#endif
  if (mixed.rc[0].rc == ccSuccess && mixed.rc[1].rc == ccSuccess) {
    CHECK(FirstDifference(mixed.out[0], mixed.out[1]) == "");
  } else {
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << mixed.rc[r].error);
      CHECK(mixed.rc[r].rc == ccInvalidUsage);
      CHECK(Contains(mixed.rc[r].error, "with PowerSGD's products on cuBLAS"));
    }
  }
}

TEST_CASE("[gpu] a device call returns once queued, the stream orders it, and host calls wait for it",
          "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 2;
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  const size_t count = 1 << 20;
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 5);
  Outcome host = OnHost(g, in, count * 4, [&](int r, const void* s, void* d, ccStream_t) {
    return ccAllReduce(s, d, count, ccFloat32, ccSum, nullptr, g[r], nullptr);
  });
  REQUIRE(host.Failure() == "");

  // Rank 0's stream is held by a host function until the main thread lets it go: the calls must still return.
  std::atomic<bool> release{false};
  auto hold = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  std::vector<float*> send(n), recv(n);
  std::vector<RankResult> rc(n), hostAfter(n);
  std::vector<std::vector<float>> hostIn(n, std::vector<float>(1000, 1.0f)), hostOut(n, std::vector<float>(1000));
  std::vector<std::unique_ptr<Pinned>> pinIn, pinOut;  // (Pinned says why)
  for (int r = 0; r < n; ++r) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&send[r]), count * 4) == cudaSuccess);
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&recv[r]), count * 4) == cudaSuccess);
    pinIn.push_back(std::make_unique<Pinned>(count * 4));
    pinOut.push_back(std::make_unique<Pinned>(count * 4));
    std::memcpy(pinIn.back()->p, in[r].data(), count * 4);
  }
  // A call of the same shape first: without memory pools the first one returns only once it has run.
  RunRanks(n, [&](int r) {
    cudaSetDevice(0);
    rc[r] = Record(ccAllReduce(send[r], recv[r], count, ccFloat32, ccSum, nullptr, g[r], st[r]), g[r]);
    cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(st[r]));
  });
  REQUIRE(rc[0].rc == ccSuccess);
  REQUIRE(rc[1].rc == ccSuccess);
  cudaStream_t s0 = reinterpret_cast<cudaStream_t>(st[0]);
  REQUIRE(cudaLaunchHostFunc(s0, hold, &release) == cudaSuccess);
  RunRanks(n, [&](int r) {
    cudaSetDevice(0);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(st[r]);
    cudaMemcpyAsync(send[r], pinIn[r]->p, count * 4, cudaMemcpyHostToDevice, s);  // before the call
    rc[r] = Record(ccAllReduce(send[r], recv[r], count, ccFloat32, ccSum, nullptr, g[r], st[r]), g[r]);
  });
  CHECK(rc[0].rc == ccSuccess);
  CHECK(rc[1].rc == ccSuccess);
  CHECK(cudaStreamQuery(s0) == cudaErrorNotReady);  // returned, not run
  release = true;
  std::vector<Bytes> out(n, Bytes(count * 4));
  RunRanks(n, [&](int r) {
    cudaSetDevice(0);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(st[r]);
    cudaMemcpyAsync(pinOut[r]->p, recv[r], count * 4, cudaMemcpyDeviceToHost, s);  // after the call
    // A host call on the same communicator: it waits for the device call before it, on every rank.
    hostAfter[r] =
        Record(ccAllReduce(hostIn[r].data(), hostOut[r].data(), 1000, ccFloat32, ccSum, nullptr, g[r], nullptr), g[r]);
    cudaStreamSynchronize(s);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    std::memcpy(out[r].data(), pinOut[r]->p, count * 4);
    CHECK(FirstDifference(out[r], host.out[r]) == "");
    CHECK(hostAfter[r].rc == ccSuccess);
    CHECK(hostOut[r][999] == 2.0f);
    cudaFree(send[r]);
    cudaFree(recv[r]);
  }
}

// Without memory pools (ctest runs the device cases so on the fake), the first device call of each shape returns only
// once it has run, with no stream held while the proxy may allocate; the next call of the shape returns once queued.
TEST_CASE("[gpu] without memory pools, a shape's first device call returns once it has run, the next once queued",
          "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  if (!FirstCallsWaitOnHost()) {
    WARN("not run: the device has memory pools");
    return;
  }
  const int n = 2;
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  const size_t count = 1 << 12;
  std::vector<float*> dev(n, nullptr);
  for (float*& d : dev) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), count * 4) == cudaSuccess);
    REQUIRE(cudaMemset(d, 0, count * 4) == cudaSuccess);
  }
  for (size_t elems : {count, count / 2}) {  // two shapes
    for (int call = 0; call < 2; ++call) {
      INFO(elems << " elements, call " << call);
      std::atomic<bool> rank0Returned{false}, rank1Calling{false};
      bool rank1HadCalled = false, rank0ReturnedAlone = false;
      std::vector<ccResult_t> rc(n, ccInternalError);
      RunRanks(n, [&](int r) {
        if (r == 0) {
          rc[0] = ccAllReduce(dev[0], dev[0], elems, ccFloat32, ccSum, nullptr, g[0], st[0]);
          rank1HadCalled = rank1Calling.load();
          rank0Returned = true;
        } else {
          if (call == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
          } else {  // (not for ever: rank 0 may wait for this rank after all)
            rank0ReturnedAlone = cctest::WaitUntil([&] { return rank0Returned.load(); }, 10000);
          }
          rank1Calling = true;
          rc[1] = ccAllReduce(dev[1], dev[1], elems, ccFloat32, ccSum, nullptr, g[1], st[1]);
        }
        cudaStreamSynchronize(st.s[r]);
      });
      CHECK(rc[0] == ccSuccess);
      CHECK(rc[1] == ccSuccess);
      if (call == 0) {
        CHECK(rank1HadCalled);  // returned once run, so after rank 1 had called
      } else {
        CHECK(rank0ReturnedAlone);  // returned once queued, before rank 1 called
      }
    }
  }
  for (float* d : dev) cudaFree(d);
}

// Without memory pools a later call of a shape holds its stream while it runs, so it must not allocate then
// (core/device_proxy.h): a device call's scratch must follow its shape, not its data or its place in the sequence of
// calls. Where the test can count them (the fake runtime, linked statically): without pools, no AllocateScratch after
// the first call of a shape (core/device_memory.h; whether a cached block serves it or not), and in every mode no
// cudaMalloc, cudaHostAlloc or cublasCreate. Without pools ctest also runs this with allocations that synchronize the
// device, where one would deadlock on a GPU.
TEST_CASE("[gpu] device calls allocate nothing after the first call of their shape, whatever their data",
          "[gpu][device][codec]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 4, calls = 3;  // (powersgd start=2: two exact calls, then a compressed one)
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  const size_t most = 4 * 4 * 40001;  // bytes of each buffer: 4 ranks x 40001 float32 values
  // Allocated once: OnDevice would allocate each call's buffers (cudaMalloc, cudaHostAlloc), which the checks count.
  RankBuffers inPlaceBuffers(std::vector<size_t>(n, most), most, true),
      apart(std::vector<size_t>(n, most), most, false);
  std::vector<std::unique_ptr<Compressors>> kept;
  // `calls` calls of issue(r, send, recv, stream) (recv: the send buffer when inPlace), rank r's input for call c
  // from input(r, c); checks that every call succeeds, leaves the same bytes on every rank (when `same`) and, after the
  // first, allocates nothing.
  auto repeat = [&](const std::string& what, size_t inBytes, size_t outBytes, bool inPlace, bool same,
                    const std::function<Bytes(int, int)>& input, const Issue& issue) {
#ifdef CCOLL_FAKE_CUDA
    const bool poolless = FirstCallsWaitOnHost();
    uint64_t scratch = 0, allocations = 0, handles = 0;
#endif
    for (int c = 0; c < calls; ++c) {
      INFO(what << ", call " << c);
      std::vector<Bytes> in;
      for (int r = 0; r < n; ++r) in.push_back(input(r, c));
      for (int r = 0; r < n; ++r) REQUIRE(in[r].size() == inBytes);
      const Outcome o = OnDevice(g, st, in, outBytes, issue, inPlace, 0, 0, inPlace ? &inPlaceBuffers : &apart);
      const std::vector<RankResult>& rc = o.rc;
      const std::vector<Bytes>& out = o.out;
      // Staged PowerSGD (CC_DEVICE_KERNELS=0) in a build with cuBLAS but no CPU BLAS: refused, as on the host.
      if (c == 0 && rc[0].rc == ccInvalidUsage && Contains(rc[0].error, "needs a CPU BLAS")) return;
      REQUIRE(cctest::FirstFailure(rc) == "");
      for (int r = 1; same && r < n; ++r) CHECK(FirstDifference(out[r], out[0]) == "");
#ifdef CCOLL_FAKE_CUDA
      if (c == 0) {
        scratch = ccoll::ScratchAllocations();
        allocations = cctest::FakeSynchronousAllocations();
        handles = cctest::FakeCublasCreates();
      } else {
        if (poolless) CHECK(ccoll::ScratchAllocations() == scratch);
        CHECK(cctest::FakeSynchronousAllocations() == allocations);
        CHECK(cctest::FakeCublasCreates() == handles);
      }
#endif
    }
  };
  // In-place sums of spec.
  auto compressed = [&](const std::string& spec, ccDataType_t dtype, size_t count,
                        const std::function<Bytes(int, int)>& input) {
    kept.push_back(std::make_unique<Compressors>(spec, n, 5));
    const Compressors& comps = *kept.back();
    if (comps.status != ccSuccess && spec.rfind("powersgd", 0) == 0) return;  // a build without BLAS
    REQUIRE(comps.status == ccSuccess);
    const std::string what = spec + ", " + (dtype == ccFloat32 ? "float32" : "bfloat16") + ", " +
                             std::to_string(count) + " elements";
    repeat(what, count * SizeOf(dtype), count * SizeOf(dtype), true, true, input,
           [&](int r, const void* s, void* d, ccStream_t stream) {
             return ccAllReduce(s, d, count, dtype, ccSum, comps[r], g[r], stream);
           });
  };
  {  // sparsifiers keeping a short last chunk on some calls and a full one on others
    // Three chunks, the last one half as long; density 0.3 keeps one: topk the short one on even calls, a full one on
    // odd calls (randk: whichever its draws pick).
    const size_t chunk = 4096, count = 2 * chunk + chunk / 2;
    auto input = [&](int r, int c) {
      std::mt19937 rng(static_cast<unsigned>(1000 * c + r));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      const size_t big = c % 2 == 0 ? 2 : 0;
      std::vector<float> x(count);
      for (size_t k = 0; k < count; ++k) x[k] = u(rng) * (k / chunk == big ? 10.0f : 1.0f);
      Bytes b(count * 4);
      std::memcpy(b.data(), x.data(), count * 4);
      return b;
    };
    for (const char* spec : {"topk:density=0.3,ef=0", "topk:density=0.3,ef=1", "randk:density=0.3,ef=0",
                             "topk:density=0.3,dtype=bf16,ef=1"}) {
      compressed(std::string(spec) + ",chunk=" + std::to_string(chunk), ccFloat32, count, input);
    }
  }
  {  // every codec, fresh random data on each call
    const char* specs[] = {"cast16",
                           "quant:bits=4,mode=requant",
                           "quant:bits=3,mode=requant,group=48,scale=bf16",
                           "quant:bits=4,mode=homomorphic",
                           "quant:bits=2,mode=homomorphic,rounding=correlated,gather=requant",
                           "topk:density=0.1",
                           "randk:density=0.2,unbiased=1,ef=0",
                           "powersgd:rank=2",
                           "powersgd:rank=3,start=2"};
    for (const char* spec : specs) {
      for (ccDataType_t dtype : {ccFloat32, ccBfloat16}) {
        for (size_t count : {size_t{1000}, size_t{40001}}) {  // the tree, the ring (CC_TREE_THRESHOLD)
          compressed(spec, dtype, count, [&](int r, int c) { return Inputs(n, count, dtype, 77 + 10 * c)[r]; });
        }
      }
    }
  }
  {  // exact collectives: 1000 elements ride in the call check, the larger counts run their schedules
    for (size_t count : {size_t{1000}, size_t{10001}, size_t{40001}}) {
      for (ccDataType_t dtype : {ccFloat32, ccFloat16}) {
        const size_t bytes = count * SizeOf(dtype);
        auto input = [&](int r, int c) { return Inputs(n, count, dtype, 5 + 10 * c)[r]; };
        auto gathered = [&](int r, int c) { return Inputs(n, count * n, dtype, 9 + 10 * c)[r]; };
        const std::string what = std::to_string(count) + " elements of " + (dtype == ccFloat32 ? "float32" : "float16");
        repeat("all-reduce average, " + what, bytes, bytes, false, true, input,
               [&](int r, const void* s, void* d, ccStream_t stream) {
                 return ccAllReduce(s, d, count, dtype, ccAvg, nullptr, g[r], stream);
               });
        // float16's average premultiplies the input into a temporary in the ring's reduce-scatter, and in reduce on
        // the ranks other than the root (collectives/average.h).
        repeat("reduce-scatter average, " + what, n * bytes, bytes, false, false, gathered,
               [&](int r, const void* s, void* d, ccStream_t stream) {
                 return ccReduceScatter(s, d, count, dtype, ccAvg, g[r], stream);
               });
        repeat("reduce average to rank 1, " + what, bytes, bytes, false, false, input,
               [&](int r, const void* s, void* d, ccStream_t stream) {
                 return ccReduce(s, d, count, dtype, ccAvg, 1, g[r], stream);
               });
        repeat("all-gather, " + what, bytes, n * bytes, false, true, input,
               [&](int r, const void* s, void* d, ccStream_t stream) {
                 return ccAllGather(s, d, count, dtype, g[r], stream);
               });
        repeat("broadcast from rank 2, " + what, bytes, bytes, true, true, input,
               [&](int r, const void* s, void* d, ccStream_t stream) {
                 return ccBroadcast(s, d, count, dtype, 2, g[r], stream);
               });
      }
    }
  }
}

// While another thread of the application captures a graph in global mode (PyTorch's default), CUDA refuses
// potentially unsafe calls (event queries, stream synchronization) from every thread whose mode is global, and the
// refusal invalidates that capture. The communicator's proxy thread makes such calls for each device call: it runs in
// relaxed mode, so a device call of threads that are relaxed themselves leaves the capture intact.
TEST_CASE("[gpu] device calls leave another thread's global-mode capture intact", "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 2;
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  const size_t count = 1 << 16;
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 9);
  for (const char* spec : {static_cast<const char*>(nullptr), "quant:bits=4,mode=requant"}) {
    INFO((spec ? spec : "exact"));
    std::unique_ptr<Compressors> cs, cd;  // one set for the host calls, one for the device calls
    if (spec != nullptr) {
      cs = std::make_unique<Compressors>(spec, n);
      cd = std::make_unique<Compressors>(spec, n);
      REQUIRE(cs->status == ccSuccess);
      REQUIRE(cd->status == ccSuccess);
    }
    Outcome host = OnHost(g, in, count * 4, [&](int r, const void* snd, void* rcv, ccStream_t) {
      return ccAllReduce(snd, rcv, count, ccFloat32, ccSum, cs ? (*cs)[r] : nullptr, g[r], nullptr);
    });
    REQUIRE(host.Failure() == "");
    std::vector<float*> send(n), recv(n);
    std::vector<std::unique_ptr<Pinned>> pinIn, pinOut;  // (Pinned says why)
    for (int r = 0; r < n; ++r) {  // every allocation before the capture begins
      REQUIRE(cudaMalloc(reinterpret_cast<void**>(&send[r]), count * 4) == cudaSuccess);
      REQUIRE(cudaMalloc(reinterpret_cast<void**>(&recv[r]), count * 4) == cudaSuccess);
      pinIn.push_back(std::make_unique<Pinned>(count * 4));
      pinOut.push_back(std::make_unique<Pinned>(count * 4));
      std::memcpy(pinIn.back()->p, in[r].data(), count * 4);
    }
    void* scratch = nullptr;
    REQUIRE(cudaMalloc(&scratch, 256) == cudaSuccess);
    cudaStream_t cap = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(scratch, 0, 256, cap) == cudaSuccess);
    std::vector<RankResult> rc(n);
    RunRanks(n, [&](int r) {
      cudaSetDevice(0);
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // this thread's own calls are the test's
      cudaThreadExchangeStreamCaptureMode(&mode);
      cudaStream_t s = reinterpret_cast<cudaStream_t>(st[r]);
      cudaMemcpyAsync(send[r], pinIn[r]->p, count * 4, cudaMemcpyHostToDevice, s);
      rc[r] = Record(ccAllReduce(send[r], recv[r], count, ccFloat32, ccSum, cd ? (*cd)[r] : nullptr, g[r], st[r]),
                     g[r]);
      cudaMemcpyAsync(pinOut[r]->p, recv[r], count * 4, cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
    });
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(cap, &graph) == cudaSuccess);
    CHECK(graph != nullptr);
    if (graph != nullptr) cudaGraphDestroy(graph);
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      CHECK(rc[r].rc == ccSuccess);
      ccResult_t async = ccSuccess;
      CHECK(ccCommGetAsyncError(g[r], &async) == ccSuccess);
      CHECK(async == ccSuccess);
      Bytes out(count * 4);
      std::memcpy(out.data(), pinOut[r]->p, count * 4);
      CHECK(FirstDifference(out, host.out[r]) == "");
      cudaFree(send[r]);
      cudaFree(recv[r]);
    }
    cudaFree(scratch);
    cudaStreamDestroy(cap);
  }
}

TEST_CASE("[gpu] device buffers: bad calls are refused before anything moves", "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  Group g = DeviceGroup(1);
  REQUIRE(g.status == ccSuccess);
  Streams st(1);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(st[0]);
  const size_t count = 4096;
  float* dev = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dev), count * 4) == cudaSuccess);
  REQUIRE(cudaMemset(dev, 0x5a, count * 4) == cudaSuccess);
  std::vector<float> host(count, 1.0f);

  // Host input, device output.
  CHECK(ccAllReduce(host.data(), dev, count, ccFloat32, ccSum, nullptr, g[0], st[0]) == ccInvalidUsage);
  CHECK(cctest::Contains(ccGetLastError(g[0]), "host memory"));

  // Graph capture: the staged path cannot be captured, and says so.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  CHECK(ccAllReduce(dev, dev, count, ccFloat32, ccSum, nullptr, g[0], st[0]) == ccInvalidUsage);
  CHECK(cctest::Contains(ccGetLastError(g[0]), "graph"));
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  if (graph) cudaGraphDestroy(graph);

  // A stream of another device (cudaStreamGetDevice, CUDA 12.8 runtimes): refused on the call's rank, in a
  // collective and in a group. The fake lends a second device that has streams only.
  int devices = 0;
  cudaGetDeviceCount(&devices);
#if CUDART_VERSION >= 12080
#ifdef CCOLL_FAKE_CUDA
  cctest::FakeDeviceCount(2);
#endif
  int now = devices;
  cudaGetDeviceCount(&now);
  if (now > 1) {
    cudaStream_t foreign = nullptr;
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&foreign, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    const ccStream_t other = reinterpret_cast<ccStream_t>(foreign);
    CHECK(ccAllReduce(dev, dev, count, ccFloat32, ccSum, nullptr, g[0], other) == ccInvalidUsage);
    CHECK(cctest::Contains(ccGetLastError(g[0]), "ccAllReduce: the stream is on CUDA device 1, but the communicator "
                                                 "is bound to device 0"));
    REQUIRE(ccGroupStart() == ccSuccess);
    CHECK(ccSend(dev, 16, ccFloat32, 0, g[0], other) == ccInvalidUsage);
    CHECK(cctest::Contains(ccGetLastError(g[0]), "ccSend: the stream is on CUDA device 1"));
    CHECK(ccGroupEnd() == ccInvalidUsage);  // none of the group's calls issued
    CHECK(cctest::Contains(ccGetLastError(nullptr), "the stream is on CUDA device 1"));
    cudaStreamDestroy(foreign);
  }
#ifdef CCOLL_FAKE_CUDA
  cctest::FakeDeviceCount(1);
#endif
#endif

  std::vector<uint8_t> back(count * 4);
  REQUIRE(cudaMemcpy(back.data(), dev, count * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  bool untouched = true;
  for (uint8_t b : back) untouched = untouched && b == 0x5a;
  CHECK(untouched);

  // A device the process does not see is refused at init, and so is a negative number.
  for (int bad : {devices, -1}) {
    Group none = DeviceGroup(1, bad);
    INFO("device " << bad << ": " << none.error);
    CHECK(none.status == ccInvalidArgument);
    CHECK(cctest::Contains(none.error, "cudaDev " + std::to_string(bad)));
  }
  // A communicator bound to another device refuses buffers on device 0.
  if (devices > 1) {
    Group other = DeviceGroup(1, 1);
    REQUIRE(other.status == ccSuccess);
    CHECK(ccAllReduce(dev, dev, count, ccFloat32, ccSum, nullptr, other[0], st[0]) == ccInvalidUsage);
    CHECK(cctest::Contains(ccGetLastError(other[0]), "bound to device"));
  }
  cudaFree(dev);
}

TEST_CASE("[gpu] a peer that aborts releases the waiting stream with an async error", "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  Group g = DeviceGroup(2);
  REQUIRE(g.status == ccSuccess);
  Streams st(2);
  const size_t count = 1 << 16;
  float* dev = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dev), count * 4) == cudaSuccess);
  REQUIRE(cudaMemset(dev, 0, count * 4) == cudaSuccess);
  if (FirstCallsWaitOnHost()) {  // (the call below must return before rank 1 aborts)
    float* other = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&other), count * 4) == cudaSuccess);
    std::vector<ccResult_t> first(2, ccInternalError);
    RunRanks(2, [&](int r) {
      first[r] = ccAllReduce(r == 0 ? dev : other, r == 0 ? dev : other, count, ccFloat32, ccSum, nullptr, g[r], st[r]);
      cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(st[r]));
    });
    REQUIRE(first[0] == ccSuccess);
    REQUIRE(first[1] == ccSuccess);
    cudaFree(other);
  }
  // Rank 0 queues a call that rank 1 never makes; rank 1 aborts instead.
  REQUIRE(ccAllReduce(dev, dev, count, ccFloat32, ccSum, nullptr, g[0], st[0]) == ccSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(ccCommAbort(g.comms[1]) == ccSuccess);
  g.comms[1] = nullptr;
  const auto start = std::chrono::steady_clock::now();
  CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(st[0])) == cudaSuccess);  // released, not hung
  INFO("released after " << cctest::SecondsSince(start) << " s");
  ccResult_t async = ccSuccess;
  CHECK(ccCommGetAsyncError(g[0], &async) == ccSuccess);
  CHECK(async != ccSuccess);
  CHECK(ccAllReduce(dev, dev, count, ccFloat32, ccSum, nullptr, g[0], st[0]) != ccSuccess);
  cudaFree(dev);
}

#ifdef CCOLL_FAKE_CUDA
// Kernels that do not finish (the fake holds them): the proxy's waits for its own streams end at the communicator's
// timeout, the call fails with ccTimeout, and the caller's stream is released instead of hanging. Exact (the
// reduction kernels on the communicator's stream) and 4-bit requant (the codec's kernels on its own stream).
TEST_CASE("[gpu] device kernels that do not finish: a timeout error within CC_TIMEOUT_MS, the stream released",
          "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  for (const char* spec : {static_cast<const char*>(nullptr), "quant:bits=4,mode=requant"}) {
    INFO((spec ? spec : "exact"));
    const int n = 2;
    ccConfig_t config = CC_CONFIG_INITIALIZER;
    config.timeoutMs = cctest::ScaledMs(2000);  // the first call, not held, must fit in it
    config.cudaDev = 0;
    Group g = Group::InitConfig(n, config);
    REQUIRE(g.status == ccSuccess);
    const std::vector<ccComm_t>& comms = g.comms;
    std::unique_ptr<Compressors> cs;
    if (spec != nullptr) {
      cs = std::make_unique<Compressors>(spec, n);
      REQUIRE(cs->status == ccSuccess);
    }
    Streams st(n);
    const size_t count = 1 << 16;
    std::vector<float*> dev(n);
    for (int r = 0; r < n; ++r) {
      REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dev[r]), count * 4) == cudaSuccess);
      REQUIRE(cudaMemset(dev[r], 0, count * 4) == cudaSuccess);
    }
    // One call first, so that the device is prepared (kernels loaded) and the scratch made, then the held one.
    for (bool hold : {false, true}) {
      cctest::FakeHoldKernels(hold);
      std::vector<RankResult> rc(n);
      const auto start = std::chrono::steady_clock::now();
      RunRanks(n, [&](int r) {
        cudaSetDevice(0);
        rc[r] = Record(ccAllReduce(dev[r], dev[r], count, ccFloat32, ccSum, cs ? (*cs)[r] : nullptr, comms[r], st[r]),
                       comms[r]);
        // Released by the proxy after its timeout: this returns although the held kernels have not run.
        CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(st[r])) == cudaSuccess);
      });
      const double seconds = cctest::SecondsSince(start);
      cctest::FakeHoldKernels(false);
      INFO((hold ? "held" : "not held") << ", released after " << seconds << " s");
      for (int r = 0; r < n; ++r) {
        CHECK(rc[r].rc == ccSuccess);  // queued
        ccResult_t async = ccSuccess;
        CHECK(ccCommGetAsyncError(comms[r], &async) == ccSuccess);
        if (!hold) {
          CHECK(async == ccSuccess);
          continue;
        }
        CHECK(seconds < 20.0 * cctest::TimeScale());
        // The rank whose wait timed out has ccTimeout; its peer may fail first on the exchange that follows.
        const std::string err = CommLastError(comms[r]);
        INFO("rank " << r << ": " << err);
        CHECK(async != ccSuccess);
        if (async == ccTimeout && err.find("did not finish within") != std::string::npos) {
          CHECK(err.find("CC_TIMEOUT_MS") != std::string::npos);
        }
      }
    }
    bool someTimedOut = false;
    for (int r = 0; r < n; ++r) {
      someTimedOut = someTimedOut || Contains(CommLastError(comms[r]), "did not finish within " +
                                                                       std::to_string(cctest::ScaledMs(2000)) + " ms");
    }
    CHECK(someTimedOut);
    // The held kernels run once released, on ccoll's streams: the communicators (their schedules' stream) and the
    // compressors (their codecs' stream) wait for them as they go, and only then are the buffers freed.
    for (int r = 0; r < n; ++r) cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(st[r]));
    for (int r = 0; r < n; ++r) ccCommAbort(comms[r]);
    g.comms.clear();  // (aborted)
    cs.reset();
    for (int r = 0; r < n; ++r) cudaFree(dev[r]);
  }
}

// A device lost during device calls, as after a kernel's fault (an Xid): from then on every CUDA call fails, with an
// error that cudaGetLastError does not take off, and what was queued never runs. Every rank's call must end in an
// error well within CC_TIMEOUT_MS (none hangs, none reports success; a rank that met the loss tells the peers that
// wait for its messages), name the CUDA failure, and fail its communicator:
// a later call fails at once, and abort and destroy return at once. The fake runtime loses its device while the
// calls' kernels are held (so that no call can have finished), right after the ranks queued their calls or a few
// milliseconds later (the proxies then wait in the middle of the schedule), for an exact call and each codec family.
TEST_CASE("[gpu] a device lost during device calls: every rank fails within CC_TIMEOUT_MS, and nothing hangs",
          "[gpu][lost]") {
  SKIP_WITHOUT_DEVICE();
  struct GiveBackTheDevice {
    ~GiveBackTheDevice() {
      cctest::FakeHoldKernels(false);
      cctest::FakeLoseDevice(false);
    }
  } giveBack;
  const int n = 3;
  const int timeoutMs = cctest::ScaledMs(3000);
  for (const char* spec : {static_cast<const char*>(nullptr), "quant:bits=4,mode=requant", "topk:density=0.1",
                           "powersgd:rank=2,rows=256,cols=128"}) {
    for (int delayMs : {0, 5}) {
      INFO((spec ? spec : "exact") << ", the device lost " << delayMs << " ms after the calls were queued");
      ccConfig_t config = CC_CONFIG_INITIALIZER;
      config.timeoutMs = timeoutMs;
      config.cudaDev = 0;
      Group g = Group::InitConfig(n, config);
      REQUIRE(g.status == ccSuccess);
      const std::vector<ccComm_t>& comms = g.comms;
      std::unique_ptr<Compressors> cs;
      if (spec != nullptr) {
        cs = std::make_unique<Compressors>(spec, n);
        if (cs->status != ccSuccess && Contains(cs->error, "BLAS")) {
          WARN("not run for " << spec << ": " << cs->error);
          continue;
        }
        REQUIRE(cs->status == ccSuccess);
      }
      Streams st(n);
      const size_t count = 256 * 128;
      std::vector<float*> dev(n);
      for (int r = 0; r < n; ++r) {
        REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dev[r]), count * 4) == cudaSuccess);
        REQUIRE(cudaMemset(dev[r], 0, count * 4) == cudaSuccess);
      }
      auto call = [&](int r) {
        return ccAllReduce(dev[r], dev[r], count, ccFloat32, ccSum, cs ? (*cs)[r] : nullptr, comms[r], st[r]);
      };
      // A first call that runs: the device prepared, the scratch made.
      std::vector<RankResult> first(n);
      RunRanks(n, [&](int r) {
        first[r] = Record(call(r), comms[r]);
        if (first[r].rc == ccSuccess && cudaStreamSynchronize(st.s[static_cast<size_t>(r)]) != cudaSuccess) {
          first[r].rc = ccUnhandledCudaError;
        }
      });
      for (int r = 0; r < n; ++r) REQUIRE(first[r].rc == ccSuccess);

      cctest::FakeHoldKernels(true);
      std::vector<RankResult> rc(n);
      std::vector<cudaError_t> synced(n, cudaSuccess);
      std::atomic<int> queued{0};
      const auto start = std::chrono::steady_clock::now();
      std::thread loser([&] {
        cctest::WaitUntil([&] { return queued.load() == n; }, 20000);
        std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
        cctest::FakeLoseDevice(true);
      });
      RunRanks(n, [&](int r) {
        rc[r] = Record(call(r), comms[r]);
        ++queued;
        synced[r] = cudaStreamSynchronize(st.s[static_cast<size_t>(r)]);
      });
      loser.join();
      std::vector<ccResult_t> async(n, ccSuccess);
      for (int r = 0; r < n; ++r) {
        // The proxy learns of the loss at its next CUDA call or wait: within CC_TIMEOUT_MS at the latest.
        cctest::WaitUntil(
            [&] { return ccCommGetAsyncError(comms[r], &async[r]) != ccSuccess || async[r] != ccSuccess; }, 2 * 3000);
      }
      // Well within CC_TIMEOUT_MS: the loss is an error at the next CUDA call, not a wait that runs out.
      const double seconds = cctest::SecondsSince(start);
      CHECK(seconds < 0.5 * timeoutMs / 1000.0);
      for (int r = 0; r < n; ++r) {
        const std::string err = rc[r].rc != ccSuccess ? rc[r].error : CommLastError(comms[r]);
        INFO("rank " << r << ": call " << rc[r].rc << ", stream " << synced[r] << ", async " << async[r] << ": "
                     << err);
        CHECK(synced[r] == cudaErrorLaunchFailure);  // the caller's stream reports the loss, sticky
        // Its call or its communicator fails: with CUDA's error where the rank met the loss itself, or with
        // ccRemoteError where a peer that met it first told it (a rank waiting for a peer's message makes no CUDA
        // call); either way the sentence names the launch failure. Never ccTimeout, never success.
        const ccResult_t code = rc[r].rc != ccSuccess ? rc[r].rc : async[r];
        CHECK((code == ccUnhandledCudaError || code == ccRemoteError));
        CHECK(Contains(err, "launch failure"));
      }
      // The communicators are done: a later call fails at once, abort and destroy return at once.
      for (int r = 0; r < n; ++r) {
        const auto t = std::chrono::steady_clock::now();
        CHECK(call(r) != ccSuccess);
        CHECK(cctest::SecondsSince(t) < 1.0 * cctest::TimeScale());
      }
      const auto t = std::chrono::steady_clock::now();
      for (int r = 0; r < n; ++r) CHECK((r == 0 ? ccCommAbort(comms[r]) : ccCommDestroy(comms[r])) == ccSuccess);
      g.comms.clear();  // (destroyed)
      CHECK(cctest::SecondsSince(t) < 1.0 * cctest::TimeScale());
      cs.reset();  // (its destroy waits for no stream that cannot finish)
      cctest::FakeHoldKernels(false);
      cctest::FakeLoseDevice(false);
      for (int r = 0; r < n; ++r) cudaFree(dev[r]);
    }
  }
}
#endif

TEST_CASE("[gpu] a compressor destroyed right after its device call outlives the call", "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 2;
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  const size_t count = 100000;
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 77);
  Compressors ref("quant:bits=4,mode=requant", n, 3);
  REQUIRE(ref.status == ccSuccess);
  Outcome host = OnHost(g, in, count * 4, [&](int r, const void* s, void* d, ccStream_t) {
    return ccAllReduce(s, d, count, ccFloat32, ccAvg, ref[r], g[r], nullptr);
  });
  REQUIRE(host.Failure() == "");
  Outcome dev = OnDevice(g, st, in, count * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
    ccCompressor_t c = nullptr;
    ccResult_t rc = ccCompressorCreateFromString(&c, "quant:bits=4,mode=requant,seed=3");
    if (rc == ccSuccess) rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, c, g[r], stream);
    ccCompressorDestroy(c);  // waits for the queued call that uses it
    return rc;
  });
  REQUIRE(dev.Failure() == "");
  for (int r = 0; r < n; ++r) CHECK(FirstDifference(dev.out[r], host.out[r]) == "");
}

// cuBLAS's guide: destroying a handle synchronizes the device. With thread ranks on one GPU, a rank that destroys a
// PowerSGD compressor (and so its cuBLAS handle) while another rank's stream waits in a call that needs this rank's
// next call would wait for that stream forever. ccoll keeps the handles for later compressors instead (the fake
// cuBLAS's cublasDestroy synchronizes the device, and aborts where a GPU would hang).
// One PowerSGD compressor per DDP bucket: more compressors alive than communicators. Rank 1 queues its first call of
// a new compressor (its stream waits for rank 0) before rank 0 makes its own first call of it: rank 0's handle must
// come from the pool, since making one may synchronize the device (FAKE_CUDA_STRICT=cublascreate in ctest's strict
// run aborts if it is made then).
TEST_CASE("[gpu] a PowerSGD compressor's first call while another rank's call waits for this rank", "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 2, buckets = 3;
  const int64_t rows = 96, cols = 80;
  const size_t count = static_cast<size_t>(rows * cols);
  const char* spec = "powersgd:rank=2,rows=96,cols=80,seed=9";
  std::vector<std::unique_ptr<Compressors>> bucket;
  for (int b = 0; b < buckets; ++b) {
    bucket.push_back(std::make_unique<Compressors>(spec, n));
    if (bucket.back()->status != ccSuccess) {
      WARN("not run: this build refuses powersgd (no BLAS): " << bucket.back()->error);
      return;
    }
  }
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 57);
  const bool waitsOnHost = FirstCallsWaitOnHost();
  std::atomic<int> rank1Queued{-1};
  Outcome dev = OnDevice(g, st, in, count * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
    // Bucket 0 first, on both ranks: its compressors hold what their first call made.
    ccResult_t rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, (*bucket[0])[r], g[r], stream);
    if (rc != ccSuccess) return rc;
    if (cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)) != cudaSuccess) return ccUnhandledCudaError;
    for (int b = 1; b < buckets; ++b) {
      if (r == 1) {
        // Its stream now waits for rank 0's call of bucket b (without memory pools, this first call of its shape
        // returns only once rank 0 has made its own, so it says so before).
        if (waitsOnHost) rank1Queued = b;
        rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, (*bucket[static_cast<size_t>(b)])[r], g[r], stream);
        rank1Queued = b;
      } else {
        // (Not for ever: rank 1 may have failed before it queued.)
        if (!cctest::WaitUntil([&] { return rank1Queued.load() == b; }, 60000)) return ccInternalError;
        rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, (*bucket[static_cast<size_t>(b)])[r], g[r], stream);
      }
      if (rc != ccSuccess) return rc;
      if (cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)) != cudaSuccess) return ccUnhandledCudaError;
    }
    return ccSuccess;
  });
  REQUIRE(dev.Failure() == "");
  CHECK(FirstDifference(dev.out[1], dev.out[0]) == "");
  std::vector<float> out(count);
  std::memcpy(out.data(), dev.out[0].data(), count * 4);
  for (float v : out) REQUIRE(std::isfinite(v));
}

// cuBLAS chooses a product's kernels by its operands' alignment too, and loads them lazily (a load may synchronize the
// context): a PowerSGD call whose buffers are aligned otherwise than any call of its compressor before must have its
// products run once before its stream waits (collectives/device_compressed.h, PrimeDeviceCodec). The fake cuBLAS
// loads per alignment, and with FAKE_CUDA_STRICT=cublas (ctest's strict entries) a load while the stream waits
// aborts. From the second call on, rank 1 (whose buffers move) calls first and rank 0 once rank 1's call has returned:
// rank 1's stream then waits for rank 0 while rank 1's proxy runs the products. (A rank that primes while another
// rank's stream on the GPU waits is not covered: README, "Device buffers".)
TEST_CASE("[gpu] a PowerSGD device call on buffers aligned otherwise than its compressor's earlier calls",
          "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 2;
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  // M is the error-feedback memory (ef=1, the default) or the input (ef=0); 97 x 81 floats are not a whole number of
  // 256-byte blocks (the product's output lies past M in the priming's block).
  for (const auto& sc : {std::pair<const char*, size_t>{"powersgd:rank=2,rows=96,cols=80", 96 * 80},
                         std::pair<const char*, size_t>{"powersgd:rank=2,rows=97,cols=81,ef=0", 97 * 81}}) {
    const char* spec = sc.first;
    const size_t count = sc.second;
    Compressors hostComps(spec, n, 4), devComps(spec, n, 4);
    if (devComps.status != ccSuccess) {
      WARN("not run: this build refuses powersgd (no BLAS): " << devComps.error);
      return;
    }
    REQUIRE(hostComps.status == ccSuccess);
    // Rank 1's buffers start 0, 4, 260 and again 4 bytes into their allocations: 16-byte aligned, not, not (the same
    // 256-byte offset as 4), not.
    const size_t shifts[] = {0, 4, 260, 4};
    for (int call = 0; call < 4; ++call) {
      INFO(spec << ", call " << call << ", rank 1's buffers " << shifts[call] << " bytes in");
      const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 31 + call);
      Outcome host = OnHost(g, in, count * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
        return ccAllReduce(s, d, count, ccFloat32, ccAvg, hostComps[r], g[r], stream);
      });
      const bool noHostResult = NoCpuBlas(host);  // then the device results must agree across ranks
      if (!noHostResult) REQUIRE(host.Failure() == "");
      std::atomic<bool> rank1Returned{false};
      bool rank1First = false;
      Outcome dev = OnDevice(
          g, st, in, count * 4,
          [&](int r, const void* s, void* d, ccStream_t stream) {
            if (r == 0 && call > 0) rank1First = cctest::WaitUntil([&] { return rank1Returned.load(); }, 10000);
            const ccResult_t rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, devComps[r], g[r], stream);
            if (r == 1) rank1Returned = true;
            return rc;
          },
          false, 0, shifts[call]);
      if (NoCpuBlas(dev)) return;  // staged (CC_DEVICE_KERNELS=0) and no CPU BLAS either
      REQUIRE(dev.Failure() == "");
      if (call > 0) CHECK(rank1First);
      if (noHostResult) {
        CHECK(FirstDifference(dev.out[1], dev.out[0]) == "");
      } else {
        CHECK(Agrees(dev.out, host.out, SameBytesAsHost(spec)) == "");
      }
    }
  }
}

// The same, where the call on buffers at new offsets is made while the compressor's call before it is still queued:
// the proxy thread owns the compressor's device state then, so the priming waits on the host for that call to be done
// (as a first call of a shape without pools does). Both ranks make one call first, on buffers at offset 0; then rank 1
// makes a call on them and, without waiting, one on buffers 4 bytes in, while that first call cannot have run: rank 0
// makes its part only once rank 1 waits in its second call (on the fake runtime, where ccoll::PrimingWaits tells and
// is checked; on a GPU, once rank 1's first call has returned, which leaves rank 1 the race by far). Rank 0's two
// calls use its aligned buffers, and its second follows rank 1's second.
// Kernels: rank 1 primes right after its first call has run on its proxy, when rank 0's stream may still wait for
// rank 0's proxy. A kernel load then (which may synchronize the device) is the case of a rank that loads while another
// thread rank's stream waits, which the README leaves uncovered. So other compressors of the spec run once at the new
// offsets first, on both ranks at once, and load every kernel; the wait is what this case checks (PrimingWaits), and
// "aligned otherwise" above checks that a priming at new offsets loads what the call needs.
TEST_CASE("[gpu] a PowerSGD device call on buffers at new offsets while its compressor's call before is queued",
          "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 2;
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  for (const auto& sc : {std::pair<const char*, size_t>{"powersgd:rank=2,rows=94,cols=78", 94 * 78},
                         std::pair<const char*, size_t>{"powersgd:rank=2,rows=95,cols=79,ef=0", 95 * 79}}) {
    const char* spec = sc.first;
    const size_t count = sc.second;
    INFO(spec);
    Compressors hostComps(spec, n, 4), devComps(spec, n, 4);
    if (devComps.status != ccSuccess) {
      WARN("not run: this build refuses powersgd (no BLAS): " << devComps.error);
      return;
    }
    REQUIRE(hostComps.status == ccSuccess);
    // count + 1 elements: rank 1's second call reads and writes elements 1..count (4 bytes in), its others 0..count-1.
    const std::vector<Bytes> first = Inputs(n, count, ccFloat32, 41), in = Inputs(n, count + 1, ccFloat32, 42);
    const auto second = [count](int r, const void* s, void* d) {
      const size_t at = r == 1 ? sizeof(float) : 0;
      return std::make_pair(static_cast<const char*>(s) + at, static_cast<char*>(d) + at);
    };
    Outcome host = OnHost(g, first, count * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
      return ccAllReduce(s, d, count, ccFloat32, ccAvg, hostComps[r], g[r], stream);
    });
    const bool noHostResult = NoCpuBlas(host);  // then the device results must agree across ranks
    if (!noHostResult) {
      REQUIRE(host.Failure() == "");
      host = OnHost(g, in, (count + 1) * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
        const ccResult_t rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, hostComps[r], g[r], stream);
        if (rc != ccSuccess) return rc;
        const auto b = second(r, s, d);
        return ccAllReduce(b.first, b.second, count, ccFloat32, ccAvg, hostComps[r], g[r], stream);
      });
      REQUIRE(host.Failure() == "");
    }
    {  // the kernels at the new offsets: every rank 4 bytes in, with compressors of their own
      Compressors loaders(spec, n, 4);
      REQUIRE(loaders.status == ccSuccess);
      const Outcome loaded =
          OnDevice(g, st, in, (count + 1) * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
            const auto b = second(1, s, d);
            return ccAllReduce(b.first, b.second, count, ccFloat32, ccAvg, loaders[r], g[r], stream);
          });
      if (NoCpuBlas(loaded)) return;  // staged (CC_DEVICE_KERNELS=0) and no CPU BLAS either
      REQUIRE(loaded.Failure() == "");
    }
    Outcome dev = OnDevice(g, st, first, count * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
      return ccAllReduce(s, d, count, ccFloat32, ccAvg, devComps[r], g[r], stream);
    });
    REQUIRE(dev.Failure() == "");
    std::atomic<bool> firstReturned{false}, secondReturned{false};
    bool ordered = true;
#ifdef CCOLL_FAKE_CUDA
    const uint64_t waitsBefore = ccoll::PrimingWaits();
#endif
    dev = OnDevice(g, st, in, (count + 1) * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
      if (r == 0 && !cctest::WaitUntil([&] { return firstReturned.load(); }, 60000)) ordered = false;
#ifdef CCOLL_FAKE_CUDA
      // (Without the wait it never comes: rank 0 goes ahead after 10 s, and the check below fails. Staged calls run
      // no product on the device and prime nothing.)
      if (r == 0 && DeviceCodecsOn(spec) &&
          !cctest::WaitUntil([&] { return ccoll::PrimingWaits() > waitsBefore; }, 10000)) {
        ordered = false;
      }
#endif
      ccResult_t rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, devComps[r], g[r], stream);
      if (r == 1) firstReturned = true;
      if (rc != ccSuccess) return rc;
      if (r == 0 && !cctest::WaitUntil([&] { return secondReturned.load(); }, 60000)) ordered = false;
      const auto b = second(r, s, d);
      rc = ccAllReduce(b.first, b.second, count, ccFloat32, ccAvg, devComps[r], g[r], stream);
      if (r == 1) secondReturned = true;
      return rc;
    });
    REQUIRE(dev.Failure() == "");
    CHECK(ordered);
#ifdef CCOLL_FAKE_CUDA
    CHECK(ccoll::PrimingWaits() == waitsBefore + (DeviceCodecsOn(spec) ? 1 : 0));
#endif
    // Each rank's second result (rank 1's 4 bytes in), which its two calls' error feedback and warm start shaped.
    const auto secondResult = [&](const std::vector<Bytes>& out) {
      std::vector<Bytes> v;
      for (int r = 0; r < n; ++r) {
        const auto at = out[r].begin() + (r == 1 ? 4 : 0);
        v.emplace_back(at, at + static_cast<std::ptrdiff_t>(count * 4));
      }
      return v;
    };
    const std::vector<Bytes> devSecond = secondResult(dev.out);
    if (noHostResult) {
      CHECK(FirstDifference(devSecond[1], devSecond[0]) == "");
    } else {
      CHECK(Agrees(devSecond, secondResult(host.out), SameBytesAsHost(spec)) == "");
    }
    CHECK(std::all_of(dev.out[0].begin() + static_cast<std::ptrdiff_t>(count * 4), dev.out[0].end(),
                      [](char b) { return b == '\x5a'; }));  // past rank 0's results: the poison, untouched
  }
}

TEST_CASE("[gpu] destroying a PowerSGD compressor while another rank's call waits for this rank", "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  // Also without host memory pools (ctest runs it so on the fake): the destroyed compressor's pinned scratch came from
  // cudaHostAlloc, and the destroy keeps its blocks for later allocations instead of calling cudaFreeHost, which
  // synchronizes the device (the fake's does: it would wait for rank 1's stream, which waits for rank 0). Each
  // compressor makes one call on both ranks first, so that rank 1's call below is not the first of its shape (which
  // would return only once run, with no stream held, where ccoll has no pools).
  const int n = 2;
  const int64_t rows = 120, cols = 100;
  const size_t count = static_cast<size_t>(rows * cols);
  const char* spec = "powersgd:rank=2,rows=120,cols=100,seed=5";
  Compressors first(spec, n), second(spec, n);
  if (first.status != ccSuccess) {
    WARN("not run: this build refuses powersgd (no BLAS): " << first.error);
    return;
  }
  REQUIRE(second.status == ccSuccess);
  Group g = DeviceGroup(n);
  REQUIRE(g.status == ccSuccess);
  Streams st(n);
  const std::vector<Bytes> in = Inputs(n, count, ccFloat32, 91);
  std::atomic<bool> rank1Waiting{false};
  std::vector<ccResult_t> destroyed(static_cast<size_t>(n), ccSuccess);
  Outcome dev = OnDevice(g, st, in, count * 4, [&](int r, const void* s, void* d, ccStream_t stream) {
    for (ccCompressor_t c : {first[r], second[r]}) {
      const ccResult_t rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, c, g[r], stream);
      if (rc != ccSuccess) return rc;
      if (cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)) != cudaSuccess) return ccUnhandledCudaError;
    }
    ccResult_t rc = ccSuccess;
    if (r == 1) {
      rc = ccAllReduce(s, d, count, ccFloat32, ccAvg, second[r], g[r], stream);  // waits on the stream for rank 0
      rank1Waiting = true;
      return rc;
    }
    if (!cctest::WaitUntil([&] { return rank1Waiting.load(); }, 60000)) return ccInternalError;  // rank 1 failed
    destroyed[0] = ccCompressorDestroy(first.c[0]);
    first.c[0] = nullptr;
    return ccAllReduce(s, d, count, ccFloat32, ccAvg, second[r], g[r], stream);
  });
  REQUIRE(dev.Failure() == "");
  CHECK(destroyed[0] == ccSuccess);
  CHECK(FirstDifference(dev.out[1], dev.out[0]) == "");
  std::vector<float> out(count);
  std::memcpy(out.data(), dev.out[0].data(), count * 4);
  for (float v : out) REQUIRE(std::isfinite(v));
}

TEST_CASE("[gpu] a refusal met by a peer's device call: later calls fail at once on both ranks",
          "[gpu][device][args]") {
  SKIP_WITHOUT_DEVICE();
  if (!cctest::CallCheckOn()) return;  // the refusal travels in the call check
  const int n = 2;
  const size_t count = 1024;
  Group g;
  g.comms.assign(n, nullptr);
  {
    ccUniqueId id;
    REQUIRE(ccGetUniqueId(&id) == ccSuccess);
    std::vector<ccResult_t> rc(n);
    RunRanks(n, [&](int r) {
      ccConfig_t c = cctest::MakeConfig(CC_CONFIG_UNDEF_INT, cctest::ScaledMs(4000));
      c.cudaDev = 0;
      rc[r] = ccCommInitRankConfig(&g.comms[r], n, id, r, &c);
    });
    REQUIRE(rc[0] == ccSuccess);
    REQUIRE(rc[1] == ccSuccess);
  }
  Streams st(n);
  float* dev = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dev), count * 4) == cudaSuccess);
  std::vector<std::vector<float>> host(n, std::vector<float>(count, 1.0f));
  std::vector<RankResult> results(n);
  // Rank 0 refuses (recvbuff NULL); rank 1's device call learns it in the call check, on its proxy: its
  // communicator fails (its stream is released without a result), but in step.
  RunRanks(n, [&](int r) {
    if (r == 0) {
      results[r] = Record(ccAllReduce(host[0].data(), nullptr, count, ccFloat32, ccSum, nullptr, g[0], nullptr), g[0]);
    } else {
      results[r] = Record(ccAllReduce(dev, dev, count, ccFloat32, ccSum, nullptr, g[1], st[1]), g[1]);
      cudaStreamSynchronize(st.s[1]);
    }
  });
  CHECK(results[0].rc == ccInvalidArgument);
  ccResult_t async = ccSuccess;
  REQUIRE(ccCommGetAsyncError(g[1], &async) == ccSuccess);
  CHECK(async == ccInvalidUsage);
  // Then both make good host calls, twice: rank 1 refuses them (its communicator failed), and rank 0 learns it at
  // once each time instead of waiting 4 s for rank 1.
  for (int round = 0; round < 2; ++round) {
    std::vector<double> seconds(n);
    RunRanks(n, [&](int r) {
      const auto start = std::chrono::steady_clock::now();
      results[r] = Record(ccAllReduce(host[r].data(), host[r].data(), count, ccFloat32, ccSum, nullptr, g[r], nullptr),
                          g[r]);
      seconds[r] = cctest::SecondsSince(start);
    });
    INFO("round " << round << ": rank 0: " << results[0].error << "; rank 1: " << results[1].error);
    CHECK(results[1].rc == ccInvalidUsage);
    CHECK(Contains(results[1].error, "failed earlier"));
    CHECK(results[0].rc == ccInvalidUsage);
    CHECK(Contains(results[0].error, "rank 1 refused the call"));
    CHECK(seconds[0] < 2.0 * cctest::TimeScale());
    CHECK(seconds[1] < 2.0 * cctest::TimeScale());
    for (float x : host[0]) CHECK(x == 1.0f);
  }
  cudaFree(dev);
}

// Rank 0's device call (result `queued`) was queued, and its proxy learned of rank 1's refusal in the call check: the
// communicator failed in step with the refusal's sentence.
void CheckToldOfRefusal(const Group& g, const RankResult& queued) {
  CHECK(queued.rc == ccSuccess);
  ccResult_t async = ccSuccess;
  REQUIRE(ccCommGetAsyncError(g[0], &async) == ccSuccess);
  CHECK(async == ccInvalidUsage);
  CHECK(Contains(CommLastError(g[0]), "rank 1 refused the call"));
}

// Two ranks bound to device 0 with the given transport and a 4 s timeout (scaled under a sanitizer).
Group TwoDeviceRanks(int transport) {
  Group g;
  g.comms.assign(2, nullptr);
  ccUniqueId id;
  REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  std::vector<ccResult_t> rc(2);
  RunRanks(2, [&](int r) {
    ccConfig_t c = cctest::MakeConfig(CC_CONFIG_UNDEF_INT, cctest::ScaledMs(4000));
    c.cudaDev = 0;
    c.transport = transport;
    rc[r] = ccCommInitRankConfig(&g.comms[r], 2, id, r, &c);
  });
  REQUIRE(rc[0] == ccSuccess);
  REQUIRE(rc[1] == ccSuccess);
  return g;
}

TEST_CASE("[gpu] a device call refused inside a capture: the capture intact, the peer told in the call check",
          "[gpu][device][args]") {
  SKIP_WITHOUT_DEVICE();
  if (!cctest::CallCheckOn()) return;  // the refusal travels in the call check
  // Rank 1's first device call on its communicator is captured: it is refused before anything a capture forbids
  // (preparing the device or a codec allocates and synchronizes), so the capture ends cleanly; rank 0's queued call
  // learns of the refusal in the call check (its communicator fails in step) instead of waiting for rank 1 until the
  // timeout. The device is prepared first (by a one-rank call), so that rank 0's preparation does not run while rank
  // 1's stream captures.
  const size_t count = 4096;
  Streams st(2);
  std::vector<float*> dev(2, nullptr);
  for (float*& d : dev) REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), count * 4) == cudaSuccess);
  {
    Group one = DeviceGroup(1);
    REQUIRE(one.status == ccSuccess);
    REQUIRE(ccAllReduce(dev[0], dev[0], count, ccFloat32, ccSum, nullptr, one[0], st[0]) == ccSuccess);
    REQUIRE(cudaStreamSynchronize(st.s[0]) == cudaSuccess);
  }
  Group g = TwoDeviceRanks(ccTransportLocal);
  std::vector<RankResult> results(2);
  cudaError_t captureEnd = cudaErrorUnknown;
  RunRanks(2, [&](int r) {
    if (r == 1 && cudaStreamBeginCapture(st.s[1], cudaStreamCaptureModeThreadLocal) != cudaSuccess) return;
    results[r] = Record(ccAllReduce(dev[r], dev[r], count, ccFloat32, ccSum, nullptr, g[r], st[r]), g[r]);
    if (r == 1) {
      cudaGraph_t graph = nullptr;
      captureEnd = cudaStreamEndCapture(st.s[1], &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
    cudaStreamSynchronize(st.s[r]);
  });
  INFO("rank 0: " << results[0].error << "; rank 1: " << results[1].error);
  CHECK(results[1].rc == ccInvalidUsage);
  CHECK(Contains(results[1].error, "captured into a CUDA graph"));
  CHECK(captureEnd == cudaSuccess);
  CheckToldOfRefusal(g, results[0]);
  for (float* d : dev) cudaFree(d);
}

#if defined(CCOLL_HAVE_UCX) && defined(CCOLL_FAKE_CUDA)
TEST_CASE("[gpu] staging that cannot be allocated on one rank: the peer told in the call check",
          "[gpu][device][args]") {
  SKIP_WITHOUT_DEVICE();
  if (!cctest::CallCheckOn()) return;  // the refusal travels in the call check
  // Over UCX exact device calls are staged through host memory. Rank 1's staging cannot grow (the fake runtime fails
  // its thread's next allocation): the call is refused before it is queued, and rank 0's queued call learns it in
  // the call check instead of waiting for rank 1 until the timeout.
  const size_t small = 1024, large = size_t{1} << 20;
  Group g = TwoDeviceRanks(ccTransportUcx);
  Streams st(2);
  std::vector<float*> dev(2, nullptr);
  for (float*& d : dev) REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), large * 4) == cudaSuccess);
  std::vector<RankResult> results(2);
  RunRanks(2, [&](int r) {  // the device prepared and staging for `small` made
    cudaMemsetAsync(dev[r], 0, large * 4, st.s[r]);
    results[r] = Record(ccAllReduce(dev[r], dev[r], small, ccFloat32, ccSum, nullptr, g[r], st[r]), g[r]);
    cudaStreamSynchronize(st.s[r]);
  });
  REQUIRE(results[0].rc == ccSuccess);
  REQUIRE(results[1].rc == ccSuccess);
  RunRanks(2, [&](int r) {
    if (r == 1) cctest::FakeFailAllocations(1);
    results[r] = Record(ccAllReduce(dev[r], dev[r], large, ccFloat32, ccSum, nullptr, g[r], st[r]), g[r]);
    cctest::FakeFailAllocations(0);
    cudaStreamSynchronize(st.s[r]);
  });
  INFO("rank 0: " << results[0].error << "; rank 1: " << results[1].error);
  CHECK(results[1].rc == ccUnhandledCudaError);
  CheckToldOfRefusal(g, results[0]);
  for (float* d : dev) cudaFree(d);
}
#endif

TEST_CASE("[gpu] abort and destroy do not wait for a held stream past the timeout, and the stream completes later",
          "[gpu][device]") {
  SKIP_WITHOUT_DEVICE();
  // Rank 0's stream is held by earlier work when its call is queued. An abort returns at once, a destroy after at most
  // CC_TIMEOUT_MS (4 s here, scaled under a sanitizer), both while the stream is still held (the call is skipped; its staging and wait word are
  // left to the stream, not freed); the stream, released later, runs to its end.
  const size_t count = 4096;
  for (bool abort : {true, false}) {
    INFO((abort ? "ccCommAbort" : "ccCommDestroy"));
    Group g = TwoDeviceRanks(ccTransportLocal);
    Streams st(2);
    std::vector<float*> dev(2, nullptr);
    for (float*& d : dev) REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), count * 4) == cudaSuccess);
    RunRanks(2, [&](int r) {  // a first call: the device prepared, the staging made
      cudaMemsetAsync(dev[r], 0, count * 4, st.s[r]);
      ccAllReduce(dev[r], dev[r], count, ccFloat32, ccSum, nullptr, g[r], st[r]);
      cudaStreamSynchronize(st.s[r]);
    });
    // Static: the host function reads it until it is set, also after a failed REQUIRE has left the case, which sets
    // it on the way out.
    static std::atomic<bool> release;
    release = false;
    struct ReleaseOnExit {
      ~ReleaseOnExit() { release = true; }
    } releaseOnExit;
    REQUIRE(cudaLaunchHostFunc(st.s[0], cctest::HoldUntil, &release) == cudaSuccess);
    REQUIRE(ccAllReduce(dev[0], dev[0], count, ccFloat32, ccSum, nullptr, g[0], st[0]) == ccSuccess);
    std::thread safety([&] {  // a hung abort or destroy fails the check below instead of the whole run
      for (int ms = 0; ms < cctest::ScaledMs(20000) && !release.load(); ms += 10) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      release = true;
    });
    CHECK((abort ? ccCommAbort(g[0]) : ccCommDestroy(g[0])) == ccSuccess);
    CHECK(!release.load());  // returned while the stream was still held
    // Rank 1's stream is idle: its staging is freed, without synchronizing the device (which would wait for rank 0's
    // held stream), with host memory pools or without.
    CHECK(ccCommAbort(g[1]) == ccSuccess);
    CHECK(!release.load());
    g.comms.clear();
    release = true;
    CHECK(cudaStreamSynchronize(st.s[0]) == cudaSuccess);
    safety.join();
    for (float* d : dev) cudaFree(d);
  }
}

TEST_CASE("[gpu] one rank's compressor serves two of its communicators back to back on one stream",
          "[gpu][device][codec]") {
  SKIP_WITHOUT_DEVICE();
  const int n = 2;
  Group a = DeviceGroup(n), b = DeviceGroup(n);
  REQUIRE(a.status == ccSuccess);
  REQUIRE(b.status == ccSuccess);
  Streams st(n);
  const size_t count = 1 << 14;
  Compressors comps("quant:bits=4", n, 3);
  REQUIRE(comps.status == ccSuccess);
  std::vector<float*> dev(n, nullptr);
  for (auto& d : dev) REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), count * 4) == cudaSuccess);
  std::vector<RankResult> results(n);
  RunRanks(n, [&](int r) {
    ccResult_t rc = ccSuccess;
    for (int i = 0; i < 10 && rc == ccSuccess; ++i) {
      rc = ccAllReduce(dev[r], dev[r], count, ccFloat32, ccAvg, comps[r], a[r], st[r]);
      if (rc == ccSuccess) rc = ccAllReduce(dev[r], dev[r], count, ccFloat32, ccAvg, comps[r], b[r], st[r]);
    }
    results[r] = Record(rc, rc == ccSuccess ? nullptr : a[r]);
    cudaStreamSynchronize(st.s[r]);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << results[r].error);
    CHECK(results[r].rc == ccSuccess);
    ccResult_t asyncA = ccSuccess, asyncB = ccSuccess;
    REQUIRE(ccCommGetAsyncError(a[r], &asyncA) == ccSuccess);
    REQUIRE(ccCommGetAsyncError(b[r], &asyncB) == ccSuccess);
    CHECK(asyncA == ccSuccess);
    CHECK(asyncB == ccSuccess);
  }
  for (auto d : dev) cudaFree(d);
}
