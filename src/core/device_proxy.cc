#include "core/device_proxy.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/comm.h"
#include "core/error.h"
#include "core/log.h"

#ifdef CCOLL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/device_memory.h"
#include "core/cuda_result.h"
#include "core/device_scope.h"
#include "core/stream_sync.h"
#include "core/stream_wait.h"
#endif

namespace ccoll {

#ifdef CCOLL_HAVE_CUDA

namespace {

ccResult_t CudaFail(cudaError_t e, const char* what, int rank) {
  cudaGetLastError();  // taken off the thread's error state (core/cuda_result.h, Launched)
  return Fail(ccUnhandledCudaError, "rank %d: %s failed: %s", rank, what, cudaGetErrorString(e));
}

#define CC_CUDA(call, what)                             \
  do {                                                  \
    cudaError_t cc_cuda_err_ = (call);                  \
    if (cc_cuda_err_ != cudaSuccess) {                  \
      return CudaFail(cc_cuda_err_, what, comm_->rank); \
    }                                                   \
  } while (0)

// The proxy's streams wait on the caller's stream, which waits for the proxy: with few hardware queues, a queue
// shared by the two holds the proxy's work behind the commands that follow the wait (README, "Device buffers"). Said
// once per process when the user set fewer than CUDA's default 8.
void WarnFewHardwareQueues() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    const long n = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
    if (n <= 0 || n >= 8) return;
    CC_WARN("CUDA_DEVICE_MAX_CONNECTIONS=%ld: device calls through ccoll's proxy thread make the caller's stream wait "
            "for work that ccoll queues on its own streams; with %ld hardware queue(s) that work can be queued behind "
            "the wait and never run (a hang). Use the NCCL transport (CC_TRANSPORT=nccl), or CC_DEVICE_KERNELS=0 "
            "with one rank per GPU, or leave the variable at CUDA's default",
            n, n);
  });
}

// The call shapes a proxy remembers as run (StagedCall::shape): a few tens of bytes each.
constexpr size_t kShapesKept = 4096;

}  // namespace

// Two staging buffers, used by calls in turn: call t (tickets count from 1) uses slot t % 2. A slot is free again
// once its last call's copy back has completed on its stream (`done`).
struct DeviceProxy::Impl {
  struct Slot {
    char* host = nullptr;  // pinned
    size_t bytes = 0;
    cudaEvent_t in = nullptr;    // the device input is in `host`
    cudaEvent_t done = nullptr;  // the result left `host`
    bool used = false;           // `done` was recorded
  };
  struct Op {
    uint64_t ticket;
    int slot;
    HostWork work;
  };

  ccComm* comm_ = nullptr;
  int device = 0;
  Slot slots[2];
  std::vector<char*> retired;  // staging outgrown while a stream might still read it: freed at the end
  uint64_t* flag = nullptr;    // pinned, mapped: the last ticket the proxy has finished (a wait word)
  uint64_t* flagDevice = nullptr;
  uint64_t issued = 0;  // tickets handed out (caller side, under enqueueMutex)
  std::mutex enqueueMutex;
  // Where some of ccoll's scratch of the device comes from cudaMalloc or cudaHostAlloc (no pool of its kind, or
  // CC_MEMORY_POOLS=0): the first call of each shape waits on the host (see device_proxy.h). Set by Init, before
  // ccComm::DeviceProxyOf publishes the proxy (under its mutex); only read after.
  bool hostWaits = false;
  std::unordered_set<uint64_t> shapesRun;  // the shapes of the calls that did (under enqueueMutex)

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Op> queue;
  bool running = false;  // the proxy thread is inside an op
  bool stop = false;
  // Set by the destructor: after this a call whose stream has not reached it is skipped (the destroy is bounded).
  std::atomic<bool> stopping{false};
  std::chrono::steady_clock::time_point stopDeadline;
  std::thread thread;

  bool Failed() const { return comm_->aborting.load() || comm_->asyncError.load() != ccSuccess; }

  // Fails the communicator with `code` and `sentence`, and aborts its transports: a call this proxy then skips is one
  // whose messages the peers expect, and they learn at once that none will come instead of waiting for them until
  // CC_TIMEOUT_MS (as a failure inside a call tells them: ccComm::FailInCall).
  void FailComm(ccResult_t code, const std::string& sentence) {
    comm_->RecordError(sentence);
    int expected = ccSuccess;
    comm_->asyncError.compare_exchange_strong(expected, code);
    comm_->Abort(("rank " + std::to_string(comm_->rank) + " failed: " + sentence).c_str());
  }

  ccResult_t Init() {
    WarnFewHardwareQueues();
    DeviceScope scope(device);
    // From the device's slab and pools, made before its first stream wait: no allocation here that may synchronize
    // the device while another communicator's stream on it waits.
    CC_CHECK(TakeWaitWord(device, &flag, &flagDevice));
    cudaMemPool_t devicePool = nullptr, hostPool = nullptr;
    CC_CHECK(DevicePool(device, &devicePool));
    CC_CHECK(PinnedHostPool(device, &hostPool));
    hostWaits = devicePool == nullptr || hostPool == nullptr;
    if (hostWaits) {
      CC_INFO(kLogInit, "rank %d: CUDA device %d: some of ccoll's scratch comes from cudaMalloc or cudaHostAlloc, so "
              "the first device call of each shape returns once it has run", comm_->rank, device);
    }
    for (Slot& s : slots) {
      CC_CUDA(cudaEventCreateWithFlags(&s.in, cudaEventDisableTiming), "cudaEventCreate");
      CC_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate");
    }
    thread = std::thread([this] { Loop(); });
    return ccSuccess;
  }

  // Polls ev until it completes; false when the communicator failed first or ev reports an error.
  bool WaitEvent(cudaEvent_t ev) {
    for (int spins = 0;; ++spins) {
      cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) {
        cudaGetLastError();  // taken off this thread's error state (core/cuda_result.h, Launched)
        FailComm(ccUnhandledCudaError,
                 std::string("device proxy: waiting for the staged input failed: ") + cudaGetErrorString(e));
        return false;
      }
      if (Failed()) return false;
      if (stopping.load(std::memory_order_acquire) && std::chrono::steady_clock::now() > stopDeadline) {
        comm_->RecordError("device proxy: the communicator was destroyed, and a stream had not reached its queued "
                           "call within CC_TIMEOUT_MS: the call was skipped");
        return false;
      }
      if (spins < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  // Records a slot's `done` on `stream` when it leaves (an Enqueue's work on the slot is queued before it: a failure
  // also leaves `done` behind that work).
  struct DoneGuard {
    Slot& slot;
    cudaStream_t stream;
    bool armed = true;
    ~DoneGuard() {
      if (!armed) return;
      if (cudaEventRecord(slot.done, stream) == cudaSuccess) slot.used = true;
      cudaGetLastError();
    }
  };

  // Waits until the slot's last call has copied its result out (`done`), at most the communicator's timeout:
  // cudaSuccess (also for a slot never used), cudaErrorTimeout, or the query's error.
  cudaError_t SlotDone(const Slot& slot) {
    return slot.used ? EventWithin(slot.done, comm_->config.timeoutMs) : cudaSuccess;
  }

  // Gives a slot whose last call is done staging of at least `bytes` (4 KiB and up, powers of two), allocated in the
  // order of `stream`, which copies into it next (the proxy reads it after that copy). The old staging is not freed
  // now: the proxy is done with it, but the stream that copied into it may not be; it is freed at the end.
  ccResult_t Grow(Slot& slot, size_t bytes, cudaStream_t stream) {
    size_t size = 4096;
    while (size < bytes) size *= 2;
    void* fresh = nullptr;
    CC_CHECK(AllocateScratch(device, true, size, stream, &fresh));
    if (slot.host != nullptr) retired.push_back(slot.host);
    slot.host = static_cast<char*>(fresh);
    slot.bytes = size;
    return ccSuccess;
  }

  // The caller's side of a call that waits on the host: true once the proxy has finished `ticket` (run or skipped),
  // false when CC_TIMEOUT_MS passed first (the call's stream had not reached it: held by its own earlier work).
  bool WaitOnHost(uint64_t ticket) {
    return PollWithin([&] { return __atomic_load_n(flag, __ATOMIC_ACQUIRE) >= ticket; }, comm_->config.timeoutMs);
  }

  void Loop() {
    gpu::IgnoreCuda(cudaSetDevice(device));  // (its failure fails the calls' CUDA work)
    // Relaxed: this thread's event queries, copies and pool allocations must not break a capture that another thread
    // of the application began in global mode (PyTorch's default), where CUDA refuses them from every thread.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stop, and nothing left
        op = std::move(queue.front());
        queue.pop_front();
        running = true;
      }
      Slot& s = slots[op.slot];
      const bool run = !Failed() && WaitEvent(s.in);
      try {
        op.work(run ? s.host : nullptr);  // the work records its own errors on the communicator
      } catch (const std::exception& e) {
        FailComm(ccInternalError, std::string("device proxy: ") + e.what());
      }
      // The work goes first: what it holds (a compressor's count of queued calls) is let go before the stream is
      // released, so a caller whose stream has got past the call finds the compressor idle.
      op.work = nullptr;
      // Release the stream whatever happened: a failed call leaves its result undefined, never a hung stream.
      __atomic_store_n(flag, op.ticket, __ATOMIC_RELEASE);
      {
        std::lock_guard<std::mutex> lock(mutex);
        running = false;
      }
      cv.notify_all();
    }
  }

  ccResult_t Enqueue(const StagedCall& call, HostWork work, bool* queued) {
    *queued = false;
    std::lock_guard<std::mutex> serial(enqueueMutex);
    DeviceScope scope(device);
    cudaStream_t stream = reinterpret_cast<cudaStream_t>(call.stream);
    CC_CHECK(DeviceProxy::RefuseCapture(comm_->rank, call.stream));
    const uint64_t ticket = issued + 1;
    Slot& s = slots[ticket % 2];
    // The slot's last call must have copied its result out before its staging is reused: its stream has to get
    // there, at most the communicator's timeout (it may be held by its own earlier work).
    cudaError_t e = SlotDone(s);
    if (e == cudaErrorTimeout) {
      return Fail(ccTimeout, "rank %d: the device call two calls back has not copied its result out of its staging "
                  "within %d ms (CC_TIMEOUT_MS): its stream has not reached it (held by earlier work?)", comm_->rank,
                  comm_->config.timeoutMs);
    }
    if (e != cudaSuccess) return CudaFail(e, "cudaEventQuery (staging reuse)", comm_->rank);
    const bool firstOfShape = hostWaits && (call.shape == 0 || shapesRun.count(call.shape) == 0);
    // From here on the stream may hold work on the slot (its staging, the wait on the flag): whatever fails below, the
    // slot's `done` follows that work, since the next call on the slot and the destructor wait for it before the
    // staging and the flag are reused.
    DoneGuard guard{s, stream};
    if (s.host == nullptr || s.bytes < call.stagingBytes) {  // (a call that stages nothing still gets a buffer)
      CC_CHECK(Grow(s, call.stagingBytes, stream));
    }
    Slot& other = slots[(ticket + 1) % 2];
    if (firstOfShape && (other.host == nullptr || other.bytes < call.stagingBytes)) {
      // The later calls of the shape use both slots and must not allocate (see device_proxy.h): the other slot grows
      // too, once its last call has copied its result out (which needs no call of this thread's after it). Here, before
      // this call is queued: no peer's call after this one can hold a stream yet. Best effort: if its last call is not
      // done within CC_TIMEOUT_MS or the allocation fails, it is left, and a later call may grow it.
      e = SlotDone(other);
      if (e == cudaSuccess) {
        DoneGuard otherGuard{other, stream};  // its next call waits for the allocation's place on this stream
        if (Grow(other, call.stagingBytes, stream) != ccSuccess) {
          CC_WARN("rank %d: the second staging buffer could not be grown ahead (%s); the call that uses it will",
                  comm_->rank, LastError().c_str());
        }
      } else if (e != cudaErrorTimeout) {
        cudaGetLastError();  // (the query's error; the slot is left)
      }
    }
    for (const StagedCopy& in : call.ins) {
      if (in.bytes == 0) continue;
      CC_CUDA(cudaMemcpyAsync(s.host + in.offset, in.device, in.bytes, cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync (device to staging)");
    }
    CC_CUDA(cudaEventRecord(s.in, stream), "cudaEventRecord");
    {
      std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(Op{ticket, static_cast<int>(ticket % 2), std::move(work)});
    }
    *queued = true;
    issued = ticket;
    cv.notify_all();
    // From here the call is queued: the proxy runs it whatever happens below (the peers expect it).
    s.used = true;
    bool ran = false;
    if (firstOfShape) {
      ran = WaitOnHost(ticket);
      if (ran && call.shape != 0) {
        if (shapesRun.size() >= kShapesKept) shapesRun.clear();  // (then each shape waits once more)
        shapesRun.insert(call.shape);
      } else if (!ran) {
        CC_WARN("rank %d: a device call's stream had not reached it within %d ms (CC_TIMEOUT_MS) while the call "
                "waited on the host for its first run of this shape; the stream waits for it instead, and an "
                "allocation the call makes meanwhile (cudaMalloc, cudaHostAlloc) may synchronize the device",
                comm_->rank, comm_->config.timeoutMs);
      }
    }
    if (!ran) CC_CUDA(LaunchStreamWait(flagDevice, ticket, stream), "the stream wait kernel launch");
    for (const StagedCopy& out : call.outs) {
      if (out.bytes == 0) continue;
      CC_CUDA(cudaMemcpyAsync(out.device, s.host + out.offset, out.bytes, cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync (staging to device)");
    }
    CC_CUDA(cudaEventRecord(s.done, stream), "cudaEventRecord");
    guard.armed = false;
    return ccSuccess;
  }

  void Drain() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return queue.empty() && !running; });
  }

  ~Impl() {
    // A destroy waits for the callers' streams at most the communicator's timeout in all, an abort not at all: for a
    // stream to reach a queued call (else the proxy skips it), then to be done with the staging and the flag (else
    // they are left to it, never freed).
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(comm_->aborting.load() ? 0 : comm_->config.timeoutMs);
    if (thread.joinable()) {
      stopDeadline = deadline;
      stopping.store(true, std::memory_order_release);
      {
        std::lock_guard<std::mutex> lock(mutex);
        stop = true;
      }
      cv.notify_all();
      thread.join();
    }
    DeviceScope scope(device);
    if (flag != nullptr) __atomic_store_n(flag, UINT64_MAX, __ATOMIC_RELEASE);  // no stream waits any more
    // The streams must be done with the staging and the flag before they are freed or reused; a caller's stream may
    // not have got there yet (held by its own earlier work).
    bool streamsDone = true;
    for (Slot& s : slots) {
      if (!s.used) continue;
      cudaError_t e;
      while ((e = cudaEventQuery(s.done)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      streamsDone = streamsDone && e != cudaErrorNotReady;
    }
    if (!streamsDone) {
      CC_WARN("rank %d: a stream has not reached its last call on the communicator's device buffers; its staging "
              "and wait word are left to it (not freed)", comm_->rank);
    }
    for (Slot& s : slots) {
      // (An event still pending is released when its work completes.)
      if (s.in) gpu::IgnoreCuda(cudaEventDestroy(s.in));
      if (s.done) gpu::IgnoreCuda(cudaEventDestroy(s.done));
      if (s.host) retired.push_back(s.host);
    }
    if (streamsDone) {
      for (char* p : retired) FreeScratch(device, true, p, ReleaseStream(device));  // nothing uses them any more
      if (flag != nullptr) ReturnWaitWord(device, flag);
    }
    cudaGetLastError();
  }
};

#undef CC_CUDA

ccResult_t DeviceProxy::Create(ccComm* comm, int device, std::unique_ptr<DeviceProxy>* out) {
  auto impl = std::make_unique<Impl>();
  impl->comm_ = comm;
  impl->device = device;
  CC_CHECK(impl->Init());
  out->reset(new DeviceProxy(std::move(impl)));
  return ccSuccess;
}

ccResult_t DeviceProxy::Enqueue(const StagedCall& call, HostWork work, bool* queued) {
  return impl_->Enqueue(call, std::move(work), queued);
}

ccResult_t DeviceProxy::RefuseCapture(int rank, ccStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capture);
  if (e != cudaSuccess) return CudaFail(e, "cudaStreamIsCapturing", rank);
  if (capture != cudaStreamCaptureStatusNone) {
    return Fail(ccInvalidUsage, "rank %d: the stream is being captured into a CUDA graph; device buffers are staged "
                "through host memory by a proxy thread, which a graph cannot hold (transport nccl can be captured)",
                rank);
  }
  return ccSuccess;
}

bool DeviceProxy::UsesShapes() const { return impl_->hostWaits; }  // (set before the proxy was published)

void DeviceProxy::Drain() { impl_->Drain(); }

#else  // no CUDA

struct DeviceProxy::Impl {};

ccResult_t DeviceProxy::Create(ccComm* comm, int /*device*/, std::unique_ptr<DeviceProxy>* /*out*/) {
  return Fail(ccInvalidUsage, "rank %d: device buffers need a build with CUDA (CCOLL_ENABLE_CUDA)", comm->rank);
}

ccResult_t DeviceProxy::Enqueue(const StagedCall& /*call*/, HostWork /*work*/, bool* queued) {
  *queued = false;
  return ccInternalError;
}

ccResult_t DeviceProxy::RefuseCapture(int /*rank*/, ccStream_t /*stream*/) { return ccSuccess; }

void DeviceProxy::Drain() {}

bool DeviceProxy::UsesShapes() const { return false; }

#endif

DeviceProxy::DeviceProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DeviceProxy::~DeviceProxy() = default;

}  // namespace ccoll
