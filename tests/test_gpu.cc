// [gpu] The CUDA codec kernels against the CPU drivers, byte for byte: the rotation (forward and inverse, counts
// with tails, every block size), the requant encode (bits 1..8, aligned and unaligned groups, every scale format and
// rounding rule, clipping), its decode, the fused hop with one and two arriving messages, the hop and decode with
// the rotation fused (slices that start and end inside rotation blocks), and the 16-bit cast hop and decode, on
// inputs with outliers, zeros, denormals, NaN and Inf. Without a CUDA device the binary exits 77 and ctest reports
// the cases as skipped (this machine and CI have none; perf/gpu_check.sh runs them on one).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/device_prepare.h"
#include "collectives/reduce.h"
#include "collectives/reduce_cuda.h"
#include "compress/bitpack.h"
#include "compress/codec_cuda.h"
#include "compress/float16.h"
#include "compress/lanes_tile.h"
#include "compress/quant_cpu.h"
#include "compress/requant_tile.h"
#include "compress/sparse.h"
#include "core/device_memory.h"
#include "core/params.h"
#include "core/stream_sync.h"
#include "core/stream_wait.h"
#ifdef CCOLL_HAVE_CUBLAS
#include "compress/lowrank.h"
#include "compress/lowrank_cuda.h"
#endif
#include "first_difference.h"
#include "gpu_skip.h"
#include "rank_harness.h"
#ifdef CCOLL_FAKE_CUDA
#include "fake_cuda/fake_launch.h"
#endif

namespace {

// A device buffer of T, freed with the object.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    void* raw = nullptr;
    REQUIRE(cudaMalloc(&raw, (count ? count : 1) * sizeof(T)) == cudaSuccess);
    p = static_cast<T*>(raw);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void Put(const std::vector<T>& v) {
    REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<T> Get() const {
    std::vector<T> v(n);
    REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }
};

// Gaussian values with a few outliers, zeros, denormals and (optionally) non-finite values.
std::vector<float> Inputs(size_t n, uint64_t seed, bool nonFinite) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v) x = normal(gen);
  for (size_t i = 0; i < n; i += 97) v[i] *= 1000.0f;
  for (size_t i = 5; i < n; i += 131) v[i] = 0.0f;
  for (size_t i = 11; i < n; i += 173) v[i] = 1e-40f;
  if (nonFinite && n > 40) {
    v[n / 3] = std::numeric_limits<float>::quiet_NaN();
    v[n / 2] = std::numeric_limits<float>::infinity();
  }
  return v;
}

// Under compute-sanitizer's memcheck (perf/gpu_check.sh), which slows every launch and copy many times over, the two
// largest sweeps (1728 and 1152 configurations) run every CCTEST_SWEEP_STRIDE-th configuration: a prime stride walks
// through every loop's values; CCTEST_SWEEP_OFFSET picks which of the stride's residues, so that runs with other
// offsets cover other configurations. Unset, every configuration runs.
// *seen counts one sweep's configurations, so that a case run alone samples what it samples in a whole run.
bool InSweep(long* seen) {
  static const long stride = [] {
    const char* s = std::getenv("CCTEST_SWEEP_STRIDE");
    return s != nullptr && std::atol(s) > 1 ? std::atol(s) : 1L;
  }();
  static const long offset = [] {
    const char* s = std::getenv("CCTEST_SWEEP_OFFSET");
    return s != nullptr && std::atol(s) > 0 ? std::atol(s) % stride : 0L;
  }();
  return (*seen)++ % stride == offset;
}

bool SameBytes(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// Float results of arithmetic: the same bits, except that any NaN equals any NaN. A NaN a float operation makes has
// other bits on a GPU (always 0x7fffffff) than on x86 (an input NaN's bits, or 0xffc00000 for 0 * inf), as the CUDA
// guide says; where a kernel only moves or compares values, SameBytes holds even for NaNs.
bool SameFloats(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return false;
  }
  return true;
}

// Lets a stream held by LaunchStreamWait on `word` go at Release, or after a while at the latest (and on the way out),
// so that a test that goes wrong cannot hang. Released: whether it has let the stream go, on its own or at Release.
class StreamReleaser {
 public:
  explicit StreamReleaser(uint64_t* word) : word_(word) {
    thread_ = std::thread([this] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(cctest::ScaledMs(3000));
      while (!done_.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      released_ = true;
      __atomic_store_n(word_, 1, __ATOMIC_RELEASE);
    });
  }
  ~StreamReleaser() { Release(); }
  StreamReleaser(const StreamReleaser&) = delete;
  StreamReleaser& operator=(const StreamReleaser&) = delete;

  bool Released() const { return released_.load(); }
  void Release() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  uint64_t* word_;
  std::atomic<bool> done_{false}, released_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("[gpu] a device is prepared before a device call's stream waits", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  // cudaFuncGetAttributes on each kernel of each .cu file, the pools and the wait words (collectives/device_prepare.h);
  // then once more, at once.
  REQUIRE(ccoll::PrepareDevice(0) == ccSuccess);
  REQUIRE(ccoll::PrepareDevice(0) == ccSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaMemPool_t devicePool = nullptr, hostPool = nullptr;
  REQUIRE(ccoll::DevicePool(0, &devicePool) == ccSuccess);
  REQUIRE(ccoll::PinnedHostPool(0, &hostPool) == ccSuccess);
  int devicePools = 0, hostPools = 0;
  REQUIRE(cudaDeviceGetAttribute(&devicePools, cudaDevAttrMemoryPoolsSupported, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&hostPools, cudaDevAttrHostMemoryPoolsSupported, 0) == cudaSuccess);
  // Without device pools ccoll uses cudaMalloc, without host pools cudaHostAlloc; and so with CC_MEMORY_POOLS=0, and
  // where the pools fail their allocations (FAKE_CUDA_BROKEN_POOLS=1 on the fake runtime; on a GPU, the warning
  // names the step that failed).
  const bool wanted = ccoll::ParamInt("CC_MEMORY_POOLS") != 0;
  CHECK((devicePool == nullptr || (wanted && devicePools != 0)));
  CHECK((hostPool == nullptr || (wanted && hostPools != 0)));
  // Pools that fail their trial allocation: expected with FAKE_CUDA_BROKEN_POOLS=1 on the fake runtime. On a GPU they
  // are a fallback, not a defect of ccoll (its warning names the failed step), but a rare one, and a trial that failed
  // every pool would leave the pools untested: that passes only with CCTEST_ALLOW_UNUSABLE_POOLS=1.
  auto envIsOne = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && std::strcmp(v, "1") == 0;
  };
  if (!envIsOne("CCTEST_ALLOW_UNUSABLE_POOLS")) {
    INFO("pools ccoll does not use: an allocation from a new pool failed (see ccoll's warning)");
    const bool usable = wanted && !envIsOne("FAKE_CUDA_BROKEN_POOLS");
    CHECK((devicePool != nullptr) == (usable && devicePools != 0));
    CHECK((hostPool != nullptr) == (usable && hostPools != 0));
  }
  // Scratch of both kinds, from the pools or not: device memory the kernels and copies reach, and pinned host memory
  // both the host and the device do.
  void* d = nullptr;
  void* h = nullptr;
  REQUIRE(ccoll::AllocateScratch(0, false, 4096, nullptr, &d) == ccSuccess);
  REQUIRE(ccoll::AllocateScratch(0, true, 4096, nullptr, &h) == ccSuccess);
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  std::memset(h, 0x5a, 4096);
  REQUIRE(cudaMemcpyAsync(d, h, 4096, cudaMemcpyHostToDevice, nullptr) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  std::memset(h, 0, 4096);
  REQUIRE(cudaMemcpyAsync(h, d, 4096, cudaMemcpyDeviceToHost, nullptr) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  CHECK(static_cast<unsigned char*>(h)[4095] == 0x5a);
  cudaPointerAttributes attr;
  REQUIRE(cudaPointerGetAttributes(&attr, h) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeHost);
  REQUIRE(cudaPointerGetAttributes(&attr, d) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeDevice);  // the transports route messages by it (core/memory.h)
  ccoll::FreeScratch(0, true, h, nullptr);
  ccoll::FreeScratch(0, false, d, nullptr);
  // Wait words: zero when taken, a device address for the wait kernel.
  uint64_t* word = nullptr;
  uint64_t* onDevice = nullptr;
  REQUIRE(ccoll::TakeWaitWord(0, &word, &onDevice) == ccSuccess);
  CHECK(*word == 0);
  CHECK(onDevice != nullptr);
  ccoll::ReturnWaitWord(0, word);
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
}

TEST_CASE("[gpu] a copy from pool host memory is queued, and reads the memory when the stream gets there", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  // The staging and the codecs' host scratch rely on it: pinned memory, so cudaMemcpyAsync returns at once and
  // copies when the stream gets there. Were it taken for pageable memory, the call would wait for the stream (held
  // here by the wait kernel, as the proxy holds a caller's stream) and copy what the host had written by then.
  REQUIRE(ccoll::PrepareDevice(0) == ccSuccess);
  cudaMemPool_t hostPool = nullptr;
  REQUIRE(ccoll::PinnedHostPool(0, &hostPool) == ccSuccess);
  if (hostPool == nullptr) {
    WARN("this device has no host memory pools: ccoll uses cudaHostAlloc");
    return;
  }
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  void* h = nullptr;
  REQUIRE(cudaMallocFromPoolAsync(&h, 4096, hostPool, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  std::memset(h, 1, 4096);
  Dev<uint8_t> d(4096);
  uint64_t* word = nullptr;
  uint64_t* onDevice = nullptr;
  REQUIRE(ccoll::TakeWaitWord(0, &word, &onDevice) == ccSuccess);
  REQUIRE(ccoll::LaunchStreamWait(onDevice, 1, s) == cudaSuccess);
  StreamReleaser releaser(word);  // a wrong copy cannot hang the test
  REQUIRE(cudaMemcpyAsync(d.p, h, 4096, cudaMemcpyHostToDevice, s) == cudaSuccess);
  const bool early = !releaser.Released();
  std::memset(h, 2, 4096);  // after the call, before the stream copies
  releaser.Release();
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(early);
  const std::vector<uint8_t> got = d.Get();
  CHECK(std::count(got.begin(), got.end(), uint8_t{2}) == 4096);
  ccoll::ReturnWaitWord(0, word);
  REQUIRE(cudaFreeAsync(h, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

// Scratch freed in a stream's order, pinned (the staging, the codecs' host scratch) and on the device (the codecs'
// and exact calls' scratch): another stream does not get it while the stream has not got past the free. Without a
// pool of its kind (cudaHostAlloc, cudaMalloc) a free neither synchronizes the device (cudaFreeHost and cudaFree would:
// a destroy would wait for every held stream) nor loses the block: it is handed out again, for its size class, once
// its stream has passed the free. The blocks are allocated before the stream is held (an allocation may synchronize
// the device), and of a size class no case before this one takes, so that only these blocks are in play. ctest runs
// this with and without pools.
TEST_CASE("[gpu] scratch freed on a held stream goes to no other stream before the stream passes the free",
          "[gpu][scratch]") {
  SKIP_WITHOUT_DEVICE();
  REQUIRE(ccoll::PrepareDevice(0) == ccSuccess);
  for (const bool pinnedHost : {true, false}) {
    INFO((pinnedHost ? "pinned host scratch" : "device scratch"));
    cudaMemPool_t pool = nullptr;
    REQUIRE((pinnedHost ? ccoll::PinnedHostPool(0, &pool) : ccoll::DevicePool(0, &pool)) == ccSuccess);
    cudaStream_t held = nullptr, other = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
    const size_t bytes = 3 * 4096 + 64;
    void* a = nullptr;
    void* b = nullptr;
    REQUIRE(ccoll::AllocateScratch(0, pinnedHost, bytes, held, &a) == ccSuccess);
    REQUIRE(ccoll::AllocateScratch(0, pinnedHost, bytes, other, &b) == ccSuccess);
    REQUIRE(cudaStreamSynchronize(held) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
    uint64_t* word = nullptr;
    uint64_t* onDevice = nullptr;
    REQUIRE(ccoll::TakeWaitWord(0, &word, &onDevice) == ccSuccess);
    REQUIRE(ccoll::LaunchStreamWait(onDevice, 1, held) == cudaSuccess);
    StreamReleaser releaser(word);  // a synchronization cannot hang the test
    ccoll::FreeScratch(0, pinnedHost, a, held);
    ccoll::FreeScratch(0, pinnedHost, b, other);
    CHECK(cudaStreamSynchronize(other) == cudaSuccess);
    void* c = nullptr;
    CHECK(ccoll::AllocateScratch(0, pinnedHost, bytes, other, &c) == ccSuccess);
    CHECK(c != a);
    if (pool == nullptr) CHECK(c == b);  // b's stream has passed its free (and a fresh block would be neither)
    const bool early = !releaser.Released();
    releaser.Release();
    CHECK(early);  // none of it waited for the held stream
    REQUIRE(cudaStreamSynchronize(held) == cudaSuccess);
    // A smaller size of the same class (12289 to 14336 bytes) gets a block of the class: a's, now that its stream has
    // passed the free.
    void* d = nullptr;
    CHECK(ccoll::AllocateScratch(0, pinnedHost, bytes - 32, other, &d) == ccSuccess);
    if (pool == nullptr) CHECK(d == a);
    ccoll::FreeScratch(0, pinnedHost, c, other);
    ccoll::FreeScratch(0, pinnedHost, d, other);
    REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
    ccoll::ReturnWaitWord(0, word);
    REQUIRE(cudaStreamDestroy(held) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(other) == cudaSuccess);
  }
}

TEST_CASE("[gpu] memory freed while tracked work may still write it is freed once that work has run, and no stream "
          "waits for it", "[gpu][scratch]") {
  SKIP_WITHOUT_DEVICE();
  // As when one rank's message copy into another rank's scratch times out, and the other rank frees that scratch on
  // its own stream: the copy may still run.
  REQUIRE(ccoll::PrepareDevice(0) == ccSuccess);
  cudaStream_t held = nullptr, other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  const size_t bytes = 3 * 4096 + 64;
  void* x = nullptr;
  REQUIRE(ccoll::AllocateScratch(0, false, bytes, other, &x) == ccSuccess);
  REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
  uint64_t* word = nullptr;
  uint64_t* onDevice = nullptr;
  REQUIRE(ccoll::TakeWaitWord(0, &word, &onDevice) == ccSuccess);
  {
    StreamReleaser releaser(word);
    REQUIRE(ccoll::LaunchStreamWait(onDevice, 1, held) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(x, 0x5a, bytes, held) == cudaSuccess);  // the work given up on: it writes x
    const ccoll::TrackedWork work = ccoll::TrackWork(held);
    REQUIRE(work != nullptr);
    CHECK(ccoll::SynchronizeWithin(held, 20) == cudaErrorTimeout);
    ccoll::EndTrackedWork(work, false);
    ccoll::FreeScratch(0, false, x, other);
    // Neither the freeing stream nor a later allocation and free on it waits for the held one; and x is not handed
    // out again, even once the freeing stream has passed its free, while the held work may still write it.
    REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
    void* y = nullptr;
    REQUIRE(ccoll::AllocateScratch(0, false, bytes, other, &y) == ccSuccess);
    CHECK(y != x);
    REQUIRE(cudaMemsetAsync(y, 1, bytes, other) == cudaSuccess);
    ccoll::FreeScratch(0, false, y, other);
    CHECK(ccoll::SynchronizeWithin(other, cctest::ScaledMs(2000)) == cudaSuccess);
    CHECK(!releaser.Released());  // all of that while the memset had not run
  }
  // The memset writes x once the stream goes: x must still be there (the fake runtime faults on freed device memory,
  // as the code before this test did: it freed x on `other` at once).
  REQUIRE(cudaStreamSynchronize(held) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
  // Work that ran is forgotten at the next free; work ended as run is forgotten at once.
  const ccoll::TrackedWork done = ccoll::TrackWork(other);
  REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
  ccoll::EndTrackedWork(done, true);
  ccoll::ReturnWaitWord(0, word);
  REQUIRE(cudaStreamDestroy(held) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(other) == cudaSuccess);
}

// Also at the ends of float's range: inputs scaled by 2^112 (up to 2e37: the inverse's prescale keeps its sums finite)
// and by 2^-140 (the prescale makes denormals, which neither side flushes).
TEST_CASE("[gpu] rotation: the kernels equal the CPU driver byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  for (size_t block : {size_t{64}, size_t{1024}, size_t{16384}}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{4099}, size_t{(1 << 18) + 5}}) {
      for (int exponent : {0, 112, -140}) {
        INFO("block " << block << " count " << count << " inputs times 2^" << exponent);
        std::vector<float> in = Inputs(count, count + block, false);
        for (float& v : in) v = std::ldexp(v, exponent);
        std::vector<float> cpu(count);
        ccoll::RotateForward(in.data(), cpu.data(), count, block, 0x1234u);
        Dev<float> din(count), dout(count);
        din.Put(in);
        REQUIRE(ccoll::gpu::RotateForward(din.p, dout.p, count, block, 0x1234u, nullptr) == ccSuccess);
        std::vector<float> gpu = dout.Get();
        CHECK(SameBytes(cpu.data(), gpu.data(), count * sizeof(float)));
        ccoll::RotateInverse(cpu.data(), count, block, 0x1234u, 0.25f);
        REQUIRE(ccoll::gpu::RotateInverse(dout.p, count, block, 0x1234u, 0.25f, nullptr, nullptr) == ccSuccess);
        gpu = dout.Get();
        CHECK(SameBytes(cpu.data(), gpu.data(), count * sizeof(float)));
        if (exponent == 112) CHECK(std::all_of(gpu.begin(), gpu.end(), [](float v) { return std::isfinite(v); }));
      }
    }
  }
}

TEST_CASE("[gpu] requant encode, decode and hop: the kernels equal the CPU driver byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  long seen = 0;
  using ccoll::ScaleFormat;
  for (size_t len : {size_t{1}, size_t{33}, size_t{1000}, size_t{65536 + 7}}) {
    // Groups up to tile::kMaxGroup take the tile kernels, 2048 the one-thread-per-group ones.
    for (size_t group : {size_t{32}, size_t{7}, size_t{1024}, size_t{2048}}) {
      for (int bits : {1, 2, 3, 4, 6, 8}) {
        for (ScaleFormat format : {ScaleFormat::kFp32, ScaleFormat::kBf16, ScaleFormat::kFp16}) {
          for (int rounding : {0, 1, 2}) {
            for (float clipK : {0.0f, 2.5f}) {
              if (!InSweep(&seen)) continue;
              INFO("len " << len << " group " << group << " bits " << bits << " format " << static_cast<int>(format)
                          << " rounding " << rounding << " clipK " << clipK);
              ccoll::DitherRule rule;
              rule.rounding = rounding;
              rule.key = 77;
              rule.sharedKey = 99;
              rule.rank = 1;
              rule.nranks = 3;
              // Odd (dithers start at the high half of a word), even, and a slice that crosses 2^32 elements.
              const uint64_t index0 = (len + bits) % 3 == 0 ? 12345 : (len + bits) % 3 == 1 ? 12346
                                                                                                : (1ull << 32) - 100;
              const std::vector<float> local = Inputs(len, len * 31 + bits, len > 100 && clipK == 0.0f);
              const size_t bytes = ccoll::gpu::RequantBytes(len, group, bits, format);
              std::vector<uint16_t> codes(len);
              std::vector<uint8_t> cpuMsg(bytes), cpuHop(bytes);
              REQUIRE(ccoll::EncodeRequantSlice(local.data(), len, index0, group, bits, format, clipK, rule,
                                                codes.data(), cpuMsg.data()) == bytes);
              Dev<float> dLocal(len), dVals(len), dOut(len);
              Dev<uint16_t> dCodes(len);
              Dev<uint8_t> dMsg(bytes), dMsg2(bytes), dHop(bytes);
              dLocal.Put(local);
              REQUIRE(ccoll::gpu::EncodeRequant(dLocal.p, len, index0, group, bits, format, clipK, rule, dCodes.p,
                                                dMsg.p, nullptr) == ccSuccess);
              std::vector<uint8_t> gpuMsg = dMsg.Get();
              CHECK(SameBytes(cpuMsg.data(), gpuMsg.data(), bytes));
              // Decode.
              std::vector<float> cpuOut(len);
              ccoll::DecodeRequantSlice(cpuMsg.data(), len, group, bits, format, codes.data(), cpuOut.data());
              dMsg.Put(cpuMsg);
              REQUIRE(ccoll::gpu::DecodeRequant(dMsg.p, len, group, bits, format, dOut.p, nullptr) == ccSuccess);
              std::vector<float> gpuOut = dOut.Get();
              CHECK(SameFloats(cpuOut.data(), gpuOut.data(), len));
              // Hop with one arriving message: local + decode(msg), re-encoded (the CPU codec's SumIn order).
              std::vector<float> sum(len);
              for (size_t j = 0; j < len; ++j) sum[j] = local[j] + cpuOut[j];
              ccoll::EncodeRequantSlice(sum.data(), len, index0, group, bits, format, clipK, rule, codes.data(),
                                        cpuHop.data());
              const void* in[1] = {dMsg.p};
              REQUIRE(ccoll::gpu::HopRequant(in, 1, dLocal.p, len, index0, group, bits, format, clipK, rule, dVals.p,
                                             dCodes.p, dHop.p, nullptr) == ccSuccess);
              std::vector<uint8_t> gpuHop = dHop.Get();
              CHECK(SameBytes(cpuHop.data(), gpuHop.data(), bytes));
              // Two different arriving messages (a tree node): local + decode(a) + decode(b), in that order.
              std::vector<uint8_t> cpuMsg2(bytes);
              const std::vector<float> other = Inputs(len, len * 7 + 3, false);
              ccoll::EncodeRequantSlice(other.data(), len, index0, group, bits, format, clipK, rule, codes.data(),
                                        cpuMsg2.data());
              std::vector<float> cpuOut2(len);
              ccoll::DecodeRequantSlice(cpuMsg2.data(), len, group, bits, format, codes.data(), cpuOut2.data());
              for (size_t j = 0; j < len; ++j) sum[j] = sum[j] + cpuOut2[j];
              ccoll::EncodeRequantSlice(sum.data(), len, index0, group, bits, format, clipK, rule, codes.data(),
                                        cpuHop.data());
              dMsg2.Put(cpuMsg2);
              const void* in2[2] = {dMsg.p, dMsg2.p};
              REQUIRE(ccoll::gpu::HopRequant(in2, 2, dLocal.p, len, index0, group, bits, format, clipK, rule,
                                             dVals.p, dCodes.p, dHop.p, nullptr) == ccSuccess);
              gpuHop = dHop.Get();
              CHECK(SameBytes(cpuHop.data(), gpuHop.data(), bytes));
            }
          }
        }
      }
    }
  }
}

// The shapes the fused-rotation cases run: every given rotation block, with groups 32, 33 and 256 and three buffer
// sizes, each as a slice that starts and ends inside rotation blocks and as the whole buffer; bits, arriving
// messages, scale format and clipping cycle with the configuration (numbered from 1; the caller's rounding rule
// cycles with it too).
struct FusedShape {
  size_t block = 0, group = 0, count = 0, off = 0, len = 0;
  int bits = 0, nin = 0, config = 0;
  ccoll::ScaleFormat format = ccoll::ScaleFormat::kFp32;
  float clipK = 0.0f;
};

template <typename Fn>
void ForFusedShapes(std::initializer_list<size_t> blocks, uint64_t seed, Fn fn) {
  std::mt19937_64 gen(seed);
  int configs = 0;
  for (size_t block : blocks) {
    for (size_t group : {size_t{32}, size_t{33}, size_t{256}}) {
      for (size_t count : {size_t{1000}, size_t{65536}, size_t{3 * 65536 + 777}}) {
        FusedShape s;
        s.block = block;
        s.group = group;
        s.count = count;
        s.bits = 1 + configs % 8;
        s.nin = configs % 3;
        s.format = static_cast<ccoll::ScaleFormat>(configs % 3);
        s.clipK = configs % 5 == 0 ? 2.5f : 0.0f;
        s.config = ++configs;
        for (int whole = 0; whole < 2; ++whole) {
          s.off = whole ? 0 : gen() % (count / 2);
          s.len = whole ? count : 1 + gen() % (count - s.off);
          INFO("block " << block << " group " << group << " count " << count << " off " << s.off << " len " << s.len
                        << " bits " << s.bits << " nin " << s.nin << " clip " << s.clipK);
          fn(s);
        }
      }
    }
  }
}

TEST_CASE("[gpu] requant hop and decode with the rotation fused equal the CPU's passes byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  ForFusedShapes({size_t{1}, size_t{32}, size_t{256}, size_t{1024}}, 41, [&](const FusedShape& s) {
    const size_t block = s.block, group = s.group, count = s.count, off = s.off, len = s.len;
    const int bits = s.bits, nin = s.nin, configs = s.config;
    const auto format = s.format;
    const float clipK = s.clipK;
    ccoll::DitherRule rule;
    rule.rounding = 1 + configs % 2;
    rule.key = 5;
    rule.sharedKey = 6;
    rule.rank = 2;
    rule.nranks = 4;
    const std::vector<float> input = Inputs(count, count + off, false);
    const size_t bytes = ccoll::gpu::RequantBytes(len, group, bits, format);
    std::vector<uint16_t> codes(count);
    std::vector<float> rotated(count), vals(count);
    ccoll::RotateForward(input.data(), rotated.data(), count, block, 0x77u);
    std::vector<std::vector<uint8_t>> msgs(2, std::vector<uint8_t>(bytes));
    Dev<uint8_t> dIn0(bytes), dIn1(bytes), dOut(bytes);
    for (int k = 0; k < nin; ++k) {
      const std::vector<float> other = Inputs(len, 3 * len + k, false);
      ccoll::EncodeRequantSlice(other.data(), len, off, group, bits, format, 0.0f, rule, codes.data(),
                                msgs[k].data());
    }
    dIn0.Put(msgs[0]);
    dIn1.Put(msgs[1]);
    std::vector<uint8_t> want(bytes);
    const void* wires[2] = {msgs[0].data(), msgs[1].data()};
    if (nin == 0) {
      ccoll::EncodeRequantSlice(rotated.data() + off, len, off, group, bits, format, clipK, rule, codes.data(),
                                want.data());
    } else {
      ccoll::HopRequantSlice(wires, nin, rotated.data() + off, len, off, group, bits, format, clipK, rule,
                             vals.data(), codes.data(), want.data());
    }
    Dev<float> dInput(count), dWork(count);
    dInput.Put(input);
    const void* devIn[2] = {dIn0.p, dIn1.p};
    REQUIRE(ccoll::gpu::HopRequantRotated(devIn, nin, dInput.p, count, block, 0x77u, false, off, len, group,
                                          bits, format, clipK, rule, dOut.p, nullptr) == ccSuccess);
    CHECK(SameBytes(want.data(), dOut.Get().data(), bytes));
    // In place: the blocks at the slice's ends that reach past it rotated in the buffer first.
    for (size_t i : {off, off + len - 1}) {
      size_t bs, bl;
      ccoll::tile::RotationBlockOf(count, block, i, &bs, &bl);
      if (bs >= off && bs + bl <= off + len) continue;
      if (i == off + len - 1 && bs < off) continue;  // the slice lies inside one block, rotated once
      REQUIRE(ccoll::gpu::RotateBlockForward(dInput.p, bs, bl, 0x77u, nullptr) == ccSuccess);
    }
    REQUIRE(ccoll::gpu::HopRequantRotated(devIn, nin, dInput.p, count, block, 0x77u, true, off, len, group,
                                          bits, format, clipK, rule, dOut.p, nullptr) == ccSuccess);
    CHECK(SameBytes(want.data(), dOut.Get().data(), bytes));
    // Its decode into a buffer that holds other values around the slice, then the finish of the blocks left.
    const std::vector<float> around = Inputs(count, 99, false);
    std::vector<float> cpu = around;
    ccoll::DecodeRequantSlice(want.data(), len, group, bits, format, codes.data(), cpu.data() + off);
    ccoll::RotateInverse(cpu.data(), count, block, 0x77u, 0.25f);
    dWork.Put(around);
    dOut.Put(want);
    Dev<uint8_t> dDone(count / block + 1);
    REQUIRE(cudaMemset(dDone.p, 0, count / block + 1) == cudaSuccess);
    REQUIRE(ccoll::gpu::DecodeRequantRotated(dOut.p, off, len, group, bits, format, count, block, 0x77u, 0.25f,
                                             dDone.p, dWork.p + off, nullptr) == ccSuccess);
    REQUIRE(ccoll::gpu::RotateInverse(dWork.p, count, block, 0x77u, 0.25f, dDone.p, nullptr) == ccSuccess);
    const std::vector<float> gpu = dWork.Get();
    CHECK(SameFloats(cpu.data(), gpu.data(), count));
  });
}

template <typename T>
void Put(T v, char* at) {
  std::memcpy(at, &v, sizeof(T));
}

// Finite random elements of dtype as raw bytes: floats of both signs over a wide range (16-bit types rounded from
// them), int32 and int64 small enough for products, any bits for the 8-bit and unsigned integers (which wrap).
std::vector<char> RawInputs(ccDataType_t dtype, size_t count, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  const size_t es = ccoll::DataTypeSize(dtype);
  std::vector<char> out(count * es);
  for (size_t i = 0; i < count; ++i) {
    const double x = normal(gen) * (i % 7 == 0 ? 300.0 : 1.0);
    char* at = out.data() + i * es;
    const int64_t small = static_cast<int64_t>(gen() % 21) - 10;
    switch (dtype) {
      case ccInt8: Put(static_cast<uint8_t>(gen()), at); break;
      case ccUint8: Put(static_cast<uint8_t>(gen()), at); break;
      case ccInt32: Put(static_cast<int32_t>(small), at); break;
      case ccUint32: Put(static_cast<uint32_t>(gen()), at); break;
      case ccInt64: Put(small * 100, at); break;
      case ccUint64: Put(static_cast<uint64_t>(gen()), at); break;
      case ccFloat16: Put(ccoll::FloatToHalf(static_cast<float>(x)).bits, at); break;
      case ccBfloat16: Put(ccoll::FloatToBf16(static_cast<float>(x)).bits, at); break;
      case ccFloat32: Put(static_cast<float>(x), at); break;
      case ccFloat64: Put(x, at); break;
    }
  }
  return out;
}

TEST_CASE("[gpu] exact reductions: the kernels equal the host loops byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  for (ccDataType_t dtype : {ccInt8, ccUint8, ccInt32, ccUint32, ccInt64, ccUint64, ccFloat16, ccFloat32, ccFloat64,
                             ccBfloat16}) {
    for (ccRedOp_t op : {ccSum, ccProd, ccMax, ccMin, ccAvg}) {
      for (size_t count : {size_t{1}, size_t{1000}, size_t{(1 << 21) + 3}}) {  // the last: a grid-stride loop
        INFO(ccoll::DataTypeName(dtype) << " " << ccoll::RedOpName(op) << " count " << count);
        const size_t bytes = count * ccoll::DataTypeSize(dtype);
        const std::vector<char> a = RawInputs(dtype, count, count + 1), b = RawInputs(dtype, count, count + 2);
        std::vector<char> cpu(bytes);
        ccoll::ReduceHost(cpu.data(), a.data(), b.data(), count, dtype, op);
        Dev<char> da(bytes), db(bytes), dd(bytes);
        da.Put(a);
        db.Put(b);
        REQUIRE(cudaMemset(dd.p, 0x5a, bytes) == cudaSuccess);
        REQUIRE(ccoll::gpu::Reduce(dd.p, da.p, db.p, count, dtype, op, nullptr) == ccSuccess);
        CHECK(SameBytes(cpu.data(), dd.Get().data(), bytes));
        REQUIRE(ccoll::gpu::Reduce(da.p, da.p, db.p, count, dtype, op, nullptr) == ccSuccess);  // in place
        CHECK(SameBytes(cpu.data(), da.Get().data(), bytes));
        if (op == ccAvg) {
          ccoll::FinishAvgHost(cpu.data(), count, dtype, 3);
          REQUIRE(ccoll::gpu::FinishAvg(dd.p, count, dtype, 3, nullptr) == ccSuccess);
          CHECK(SameBytes(cpu.data(), dd.Get().data(), bytes));
        }
        if (op == ccAvg && ccoll::IsFloatType(dtype)) {  // a float average's input, times 1/3 and 1/8
          for (int n : {3, 8}) {
            ccoll::PremultiplyHost(cpu.data(), a.data(), count, dtype, n);
            da.Put(a);
            REQUIRE(ccoll::gpu::Premultiply(dd.p, da.p, count, dtype, n, nullptr) == ccSuccess);
            CHECK(SameBytes(cpu.data(), dd.Get().data(), bytes));
            REQUIRE(ccoll::gpu::Premultiply(da.p, da.p, count, dtype, n, nullptr) == ccSuccess);  // in place
            CHECK(SameBytes(cpu.data(), da.Get().data(), bytes));
            ccoll::ReducePremultipliedHost(cpu.data(), a.data(), b.data(), count, dtype, n);
            da.Put(a);
            REQUIRE(ccoll::gpu::ReducePremultiplied(dd.p, da.p, db.p, count, dtype, n, nullptr) == ccSuccess);
            CHECK(SameBytes(cpu.data(), dd.Get().data(), bytes));
          }
        }
      }
    }
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("[gpu] 16-bit cast hop and decode: the kernels equal the CPU codec byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  for (ccDataType_t wire : {ccBfloat16, ccFloat16}) {
    const size_t len = 100003;
    const std::vector<float> local = Inputs(len, 5, true), other = Inputs(len, 6, false);
    const std::vector<float> third = Inputs(len, 7, false);
    std::vector<uint16_t> msg(len), msg2(len), cpu(len);
    std::vector<float> cpuLost(len);  // what the rounding took away (the sparsifiers' error feedback)
    for (size_t i = 0; i < len; ++i) {
      msg[i] = wire == ccBfloat16 ? ccoll::FloatToBf16(other[i]).bits : ccoll::FloatToHalf(other[i]).bits;
      msg2[i] = wire == ccBfloat16 ? ccoll::FloatToBf16(third[i]).bits : ccoll::FloatToHalf(third[i]).bits;
    }
    for (int nin : {0, 1, 2}) {
      INFO((wire == ccBfloat16 ? "bf16" : "fp16") << " nin " << nin);
      for (size_t i = 0; i < len; ++i) {
        auto load = [&](uint16_t b) {
          return wire == ccBfloat16 ? ccoll::Bf16ToFloat(ccoll::Bf16{b}) : ccoll::HalfToFloat(ccoll::Half{b});
        };
        float x = local[i];
        if (nin == 1) x = local[i] + load(msg[i]);
        if (nin == 2) x = local[i] + load(msg[i]) + load(msg2[i]);
        cpu[i] = wire == ccBfloat16 ? ccoll::FloatToBf16(x).bits : ccoll::FloatToHalf(x).bits;
        cpuLost[i] = x - load(cpu[i]);
      }
      Dev<float> dLocal(len), dOut(len), dLost(len);
      Dev<uint16_t> dMsg(len), dMsg2(len), dHop(len);
      dLocal.Put(local);
      dMsg.Put(msg);
      dMsg2.Put(msg2);
      const void* in[2] = {dMsg.p, dMsg2.p};
      REQUIRE(ccoll::gpu::CastHop(wire, in, nin, dLocal.p, len, dHop.p, nullptr, nullptr) == ccSuccess);
      std::vector<uint16_t> gpu = dHop.Get();
      CHECK(SameBytes(cpu.data(), gpu.data(), len * 2));
      dHop.Put(std::vector<uint16_t>(len, 0));
      REQUIRE(ccoll::gpu::CastHop(wire, in, nin, dLocal.p, len, dHop.p, dLost.p, nullptr) == ccSuccess);
      CHECK(SameBytes(cpu.data(), dHop.Get().data(), len * 2));
      CHECK(SameFloats(cpuLost.data(), dLost.Get().data(), len));  // NaN where the input is not finite
      REQUIRE(ccoll::gpu::CastDecode(wire, dMsg.p, len, dOut.p, nullptr) == ccSuccess);
      std::vector<float> decoded = dOut.Get();
      size_t same = 0;
      for (size_t i = 0; i < len; ++i) {
        const float want = wire == ccBfloat16 ? ccoll::Bf16ToFloat(ccoll::Bf16{msg[i]})
                                              : ccoll::HalfToFloat(ccoll::Half{msg[i]});
        same += std::memcmp(&want, &decoded[i], 4) == 0 ? 1 : 0;
      }
      CHECK(same == len);
    }
  }
}

TEST_CASE("[gpu] homomorphic lanes: scales, encode, add and decode equal the CPU driver byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  long seen = 0;
  for (size_t len : {size_t{1}, size_t{13}, size_t{1000}, size_t{65536 + 5}}) {
    for (size_t group : {size_t{1024}, size_t{7}, size_t{100}, size_t{2048}}) {  // tiles up to 1024
      for (int bits : {1, 2, 4, 8}) {
        for (int nranks : {2, 3, 8}) {
          for (int rounding : {0, 1, 2}) {
            for (float clipK : {0.0f, 2.5f}) {
              if (!InSweep(&seen)) continue;
              int laneBits = bits;
              while ((1 << (laneBits - bits)) < nranks) ++laneBits;
              INFO("len " << len << " group " << group << " bits " << bits << " lanes " << laneBits << " rounding "
                          << rounding << " clipK " << clipK);
              ccoll::DitherRule rule;
              rule.rounding = rounding;
              rule.key = 5;
              rule.sharedKey = 6;
              rule.rank = 1;
              rule.nranks = nranks;
              const uint64_t index0 = len % 2 ? 4097 : 3 * 65536;  // the slice's global index (odd and even)
              const std::vector<float> v = Inputs(len, len + bits + group, len > 100 && clipK == 0.0f);
              // The scales of the global groups that [index0, index0 + len) touches, from these values (as if the
              // buffer started at index0 - first): GroupScales over a buffer that starts on a group boundary.
              const size_t first = index0 % group, total = first + len, groups = (total + group - 1) / group;
              std::vector<float> buf(total, 0.5f);
              std::copy(v.begin(), v.end(), buf.begin() + static_cast<long>(first));
              std::vector<float> cpuScales(groups);
              for (size_t g = 0; g < groups; ++g) {
                cpuScales[g] = ccoll::GroupScaleOf(buf.data() + g * group, std::min(group, total - g * group), clipK);
              }
              Dev<float> dBuf(total), dScales(groups), dV(len), dOut(len);
              dBuf.Put(buf);
              REQUIRE(ccoll::gpu::GroupScales(dBuf.p, total, group, clipK, dScales.p, nullptr) == ccSuccess);
              std::vector<float> gpuScales = dScales.Get();
              CHECK(SameBytes(cpuScales.data(), gpuScales.data(), groups * sizeof(float)));
              // The codec indexes scales by global group: shift the array so that entry index0 / group is group 0.
              std::vector<float> scales(index0 / group + groups, 0.0f);
              std::copy(cpuScales.begin(), cpuScales.end(), scales.begin() + static_cast<long>(index0 / group));
              const size_t bytes = ccoll::PackedBytes(len, laneBits);
              std::vector<uint16_t> codes(len);
              std::vector<uint8_t> cpuMsg(bytes), cpuSum(bytes);
              ccoll::EncodeLanesSlice(v.data(), len, index0, group, scales.data(), bits, laneBits, rule, codes.data(),
                                      cpuMsg.data());
              Dev<float> dAll(scales.size());
              Dev<uint8_t> dMsg(bytes), dMsg2(bytes);
              dAll.Put(scales);
              dV.Put(v);
              REQUIRE(ccoll::gpu::EncodeLanes(dV.p, len, index0, group, dAll.p, bits, laneBits, rule, dMsg.p,
                                              nullptr) == ccSuccess);
              std::vector<uint8_t> gpuMsg = dMsg.Get();
              CHECK(SameBytes(cpuMsg.data(), gpuMsg.data(), bytes));
              // The packed add of nranks - 1 copies of another rank's codes (every lane stays within its width).
              rule.rank = 0;
              std::vector<uint8_t> other(bytes);
              ccoll::EncodeLanesSlice(v.data(), len, index0, group, scales.data(), bits, laneBits, rule, codes.data(),
                                      other.data());
              cpuSum = cpuMsg;
              dMsg2.Put(other);
              for (int k = 1; k < nranks; ++k) {
                ccoll::AddPackedStreams(cpuSum.data(), cpuSum.data(), other.data(), bytes);
                REQUIRE(ccoll::gpu::AddLanes(dMsg.p, dMsg.p, dMsg2.p, len, laneBits, nullptr) == ccSuccess);
              }
              gpuMsg = dMsg.Get();
              CHECK(SameBytes(cpuSum.data(), gpuMsg.data(), bytes));
              std::vector<float> cpuOut(len);
              ccoll::DecodeLanesSlice(cpuSum.data(), len, index0, group, scales.data(), bits, laneBits, nranks,
                                      codes.data(), cpuOut.data());
              REQUIRE(ccoll::gpu::DecodeLanes(dMsg.p, len, index0, group, dAll.p, bits, laneBits, nranks, dOut.p,
                                              nullptr) == ccSuccess);
              std::vector<float> gpuOut = dOut.Get();
              CHECK(SameFloats(cpuOut.data(), gpuOut.data(), len));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("[gpu] homomorphic lanes with the rotation fused equal the CPU's passes byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  {  // Arguments the lane kernels cannot take are refused before anything is queued.
    Dev<float> v(64), scales(2);
    Dev<uint8_t> out(64);
    const ccoll::tile::HopArgs hop = ccoll::tile::HopArgsOf(v.p, nullptr, 0, 0, 64, 32, 4, ccoll::ScaleFormat::kFp32,
                                                            0.0f, ccoll::DitherRule(), out.p);
    ccoll::tile::LanesArgs bad = ccoll::tile::LanesArgsOf(hop, scales.p, 17, 4, false);
    CHECK(ccoll::gpu::LanesTiles(bad, nullptr) == ccInternalError);
    bad.laneBits = 6;
    bad.hop.nin = 3;
    CHECK(ccoll::gpu::LanesTiles(bad, nullptr) == ccInternalError);
    bad.hop.nin = 0;
    bad.agreed = nullptr;
    CHECK(ccoll::gpu::LanesTiles(bad, nullptr) == ccInternalError);
    CHECK(ccoll::gpu::LanesTiles(ccoll::tile::ScalesArgsOf(v.p, 64, 32, 0.0f, nullptr), nullptr) == ccInternalError);
    const ccoll::tile::DecodeArgs d = ccoll::tile::DecodeArgsOf(out.p, 0, 64, 32, 4, ccoll::ScaleFormat::kFp32, v.p);
    CHECK(ccoll::gpu::DecodeTiles(ccoll::tile::LanesFrom(d, scales.p, 17, 4), nullptr) == ccInternalError);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
  }
  ForFusedShapes({size_t{1}, size_t{32}, size_t{1024}}, 43, [&](const FusedShape& s) {
    const size_t block = s.block, group = s.group, count = s.count, off = s.off, len = s.len;
    const int bits = s.bits, nin = s.nin, configs = s.config;
    const auto format = s.format;
    const float clipK = s.clipK;
    const int nranks = 4, laneBits = bits + 2;
    ccoll::DitherRule rule;
    rule.rounding = configs % 3;
    rule.key = 5;
    rule.sharedKey = 6;
    rule.rank = 2;
    rule.nranks = nranks;
    const std::vector<float> input = Inputs(count, count + off + 1, false);
    std::vector<float> rotated(count);
    ccoll::RotateForward(input.data(), rotated.data(), count, block, 0x78u);
    // The scales of the rotated buffer, found from the unrotated one.
    const size_t groups = (count + group - 1) / group;
    std::vector<float> scales(groups);
    for (size_t g = 0; g < groups; ++g) {
      scales[g] = ccoll::GroupScaleOf(rotated.data() + g * group, std::min(group, count - g * group), clipK);
    }
    Dev<float> dInput(count), dScales(groups), dWork(count);
    dInput.Put(input);
    ccoll::tile::LanesArgs sa = ccoll::tile::ScalesArgsOf(nullptr, count, group, clipK, dScales.p);
    sa.hop = ccoll::tile::RotatedFrom(sa.hop, dInput.p, count, block, 0x78u, false);
    REQUIRE(ccoll::gpu::LanesTiles(sa, nullptr) == ccSuccess);
    CHECK(SameBytes(scales.data(), dScales.Get().data(), groups * sizeof(float)));
    // The hop, then the requantizing hop, against the CPU's lanes, adds, decode and requant encode.
    const size_t bytes = ccoll::PackedBytes(len, laneBits);
    std::vector<uint16_t> codes(count);
    std::vector<std::vector<uint8_t>> msgs(2, std::vector<uint8_t>(bytes));
    for (int k = 0; k < nin; ++k) {
      const std::vector<float> other = Inputs(len, 3 * len + k, false);
      ccoll::EncodeLanesSlice(other.data(), len, off, group, scales.data(), bits, laneBits, rule, codes.data(),
                              msgs[k].data());
    }
    std::vector<uint8_t> want(bytes);
    ccoll::EncodeLanesSlice(rotated.data() + off, len, off, group, scales.data(), bits, laneBits, rule,
                            codes.data(), want.data());
    for (int k = 0; k < nin; ++k) ccoll::AddPackedStreams(want.data(), want.data(), msgs[k].data(), bytes);
    std::vector<float> sums(len);
    ccoll::DecodeLanesSlice(want.data(), len, off, group, scales.data(), bits, laneBits, nranks, codes.data(),
                            sums.data());
    const size_t reqBytes = ccoll::gpu::RequantBytes(len, group, bits, format);
    std::vector<uint8_t> wantReq(reqBytes);
    ccoll::EncodeRequantSlice(sums.data(), len, off, group, bits, format, clipK, rule, codes.data(),
                              wantReq.data());
    Dev<uint8_t> dIn0(bytes), dIn1(bytes), dOut(std::max(bytes, reqBytes));
    dIn0.Put(msgs[0]);
    dIn1.Put(msgs[1]);
    const void* devIn[2] = {dIn0.p, dIn1.p};
    ccoll::tile::HopArgs hop = ccoll::tile::HopArgsOf(nullptr, devIn, nin, off, len, group, bits, format, clipK,
                                                      rule, dOut.p);
    hop = ccoll::tile::RotatedFrom(hop, dInput.p, count, block, 0x78u, false);
    REQUIRE(ccoll::gpu::LanesTiles(ccoll::tile::LanesArgsOf(hop, dScales.p, laneBits, nranks, false), nullptr) ==
            ccSuccess);
    CHECK(SameBytes(want.data(), dOut.Get().data(), bytes));
    REQUIRE(ccoll::gpu::LanesTiles(ccoll::tile::LanesArgsOf(hop, dScales.p, laneBits, nranks, true), nullptr) ==
            ccSuccess);
    CHECK(SameBytes(wantReq.data(), dOut.Get().data(), reqBytes));
    // The decode of the lane sums into a buffer of other values, then the finish of the blocks left.
    const std::vector<float> around = Inputs(count, 98, false);
    std::vector<float> cpu = around;
    std::copy(sums.begin(), sums.end(), cpu.begin() + static_cast<long>(off));
    ccoll::RotateInverse(cpu.data(), count, block, 0x78u, 0.25f);
    dWork.Put(around);
    dOut.Put(want);
    Dev<uint8_t> dDone(count / block + 1);
    REQUIRE(cudaMemset(dDone.p, 0, count / block + 1) == cudaSuccess);
    const ccoll::tile::DecodeArgs d = ccoll::tile::RotatedBack(
        ccoll::tile::DecodeArgsOf(dOut.p, off, len, group, bits, format, dWork.p + off), count, block, 0x78u,
        0.25f, dDone.p);
    REQUIRE(ccoll::gpu::DecodeTiles(ccoll::tile::LanesFrom(d, dScales.p, laneBits, nranks), nullptr) ==
            ccSuccess);
    REQUIRE(ccoll::gpu::RotateInverse(dWork.p, count, block, 0x78u, 0.25f, dDone.p, nullptr) == ccSuccess);
    const std::vector<float> gpu = dWork.Get();
    CHECK(SameFloats(cpu.data(), gpu.data(), count));
  });
}

TEST_CASE("[gpu] sparsifier and error-feedback kernels equal the CPU code byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  for (size_t count : {size_t{1}, size_t{1000}, size_t{(1 << 20) + 3}}) {
    for (size_t chunk : {size_t{1}, size_t{7}, size_t{1024}}) {
      INFO("count " << count << " chunk " << chunk);
      const std::vector<float> x = Inputs(count, count + chunk, count > 100);
      Dev<float> dx(count), dNorms(ccoll::ChunkCount(count, chunk));
      dx.Put(x);
      std::vector<float> cpuNorms;
      ccoll::ChunkNorms(x.data(), count, chunk, &cpuNorms);
      REQUIRE(ccoll::gpu::ChunkNorms(dx.p, count, chunk, dNorms.p, nullptr) == ccSuccess);
      std::vector<float> gpuNorms = dNorms.Get();
      CHECK(SameBytes(cpuNorms.data(), gpuNorms.data(), cpuNorms.size() * sizeof(float)));
      // The last chunk (maybe short) is always among the chosen ones here.
      std::vector<uint32_t> chosen;
      ccoll::RandomChunks(cpuNorms.size(), (cpuNorms.size() + 2) / 3, 17, &chosen);
      if (chosen.back() != cpuNorms.size() - 1) chosen.back() = static_cast<uint32_t>(cpuNorms.size() - 1);
      const size_t packed = ccoll::PackedCount(count, chunk, chosen);
      std::vector<float> cpuPacked(packed);
      ccoll::GatherChunks(x.data(), count, chunk, chosen, cpuPacked.data());
      Dev<uint32_t> dChosen(chosen.size());
      Dev<float> dPacked(packed), dOut(count);
      dChosen.Put(chosen);
      REQUIRE(ccoll::gpu::GatherChunks(dx.p, count, chunk, dChosen.p, packed, dPacked.p, nullptr) == ccSuccess);
      std::vector<float> gpuPacked = dPacked.Get();
      CHECK(SameBytes(cpuPacked.data(), gpuPacked.data(), packed * sizeof(float)));
      std::vector<float> cpuOut(count, 0.0f);
      ccoll::ScatterChunks(cpuPacked.data(), count, chunk, chosen, cpuOut.data());
      REQUIRE(ccoll::gpu::Fill(dOut.p, count, 0.0f, nullptr) == ccSuccess);
      REQUIRE(ccoll::gpu::ScatterChunks(dPacked.p, count, chunk, dChosen.p, packed, dOut.p, nullptr) == ccSuccess);
      std::vector<float> gpuOut = dOut.Get();
      CHECK(SameBytes(cpuOut.data(), gpuOut.data(), count * sizeof(float)));
      // The non-finite flag, and the error feedback's passes.
      Dev<unsigned> dFlag(1);
      dFlag.Put({0u});
      REQUIRE(ccoll::gpu::AnyNonFinite(dx.p, count, dFlag.p, nullptr) == ccSuccess);
      CHECK((dFlag.Get()[0] != 0) == !std::isfinite(ccoll::MaxAbs(x.data(), count)));
      const std::vector<float> g = Inputs(count, count + 1, false);
      std::vector<float> e = x;
      Dev<float> dg(count);
      dg.Put(g);
      for (size_t i = 0; i < count; ++i) e[i] += g[i];
      REQUIRE(ccoll::gpu::AddInto(dx.p, dg.p, count, nullptr) == ccSuccess);
      CHECK(SameFloats(e.data(), dx.Get().data(), count));
      // The add and the norms of the sums in one pass (topk's pre-pass with error feedback).
      std::vector<float> e2 = e;
      for (size_t i = 0; i < count; ++i) e2[i] += g[i];
      ccoll::ChunkNorms(e2.data(), count, chunk, &cpuNorms);
      REQUIRE(ccoll::gpu::AddIntoChunkNorms(dx.p, dg.p, count, chunk, dNorms.p, nullptr) == ccSuccess);
      CHECK(SameFloats(e2.data(), dx.Get().data(), count));
      gpuNorms = dNorms.Get();
      CHECK(SameBytes(cpuNorms.data(), gpuNorms.data(), cpuNorms.size() * sizeof(float)));
      dx.Put(e);
      for (size_t i = 0; i < count; ++i) {
        const float left = e[i] - g[i] * 0.5f;
        e[i] = std::isfinite(left) ? left : 0.0f;
      }
      std::vector<float> half = g;
      for (float& h : half) h *= 0.5f;
      dg.Put(half);
      REQUIRE(ccoll::gpu::KeepResidual(dx.p, dg.p, count, nullptr) == ccSuccess);
      CHECK(SameBytes(e.data(), dx.Get().data(), count * sizeof(float)));
      std::vector<float> bad = x;
      for (float& b : bad) b = std::isfinite(b) ? b : 0.0f;
      dx.Put(x);
      REQUIRE(ccoll::gpu::DropNonFinite(dx.p, count, nullptr) == ccSuccess);
      CHECK(SameBytes(bad.data(), dx.Get().data(), count * sizeof(float)));
    }
  }
}

TEST_CASE("[gpu] the chunk choice on the device (CUB radix sort) equals TopChunks and RandomChunks", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 gen(12345);
  for (size_t chunks : {size_t{1}, size_t{5}, size_t{1000}, size_t{262147}}) {
    for (size_t k : {size_t{1}, (chunks + 9) / 10, chunks}) {
      INFO(chunks << " chunks, k " << k);
      // Norms with ties, zeros, +inf and NaN (ranked as +inf), as summed chunk norms can be.
      std::vector<float> norms(chunks);
      for (size_t c = 0; c < chunks; ++c) {
        const uint32_t r = gen();
        norms[c] = r % 13 == 0 ? 0.0f : r % 17 == 0 ? INFINITY : r % 19 == 0 ? NAN
                 : static_cast<float>(r % 97) * 0.25f;
      }
      Dev<float> dNorms(chunks);
      dNorms.Put(norms);
      Dev<char> scratch(ccoll::gpu::ChooseChunksScratchBytes(chunks));
      Dev<uint32_t> dChosen(k);
      std::vector<uint32_t> cpu;
      ccoll::TopChunks(norms, k, &cpu);
      REQUIRE(ccoll::gpu::ChooseTopChunks(dNorms.p, chunks, k, scratch.p, dChosen.p, nullptr) == ccSuccess);
      CHECK(cctest::FirstDifference(dChosen.Get(), cpu) == "");
      for (uint32_t key : {0u, 17u, 0xdeadbeefu}) {
        ccoll::RandomChunks(chunks, k, key, &cpu);
        REQUIRE(ccoll::gpu::ChooseRandomChunks(chunks, k, key, scratch.p, dChosen.p, nullptr) == ccSuccess);
        CHECK(cctest::FirstDifference(dChosen.Get(), cpu) == "");
      }
    }
  }
  // randk's non-finite mark and the poisoning it causes.
  for (bool bad : {false, true}) {
    std::vector<float> x(5000, 1.5f);
    if (bad) x[4321] = -INFINITY;
    Dev<float> dx(x.size()), dMark(1);
    dx.Put(x);
    dMark.Put({0.0f});
    REQUIRE(ccoll::gpu::MarkNonFinite(dx.p, x.size(), dMark.p, nullptr) == ccSuccess);
    const float mark = dMark.Get()[0];
    CHECK(std::isnan(mark) == bad);
    REQUIRE(ccoll::gpu::PoisonIfMarked(dx.p, x.size(), dMark.p, nullptr) == ccSuccess);
    const std::vector<float> y = dx.Get();
    CHECK(std::isnan(y[0]) == bad);
    CHECK(std::isnan(y.back()) == bad);
  }
}

#ifdef CCOLL_HAVE_CUBLAS
// Whether every element of gpu = a (m x k) b (k x n) (row-major; ta / tb: a or b stored transposed) is within the
// standard bound of an fp32 dot product of k terms: |gpu - exact| <= k * 2^-24 * sum |terms| (exact in double).
bool WithinProductBound(const std::vector<float>& gpu, const std::vector<float>& a, const std::vector<float>& b,
                        size_t m, size_t k, size_t n, bool ta, bool tb) {
  const double u = std::ldexp(1.0, -24);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double s = 0.0, abs = 0.0;
      for (size_t l = 0; l < k; ++l) {
        const double t = static_cast<double>(ta ? a[l * m + i] : a[i * k + l]) * (tb ? b[j * k + l] : b[l * n + j]);
        s += t;
        abs += std::fabs(t);
      }
      if (std::fabs(gpu[i * n + j] - s) > static_cast<double>(k) * u * abs + 1e-30) return false;
    }
  }
  return true;
}

TEST_CASE("[gpu] PowerSGD's cuBLAS products match a double-precision reference", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  std::unique_ptr<ccoll::gpu::LowRankBlas> blas;
  REQUIRE(ccoll::gpu::LowRankBlas::Create(stream, nullptr, 0, false, &blas) == ccSuccess);
  struct Shape {
    size_t rows, cols;
    int r;
  } shapes[] = {{300, 333, 2}, {1024, 64, 8}, {7, 1000, 3}, {2048, 2048, 16}};
  for (const Shape& sh : shapes) {
    INFO(sh.rows << " x " << sh.cols << " rank " << sh.r);
    const size_t rows = sh.rows, cols = sh.cols, r = static_cast<size_t>(sh.r);
    const std::vector<float> m = Inputs(rows * cols, rows, false), q = Inputs(cols * r, cols, false);
    const std::vector<float> p = Inputs(rows * r, r, false);
    Dev<float> dm(rows * cols), dq(cols * r), dp(rows * r), dOut(rows * cols), dq2(cols * r);
    dm.Put(m);
    dq.Put(q);
    dp.Put(p);
    REQUIRE(blas->ProductMQ(dm.p, rows, cols, dq.p, sh.r, dp.p) == ccSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(WithinProductBound(dp.Get(), m, q, rows, cols, r, false, false));
    dp.Put(p);
    REQUIRE(blas->ProductMtP(dm.p, rows, cols, dp.p, sh.r, dq2.p) == ccSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(WithinProductBound(dq2.Get(), m, p, cols, rows, r, true, false));
    REQUIRE(blas->ProductPQt(dp.p, dq.p, rows, cols, sh.r, dOut.p) == ccSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(WithinProductBound(dOut.Get(), p, q, rows, r, cols, false, true));
    // Deterministic: the same product twice gives the same bytes.
    std::vector<float> once = dOut.Get();
    REQUIRE(blas->ProductPQt(dp.p, dq.p, rows, cols, sh.r, dOut.p) == ccSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(SameBytes(once.data(), dOut.Get().data(), once.size() * sizeof(float)));
  }
  blas.reset();
  cudaStreamDestroy(stream);
}

// Largest |a[i] - b[i]|.
double MaxDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double most = 0.0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::fabs(static_cast<double>(a[i]) - b[i]));
  return most;
}

#ifdef CCOLL_FAKE_CUDA
// The handle pool (compress/lowrank_cuda.cc), seen through the fake cuBLAS's counts (every cublasCreate in this
// process is the pool's): a handle is never destroyed, a destroyed LowRankBlas's handle is the next one's, and
// ReserveBlasHandles makes only what is missing, and a call being captured takes a kept handle or none.
TEST_CASE("[gpu] cuBLAS handles are kept in a pool: reused, reserved ahead, never destroyed", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const uint64_t destroys = cctest::FakeCublasDestroys();
  std::unique_ptr<ccoll::gpu::LowRankBlas> a, b;
  REQUIRE(ccoll::gpu::LowRankBlas::Create(stream, nullptr, 0, false, &a) == ccSuccess);
  a.reset();  // its handle goes back to the pool
  uint64_t made = cctest::FakeCublasCreates();
  REQUIRE(ccoll::gpu::LowRankBlas::Create(stream, nullptr, 0, false, &a) == ccSuccess);
  CHECK(cctest::FakeCublasCreates() == made);  // from the pool
  a.reset();
  // Every handle made so far is in the pool: as many objects as that take them all, one more makes a new one.
  std::vector<std::unique_ptr<ccoll::gpu::LowRankBlas>> many(made + 1);
  for (auto& m : many) REQUIRE(ccoll::gpu::LowRankBlas::Create(stream, nullptr, 0, false, &m) == ccSuccess);
  CHECK(cctest::FakeCublasCreates() == made + 1);
  many.clear();
  made = cctest::FakeCublasCreates();
  REQUIRE(ccoll::gpu::ReserveBlasHandles(0, static_cast<int>(made)) == ccSuccess);  // all made already
  CHECK(cctest::FakeCublasCreates() == made);
  REQUIRE(ccoll::gpu::ReserveBlasHandles(0, static_cast<int>(made) + 2) == ccSuccess);  // the two missing ones
  CHECK(cctest::FakeCublasCreates() == made + 2);
  many.resize(made + 2);
  // All from the pool:
  for (auto& m : many) REQUIRE(ccoll::gpu::LowRankBlas::Create(stream, nullptr, 0, false, &m) == ccSuccess);
  CHECK(cctest::FakeCublasCreates() == made + 2);
  // During a capture only a kept handle will do: with none left, a usage error and no cublasCreate.
  std::unique_ptr<ccoll::gpu::LowRankBlas> captured;
  CHECK(ccoll::gpu::LowRankBlas::Create(stream, nullptr, 0, true, &captured) == ccInvalidUsage);
  CHECK(captured == nullptr);
  CHECK(std::string(ccGetLastError(nullptr)).find("captured") != std::string::npos);
  CHECK(cctest::FakeCublasCreates() == made + 2);
  many.back().reset();
  CHECK(ccoll::gpu::LowRankBlas::Create(stream, nullptr, 0, true, &captured) == ccSuccess);
  CHECK(cctest::FakeCublasCreates() == made + 2);
  captured.reset();
  many.clear();
  CHECK(cctest::FakeCublasDestroys() == destroys);
  cudaStreamDestroy(stream);
}

// A product that cannot run because the device is lost (an Xid): the error names the CUDA runtime's cause, not only
// cuBLAS's status, so that it reads like every other call's on that device.
TEST_CASE("[gpu] a cuBLAS product on a lost device fails naming the CUDA error", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  Dev<float> m(64 * 32), q(32 * 2), p(64 * 2);
  std::unique_ptr<ccoll::gpu::LowRankBlas> blas;
  REQUIRE(ccoll::gpu::LowRankBlas::Create(stream, nullptr, 0, false, &blas) == ccSuccess);
  {
    struct GiveBackTheDevice {
      ~GiveBackTheDevice() { cctest::FakeLoseDevice(false); }
    } giveBack;
    cctest::FakeLoseDevice(true);
    CHECK(blas->ProductMQ(m.p, 64, 32, q.p, 2, p.p) == ccUnhandledCudaError);
    const std::string error = ccGetLastError(nullptr);
    INFO(error);
    CHECK(error.find("CUBLAS_STATUS_EXECUTION_FAILED") != std::string::npos);
    CHECK(error.find("launch failure") != std::string::npos);
  }
  blas.reset();
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  cudaStreamDestroy(stream);
}
#endif

TEST_CASE("[gpu] PowerSGD's Gram-Schmidt and start of Q on the device match the host's to rounding", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  REQUIRE(ccoll::gpu::LoadLowRankKernels() == ccSuccess);
  std::vector<double> scratch;
  // rows >= r: with fewer rows, the columns past the rows' span are rounding noise normalized to unit length, and the
  // host's and the device's noise differ.
  for (int64_t rows : {int64_t{16}, int64_t{300}, int64_t{4096}}) {
    for (int r : {1, 4, 16}) {
      INFO(rows << " x " << r);
      const size_t elems = static_cast<size_t>(rows) * r;
      Dev<double> w(elems);
      Dev<float> da(elems);
      // Gram-Schmidt of a random matrix (and of one with a zero column): the host's result to a few float ulps; every
      // column unit or zero, and the same bytes twice.
      for (bool zeroColumn : {false, true}) {
        std::vector<float> a = Inputs(elems, rows * 31 + r, false);
        if (zeroColumn) {
          for (int64_t i = 0; i < rows; ++i) a[i * r] = 0.0f;
        }
        std::vector<float> host = a;
        ccoll::Orthogonalize(host.data(), rows, r, 1e-8, &scratch);
        da.Put(a);
        REQUIRE(ccoll::gpu::OrthogonalizeOnDevice(da.p, rows, r, 1e-8, w.p, nullptr) == ccSuccess);
        const std::vector<float> dev = da.Get();
        CHECK(MaxDifference(dev, host) < 1e-5);
        da.Put(a);
        REQUIRE(ccoll::gpu::OrthogonalizeOnDevice(da.p, rows, r, 1e-8, w.p, nullptr) == ccSuccess);
        CHECK(SameBytes(dev.data(), da.Get().data(), elems * sizeof(float)));
      }
      // The start of Q: cold, a fresh random Q (RandomQ's values, orthonormalized); warm from a usable Q, that Q
      // orthonormalized again; warm from one with a zero column, a fresh random Q.
      std::vector<float> host(elems);
      ccoll::RandomQ(host.data(), rows, r, 99, &scratch);
      REQUIRE(ccoll::gpu::StartQOnDevice(da.p, rows, r, 99, false, 0.0, w.p, nullptr) == ccSuccess);
      CHECK(MaxDifference(da.Get(), host) < 1e-5);
      std::vector<float> q = Inputs(elems, rows + r, false);
      host = q;
      ccoll::Orthogonalize(host.data(), rows, r, 0.0, &scratch);
      if (ccoll::UsableQ(host.data(), rows, r)) {
        da.Put(q);
        REQUIRE(ccoll::gpu::StartQOnDevice(da.p, rows, r, 99, true, 0.0, w.p, nullptr) == ccSuccess);
        CHECK(MaxDifference(da.Get(), host) < 1e-5);
      }
      for (int64_t i = 0; i < rows; ++i) q[i * r + (r - 1)] = 0.0f;
      ccoll::RandomQ(host.data(), rows, r, 7, &scratch);
      da.Put(q);
      REQUIRE(ccoll::gpu::StartQOnDevice(da.p, rows, r, 7, true, 0.0, w.p, nullptr) == ccSuccess);
      CHECK(MaxDifference(da.Get(), host) < 1e-5);
    }
  }
}
#endif
