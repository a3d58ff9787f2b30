// gpu_probe: where device work first fails on this machine's GPU, one step at a time, each printed with "ok" or with
// what failed (CUDA's or ccoll's sentence), so that a single call on a borrowed GPU says where to look:
//   the driver and the device's attributes; a context; cudaMalloc and copies; ccoll's reduce and rotation kernels
//   against the CPU, byte for byte; the device's preparation (kernel loads, memory pools, wait words); a stream held
//   by the wait kernel on a mapped host word and released from the host; pool allocations; then device all-reduces
//   through the public API, exact and 4-bit, on 1 rank and on 2 thread ranks sharing the device.
// A failing step does not stop the others, but after one the context's state is printed (a sticky error breaks every
// later call). A step that does not finish within -t seconds (default 20) ends the program, naming it.
//
//   gpu_probe [-t SECONDS]          exit status: 0 when every step passed, 1 when one failed, 2 stuck, 64 bad usage
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ccoll.h"
#include "collectives/device_prepare.h"
#include "collectives/reduce_cuda.h"
#include "compress/codec_cuda.h"
#include "compress/quant_cpu.h"
#include "core/device_memory.h"
#include "core/kernel_loading.h"
#include "core/stream_wait.h"

namespace {

using Clock = std::chrono::steady_clock;

// The step now running, for the watchdog.
std::mutex gStepMutex;
std::condition_variable gStepChanged;
std::string gStep;
uint64_t gStepNumber = 0;
bool gDone = false;

// Ends the process when one step runs longer than `limitS` seconds.
void Watchdog(int limitS) {
  std::unique_lock<std::mutex> lock(gStepMutex);
  while (!gDone) {
    const uint64_t seen = gStepNumber;
    if (gStepChanged.wait_for(lock, std::chrono::seconds(limitS), [&] { return gDone || gStepNumber != seen; })) {
      continue;
    }
    std::printf("STUCK: step '%s' has not finished after %d s\n", gStep.c_str(), limitS);
    std::fflush(stdout);
    std::_Exit(2);
  }
}

// A step's outcome: empty when it passed, else why not.
using Outcome = std::string;

std::string Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return std::string();
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

std::string Cc(ccResult_t r, const char* what, ccComm_t comm = nullptr) {
  if (r == ccSuccess) return std::string();
  return std::string(what) + ": " + ccGetErrorString(r) + " (" + ccGetLastError(comm) + ")";
}

#define PROBE_CUDA(call)                           \
  do {                                             \
    std::string why_ = Cuda((call), #call);        \
    if (!why_.empty()) return why_;                \
  } while (0)

#define PROBE_CC(call)                             \
  do {                                             \
    std::string why_ = Cc((call), #call);          \
    if (!why_.empty()) return why_;                \
  } while (0)

int gFailures = 0;
void* gProbeBytes = nullptr;  // 256 bytes of device memory from the context step, for ContextState's memset

// After a failed step, the context's state without waiting for streams the failure may have left held (a
// cudaDeviceSynchronize would wait for them for ever): a memset on a fresh stream, waited for at most 5 s.
std::string ContextState() {
  std::string state = std::string("cudaGetLastError ") + cudaGetErrorName(cudaGetLastError());
  cudaStream_t fresh = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking);
  if (e == cudaSuccess && gProbeBytes != nullptr) e = cudaMemsetAsync(gProbeBytes, 0, 256, fresh);
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (e == cudaSuccess && gProbeBytes != nullptr) {
    e = cudaStreamQuery(fresh);
    if (e != cudaErrorNotReady || Clock::now() > until) break;
    e = cudaSuccess;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (e == cudaErrorNotReady) return state + "; a memset on a fresh stream was still queued after 5 s";
  if (fresh != nullptr) cudaStreamDestroy(fresh);
  return state + "; a memset on a fresh stream: " + cudaGetErrorName(e) + (gProbeBytes ? "" : " (no memory to set)");
}

void Step(const char* name, const std::function<Outcome()>& body) {
  {
    std::lock_guard<std::mutex> lock(gStepMutex);
    gStep = name;
    ++gStepNumber;
  }
  gStepChanged.notify_all();
  const auto start = Clock::now();
  const Outcome why = body();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (why.empty()) {
    std::printf("ok      %-44s %8.1f ms\n", name, ms);
  } else {
    ++gFailures;
    std::printf("FAILED  %-44s %8.1f ms: %s\n", name, ms, why.c_str());
    // A sticky error (an illegal address, a launch failure) fails every later call of the context.
    std::printf("        after it: %s\n", ContextState().c_str());
  }
  std::fflush(stdout);
}

// Whether ccoll's kernels were loaded by the preparation's reference (cudaFuncGetAttributes), as it assumes
// (core/kernel_loading.h), or needed cuFuncLoad.
void PrintKernelLoads() {
  const ccoll::gpu::KernelLoads k = ccoll::gpu::KernelLoadsSoFar();
  std::printf("        kernel loads: %d states read (cuFuncIsLoaded): %d loaded by the reference, %d by "
              "cuFuncLoad%s%s\n",
              k.checked, k.loadedByReference, k.loadedExplicitly, k.note.empty() ? "" : "; ", k.note.c_str());
  std::fflush(stdout);
}

std::vector<float> Gaussian(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

// A device buffer holding `v`.
Outcome Upload(const std::vector<float>& v, float** p) {
  PROBE_CUDA(cudaMalloc(reinterpret_cast<void**>(p), v.size() * sizeof(float)));
  PROBE_CUDA(cudaMemcpy(*p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  return Outcome();
}

Outcome Download(const float* p, size_t n, std::vector<float>* v) {
  v->resize(n);
  PROBE_CUDA(cudaMemcpy(v->data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return Outcome();
}

Outcome DeviceAttributes() {
  int driver = 0, runtime = 0, count = 0;
  PROBE_CUDA(cudaDriverGetVersion(&driver));
  PROBE_CUDA(cudaRuntimeGetVersion(&runtime));
  PROBE_CUDA(cudaGetDeviceCount(&count));
  cudaDeviceProp prop;
  PROBE_CUDA(cudaGetDeviceProperties(&prop, 0));
  const struct {
    cudaDeviceAttr attr;
    const char* name;
  } attrs[] = {{cudaDevAttrMemoryPoolsSupported, "memory pools"},
               {cudaDevAttrHostMemoryPoolsSupported, "host memory pools"},
               {cudaDevAttrCanMapHostMemory, "maps host memory"},
               {cudaDevAttrUnifiedAddressing, "unified addressing"},
               {cudaDevAttrHostRegisterSupported, "host register"},
               {cudaDevAttrPageableMemoryAccess, "pageable memory access"},
               {cudaDevAttrComputeMode, "compute mode"},
               {cudaDevAttrMaxSharedMemoryPerBlockOptin, "shared memory per block (opt-in)"}};
  std::printf("        driver %d, runtime %d, %d device(s); device 0: %s, sm_%d%d, %d SMs, %.1f GiB\n", driver, runtime,
              count, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1u << 30));
  std::printf("       ");
  for (const auto& a : attrs) {
    int value = 0;
    const cudaError_t e = cudaDeviceGetAttribute(&value, a.attr, 0);
    if (e == cudaSuccess) {
      std::printf(" %s %d;", a.name, value);
    } else {
      cudaGetLastError();
      std::printf(" %s: %s;", a.name, cudaGetErrorName(e));
    }
  }
  std::printf("\n");
  return Outcome();
}

Outcome Copies() {
  const std::vector<float> in = Gaussian(1 << 20, 1);
  float* d = nullptr;
  Outcome why = Upload(in, &d);
  std::vector<float> back;
  if (why.empty()) why = Download(d, in.size(), &back);
  cudaFree(d);
  if (why.empty() && std::memcmp(in.data(), back.data(), in.size() * sizeof(float)) != 0) {
    why = "the bytes read back differ from those written";
  }
  return why;
}

Outcome ReduceKernel() {
  const size_t n = (1 << 20) + 3;
  const std::vector<float> a = Gaussian(n, 2), b = Gaussian(n, 3);
  float *da = nullptr, *db = nullptr;
  Outcome why = Upload(a, &da);
  if (why.empty()) why = Upload(b, &db);
  if (why.empty()) why = Cc(ccoll::gpu::Reduce(da, da, db, n, ccFloat32, ccSum, nullptr), "gpu::Reduce");
  if (why.empty()) why = Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<float> got;
  if (why.empty()) why = Download(da, n, &got);
  for (size_t i = 0; why.empty() && i < n; ++i) {
    const float want = a[i] + b[i];
    if (std::memcmp(&want, &got[i], sizeof(float)) != 0) {
      why = "element " + std::to_string(i) + ": " + std::to_string(got[i]) + ", the CPU's " + std::to_string(want);
    }
  }
  cudaFree(da);
  cudaFree(db);
  return why;
}

Outcome RotationKernel() {
  const size_t n = (1 << 18) + 5, block = 1024;
  const std::vector<float> in = Gaussian(n, 4);
  std::vector<float> cpu(n);
  ccoll::RotateForward(in.data(), cpu.data(), n, block, 0x1234u);
  float *din = nullptr, *dout = nullptr;
  Outcome why = Upload(in, &din);
  if (why.empty()) why = Cuda(cudaMalloc(reinterpret_cast<void**>(&dout), n * sizeof(float)), "cudaMalloc");
  if (why.empty()) why = Cc(ccoll::gpu::RotateForward(din, dout, n, block, 0x1234u, nullptr), "gpu::RotateForward");
  if (why.empty()) why = Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<float> got;
  if (why.empty()) why = Download(dout, n, &got);
  if (why.empty() && std::memcmp(got.data(), cpu.data(), n * sizeof(float)) != 0) {
    why = "the rotated bytes differ from the CPU's";
  }
  cudaFree(din);
  cudaFree(dout);
  return why;
}

// The device proxy's mechanism: a one-thread kernel holds a stream until a host store to mapped memory releases it.
Outcome HeldStream() {
  uint64_t* word = nullptr;
  uint64_t* onDevice = nullptr;
  PROBE_CC(ccoll::TakeWaitWord(0, &word, &onDevice));
  cudaStream_t s = nullptr;
  Outcome why = Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  if (why.empty()) why = Cuda(ccoll::LaunchStreamWait(onDevice, 1, s), "LaunchStreamWait");
  if (why.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) why = std::string("the held stream's query gave ") + cudaGetErrorName(e);
  }
  __atomic_store_n(word, 1, __ATOMIC_RELEASE);  // also after a failure: nothing stays held
  if (why.empty()) {
    const auto until = Clock::now() + std::chrono::seconds(5);
    cudaError_t e = cudaErrorNotReady;
    while (e == cudaErrorNotReady && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      e = cudaStreamQuery(s);
    }
    if (e == cudaErrorNotReady) why = "the stream was still held 5 s after the host released the word";
    else why = Cuda(e, "cudaStreamQuery after the release");
  }
  if (s != nullptr && why.empty()) cudaStreamDestroy(s);  // (a stream still held is left alone)
  if (why.empty()) ccoll::ReturnWaitWord(0, word);
  return why;
}

// The hazard README "Device buffers" names: CUDA spreads streams over CUDA_DEVICE_MAX_CONNECTIONS hardware queues,
// each run in order, and the device proxy holds a caller's stream (the wait kernel, with copies and an event queued
// behind it) while its own kernels and copies run on other streams. Counted here: of kStreams streams made after the
// held one, how many could not finish a kernel, a memset and a copy to pinned memory while it was held (work queued
// behind a held stream in a shared queue); the step fails only if some have not finished 5 s after the release.
Outcome QueuesBesideAHeldStream() {
  constexpr int kStreams = 40;
  constexpr size_t kFloats = 256;
  uint64_t* word = nullptr;
  uint64_t* onDevice = nullptr;
  PROBE_CC(ccoll::TakeWaitWord(0, &word, &onDevice));
  float* d = nullptr;
  float* h = nullptr;
  std::vector<cudaStream_t> streams(kStreams + 1, nullptr);  // [0] is the held one
  std::vector<cudaEvent_t> events(kStreams + 1, nullptr);
  // Everything is made before the hold (nothing below allocates), and freed at the end whatever failed.
  Outcome why = Cuda(cudaMalloc(reinterpret_cast<void**>(&d), (kStreams + 1) * kFloats * sizeof(float)), "cudaMalloc");
  if (why.empty()) {
    why = Cuda(cudaHostAlloc(reinterpret_cast<void**>(&h), (kStreams + 1) * kFloats * sizeof(float),
                             cudaHostAllocDefault), "cudaHostAlloc");
  }
  for (int i = 0; i <= kStreams && why.empty(); ++i) {
    why = Cuda(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    if (why.empty()) why = Cuda(cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  if (why.empty()) why = Cuda(ccoll::LaunchStreamWait(onDevice, 1, streams[0]), "LaunchStreamWait");
  if (why.empty()) {
    why = Cuda(cudaMemcpyAsync(d, h, kFloats * sizeof(float), cudaMemcpyHostToDevice, streams[0]), "held copy");
  }
  if (why.empty()) why = Cuda(cudaEventRecord(events[0], streams[0]), "cudaEventRecord (held)");
  for (int i = 1; i <= kStreams && why.empty(); ++i) {
    float* mine = d + static_cast<size_t>(i) * kFloats;
    why = Cc(ccoll::gpu::Reduce(mine, mine, mine, kFloats, ccFloat32, ccSum, streams[i]), "Reduce kernel");
    if (why.empty()) why = Cuda(cudaMemsetAsync(mine, 0, kFloats * sizeof(float), streams[i]), "cudaMemsetAsync");
    if (why.empty()) {
      why = Cuda(cudaMemcpyAsync(h + static_cast<size_t>(i) * kFloats, mine, kFloats * sizeof(float),
                                 cudaMemcpyDeviceToHost, streams[i]), "cudaMemcpyAsync");
    }
    if (why.empty()) why = Cuda(cudaEventRecord(events[i], streams[i]), "cudaEventRecord");
  }
  // Events still pending among [from, to], waited for until `until`.
  auto pending = [&](int from, int to, Clock::time_point until) {
    int left = 0;
    do {
      left = 0;
      for (int i = from; i <= to; ++i) {
        left += events[i] != nullptr && cudaEventQuery(events[i]) == cudaErrorNotReady ? 1 : 0;
      }
      if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    } while (left > 0 && Clock::now() < until);
    return left;
  };
  int waited = -1;
  bool heldHeld = false;
  if (why.empty()) {
    waited = pending(1, kStreams, Clock::now() + std::chrono::seconds(3));
    heldHeld = cudaEventQuery(events[0]) == cudaErrorNotReady;
  }
  __atomic_store_n(word, 1, __ATOMIC_RELEASE);  // also after a failure: nothing stays held
  const int stuck = pending(0, kStreams, Clock::now() + std::chrono::seconds(5));
  const char* queues = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (waited >= 0) {
    std::printf("        %d of %d streams could not finish while one was held (CUDA_DEVICE_MAX_CONNECTIONS=%s)%s\n",
                waited, kStreams, queues ? queues : "unset, 8", heldHeld ? "" : "; the held stream was not held");
  }
  if (why.empty() && stuck > 0) why = std::to_string(stuck) + " stream(s) still busy 5 s after the release";
  if (why.empty() && !heldHeld) why = "the wait kernel did not hold its stream";
  if (stuck == 0) {  // (streams still busy are left alone)
    for (int i = 0; i <= kStreams; ++i) {
      if (events[i] != nullptr) cudaEventDestroy(events[i]);
      if (streams[i] != nullptr) cudaStreamDestroy(streams[i]);
    }
    if (d != nullptr) cudaFree(d);
    if (h != nullptr) cudaFreeHost(h);
    ccoll::ReturnWaitWord(0, word);
  }
  return why;
}

Outcome Pools() {
  cudaMemPool_t device = nullptr, host = nullptr;
  PROBE_CC(ccoll::DevicePool(0, &device));
  PROBE_CC(ccoll::PinnedHostPool(0, &host));
  std::printf("        device pool %s, pinned host pool %s\n", device ? "made" : "none (cudaMalloc)",
              host ? "made" : "none (cudaHostAlloc)");
  void* p = nullptr;
  void* h = nullptr;
  PROBE_CC(ccoll::AllocateScratch(0, false, 1 << 20, nullptr, &p));
  PROBE_CC(ccoll::AllocateScratch(0, true, 1 << 20, nullptr, &h));
  PROBE_CUDA(cudaMemsetAsync(p, 1, 1 << 20, nullptr));
  PROBE_CUDA(cudaMemcpyAsync(h, p, 1 << 20, cudaMemcpyDeviceToHost, nullptr));
  PROBE_CUDA(cudaStreamSynchronize(nullptr));
  if (static_cast<unsigned char*>(h)[(1 << 20) - 1] != 1) return "the pinned scratch did not receive the copy";
  ccoll::FreeScratch(0, false, p, nullptr);
  ccoll::FreeScratch(0, true, h, nullptr);
  PROBE_CUDA(cudaStreamSynchronize(nullptr));
  return Outcome();
}

// nranks thread ranks on device 0 all-reduce (sum) Gaussian inputs of their own, exactly or with `spec`; every rank's
// result must equal rank 0's byte for byte, and the exact sum the host's sum in rank order to rounding.
Outcome AllReduce(int nranks, const char* spec) {
  const size_t n = (1 << 20) + 11;
  std::vector<ccComm_t> comms(nranks, nullptr);
  std::vector<int> devs(nranks, 0);
  PROBE_CC(ccCommInitAll(comms.data(), nranks, devs.data()));
  std::vector<std::vector<float>> in(nranks), out(nranks);
  std::vector<std::string> why(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    in[r] = Gaussian(n, 10 + r);
    threads.emplace_back([&, r] {
      ccCompressor_t comp = nullptr;
      float* d = nullptr;
      cudaStream_t s = nullptr;
      std::string& w = why[r];
      w = Cuda(cudaSetDevice(0), "cudaSetDevice");
      if (w.empty()) w = Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      if (w.empty() && spec != nullptr) {
        w = Cc(ccCompressorCreateFromString(&comp, spec), "ccCompressorCreateFromString");
      }
      if (w.empty()) w = Upload(in[r], &d);
      if (w.empty()) w = Cc(ccAllReduce(d, d, n, ccFloat32, ccSum, comp, comms[r], s), "ccAllReduce", comms[r]);
      if (w.empty()) w = Cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      if (w.empty()) {
        ccResult_t async = ccSuccess;
        ccCommGetAsyncError(comms[r], &async);
        w = Cc(async, "ccCommGetAsyncError", comms[r]);
      }
      if (w.empty()) w = Download(d, n, &out[r]);
      if (!w.empty()) ccCommAbort(comms[r]);  // the other rank's call then fails instead of waiting
      if (d != nullptr) cudaFree(d);
      if (comp != nullptr) ccCompressorDestroy(comp);
      if (s != nullptr) cudaStreamDestroy(s);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < nranks; ++r) {
    if (why[r].empty()) continue;
    for (int q = 0; q < nranks; ++q) {
      if (why[q].empty()) ccCommAbort(comms[q]);  // (the failed ranks aborted theirs); abort does not wait for peers
    }
    return "rank " + std::to_string(r) + ": " + why[r];
  }
  for (int r = 0; r < nranks; ++r) ccCommDestroy(comms[r]);
  for (int r = 1; r < nranks; ++r) {
    if (std::memcmp(out[r].data(), out[0].data(), n * sizeof(float)) != 0) {
      return "rank " + std::to_string(r) + "'s result differs from rank 0's";
    }
  }
  double err = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    double want = 0;
    for (int r = 0; r < nranks; ++r) want += in[r][i];
    if (!std::isfinite(out[0][i])) return "element " + std::to_string(i) + " is not finite";
    err += (out[0][i] - want) * (out[0][i] - want);
    norm += want * want;
  }
  const double nmse = err / norm;
  // One rank: a copy, compressed or not. Two: float32 sums, or 4-bit requant with rotation (0.025 measured against the
  // fake CUDA runtime, whose codec kernels are the CPU's: the GPU's bytes must be the same, with the default seed).
  const double bound = nranks == 1 ? 0.0 : spec == nullptr ? 1e-12 : 0.05;
  std::printf("        %d rank(s), %s: normalized squared error %.3g (bound %.3g)\n", nranks, spec ? spec : "exact",
              nmse, bound);
  if (!(nmse <= bound)) return "the error is over its bound";
  return Outcome();
}

}  // namespace

int main(int argc, char** argv) {
  int limitS = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
      limitS = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [-t SECONDS]\n", argv[0]);
      return 64;
    }
  }
  if (limitS <= 0) limitS = 20;
  std::thread watchdog(Watchdog, limitS);
  Step("driver, runtime and device attributes", DeviceAttributes);
  Step("context (cudaSetDevice, cudaFree(0))", [] {
    Outcome why = Cuda(cudaSetDevice(0), "cudaSetDevice");
    if (why.empty()) why = Cuda(cudaFree(nullptr), "cudaFree(0)");
    return why.empty() ? Cuda(cudaMalloc(&gProbeBytes, 256), "cudaMalloc of 256 bytes") : why;
  });
  Step("cudaMalloc and copies, 4 MiB", Copies);
  Step("reduce kernel against the CPU", ReduceKernel);
  Step("rotation kernel against the CPU", RotationKernel);
  Step("device preparation (kernels, pools, words)", [] { return Cc(ccoll::PrepareDevice(0), "PrepareDevice"); });
  PrintKernelLoads();
  Step("stream held on a mapped word, released", HeldStream);
  Step("scratch from the pools", Pools);
  Step("all-reduce, 1 rank, exact", [] { return AllReduce(1, nullptr); });
  Step("all-reduce, 1 rank, quant 4 bits (a copy)", [] { return AllReduce(1, "quant:bits=4,mode=requant"); });
  Step("all-reduce, 2 thread ranks, exact", [] { return AllReduce(2, nullptr); });
  Step("all-reduce, 2 thread ranks, quant 4 bits", [] { return AllReduce(2, "quant:bits=4,mode=requant"); });
  Step("40 streams beside a held one (hardware queues)", QueuesBesideAHeldStream);
  {
    std::lock_guard<std::mutex> lock(gStepMutex);
    gDone = true;
  }
  gStepChanged.notify_all();
  watchdog.join();
  std::printf("gpu_probe: %d step(s) failed\n", gFailures);
  std::fflush(stdout);
  return gFailures == 0 ? 0 : 1;
}
