// A CPU stand-in for the part of the CUDA runtime that ccoll's host code and the device tests call, so that the
// device proxy's orchestration runs where there is no GPU (ctest here and in CI, under the sanitizers too). One
// device. Each stream is a worker thread that runs its operations in order; an event is "everything its stream had
// been given when it was recorded"; device memory is memory that cudaPointerGetAttributes reports as device memory
// and that the host cannot touch at the address cudaMalloc returned (a fault, as on a GPU), only through the fake's
// copies and kernels; the stream-wait kernel is an operation that polls the flag; the codec kernels
// (fake_codec_kernels.cc) are operations that run the CPU drivers.
//
// Calls that synchronize the whole device on a GPU do so here too: cudaFree, cudaFreeHost, and a kernel launch before
// the kernels are loaded (CUDA loads modules lazily, and loading may synchronize the context). So, as FAKE_CUDA_STRICT
// says (see Strict), do the allocations the CUDA guide lists among the implicit synchronizations (cudaMalloc,
// cudaHostAlloc) and cuBLAS's first products. A device synchronization that waits for a stream held by the stream-wait
// kernel of a call whose host work this very thread would do is a deadlock on a GPU; here it aborts with a message
// after FAKE_CUDA_SYNC_TIMEOUT_S seconds (default 60).
//
// Not modelled: other kernels, the legacy default stream's implicit synchronization with other streams, memory pools
// (an allocation from one is a plain allocation: no reuse, no dependency on other streams), graphs beyond "this stream
// is capturing".
// Implements the functions as declared in cuda_runtime_api.h, so the signatures are the real ones.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "core/stream_wait.h"
#include "fake_launch.h"

namespace {

// How far a stream has come. Shared with the events recorded on it, which outlive the stream (as in CUDA, where an
// event of a destroyed stream is simply complete).
struct Progress {
  std::mutex m;
  std::condition_variable cv;
  uint64_t pushed = 0, done = 0;

  bool Reached(uint64_t n) {
    std::lock_guard<std::mutex> lock(m);
    return done >= n;
  }
  void WaitFor(uint64_t n) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return done >= n; });
  }
  bool WaitUntil(uint64_t n, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_until(lock, deadline, [&] { return done >= n; });
  }
};

class FakeStream;

// The streams alive, for the calls that synchronize the whole device.
std::mutex gStreamsMutex;
std::set<FakeStream*>& Streams() {
  static auto* s = new std::set<FakeStream*>();
  return *s;
}

class FakeStream {
 public:
  FakeStream() : progress_(std::make_shared<Progress>()), worker_([this] { Run(); }) {
    std::lock_guard<std::mutex> lock(gStreamsMutex);
    Streams().insert(this);
  }
  ~FakeStream() {
    {
      std::lock_guard<std::mutex> lock(gStreamsMutex);
      Streams().erase(this);
    }
    {
      std::lock_guard<std::mutex> lock(progress_->m);
      stop_ = true;
    }
    progress_->cv.notify_all();
    worker_.join();  // runs what is queued first, as CUDA lets it complete
  }

  void Push(std::function<void()> op) {
    std::lock_guard<std::mutex> lock(progress_->m);
    ops_.push_back(std::move(op));
    ++progress_->pushed;
    progress_->cv.notify_all();
  }
  // The progress object and the number of operations queued so far.
  std::shared_ptr<Progress> Mark(uint64_t* pushed) {
    std::lock_guard<std::mutex> lock(progress_->m);
    *pushed = progress_->pushed;
    return progress_;
  }
  void Synchronize() {
    uint64_t n;
    Mark(&n)->WaitFor(n);
  }
  bool Idle() {
    uint64_t n;
    return Mark(&n)->Reached(n);
  }

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;

 private:
  void Run() {
    Progress& p = *progress_;
    std::unique_lock<std::mutex> lock(p.m);
    for (;;) {
      p.cv.wait(lock, [&] { return stop_ || !ops_.empty(); });
      if (ops_.empty()) return;  // stop with nothing left
      std::function<void()> op = std::move(ops_.front());
      ops_.pop_front();
      lock.unlock();
      op();
      lock.lock();
      ++p.done;
      p.cv.notify_all();
    }
  }

  std::shared_ptr<Progress> progress_;
  std::deque<std::function<void()>> ops_;  // guarded by progress_->m
  bool stop_ = false;
  std::thread worker_;
};

struct FakeEvent {
  std::mutex m;
  std::shared_ptr<Progress> progress;  // null: never recorded (complete)
  uint64_t target = 0;
};

FakeStream& LegacyStream() {
  static auto* s = new FakeStream();  // never destroyed: other static destructors may still queue work
  return *s;
}

// The legacy default stream stands for the per-thread one too (a stream that orders one thread's work).
FakeStream* StreamOf(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &LegacyStream();
  return reinterpret_cast<FakeStream*>(s);
}

// FAKE_CUDA_STRICT: a comma-separated list of the calls that also synchronize the device here (see the top of the
// file): malloc (cudaMalloc), hostalloc (cudaHostAlloc), cublas (cuBLAS's first product of a shape); 1 means all.
bool Strict(const char* what) {
  const char* v = std::getenv("FAKE_CUDA_STRICT");
  if (v == nullptr) return false;
  const std::string list = std::string(",") + v + ",";
  return list == ",1," || list.find(std::string(",") + what + ",") != std::string::npos;
}

// Waits until every stream has done what it had been given, as the CUDA calls that synchronize the device do. A
// stream that does not get there in time is taken for a deadlock (see the top of this file).
void SynchronizeDevice(const char* what) {
  static const int seconds = [] {
    const char* v = std::getenv("FAKE_CUDA_SYNC_TIMEOUT_S");
    return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 60;
  }();
  std::vector<std::pair<std::shared_ptr<Progress>, uint64_t>> marks;
  {
    std::lock_guard<std::mutex> lock(gStreamsMutex);
    for (FakeStream* s : Streams()) {
      uint64_t n = 0;
      std::shared_ptr<Progress> p = s->Mark(&n);
      marks.emplace_back(std::move(p), n);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (auto& m : marks) {
    if (!m.first->WaitUntil(m.second, deadline)) {
      std::fprintf(stderr,
                   "fake CUDA runtime: %s synchronizes the device, and after %d s a stream still has not done the work "
                   "it was given before: it waits (the stream-wait kernel) for host work that cannot run until this "
                   "call returns. On a GPU this is a deadlock.\n",
                   what, seconds);
      std::abort();
    }
  }
}

// Kernel families loaded so far (cctest::FakeKernelsLoaded): until every one is, a launch may have to load its module,
// and loading may synchronize the device.
std::atomic<unsigned> gLoaded{0};

void BeforeLaunch() {
  if (gLoaded.load() != cctest::kAllKernelFamilies) {
    SynchronizeDevice("a kernel launch before ccoll's kernels were loaded (lazy module loading)");
  }
}

// Allocations: device (cudaMalloc) and pinned host (cudaHostAlloc), by start address. Device memory is two mappings
// of one memory file: the address cudaMalloc returns has no access at all, so host code that reads or writes device
// memory faults here as it would on a GPU; the fake's copies and "kernels" use the other, readable mapping
// (FakeHostView). Pinned host memory is ordinary memory, as on a GPU machine.
struct Allocation {
  size_t bytes;
  cudaMemoryType type;
  char* view;     // where the fake runtime reads and writes it (the address itself for pinned host memory)
  size_t mapped;  // bytes of each mapping (device memory)
  bool pooled;    // from a memory pool (freed with cudaFreeAsync only)
};

std::mutex gMemMutex;
std::map<uintptr_t, Allocation>& Allocations() {
  static auto* m = new std::map<uintptr_t, Allocation>();
  return *m;
}

void* Allocate(size_t bytes, cudaMemoryType type, bool pooled) {
  const size_t size = bytes ? bytes : 1;
  Allocation a{size, type, nullptr, 0, pooled};
  void* p = nullptr;
  if (type == cudaMemoryTypeDevice) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    a.mapped = (size + page - 1) / page * page;
    const int fd = memfd_create("fake-cuda-device", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    if (ftruncate(fd, static_cast<off_t>(a.mapped)) != 0) {
      close(fd);
      return nullptr;
    }
    p = mmap(nullptr, a.mapped, PROT_NONE, MAP_SHARED, fd, 0);
    void* view = mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED || view == MAP_FAILED) {
      if (p != MAP_FAILED) munmap(p, a.mapped);
      if (view != MAP_FAILED) munmap(view, a.mapped);
      return nullptr;
    }
    a.view = static_cast<char*>(view);
  } else {
    if (posix_memalign(&p, 256, size) != 0) return nullptr;
    a.view = static_cast<char*>(p);
  }
  std::lock_guard<std::mutex> lock(gMemMutex);
  Allocations()[reinterpret_cast<uintptr_t>(p)] = a;
  return p;
}

// Frees p, which `what` (cudaFree, cudaFreeHost, cudaFreeAsync) may free: memory of another kind or origin aborts
// with a message (the callers' destructors do not look at the result, and on a GPU it is an error or worse).
cudaError_t Release(void* p, cudaMemoryType type, bool pooled, const char* what) {
  if (p == nullptr) return cudaSuccess;
  Allocation a{};
  {
    std::lock_guard<std::mutex> lock(gMemMutex);
    auto it = Allocations().find(reinterpret_cast<uintptr_t>(p));
    if (it == Allocations().end() || it->second.type != type || it->second.pooled != pooled) {
      std::fprintf(stderr, "fake CUDA runtime: %s of %s\n", what,
                   it == Allocations().end() ? "memory it did not allocate"
                   : it->second.pooled       ? "memory from a pool (free it with cudaFreeAsync)"
                                             : "memory of another kind or not from a pool");
      std::abort();
    }
    a = it->second;
    Allocations().erase(it);
  }
  if (type == cudaMemoryTypeDevice) {
    munmap(p, a.mapped);
    munmap(a.view, a.mapped);
  } else {
    std::free(p);
  }
  return cudaSuccess;
}

// The allocation holding p (its end included, for empty ranges), or nullptr; under gMemMutex.
const std::pair<const uintptr_t, Allocation>* Find(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = Allocations().upper_bound(a);
  if (it == Allocations().begin()) return nullptr;
  --it;
  return a <= it->first + it->second.bytes ? &*it : nullptr;
}

cudaMemoryType TypeOf(const void* p) {
  std::lock_guard<std::mutex> lock(gMemMutex);
  const auto* e = Find(p);
  return e != nullptr && reinterpret_cast<uintptr_t>(p) < e->first + e->second.bytes ? e->second.type
                                                                                     : cudaMemoryTypeUnregistered;
}

thread_local int tDevice = 0;

}  // namespace

extern "C" {

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error (fake CUDA runtime)";
    case cudaErrorNotReady:
      return "device not ready (fake CUDA runtime)";
    case cudaErrorInvalidValue:
      return "invalid argument (fake CUDA runtime)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (fake CUDA runtime)";
    default:
      return "error (fake CUDA runtime)";
  }
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = tDevice;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  tDevice = device;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  std::memset(attributes, 0, sizeof(*attributes));
  attributes->type = TypeOf(ptr);
  attributes->device = attributes->type == cudaMemoryTypeUnregistered ? -2 : 0;
  if (attributes->type != cudaMemoryTypeUnregistered) {
    attributes->devicePointer = const_cast<void*>(ptr);
    if (attributes->type == cudaMemoryTypeHost) attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (Strict("malloc")) SynchronizeDevice("cudaMalloc (FAKE_CUDA_STRICT)");
  *devPtr = Allocate(size, cudaMemoryTypeDevice, false);
  return *devPtr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void* devPtr) {
  SynchronizeDevice("cudaFree");
  return Release(devPtr, cudaMemoryTypeDevice, false, "cudaFree");
}

// Stream-ordered allocation from a memory pool of device memory or of pinned host memory: synchronizes nothing, on a
// GPU as here. The memory is there at once (pools are not modelled: no reuse, so no dependency on other streams); a
// free waits for the stream's earlier work. FAKE_CUDA_NO_HOST_POOLS=1: a device without host memory pools (before
// CUDA 12.6), where ccoll falls back to cudaHostAlloc.
static bool NoHostPools() {
  const char* v = std::getenv("FAKE_CUDA_NO_HOST_POOLS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const struct cudaMemPoolProps* poolProps) {
  cudaMemoryType type;
  if (poolProps->location.type == cudaMemLocationTypeDevice && poolProps->location.id == 0) {
    type = cudaMemoryTypeDevice;
  } else if (poolProps->location.type == cudaMemLocationTypeHost && !NoHostPools()) {
    type = cudaMemoryTypeHost;
  } else {
    return cudaErrorInvalidValue;
  }
  *memPool = reinterpret_cast<cudaMemPool_t>(new cudaMemoryType(type));  // kept for the process, as ccoll's are
  return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
  delete reinterpret_cast<cudaMemoryType*>(memPool);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrMemoryPoolsSupported: *value = 1; return cudaSuccess;
    case cudaDevAttrHostMemoryPoolsSupported: *value = NoHostPools() ? 0 : 1; return cudaSuccess;
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t /*memPool*/, enum cudaMemPoolAttr /*attr*/, void* /*value*/) {
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool, const struct cudaMemAccessDesc* descList, size_t count) {
  if (memPool == nullptr || (count > 0 && descList == nullptr)) return cudaErrorInvalidValue;
  for (size_t i = 0; i < count; ++i) {
    if (descList[i].location.type != cudaMemLocationTypeDevice || descList[i].location.id != 0) {
      return cudaErrorInvalidDevice;
    }
  }
  return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t /*stream*/) {
  if (memPool == nullptr) return cudaErrorInvalidValue;
  *ptr = Allocate(size, *reinterpret_cast<cudaMemoryType*>(memPool), true);
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  if (devPtr == nullptr) return cudaSuccess;
  const cudaMemoryType type = TypeOf(devPtr);
  if (type != cudaMemoryTypeDevice && type != cudaMemoryTypeHost) return cudaErrorInvalidValue;
  StreamOf(hStream)->Push([=] { Release(devPtr, type, true, "cudaFreeAsync"); });
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int /*flags*/) {
  if (Strict("hostalloc")) SynchronizeDevice("cudaHostAlloc (FAKE_CUDA_STRICT)");
  *pHost = Allocate(size, cudaMemoryTypeHost, false);
  return *pHost ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int /*flags*/) {
  if (TypeOf(pHost) != cudaMemoryTypeHost) return cudaErrorInvalidValue;
  *pDevice = pHost;  // unified addressing
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  SynchronizeDevice("cudaFreeHost");
  return Release(ptr, cudaMemoryTypeHost, false, "cudaFreeHost");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int /*flags*/) {
  *pStream = reinterpret_cast<cudaStream_t>(new FakeStream());
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<FakeStream*>(stream);  // runs what is queued first, as CUDA lets it complete
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  StreamOf(stream)->Synchronize();
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) { return StreamOf(stream)->Idle() ? cudaSuccess : cudaErrorNotReady; }

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
  *pCaptureStatus = StreamOf(stream)->capture;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode /*mode*/) {
  StreamOf(stream)->capture = cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  StreamOf(stream)->capture = cudaStreamCaptureStatusNone;
  *pGraph = reinterpret_cast<cudaGraph_t>(new char(0));
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<char*>(graph);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int /*flags*/) {
  *event = reinterpret_cast<cudaEvent_t>(new FakeEvent());
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<FakeEvent*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  FakeEvent* e = reinterpret_cast<FakeEvent*>(event);
  uint64_t target;
  std::shared_ptr<Progress> p = StreamOf(stream)->Mark(&target);
  std::lock_guard<std::mutex> lock(e->m);
  e->progress = std::move(p);
  e->target = target;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  FakeEvent* e = reinterpret_cast<FakeEvent*>(event);
  std::lock_guard<std::mutex> lock(e->m);
  return e->progress == nullptr || e->progress->Reached(e->target) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  FakeEvent* e = reinterpret_cast<FakeEvent*>(event);
  std::shared_ptr<Progress> p;
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(e->m);
    p = e->progress;
    target = e->target;
  }
  if (p != nullptr) p->WaitFor(target);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind /*kind*/,
                            cudaStream_t stream) {
  void* d = cctest::FakeHostView(dst);
  const void* from = cctest::FakeHostView(src);
  StreamOf(stream)->Push([=] { std::memcpy(d, from, count); });
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                                cudaStream_t stream) {
  if (dstDevice != 0 || srcDevice != 0) return cudaErrorInvalidDevice;
  return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  cudaMemcpyAsync(dst, src, count, kind, nullptr);
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  void* d = cctest::FakeHostView(devPtr);
  StreamOf(stream)->Push([=] { std::memset(d, value, count); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  cudaMemsetAsync(devPtr, value, count, nullptr);
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  StreamOf(stream)->Push([=] { fn(userData); });
  return cudaSuccess;
}

}  // extern "C"

namespace cctest {

void FakeLaunch(cudaStream_t stream, std::function<void()> op) {
  BeforeLaunch();
  StreamOf(stream)->Push(std::move(op));
}

void FakeKernelsLoaded(unsigned families) { gLoaded.fetch_or(families); }

void FakeLazyLibraryCall(const char* what) {
  if (Strict("cublas")) SynchronizeDevice(what);
}

void* FakeHostView(const void* p) {
  if (p == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(gMemMutex);
  const auto* e = Find(p);
  if (e == nullptr) return const_cast<void*>(p);
  return e->second.view + (reinterpret_cast<uintptr_t>(p) - e->first);
}

}  // namespace cctest

namespace ccoll {

ccResult_t LoadStreamWaitKernel() {
  cctest::FakeKernelsLoaded(cctest::kStreamWaitKernels);
  return ccSuccess;
}

cudaError_t LaunchStreamWait(const uint64_t* flag, uint64_t ticket, cudaStream_t stream) {
  BeforeLaunch();
  StreamOf(stream)->Push([=] {
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < ticket) std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
  return cudaSuccess;
}

}  // namespace ccoll
