#include "core/device_memory.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda_result.h"
#include "core/device_scope.h"
#include "core/error.h"
#include "core/log.h"
#include "core/params.h"

namespace ccoll {
namespace {

constexpr size_t kLine = 64;           // one wait word per cache line
constexpr size_t kWordsPerSlab = 256;  // proxies of one device before a second slab is needed

// Where a device has no pool of a kind (see DevicePool and PinnedHostPool), AllocateScratch takes blocks of that
// kind from cudaMalloc or cudaHostAlloc, and FreeScratch keeps them instead of freeing them: cudaFree and
// cudaFreeHost synchronize the device, and so would wait for any stream held by its own earlier work. A kept block
// is handed out again, for its size, once `freed` (recorded where it was freed) has completed.
struct Block {
  size_t bytes;
  bool onDevice;  // device memory (cudaMalloc), else pinned host memory (cudaHostAlloc)
};
struct CachedBlock {
  void* p;
  Block block;
  cudaEvent_t freed;
};

// Everything of one device, under gMutex. Never freed: the memory lives as long as the process.
struct DeviceMemory {
  bool devicePoolTried = false;
  cudaMemPool_t devicePool = nullptr;  // nullptr: none (see DevicePool)
  cudaStream_t releaseStream = nullptr;
  bool hostPoolTried = false;
  cudaMemPool_t hostPool = nullptr;  // nullptr: none (see PinnedHostPool)
  std::vector<uint64_t*> freeWords;  // host addresses
  std::map<uint64_t*, uint64_t*> deviceAddress;  // every word's device address
  std::map<void*, Block> blocks;         // the blocks from cudaMalloc or cudaHostAlloc in use
  std::vector<CachedBlock> blockCache;   // and those that FreeScratch kept
};

std::mutex gMutex;
std::map<int, DeviceMemory>& Devices() {
  static auto* d = new std::map<int, DeviceMemory>();
  return *d;
}

cudaError_t SetUpPool(cudaMemPool_t pool) {
  int no = 0;
  cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no);
  uint64_t keepAll = UINT64_MAX;
  if (e == cudaSuccess) e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keepAll);
  return e;
}

// A pool that can be made may still fail its allocations: neither the attribute nor cudaMemPoolCreate needs the
// virtual-memory calls a pool grows with, which a virtual GPU profile or a sandbox may refuse (drivers do refuse them
// on some vGPU profiles: xgboost issue #12217, its own allocator's cuMemGetAllocationGranularity). So a new pool is
// used only once an allocation from it and its free have returned, and the stream they were queued on (one of their
// own, before any of ccoll's streams waits: core/device_proxy.h) has run them, or has not said otherwise within a
// second (a queue shared with a stream that is held elsewhere must not hold this thread).
constexpr size_t kTrialBytes = 4096;
cudaError_t TryPool(cudaMemPool_t pool) {
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return e;
  void* p = nullptr;
  e = cudaMallocFromPoolAsync(&p, kTrialBytes, pool, s);
  if (e == cudaSuccess) e = cudaFreeAsync(p, s);
  for (int ms = 0; e == cudaSuccess && ms < 1000; ++ms) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) e = q;
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cudaGetLastError();  // (a cudaErrorNotReady the query left)
  gpu::IgnoreCuda(cudaStreamDestroy(s));
  return e;
}

// Sets up a pool just made (SetUpPool) and tries it (TryPool); destroys it on a failure, which *step then names.
cudaError_t ReadyPool(cudaMemPool_t pool, const char** step) {
  *step = "setting its attributes";
  cudaError_t e = SetUpPool(pool);
  if (e == cudaSuccess) {
    *step = "an allocation from it";
    e = TryPool(pool);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();  // (the failed call's error)
    gpu::IgnoreCuda(cudaMemPoolDestroy(pool));
  }
  return e;
}

// A pool of `device`'s memory, or the reason there is none (*step names where it failed): a device without
// stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported: some virtual GPUs have none), or one whose pools fail
// their allocations.
cudaError_t MakeDevicePool(int device, cudaMemPool_t* made, const char** step) {
  *step = "cudaDevAttrMemoryPoolsSupported";
  int yes = 0;
  cudaError_t e = cudaDeviceGetAttribute(&yes, cudaDevAttrMemoryPoolsSupported, device);
  if (e != cudaSuccess) return e;
  if (yes == 0) return cudaErrorNotSupported;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  *step = "cudaMemPoolCreate";
  e = cudaMemPoolCreate(&pool, &props);
  if (e != cudaSuccess) return e;
  e = ReadyPool(pool, step);
  if (e != cudaSuccess) return e;
  *made = pool;
  return cudaSuccess;
}

// CC_MEMORY_POOLS=0: no pools even where the device has them (what a device without pools gets).
bool PoolsWanted() { return ParamInt("CC_MEMORY_POOLS") != 0; }

// Whether `device` has host memory pools.
bool HasHostPools(int device) {
  int yes = 0;
  if (cudaDeviceGetAttribute(&yes, cudaDevAttrHostMemoryPoolsSupported, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return yes != 0;
}

// A pool of pinned host memory that every device with host pools reads and writes (the transports' copies may run
// on another rank's device), or the reason there is none (*step names where it failed).
cudaError_t MakeHostPool(int device, cudaMemPool_t* made, const char** step) {
  *step = "cudaDevAttrHostMemoryPoolsSupported";
  if (!HasHostPools(device)) return cudaErrorNotSupported;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeHost;
  props.location.id = 0;  // (ignored for host memory)
  cudaMemPool_t pool = nullptr;
  *step = "cudaMemPoolCreate";
  cudaError_t e = cudaMemPoolCreate(&pool, &props);
  if (e != cudaSuccess) return e;
  int devices = 0;
  *step = "cudaMemPoolSetAccess";
  e = cudaGetDeviceCount(&devices);
  std::vector<cudaMemAccessDesc> access;
  for (int d = 0; e == cudaSuccess && d < devices; ++d) {
    if (d != device && !HasHostPools(d)) continue;
    cudaMemAccessDesc a = {};
    a.location.type = cudaMemLocationTypeDevice;
    a.location.id = d;
    a.flags = cudaMemAccessFlagsProtReadWrite;
    access.push_back(a);
  }
  if (e == cudaSuccess) e = cudaMemPoolSetAccess(pool, access.data(), access.size());
  if (e != cudaSuccess) {
    gpu::IgnoreCuda(cudaMemPoolDestroy(pool));
    return e;
  }
  e = ReadyPool(pool, step);
  if (e != cudaSuccess) return e;
  *made = pool;
  return cudaSuccess;
}

// Under gMutex: the first call makes a pool of `kind` with make(device, pool), later calls return at once. A failure
// leaves no pool (AllocateScratch falls back to `fallback`, with a warning), never an error; so does CC_MEMORY_POOLS=0.
void PoolLocked(int device, bool* tried, cudaMemPool_t* pool,
                cudaError_t (*make)(int, cudaMemPool_t*, const char**), const char* kind, const char* fallback) {
  if (*tried) return;
  *tried = true;
  if (!PoolsWanted()) {
    CC_INFO(kLogInit, "CUDA device %d: CC_MEMORY_POOLS=0: %s scratch from %s", device, kind, fallback);
    return;
  }
  const char* step = "";
  const cudaError_t e = make(device, pool, &step);
  if (e == cudaSuccess) return;
  cudaGetLastError();
  CC_WARN("CUDA device %d: no pool of %s memory (%s: %s); ccoll's %s scratch comes from %s, which may synchronize "
          "the device, so the first device call of each shape returns only once it has run; what ccoll frees is kept "
          "for reuse", device, kind, step, cudaGetErrorString(e), kind, fallback);
}

void DevicePoolLocked(int device, DeviceMemory& m) {
  PoolLocked(device, &m.devicePoolTried, &m.devicePool, MakeDevicePool, "device", "cudaMalloc");
}

void HostPoolLocked(int device, DeviceMemory& m) {
  PoolLocked(device, &m.hostPoolTried, &m.hostPool, MakeHostPool, "pinned host", "cudaHostAlloc");
}

// Under gMutex.
ccResult_t ReleaseStreamLocked(DeviceMemory& m) {
  if (m.releaseStream != nullptr) return ccSuccess;
  const cudaError_t e = cudaStreamCreateWithFlags(&m.releaseStream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return gpu::CudaResult(e, "cudaStreamCreateWithFlags (frees)");
  return ccSuccess;
}

// Under gMutex.
ccResult_t AddWordSlab(DeviceMemory& m) {
  void* slab = nullptr;
  cudaError_t e = cudaHostAlloc(&slab, kLine * kWordsPerSlab, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) return gpu::CudaResult(e, "cudaHostAlloc (wait words)");
  void* onDevice = nullptr;
  e = cudaHostGetDevicePointer(&onDevice, slab, 0);
  if (e != cudaSuccess) return gpu::CudaResult(e, "cudaHostGetDevicePointer (wait words)");
  for (size_t i = kWordsPerSlab; i-- > 0;) {
    auto* word = reinterpret_cast<uint64_t*>(static_cast<char*>(slab) + i * kLine);
    m.freeWords.push_back(word);
    m.deviceAddress[word] = reinterpret_cast<uint64_t*>(static_cast<char*>(onDevice) + i * kLine);
  }
  return ccSuccess;
}

// The size of the block that serves `bytes`: at least 256 bytes, and above that a power of two or 1.25, 1.5 or 1.75
// times one, whichever is the first not below `bytes` (ccoll's pinned buffers are powers of two, its device scratch
// follows a call's count). A kept block goes to an allocation of its own size only: a caller whose sizes vary reuses
// what earlier calls of about its size freed, and holds at most a quarter more than it asked for.
//
// (CUB's CachingDeviceAllocator keeps device blocks so too, but it frees its cache with cudaFree when an allocation
// fails or the cache is over its limit, and such a device synchronization is what this file exists to avoid; nor
// does it keep pinned host memory.)
size_t BlockSize(size_t bytes) {
  if (bytes <= 256) return 256;
  if (bytes > SIZE_MAX / 2) return bytes;
  size_t p = 256;
  while (p <= (bytes - 1) / 2) p *= 2;  // p < bytes <= 2p
  const size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

// Without a pool of the kind: a kept block of that kind and of `bytes`'s size whose stream has passed its free, else
// a fresh one from cudaMalloc or cudaHostAlloc (either may synchronize the device).
ccResult_t TakeBlock(int device, bool onDevice, size_t bytes, void** p) {
  const Block want{BlockSize(bytes), onDevice};
  {
    std::lock_guard<std::mutex> lock(gMutex);
    DeviceMemory& m = Devices()[device];
    std::vector<CachedBlock>& cache = m.blockCache;
    DeviceScope scope(device);
    for (size_t i = 0; i < cache.size(); ++i) {
      if (cache[i].block.bytes != want.bytes || cache[i].block.onDevice != onDevice) continue;
      const cudaError_t e = cudaEventQuery(cache[i].freed);
      if (e == cudaSuccess) {
        *p = cache[i].p;
        gpu::IgnoreCuda(cudaEventDestroy(cache[i].freed));
        cache.erase(cache.begin() + static_cast<std::ptrdiff_t>(i));
        m.blocks[*p] = want;
        return ccSuccess;
      }
      if (e != cudaErrorNotReady) cudaGetLastError();  // (this query's error; the block is tried again next time)
    }
  }
  {
    DeviceScope scope(device);
    if (onDevice) {
      CC_CHECK(gpu::CudaResult(cudaMalloc(p, want.bytes), "cudaMalloc"));
    } else {
      CC_CHECK(gpu::CudaResult(cudaHostAlloc(p, want.bytes, cudaHostAllocPortable), "cudaHostAlloc"));
    }
  }
  std::lock_guard<std::mutex> lock(gMutex);
  Devices()[device].blocks[*p] = want;
  return ccSuccess;
}

// Without a pool of the kind: keeps p for TakeBlock, once `stream`'s work queued so far is done (the stream must not
// be capturing a graph; no caller frees on one). Where the event cannot be made or recorded, cudaFree or cudaFreeHost
// frees p at once, after a device synchronization, and outside gMutex (a proxy thread that a waiting stream needs may
// take it).
void KeepBlock(int device, void* p, cudaStream_t stream) {
  Block block{};
  {
    std::lock_guard<std::mutex> lock(gMutex);
    DeviceMemory& m = Devices()[device];
    const auto known = m.blocks.find(p);
    if (known == m.blocks.end()) {
      CC_WARN("CUDA device %d: block %p freed but not ccoll's (or freed twice): left alone", device, p);
      return;
    }
    block = known->second;
    DeviceScope scope(device);
    cudaEvent_t freed = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&freed, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(freed, stream);
    if (e == cudaSuccess) {
      m.blockCache.push_back(CachedBlock{p, block, freed});
      m.blocks.erase(known);  // (back when it is handed out again)
      return;
    }
    cudaGetLastError();  // (the failed call's error)
    if (freed != nullptr) gpu::IgnoreCuda(cudaEventDestroy(freed));
    m.blocks.erase(known);
  }
  DeviceScope scope(device);
  gpu::IgnoreCuda(block.onDevice ? cudaFree(p) : cudaFreeHost(p));
}

}  // namespace

ccResult_t PrepareDeviceMemory(int device) {
  std::lock_guard<std::mutex> lock(gMutex);
  DeviceMemory& m = Devices()[device];
  DeviceScope scope(device);
  DevicePoolLocked(device, m);
  HostPoolLocked(device, m);
  CC_CHECK(ReleaseStreamLocked(m));
  if (m.freeWords.empty()) CC_CHECK(AddWordSlab(m));
  return ccSuccess;
}

namespace {
std::atomic<uint64_t> gScratchAllocations{0};
}  // namespace

uint64_t ScratchAllocations() { return gScratchAllocations.load(std::memory_order_relaxed); }

ccResult_t AllocateScratch(int device, bool pinnedHost, size_t bytes, cudaStream_t stream, void** p) {
  gScratchAllocations.fetch_add(1, std::memory_order_relaxed);
  cudaMemPool_t pool = nullptr;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    DeviceMemory& m = Devices()[device];
    DeviceScope scope(device);
    if (pinnedHost) {
      HostPoolLocked(device, m);
      pool = m.hostPool;
    } else {
      DevicePoolLocked(device, m);
      pool = m.devicePool;
    }
  }
  if (pool == nullptr) return TakeBlock(device, !pinnedHost, bytes, p);
  return gpu::CudaResult(cudaMallocFromPoolAsync(p, bytes, pool, stream), "cudaMallocFromPoolAsync");
}

namespace {

// TrackWork's work not known to have run, of every device (a peer copy touches two), under gMutex, with whether some
// cannot be tracked (gKeepEverything); gTracking: either holds (FreeScratch's common case takes no lock). Never freed,
// as Devices(): threads may still free memory during exit.
std::vector<cudaEvent_t>& Tracked() {
  static auto* tracked = new std::vector<cudaEvent_t>();
  return *tracked;
}
bool gKeepEverything = false;
std::atomic<bool> gTracking{false};
std::map<int, cudaStream_t>& LaterFrees() {  // per device: the stream of the frees that wait for tracked work
  static auto* streams = new std::map<int, cudaStream_t>();
  return *streams;
}

// Under gMutex.
void UpdateTrackingLocked() {
  gTracking.store(gKeepEverything || !Tracked().empty(), std::memory_order_release);
}

// Forgets the tracked work that has run. Work whose state cannot be read (a sticky error: the context is lost) stays,
// so memory freed after it is kept. Under gMutex.
void DropFinishedLocked() {
  for (auto it = Tracked().begin(); it != Tracked().end();) {
    if (cudaEventQuery(*it) == cudaSuccess) {
      gpu::IgnoreCuda(cudaEventDestroy(*it));
      it = Tracked().erase(it);
    } else {
      cudaGetLastError();  // (cudaErrorNotReady, or the error that keeps it)
      ++it;
    }
  }
  UpdateTrackingLocked();
}

// The stream a free of `device`'s memory goes to instead of `stream` while tracked work may still touch it: one that
// waits for the point `stream` has reached and for every piece of tracked work. False where that cannot be queued
// (the memory is then kept). Under gMutex, with `device` current.
bool LaterFreeStreamLocked(int device, cudaStream_t* stream) {
  cudaStream_t& later = LaterFrees()[device];
  cudaError_t e = later != nullptr ? cudaSuccess : cudaStreamCreateWithFlags(&later, cudaStreamNonBlocking);
  cudaEvent_t reached = nullptr;
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&reached, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(reached, *stream);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(later, reached, 0);
  if (reached != nullptr) gpu::IgnoreCuda(cudaEventDestroy(reached));  // (released once it has completed)
  for (size_t i = 0; e == cudaSuccess && i < Tracked().size(); ++i) e = cudaStreamWaitEvent(later, Tracked()[i], 0);
  if (e != cudaSuccess) {
    cudaGetLastError();  // (the failed call's error)
    CC_WARN("CUDA device %d: a free could not be queued behind the work that may still use the memory (%s): it is "
            "kept", device, cudaGetErrorString(e));
    return false;
  }
  *stream = later;
  return true;
}

}  // namespace

TrackedWork TrackWork(cudaStream_t stream) {
  cudaEvent_t reached = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&reached, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(reached, stream);
  if (e == cudaSuccess) {
    std::lock_guard<std::mutex> lock(gMutex);
    Tracked().push_back(reached);
    UpdateTrackingLocked();
    return reached;
  }
  cudaGetLastError();  // (the failed call's error)
  if (reached != nullptr) gpu::IgnoreCuda(cudaEventDestroy(reached));
  return nullptr;
}

void EndTrackedWork(TrackedWork work, bool ran) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (!ran) {  // it stays tracked until it has run (DropFinishedLocked)
    if (work == nullptr && !gKeepEverything) {
      CC_WARN("work that a wait gave up on may still run and could not be tracked: ccoll's device and pinned memory "
              "is no longer freed in this process");
      gKeepEverything = true;
    }
    UpdateTrackingLocked();
    return;
  }
  for (auto it = Tracked().begin(); work != nullptr && it != Tracked().end(); ++it) {
    if (*it == work) {
      gpu::IgnoreCuda(cudaEventDestroy(*it));
      Tracked().erase(it);
      break;
    }
  }
  DropFinishedLocked();  // (and any other that has run meanwhile)
}

void FreeScratch(int device, bool pinnedHost, void* p, cudaStream_t stream) {
  if (p == nullptr) return;
  if (gTracking.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(gMutex);
    if (gKeepEverything) return;
    DropFinishedLocked();
    DeviceScope scope(device);
    if (!Tracked().empty() && !LaterFreeStreamLocked(device, &stream)) return;  // kept: something may still use it
  }
  bool pooled = true;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    const DeviceMemory& m = Devices()[device];
    pooled = (pinnedHost ? m.hostPool : m.devicePool) != nullptr;  // (decided at the first allocation, for good)
  }
  if (pooled) {
    gpu::IgnoreCuda(cudaFreeAsync(p, stream));
  } else {
    KeepBlock(device, p, stream);
  }
}

cudaStream_t ReleaseStream(int device) {
  std::lock_guard<std::mutex> lock(gMutex);
  DeviceMemory& m = Devices()[device];
  DeviceScope scope(device);
  if (ReleaseStreamLocked(m) != ccSuccess) return cudaStreamPerThread;  // (legal too; it may wait longer)
  return m.releaseStream;
}

ccResult_t DevicePool(int device, cudaMemPool_t* pool) {
  std::lock_guard<std::mutex> lock(gMutex);
  DeviceMemory& m = Devices()[device];
  DeviceScope scope(device);
  DevicePoolLocked(device, m);
  *pool = m.devicePool;
  return ccSuccess;
}

ccResult_t PinnedHostPool(int device, cudaMemPool_t* pool) {
  std::lock_guard<std::mutex> lock(gMutex);
  DeviceMemory& m = Devices()[device];
  DeviceScope scope(device);
  HostPoolLocked(device, m);
  *pool = m.hostPool;
  return ccSuccess;
}

ccResult_t TakeWaitWord(int device, uint64_t** word, uint64_t** deviceAddress) {
  std::lock_guard<std::mutex> lock(gMutex);
  DeviceMemory& m = Devices()[device];
  if (m.freeWords.empty()) {
    DeviceScope scope(device);
    CC_CHECK(AddWordSlab(m));  // more proxies than a slab holds: this one is made during the calls
  }
  *word = m.freeWords.back();
  m.freeWords.pop_back();
  __atomic_store_n(*word, 0, __ATOMIC_RELEASE);
  *deviceAddress = m.deviceAddress[*word];
  return ccSuccess;
}

void ReturnWaitWord(int device, uint64_t* word) {
  std::lock_guard<std::mutex> lock(gMutex);
  Devices()[device].freeWords.push_back(word);
}

}  // namespace ccoll
