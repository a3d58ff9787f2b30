// A CPU stand-in for the part of the CUDA runtime that ccoll's host code and the device tests call, so that the
// device proxy's orchestration runs where there is no GPU (ctest here and in CI, under the sanitizers too). One
// device (cctest::FakeDeviceCount adds devices that have streams only). Each stream is a worker thread that runs its operations in order; an event is "everything its stream had
// been given when it was recorded"; device memory is memory that cudaPointerGetAttributes reports as device memory
// and that the host cannot touch at the address cudaMalloc returned (a fault, as on a GPU), only through the fake's
// copies and kernels; the stream-wait kernel is an operation that polls the flag; the codec kernels
// (fake_codec_kernels.cc) are operations that run the CPU drivers; the fake NCCL's operations (fake_nccl.cc) are
// operations too (cctest::FakePush).
//
// Calls that synchronize the whole device on a GPU do so here too: cudaFree, cudaFreeHost, and a kernel launch before
// the kernels are loaded (CUDA loads modules lazily, and loading may synchronize the context). So, as FAKE_CUDA_STRICT
// says (see Strict), do the allocations the CUDA guide lists among the implicit synchronizations (cudaMalloc,
// cudaHostAlloc) and cuBLAS's first products. A device synchronization that waits for a stream held by the stream-wait
// kernel of a call whose host work this very thread would do is a deadlock on a GPU; here it aborts with a message
// after FAKE_CUDA_SYNC_TIMEOUT_S seconds (default 60).
//
// Stream capture and graphs: between cudaStreamBeginCapture and cudaStreamEndCapture every operation queued on the
// stream (copies, memsets, host functions, kernels, the stream-wait kernel, NCCL operations) is recorded instead of
// run, and the graph is that list: cudaGraphLaunch queues it as one operation that runs the recorded operations in
// order, again at every launch (an operation reads its arguments, addresses included, as they were at capture). An
// event recorded during a capture marks a point of that capture: no graph node, nothing recorded at replay. The rules
// of capture are CUDA's, and breaking one invalidates the capture (cudaStreamEndCapture then returns
// cudaErrorStreamCaptureInvalidated and no graph; later operations on the stream return that error too):
//   - calls that necessarily conflict with a capture, in every mode: synchronizing or querying the capturing stream
//     (cudaErrorStreamCaptureUnsupported) or an event recorded in a capture that has not ended
//     (cudaErrorCapturedEvent), and any use of the legacy stream while a blocking stream (one created without
//     cudaStreamNonBlocking) captures (cudaErrorStreamCaptureImplicit);
//   - potentially unsafe calls (cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost, the synchronous cudaMemcpy and
//     cudaMemset, cudaStreamSynchronize, cudaStreamQuery, cudaEventSynchronize, cudaEventQuery), unless the calling
//     thread's mode (cudaThreadExchangeStreamCaptureMode; global by default) is relaxed: they fail with
//     cudaErrorStreamCaptureUnsupported, and invalidate the capture, when the calling thread began a capture that
//     is not relaxed, or when the thread's mode is global and any thread began a capture in global mode. (PyTorch
//     met the second: its NCCL watchdog's cudaEventQuery broke other threads' global captures.)
//   - stream-ordered allocation and free on a capturing stream: CUDA would make memory nodes, not modelled
//     (cudaErrorStreamCaptureUnsupported).
// Not modelled: joining another stream into a capture (cudaStreamWaitEvent on an event recorded in another stream's
// capture: cudaErrorStreamCaptureUnsupported; on an event recorded outside any capture:
// cudaErrorStreamCaptureIsolation, as in CUDA), graphs built node by node, graph updates, cudaStreamGetCaptureInfo.
//
// Copies: cudaMemcpy, cudaMemcpyAsync and cudaMemcpyPeerAsync check their kind against what the fake knows of the
// pointers, at the call (device memory: cudaMalloc or a device pool; host memory: anything else, pinned or not):
// cudaMemcpyHostToDevice needs a host source and a device destination, cudaMemcpyDeviceToHost the reverse,
// cudaMemcpyDeviceToDevice (and every peer copy) device memory on both sides, cudaMemcpyHostToHost on neither;
// cudaMemcpyDefault takes anything. A mismatch is undefined behaviour on a GPU, though a UVA system often copies
// anyway: the fake prints the call, its kind, what each pointer is and the stack, and aborts. FAKE_CUDA_COPY_KIND=warn
// prints the same and goes on (to list every mismatch of a run). A kind outside the enum:
// cudaErrorInvalidMemcpyDirection. Copies of 0 bytes are not checked (CUDA takes them with any pointers, null
// included).
//
// Errors: every call that fails records its error as the thread's last error (cudaGetLastError takes it off,
// cudaPeekAtLastError reads it), except cudaErrorNotReady; the fake kernels' launch checks read it, as the real ones
// do (core/cuda_result.h, Launched), so an error some path reported but left on the thread fails the next launch.
// No error is sticky (a GPU's faults spoil the context for good; nothing here faults that way), but for a lost
// device (cctest::FakeLoseDevice): from then on every call that queues, waits, allocates or frees returns
// cudaErrorLaunchFailure, which cudaGetLastError does not take off, as after a kernel's fault; work already queued is
// dropped (a kernel or copy that has not run never runs; the stream-wait kernel and held kernels end), and frees
// still release the fake's memory.
//
// Not modelled otherwise: other kernels, the legacy default stream's implicit synchronization with other streams,
// memory pools (an allocation from one is a plain allocation: no reuse, no dependency on other streams).
// Implements the functions as declared in cuda_runtime_api.h, so the signatures are the real ones.
#include <cuda_runtime_api.h>
#include <execinfo.h>

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

// The calling thread's last error (cudaGetLastError, cudaPeekAtLastError): every call that fails records its error
// here, as the runtime does, except cudaErrorNotReady (a query's answer, not a failure). A kernel launch reports it
// (cctest::FakeLaunchResult), so an error a caller left behind fails the next launch's check, as on a GPU.
thread_local cudaError_t tLastError = cudaSuccess;

cudaError_t Note(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) tLastError = e;
  return e;
}

// A lost device (cctest::FakeLoseDevice): the sticky error, else cudaSuccess. gLosses counts the devices given back;
// a thread's last error from a loss that has ended since (tLoss: which loss it recorded) is forgotten, as a new
// process would not have it.
std::atomic<bool> gLost{false};
std::atomic<int> gLosses{0};
thread_local int tLoss = 0;
bool IsLost() { return gLost.load(std::memory_order_acquire); }
cudaError_t Lost() {
  if (!IsLost()) return cudaSuccess;
  tLoss = gLosses.load();
  return Note(cudaErrorLaunchFailure);
}
void ForgetEndedLoss() {
  if (tLastError == cudaErrorLaunchFailure && tLoss != gLosses.load()) tLastError = cudaSuccess;
}

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

// A capture sequence of one stream (cudaStreamBeginCapture .. cudaStreamEndCapture): the operations recorded so far.
// Shared with the events recorded in it, which may outlive it.
struct Capture {
  cudaStreamCaptureMode mode;
  std::thread::id thread;  // the one that began it
  bool blocking;           // its stream synchronizes with the legacy stream
  bool invalidated = false;
  bool ended = false;
  std::vector<std::function<void()>> ops;
};

// Guards every Capture and each stream's capture_. gCaptureCount (captures begun and not ended) lets the operations
// of streams that do not capture skip the lock.
std::mutex gCaptureMutex;
std::atomic<int> gCaptureCount{0};
std::vector<std::shared_ptr<Capture>>& Captures() {  // begun, not ended; under gCaptureMutex
  static auto* v = new std::vector<std::shared_ptr<Capture>>();
  return *v;
}

void Invalidate(Capture* c) {
  c->invalidated = true;
  c->ops.clear();
}

// The calling thread's capture interaction mode (cudaThreadExchangeStreamCaptureMode).
thread_local cudaStreamCaptureMode tCaptureMode = cudaStreamCaptureModeGlobal;

class FakeStream;

// The streams alive, for the calls that synchronize the whole device.
std::mutex gStreamsMutex;
std::set<FakeStream*>& Streams() {
  static auto* s = new std::set<FakeStream*>();
  return *s;
}

class FakeStream {
 public:
  explicit FakeStream(bool blocking)
      : blocking(blocking), progress_(std::make_shared<Progress>()), worker_([this] { Run(); }) {
    std::lock_guard<std::mutex> lock(gStreamsMutex);
    Streams().insert(this);
  }
  ~FakeStream() {
    {
      std::lock_guard<std::mutex> lock(gStreamsMutex);
      Streams().erase(this);
    }
    {
      // A capture the program never ended ends with its stream, so that it stops restricting other calls.
      std::lock_guard<std::mutex> lock(gCaptureMutex);
      if (capture_ != nullptr) EndCaptureLocked();
    }
    {
      std::lock_guard<std::mutex> lock(progress_->m);
      stop_ = true;
    }
    progress_->cv.notify_all();
    worker_.join();  // runs what is queued first, as CUDA lets it complete
  }

  // Queues op, or records it into the stream's capture; cudaErrorStreamCaptureInvalidated (op dropped) once that
  // capture has been invalidated, as CUDA fails every later operation of the capture sequence.
  cudaError_t Push(std::function<void()> op) {
    if (cudaError_t e = Lost()) return e;
    if (gCaptureCount.load(std::memory_order_acquire) > 0) {
      std::lock_guard<std::mutex> lock(gCaptureMutex);
      if (capture_ != nullptr) {
        if (capture_->invalidated) return Note(cudaErrorStreamCaptureInvalidated);
        capture_->ops.push_back(std::move(op));
        return cudaSuccess;
      }
    }
    std::lock_guard<std::mutex> lock(progress_->m);
    ops_.push_back(std::move(op));
    ++progress_->pushed;
    progress_->cv.notify_all();
    return cudaSuccess;
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

  // Under gCaptureMutex: ends the stream's capture and returns it.
  std::shared_ptr<Capture> EndCaptureLocked() {
    std::shared_ptr<Capture> c = std::move(capture_);
    capture_ = nullptr;
    c->ended = true;
    auto& all = Captures();
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i] == c) {
        all.erase(all.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
    gCaptureCount.fetch_sub(1, std::memory_order_release);
    return c;
  }

  const bool blocking;                // created without cudaStreamNonBlocking
  int device = 0;                     // the device current at its creation (cudaStreamGetDevice)
  std::shared_ptr<Capture> capture_;  // while it captures; under gCaptureMutex

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
      if (!IsLost()) op();  // (a lost device drops what was queued)
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
  std::shared_ptr<Progress> progress;  // null: never recorded (complete), or recorded in a capture
  uint64_t target = 0;
  std::shared_ptr<Capture> captured;  // last recorded in this capture
  // When its stream reached the last record (host steady clock, ns; cudaEventElapsedTime): an operation the record
  // queues writes it, so the time between two events is the host time the operations between them took here.
  std::shared_ptr<std::atomic<int64_t>> reached = std::make_shared<std::atomic<int64_t>>(0);
};

FakeStream& LegacyStream() {
  static auto* s = new FakeStream(true);  // never destroyed: other static destructors may still queue work
  return *s;
}

bool IsLegacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy; }

// The legacy default stream stands for the per-thread one too (a stream that orders one thread's work).
FakeStream* StreamOf(cudaStream_t s) {
  if (IsLegacy(s) || s == cudaStreamPerThread) return &LegacyStream();
  return reinterpret_cast<FakeStream*>(s);
}

// The capture rules (see the top of the file). Each returns cudaSuccess when the call may go on, else the error, and
// invalidates the captures it conflicts with.

// A potentially unsafe call by this thread.
cudaError_t CheckUnsafeCall() {
  if (gCaptureCount.load(std::memory_order_acquire) == 0 || tCaptureMode == cudaStreamCaptureModeRelaxed) {
    return cudaSuccess;
  }
  const std::thread::id self = std::this_thread::get_id();
  bool forbidden = false;
  std::lock_guard<std::mutex> lock(gCaptureMutex);
  for (auto& c : Captures()) {
    if (c->mode == cudaStreamCaptureModeRelaxed) continue;
    if (c->thread == self || (tCaptureMode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal)) {
      Invalidate(c.get());
      forbidden = true;
    }
  }
  return forbidden ? Note(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

// A use of the legacy stream: it would depend on every blocking stream.
cudaError_t CheckLegacyStreamUse() {
  if (gCaptureCount.load(std::memory_order_acquire) == 0) return cudaSuccess;
  bool conflict = false;
  std::lock_guard<std::mutex> lock(gCaptureMutex);
  for (auto& c : Captures()) {
    if (c->blocking) {
      Invalidate(c.get());
      conflict = true;
    }
  }
  return conflict ? Note(cudaErrorStreamCaptureImplicit) : cudaSuccess;
}

// A call that synchronizes or queries the stream, or allocates or frees in its order: not while it captures.
cudaError_t CheckNotCapturing(FakeStream* s) {
  if (gCaptureCount.load(std::memory_order_acquire) == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(gCaptureMutex);
  if (s->capture_ == nullptr) return cudaSuccess;
  if (s->capture_->invalidated) return Note(cudaErrorStreamCaptureInvalidated);
  Invalidate(s->capture_.get());
  return Note(cudaErrorStreamCaptureUnsupported);
}

// A synchronization or query of the event: not while it marks a point of a capture that goes on.
cudaError_t CheckEventNotCaptured(FakeEvent* e) {
  std::shared_ptr<Capture> c;
  {
    std::lock_guard<std::mutex> lock(e->m);
    c = e->captured;
  }
  if (c == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(gCaptureMutex);
  if (c->ended) return cudaSuccess;
  Invalidate(c.get());
  return Note(cudaErrorCapturedEvent);
}

// Queues op on the stream (or records it into the stream's capture).
cudaError_t Enqueue(cudaStream_t stream, std::function<void()> op) {
  if (IsLegacy(stream)) {
    if (cudaError_t e = CheckLegacyStreamUse()) return e;
  }
  return StreamOf(stream)->Push(std::move(op));
}

// The synchronous calls: op on the legacy stream, waited for.
cudaError_t RunOnLegacyStream(std::function<void()> op) {
  if (cudaError_t e = CheckUnsafeCall()) return e;
  if (cudaError_t e = Enqueue(nullptr, std::move(op))) return e;
  LegacyStream().Synchronize();
  return cudaSuccess;
}

// What cudaStreamEndCapture returns and cudaGraphInstantiate copies: the recorded operations, run in order.
struct FakeGraph {
  std::shared_ptr<const std::vector<std::function<void()>>> ops;
};

// FAKE_CUDA_STRICT: a comma-separated list of the calls that also synchronize the device here (see the top of the
// file): malloc (cudaMalloc), hostalloc (cudaHostAlloc), cublas (cuBLAS's first product of a shape), cublascreate
// (cublasCreate, fake_cublas.cc); 1 means all.
bool Strict(const char* what) {
  const char* v = std::getenv("FAKE_CUDA_STRICT");
  if (v == nullptr) return false;
  const std::string list = std::string(",") + v + ",";
  return list == ",1," || list.find(std::string(",") + what + ",") != std::string::npos;
}

// cudaMalloc and cudaHostAlloc calls so far (cctest::FakeSynchronousAllocations).
std::atomic<uint64_t> gSynchronousAllocations{0};

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

thread_local int tFailAllocations = 0;  // cctest::FakeFailAllocations

void* Allocate(size_t bytes, cudaMemoryType type, bool pooled) {
  if (tFailAllocations > 0) {
    --tFailAllocations;
    return nullptr;
  }
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
std::atomic<int> gDeviceCount{1};  // cctest::FakeDeviceCount

// What a copy's pointer is, as its kind sees it (see the top of the file), for the message.
const char* MemoryName(const void* p, bool* device) {
  const cudaMemoryType type = TypeOf(p);
  *device = type == cudaMemoryTypeDevice;
  switch (type) {
    case cudaMemoryTypeDevice:
      return "device memory";
    case cudaMemoryTypeHost:
      return "pinned host memory";
    default:
      return "host memory (not from the CUDA runtime)";
  }
}

const char* KindName(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
      return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
      return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "cudaMemcpyDeviceToDevice";
    default:
      return "cudaMemcpyDefault";
  }
}

// A copy's kind against its pointers: cudaErrorInvalidMemcpyDirection for a kind outside the enum; a mismatch aborts
// (or, with FAKE_CUDA_COPY_KIND=warn, is reported and let through).
cudaError_t CheckCopyKind(const char* fn, void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (static_cast<unsigned>(kind) > cudaMemcpyDefault) return Note(cudaErrorInvalidMemcpyDirection);
  if (count == 0 || kind == cudaMemcpyDefault) return cudaSuccess;
  bool dstDevice, srcDevice;
  const char* dstName = MemoryName(dst, &dstDevice);
  const char* srcName = MemoryName(src, &srcDevice);
  const bool wantSrcDevice = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool wantDstDevice = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (srcDevice == wantSrcDevice && dstDevice == wantDstDevice) return cudaSuccess;
  static const bool warn = [] {
    const char* v = std::getenv("FAKE_CUDA_COPY_KIND");
    return v != nullptr && std::strcmp(v, "warn") == 0;
  }();
  static std::mutex m;  // one message at a time, its stack with it
  std::lock_guard<std::mutex> lock(m);
  std::fprintf(stderr,
               "fake CUDA runtime: %s(dst %p, src %p, %zu bytes, %s): dst is %s and src is %s, but the kind says %s "
               "to %s. Undefined behaviour on a GPU (cudaMemcpyDefault infers the direction). The stack:\n",
               fn, dst, src, count, KindName(kind), dstName, srcName, wantSrcDevice ? "device" : "host",
               wantDstDevice ? "device" : "host");
  std::fflush(stderr);
  void* frames[32];
  backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
  if (!warn) std::abort();
  return cudaSuccess;
}

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
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state (fake CUDA runtime)";
    case cudaErrorNotSupported:
      return "operation not supported (fake CUDA runtime)";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (fake CUDA runtime)";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing (fake CUDA runtime)";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture (fake CUDA runtime)";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream (fake CUDA runtime)";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream (fake CUDA runtime)";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream (fake CUDA runtime)";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread (fake CUDA runtime)";
    default:
      return "error (fake CUDA runtime)";
  }
}

// The enumerator's name for the common ones, as the real runtime gives it.
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    default:
      return "cudaError (fake CUDA runtime)";
  }
}

cudaError_t cudaGetLastError(void) {
  if (cudaError_t e = Lost()) return e;  // sticky
  ForgetEndedLoss();
  const cudaError_t e = tLastError;
  tLastError = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  if (cudaError_t e = Lost()) return e;
  ForgetEndedLoss();
  return tLastError;
}

// The version of the headers built against, for both.
cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = gDeviceCount.load();
  return cudaSuccess;
}

// The name says what it is; the rest is zero.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return Note(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "fake CUDA runtime (tests/fake_cuda)");
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = tDevice;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= gDeviceCount.load()) return Note(cudaErrorInvalidDevice);
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
  if (cudaError_t e = Lost()) return e;
  if (cudaError_t e = CheckUnsafeCall()) return e;
  if (Strict("malloc")) SynchronizeDevice("cudaMalloc (FAKE_CUDA_STRICT)");
  gSynchronousAllocations.fetch_add(1);
  *devPtr = Allocate(size, cudaMemoryTypeDevice, false);
  return *devPtr ? cudaSuccess : Note(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* devPtr) {
  if (IsLost()) {
    Release(devPtr, cudaMemoryTypeDevice, false, "cudaFree");
    return Lost();
  }
  if (cudaError_t e = CheckUnsafeCall()) return e;
  SynchronizeDevice("cudaFree");
  return Release(devPtr, cudaMemoryTypeDevice, false, "cudaFree");
}

// Stream-ordered allocation from a memory pool of device memory or of pinned host memory: synchronizes nothing, on a
// GPU as here. The memory is there at once (pools are not modelled: no reuse, so no dependency on other streams); a
// free waits for the stream's earlier work. FAKE_CUDA_NO_HOST_POOLS=1: a device without host memory pools (before
// CUDA 12.6), where ccoll falls back to cudaHostAlloc. FAKE_CUDA_NO_POOLS=1: a device without memory pools of either
// kind (cudaDevAttrMemoryPoolsSupported 0, as on some virtual GPUs), where ccoll falls back to cudaMalloc too.
// FAKE_CUDA_BROKEN_POOLS=1: pools of both kinds are there and can be made, but every allocation from one fails with
// cudaErrorNotSupported (as on a virtual GPU profile that refuses the virtual-memory calls pools grow with).
static bool EnvIsOne(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}
static bool NoDevicePools() { return EnvIsOne("FAKE_CUDA_NO_POOLS"); }
static bool NoHostPools() { return NoDevicePools() || EnvIsOne("FAKE_CUDA_NO_HOST_POOLS"); }
static bool BrokenPools() { return EnvIsOne("FAKE_CUDA_BROKEN_POOLS"); }

cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const struct cudaMemPoolProps* poolProps) {
  if (cudaError_t e = Lost()) return e;
  cudaMemoryType type;
  if (poolProps->location.type == cudaMemLocationTypeDevice && poolProps->location.id == 0) {
    if (NoDevicePools()) return Note(cudaErrorNotSupported);
    type = cudaMemoryTypeDevice;
  } else if (poolProps->location.type == cudaMemLocationTypeHost && !NoHostPools()) {
    type = cudaMemoryTypeHost;
  } else {
    return Note(cudaErrorInvalidValue);
  }
  *memPool = reinterpret_cast<cudaMemPool_t>(new cudaMemoryType(type));  // kept for the process, as ccoll's are
  return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
  delete reinterpret_cast<cudaMemoryType*>(memPool);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (device != 0) return Note(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMemoryPoolsSupported: *value = NoDevicePools() ? 0 : 1; return cudaSuccess;
    case cudaDevAttrHostMemoryPoolsSupported: *value = NoHostPools() ? 0 : 1; return cudaSuccess;
    default: return Note(cudaErrorInvalidValue);
  }
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t /*memPool*/, enum cudaMemPoolAttr /*attr*/, void* /*value*/) {
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool, const struct cudaMemAccessDesc* descList, size_t count) {
  if (memPool == nullptr || (count > 0 && descList == nullptr)) return Note(cudaErrorInvalidValue);
  for (size_t i = 0; i < count; ++i) {
    if (descList[i].location.type != cudaMemLocationTypeDevice || descList[i].location.id != 0) {
      return Note(cudaErrorInvalidDevice);
    }
  }
  return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  if (cudaError_t e = Lost()) return e;
  if (memPool == nullptr) return Note(cudaErrorInvalidValue);
  if (cudaError_t e = CheckNotCapturing(StreamOf(stream))) return e;
  if (BrokenPools()) return Note(cudaErrorNotSupported);
  *ptr = Allocate(size, *reinterpret_cast<cudaMemoryType*>(memPool), true);
  return *ptr ? cudaSuccess : Note(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  if (devPtr == nullptr) return cudaSuccess;
  const cudaMemoryType type = TypeOf(devPtr);
  if (type != cudaMemoryTypeDevice && type != cudaMemoryTypeHost) return Note(cudaErrorInvalidValue);
  if (IsLost()) {
    Release(devPtr, type, true, "cudaFreeAsync");
    return Lost();
  }
  if (cudaError_t e = CheckNotCapturing(StreamOf(hStream))) return e;
  return Enqueue(hStream, [=] { Release(devPtr, type, true, "cudaFreeAsync"); });
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int /*flags*/) {
  if (cudaError_t e = Lost()) return e;
  if (cudaError_t e = CheckUnsafeCall()) return e;
  if (Strict("hostalloc")) SynchronizeDevice("cudaHostAlloc (FAKE_CUDA_STRICT)");
  gSynchronousAllocations.fetch_add(1);
  *pHost = Allocate(size, cudaMemoryTypeHost, false);
  return *pHost ? cudaSuccess : Note(cudaErrorMemoryAllocation);
}

cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int /*flags*/) {
  if (cudaError_t e = Lost()) return e;
  if (TypeOf(pHost) != cudaMemoryTypeHost) return Note(cudaErrorInvalidValue);
  *pDevice = pHost;  // unified addressing
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (IsLost()) {
    Release(ptr, cudaMemoryTypeHost, false, "cudaFreeHost");
    return Lost();
  }
  if (cudaError_t e = CheckUnsafeCall()) return e;
  SynchronizeDevice("cudaFreeHost");
  return Release(ptr, cudaMemoryTypeHost, false, "cudaFreeHost");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  if (cudaError_t e = Lost()) return e;
  auto* s = new FakeStream((flags & cudaStreamNonBlocking) == 0);
  s->device = tDevice;
  *pStream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

// The legacy and per-thread streams are the current device's.
cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  if (device == nullptr) return Note(cudaErrorInvalidValue);
  *device = IsLegacy(stream) || stream == cudaStreamPerThread ? tDevice : StreamOf(stream)->device;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<FakeStream*>(stream);  // runs what is queued first, as CUDA lets it complete
  return Lost();
}

cudaError_t cudaDeviceSynchronize() {
  if (cudaError_t e = Lost()) return e;
  if (cudaError_t e = CheckUnsafeCall()) return e;
  SynchronizeDevice("cudaDeviceSynchronize");
  return Lost();
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (cudaError_t e = Lost()) return e;
  FakeStream* s = StreamOf(stream);
  if (cudaError_t e = CheckNotCapturing(s)) return e;
  if (cudaError_t e = CheckUnsafeCall()) return e;
  if (IsLegacy(stream)) {
    if (cudaError_t e = CheckLegacyStreamUse()) return e;
  }
  s->Synchronize();
  return Lost();  // (lost while it waited: what was queued was dropped)
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (cudaError_t e = Lost()) return e;
  FakeStream* s = StreamOf(stream);
  if (cudaError_t e = CheckNotCapturing(s)) return e;
  if (cudaError_t e = CheckUnsafeCall()) return e;
  if (IsLegacy(stream)) {
    if (cudaError_t e = CheckLegacyStreamUse()) return e;
  }
  return s->Idle() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  if (cudaError_t e = Lost()) return e;
  FakeStream* s = StreamOf(stream);
  FakeEvent* e = reinterpret_cast<FakeEvent*>(event);
  std::shared_ptr<Progress> p;
  uint64_t target;
  std::shared_ptr<Capture> captured;
  {
    std::lock_guard<std::mutex> lock(e->m);
    p = e->progress;
    target = e->target;
    captured = e->captured;
  }
  if (captured != nullptr || gCaptureCount.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> lock(gCaptureMutex);
    if (captured != nullptr && !captured->ended) {
      if (s->capture_ == captured) return cudaSuccess;  // a point earlier in this very stream's capture
      // CUDA would join the waiting stream into that capture (a fork of the graph): not modelled.
      Invalidate(captured.get());
      if (s->capture_ != nullptr) Invalidate(s->capture_.get());
      return Note(cudaErrorStreamCaptureUnsupported);
    }
    if (s->capture_ != nullptr && p != nullptr) {
      Invalidate(s->capture_.get());
      return Note(cudaErrorStreamCaptureIsolation);
    }
  }
  if (p == nullptr) return cudaSuccess;  // never recorded, or in a capture that has ended: nothing to wait for
  return Enqueue(stream, [p, target] { p->WaitFor(target); });
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  std::swap(*mode, tCaptureMode);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
  if (IsLegacy(stream)) {
    // CUDA: an error while a blocking stream captures, which it leaves as it is.
    std::lock_guard<std::mutex> lock(gCaptureMutex);
    for (auto& c : Captures()) {
      if (c->blocking) return Note(cudaErrorStreamCaptureImplicit);
    }
    *pCaptureStatus = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  FakeStream* s = StreamOf(stream);
  std::lock_guard<std::mutex> lock(gCaptureMutex);
  *pCaptureStatus = s->capture_ == nullptr     ? cudaStreamCaptureStatusNone
                    : s->capture_->invalidated ? cudaStreamCaptureStatusInvalidated
                                               : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (cudaError_t e = Lost()) return e;
  if (IsLegacy(stream) || stream == cudaStreamPerThread) return Note(cudaErrorStreamCaptureUnsupported);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return Note(cudaErrorInvalidValue);
  }
  FakeStream* s = StreamOf(stream);
  std::lock_guard<std::mutex> lock(gCaptureMutex);
  if (s->capture_ != nullptr) return Note(cudaErrorIllegalState);
  auto c = std::make_shared<Capture>();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->blocking = s->blocking;
  s->capture_ = c;
  Captures().push_back(std::move(c));
  gCaptureCount.fetch_add(1, std::memory_order_release);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  if (IsLegacy(stream) || stream == cudaStreamPerThread) return Note(cudaErrorIllegalState);
  FakeStream* s = StreamOf(stream);
  std::shared_ptr<Capture> c;
  {
    std::lock_guard<std::mutex> lock(gCaptureMutex);
    if (s->capture_ == nullptr) return Note(cudaErrorIllegalState);
    if (s->capture_->mode != cudaStreamCaptureModeRelaxed && s->capture_->thread != std::this_thread::get_id()) {
      return Note(cudaErrorStreamCaptureWrongThread);
    }
    c = s->EndCaptureLocked();
  }
  *pGraph = nullptr;
  if (c->invalidated) return Note(cudaErrorStreamCaptureInvalidated);
  auto* g = new FakeGraph();
  g->ops = std::make_shared<const std::vector<std::function<void()>>>(std::move(c->ops));
  *pGraph = reinterpret_cast<cudaGraph_t>(g);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long /*flags*/) {
  if (cudaError_t e = Lost()) return e;
  if (pGraphExec == nullptr || graph == nullptr) return Note(cudaErrorInvalidValue);
  *pGraphExec = reinterpret_cast<cudaGraphExec_t>(new FakeGraph(*reinterpret_cast<FakeGraph*>(graph)));
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  if (graphExec == nullptr) return Note(cudaErrorInvalidValue);
  std::shared_ptr<const std::vector<std::function<void()>>> ops = reinterpret_cast<FakeGraph*>(graphExec)->ops;
  return Enqueue(stream, [ops] {
    for (const auto& op : *ops) op();
  });
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  delete reinterpret_cast<FakeGraph*>(graphExec);  // a launch still queued holds the operations
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<FakeGraph*>(graph);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int /*flags*/) {
  if (cudaError_t e = Lost()) return e;
  *event = reinterpret_cast<cudaEvent_t>(new FakeEvent());
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<FakeEvent*>(event);
  return Lost();
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (cudaError_t err = Lost()) return err;
  FakeEvent* e = reinterpret_cast<FakeEvent*>(event);
  if (IsLegacy(stream)) {
    if (cudaError_t err = CheckLegacyStreamUse()) return err;
  }
  FakeStream* s = StreamOf(stream);
  if (gCaptureCount.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> lock(gCaptureMutex);
    if (s->capture_ != nullptr) {
      if (s->capture_->invalidated) return Note(cudaErrorStreamCaptureInvalidated);
      std::lock_guard<std::mutex> event_lock(e->m);
      e->progress = nullptr;
      e->captured = s->capture_;
      return cudaSuccess;
    }
  }
  std::shared_ptr<std::atomic<int64_t>> reached = std::make_shared<std::atomic<int64_t>>(0);
  if (cudaError_t err = s->Push([reached] {
        reached->store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count());
      })) {
    return err;
  }
  uint64_t target;
  std::shared_ptr<Progress> p = s->Mark(&target);
  std::lock_guard<std::mutex> lock(e->m);
  e->progress = std::move(p);
  e->target = target;
  e->captured = nullptr;
  e->reached = std::move(reached);
  return cudaSuccess;
}

// The host time between the two records' operations (see FakeEvent::reached), once both ran.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (cudaEventQuery(start) != cudaSuccess || cudaEventQuery(end) != cudaSuccess) return cudaErrorNotReady;
  FakeEvent* a = reinterpret_cast<FakeEvent*>(start);
  FakeEvent* b = reinterpret_cast<FakeEvent*>(end);
  std::lock_guard<std::mutex> la(a->m);
  std::lock_guard<std::mutex> lb(b->m);
  if (a->progress == nullptr || b->progress == nullptr) return Note(cudaErrorInvalidResourceHandle);  // never recorded
  *ms = static_cast<float>(static_cast<double>(b->reached->load() - a->reached->load()) / 1e6);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (cudaError_t err = Lost()) return err;
  FakeEvent* e = reinterpret_cast<FakeEvent*>(event);
  if (cudaError_t err = CheckEventNotCaptured(e)) return err;
  if (cudaError_t err = CheckUnsafeCall()) return err;
  std::lock_guard<std::mutex> lock(e->m);
  return e->progress == nullptr || e->progress->Reached(e->target) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (cudaError_t err = Lost()) return err;
  FakeEvent* e = reinterpret_cast<FakeEvent*>(event);
  if (cudaError_t err = CheckEventNotCaptured(e)) return err;
  if (cudaError_t err = CheckUnsafeCall()) return err;
  std::shared_ptr<Progress> p;
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(e->m);
    p = e->progress;
    target = e->target;
  }
  if (p != nullptr) p->WaitFor(target);
  return Lost();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  if (cudaError_t e = CheckCopyKind("cudaMemcpyAsync", dst, src, count, kind)) return e;
  void* d = cctest::FakeHostView(dst);
  const void* from = cctest::FakeHostView(src);
  // count 0 may come with null pointers, which CUDA takes and memcpy does not.
  return Enqueue(stream, [=] {
    if (count > 0) std::memcpy(d, from, count);
  });
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                                cudaStream_t stream) {
  if (dstDevice != 0 || srcDevice != 0) return Note(cudaErrorInvalidDevice);
  if (cudaError_t e = CheckCopyKind("cudaMemcpyPeerAsync", dst, src, count, cudaMemcpyDeviceToDevice)) return e;
  return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  if (cudaError_t e = CheckCopyKind("cudaMemcpy", dst, src, count, kind)) return e;
  void* d = cctest::FakeHostView(dst);
  const void* from = cctest::FakeHostView(src);
  return RunOnLegacyStream([=] {
    if (count > 0) std::memcpy(d, from, count);
  });
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  void* d = cctest::FakeHostView(devPtr);
  return Enqueue(stream, [=] {
    if (count > 0) std::memset(d, value, count);
  });
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  void* d = cctest::FakeHostView(devPtr);
  return RunOnLegacyStream([=] {
    if (count > 0) std::memset(d, value, count);
  });
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  return Enqueue(stream, [=] { fn(userData); });
}

}  // extern "C"

namespace cctest {

std::atomic<bool> gHoldKernels{false};

void FakeLaunch(cudaStream_t stream, std::function<void()> op) {
  BeforeLaunch();
  Enqueue(stream, [op = std::move(op)] {
    while (gHoldKernels.load() && !IsLost()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!IsLost()) op();
  });
}

void FakeHoldKernels(bool hold) { gHoldKernels.store(hold); }

void FakeLoseDevice(bool lost) {
  if (!gLost.exchange(lost, std::memory_order_acq_rel) || lost) return;
  gLosses.fetch_add(1);
}

FakeKeepLastError::FakeKeepLastError() : saved_(tLastError) {}
FakeKeepLastError::~FakeKeepLastError() { tLastError = saved_; }

void FakeFailAllocations(int n) { tFailAllocations = n; }

void FakeDeviceCount(int n) { gDeviceCount.store(n); }

cudaError_t FakePush(cudaStream_t stream, std::function<void()> op) { return Enqueue(stream, std::move(op)); }

void FakeKernelsLoaded(unsigned families) { gLoaded.fetch_or(families); }

void FakeLazyLibraryCall(const char* what) {
  if (Strict("cublas")) SynchronizeDevice(what);
}

void FakeStrictCall(const char* token, const char* what) {
  if (Strict(token)) SynchronizeDevice(what);
}

void FakeSynchronizeDevice(const char* what) { SynchronizeDevice(what); }

uint64_t FakeSynchronousAllocations() { return gSynchronousAllocations.load(); }

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

// As core/stream_wait.cu's: an earlier error is taken off first, and the launch's own is returned.
cudaError_t LaunchStreamWait(const uint64_t* flag, uint64_t ticket, cudaStream_t stream) {
  cudaGetLastError();
  BeforeLaunch();
  Enqueue(stream, [=] {
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < ticket && !IsLost()) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  return cudaGetLastError();
}

}  // namespace ccoll
