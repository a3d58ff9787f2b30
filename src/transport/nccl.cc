#include "transport/nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "core/cuda_result.h"
#include "core/device_scope.h"
#include "core/error.h"
#include "core/log.h"

namespace ccoll {

// ccoll's enums were given NCCL's values, so that a port is a rename; the casts below rely on it.
static_assert(ccInt8 == static_cast<int>(ncclInt8) && ccUint8 == static_cast<int>(ncclUint8) &&
                  ccInt32 == static_cast<int>(ncclInt32) && ccUint32 == static_cast<int>(ncclUint32) &&
                  ccInt64 == static_cast<int>(ncclInt64) && ccUint64 == static_cast<int>(ncclUint64) &&
                  ccFloat16 == static_cast<int>(ncclFloat16) && ccFloat32 == static_cast<int>(ncclFloat32) &&
                  ccFloat64 == static_cast<int>(ncclFloat64) && ccBfloat16 == static_cast<int>(ncclBfloat16),
              "ccDataType_t values are NCCL's");
static_assert(ccSum == static_cast<int>(ncclSum) && ccProd == static_cast<int>(ncclProd) &&
                  ccMax == static_cast<int>(ncclMax) && ccMin == static_cast<int>(ncclMin) &&
                  ccAvg == static_cast<int>(ncclAvg),
              "ccRedOp_t values are NCCL's");
static_assert(ccUnhandledCudaError == static_cast<int>(ncclUnhandledCudaError) &&
                  ccSystemError == static_cast<int>(ncclSystemError) &&
                  ccInternalError == static_cast<int>(ncclInternalError) &&
                  ccInvalidArgument == static_cast<int>(ncclInvalidArgument) &&
                  ccInvalidUsage == static_cast<int>(ncclInvalidUsage) &&
                  ccRemoteError == static_cast<int>(ncclRemoteError) && ccInProgress == static_cast<int>(ncclInProgress),
              "ccResult_t values are NCCL's");

namespace {

using Clock = std::chrono::steady_clock;

ccResult_t ResultOf(ncclResult_t r) {
  return r >= ncclSuccess && r <= ncclInProgress ? static_cast<ccResult_t>(r) : ccInternalError;
}

cudaStream_t CudaStream(ccStream_t s) { return reinterpret_cast<cudaStream_t>(s); }

// A non-blocking communicator's call that returned `r`: while that (then the communicator's async error) reads
// ncclInProgress, polls it again, until it reads something else, which is returned. ncclInProgress is returned when
// *stop (may be null) becomes true or `deadline` passes first.
ncclResult_t WhileInProgress(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline,
                             const std::atomic<bool>* stop) {
  for (int polls = 0; r == ncclInProgress; ++polls) {
    if (stop != nullptr && stop->load()) return ncclInProgress;
    const ncclResult_t got = ncclCommGetAsyncError(comm, &r);
    if (got != ncclSuccess) return got;  // (the state cannot be read: that is the answer, not another poll)
    if (r != ncclInProgress) break;
    if (Clock::now() > deadline) return ncclInProgress;
    if (polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return r;
}

}  // namespace

struct NcclTransport::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int nranks = 0;
  int device = 0;
  int timeoutMs = 0;

  // Calls into NCCL hold this shared; the abort takes it exclusively, so that it does not free the communicator under
  // a call, unless a call stays inside NCCL (blocked: what the abort is there to release).
  std::shared_timed_mutex commLock;
  std::atomic<bool> aborted{false};
  std::atomic<bool> commGone{false};  // ncclCommAbort or ncclCommDestroy has run (or is running)

  std::mutex errorMutex;
  std::atomic<int> error{ccSuccess};
  std::string errorSentence;

  // Collectives queued outside graph capture, oldest first: an event recorded after each, and when it was queued.
  struct Pending {
    cudaEvent_t event;
    Clock::time_point queued;
  };
  std::mutex pendingMutex;
  std::deque<Pending> pending;
  std::vector<cudaEvent_t> spareEvents;

  std::mutex watchMutex;
  std::condition_variable watchCv;
  bool stop = false;
  std::thread watchdog;

  // Records the first failure (later ones are its consequences) and logs it.
  void RecordError(ccResult_t r, const std::string& sentence) {
    std::lock_guard<std::mutex> lock(errorMutex);
    if (error.load() != ccSuccess) return;
    errorSentence = sentence;
    error = r;
    CC_WARN("%s", sentence.c_str());
  }

  // The error of a call that finds the communicator aborted.
  ccResult_t Aborted(const char* what) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(errorMutex);
      why = errorSentence;
    }
    return Fail(ccRemoteError, "rank %d: %s on the nccl transport after it was aborted (%s)", rank, what,
                why.c_str());
  }

  ccResult_t Check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return ccSuccess;
    return Fail(ResultOf(r), "rank %d: %s failed: %s (%s)", rank, what, ncclGetErrorString(r),
                ncclGetLastError(nullptr));
  }

  // One call of a non-blocking communicator: ncclInProgress means NCCL is still queueing it (connecting to a peer, at
  // the first operations with it), so the communicator is polled until the call is queued on its stream, and nothing
  // else is issued meanwhile (CUDA work on the same stream would otherwise land before it). Past `deadline`, or on an
  // abort, it gives up; *late says which.
  ccResult_t Step(ncclResult_t r, const char* what, Clock::time_point deadline, bool* late) {
    r = WhileInProgress(comm, r, deadline, &aborted);
    if (r != ncclInProgress) return Check(r, what);
    if (aborted.load()) return Aborted(what);
    *late = true;
    return Fail(ccTimeout, "rank %d: %s was not queued within CC_TIMEOUT_MS=%d ms: NCCL is still connecting to a "
                "peer that does not answer (dead, stuck, or calling collectives in another order)", rank, what,
                timeoutMs);
  }

  // Runs `calls(step)` unless the communicator is aborted, where step(result, name) settles each NCCL call (Step). A
  // call that NCCL has not queued by the timeout aborts the communicator.
  template <typename Calls>
  ccResult_t Enter(const char* what, Calls&& calls) {
    bool late = false;
    ccResult_t r;
    {
      std::shared_lock<std::shared_timed_mutex> lock(commLock);
      if (aborted.load() || commGone.load()) return Aborted(what);
      const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
      r = calls([&](ncclResult_t x, const char* name) { return Step(x, name, deadline, &late); });
    }
    if (late) {
      RecordError(ccTimeout, LastError());
      AbortComm(LastError());
    }
    return r;
  }

  void AbortComm(const std::string& sentence, ccResult_t code = ccRemoteError) {
    RecordError(code, sentence);
    aborted = true;
    // A call polling a non-blocking communicator sees `aborted` and leaves within microseconds; the abort then has
    // the communicator to itself (the lock is only given up on for a call that does not leave).
    std::unique_lock<std::shared_timed_mutex> lock(commLock, std::defer_lock);
    lock.try_lock_for(std::chrono::seconds(2));
    if (commGone.exchange(true)) return;
    DeviceScope scope(device);
    // The abort synchronizes and frees memory: on a thread that is capturing a stream in global or thread-local mode
    // (a captured call that failed) that would break the capture's rules, so this thread is relaxed meanwhile.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    ncclResult_t r = ncclCommAbort(comm);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (r != ncclSuccess) CC_WARN("rank %d: ncclCommAbort failed: %s", rank, ncclGetErrorString(r));
  }

  // One pass of the watchdog: NCCL's asynchronous error, then the oldest queued collectives.
  void Watch() {
    if (aborted.load()) return;
    ncclResult_t async = ncclSuccess;
    {
      std::shared_lock<std::shared_timed_mutex> lock(commLock);
      if (commGone) return;
      ncclCommGetAsyncError(comm, &async);
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      // A CUDA error is this rank's device's (a lost device); anything else, a peer's failure or departure.
      const bool cuda = async == ncclUnhandledCudaError;
      AbortComm("rank " + std::to_string(rank) + ": NCCL reported an asynchronous error: " + ncclGetErrorString(async) +
                    (cuda ? " (the communicator is aborted)" : " (a peer failed or left; the communicator is aborted)"),
                cuda ? ccUnhandledCudaError : ccRemoteError);
      return;
    }
    const Clock::time_point now = Clock::now();
    std::string late;
    ccResult_t code = ccTimeout;
    {
      std::lock_guard<std::mutex> lock(pendingMutex);
      while (!pending.empty()) {
        cudaError_t e = cudaEventQuery(pending.front().event);
        if (e == cudaSuccess) {
          spareEvents.push_back(pending.front().event);
          pending.pop_front();
          continue;
        }
        if (e != cudaErrorNotReady) {
          cudaGetLastError();
          late = std::string("a CUDA error on the stream of a collective: ") + cudaGetErrorString(e);
          code = ccUnhandledCudaError;
        } else if (now - pending.front().queued > std::chrono::milliseconds(timeoutMs)) {
          late = "a collective queued " +
                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - pending.front().queued)
                                    .count()) +
                 " ms ago has not completed (CC_TIMEOUT_MS=" + std::to_string(timeoutMs) +
                 "): a peer is dead or stuck, or its ranks called collectives in different orders";
        }
        break;
      }
    }
    if (!late.empty()) {
      RecordError(code, "rank " + std::to_string(rank) + ": " + late);
      AbortComm("rank " + std::to_string(rank) + ": aborted after " + late);
    }
  }

  void WatchLoop() {
    // The communicator's device (a thread starts on device 0, and a CUDA call there would make a context on it).
    cudaSetDevice(device);
    // Relaxed: this thread's event queries must not break a capture that another thread began in global mode (where
    // CUDA refuses such queries from any thread, and the capture with them).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    std::unique_lock<std::mutex> lock(watchMutex);
    while (!stop) {
      watchCv.wait_for(lock, std::chrono::milliseconds(50));
      if (stop) break;
      lock.unlock();
      Watch();
      lock.lock();
    }
  }
};

ccResult_t NcclTransport::MakeId(std::string* id) {
  ncclUniqueId uid;
  ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess) {
    return Fail(ResultOf(r), "ncclGetUniqueId failed: %s (%s)", ncclGetErrorString(r), ncclGetLastError(nullptr));
  }
  id->assign(reinterpret_cast<const char*>(&uid), sizeof(uid));
  return ccSuccess;
}

ccResult_t NcclTransport::Create(const std::string& id, int rank, int nranks, int device, int timeoutMs,
                                 const std::atomic<bool>* cancel, std::unique_ptr<NcclTransport>* out) {
  ncclUniqueId uid;
  if (id.size() != sizeof(uid)) {
    return Fail(ccRemoteError, "rank %d: rank 0 sent a %zu-byte NCCL id (expected %zu: another NCCL version?)", rank,
                id.size(), sizeof(uid));
  }
  std::memcpy(&uid, id.data(), sizeof(uid));
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->nranks = nranks;
  impl->device = device;
  impl->timeoutMs = timeoutMs;
  {
    // Non-blocking (see the top of nccl.h): init and every later call return while NCCL still connects, and are
    // polled with a deadline here, instead of blocking inside NCCL for a peer that never comes.
    DeviceScope scope(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&impl->comm, nranks, uid, rank, &config);
    r = WhileInProgress(impl->comm, r, Clock::now() + std::chrono::milliseconds(timeoutMs), cancel);
    if (r == ncclInProgress) {
      const bool cancelled = cancel != nullptr && cancel->load();
      ncclCommAbort(impl->comm);
      return Fail(cancelled ? ccRemoteError : ccTimeout, "rank %d: ncclCommInitRankConfig on CUDA device %d %s", rank,
                  device, cancelled ? "was aborted" : "did not finish within CC_TIMEOUT_MS: a rank did not join");
    }
    if (r != ncclSuccess) {
      if (impl->comm != nullptr) ncclCommAbort(impl->comm);
      return Fail(ResultOf(r), "rank %d: ncclCommInitRankConfig on CUDA device %d failed: %s (%s)%s", rank, device,
                  ncclGetErrorString(r), ncclGetLastError(nullptr),
                  r == ncclInvalidUsage ? "; ranks that share a GPU must be processes with different NCCL_HOSTID "
                                          "values"
                                        : "");
    }
  }
  int version = 0;
  ncclGetVersion(&version);
  CC_INFO(kLogInit, "rank %d: nccl transport ready (NCCL %d, CUDA device %d, %d ranks)", rank, version, device,
          nranks);
  Impl* raw = impl.get();
  impl->watchdog = std::thread([raw] { raw->WatchLoop(); });
  out->reset(new NcclTransport(std::move(impl)));
  return ccSuccess;
}

NcclTransport::NcclTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NcclTransport::~NcclTransport() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.watchMutex);
    m.stop = true;
  }
  m.watchCv.notify_all();
  m.watchdog.join();
  // The work queued on the communicator must finish before it goes; if it does not within the timeout, or NCCL
  // reports an error meanwhile (the watchdog is gone), a peer is gone, and only an abort ends it.
  DeviceScope scope(m.device);
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(m.timeoutMs);
  bool drained = m.error.load() == ccSuccess;
  {
    std::lock_guard<std::mutex> lock(m.pendingMutex);
    while (drained && !m.pending.empty()) {
      cudaError_t e = cudaEventQuery(m.pending.front().event);
      if (e == cudaErrorNotReady) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(m.comm, &async);
        if (Clock::now() > deadline || (async != ncclSuccess && async != ncclInProgress)) {
          drained = false;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      cudaGetLastError();
      m.spareEvents.push_back(m.pending.front().event);
      m.pending.pop_front();
    }
  }
  {
    std::unique_lock<std::shared_timed_mutex> lock(m.commLock);
    if (!m.commGone.exchange(true)) {
      // A non-blocking communicator is finalized first (it flushes what is queued, and may return ncclInProgress),
      // then destroyed; one that does not finalize in time is aborted.
      ncclResult_t r = ncclInternalError;
      if (drained) r = WhileInProgress(m.comm, ncclCommFinalize(m.comm), deadline, nullptr);
      r = r == ncclSuccess ? ncclCommDestroy(m.comm) : ncclCommAbort(m.comm);
      if (r != ncclSuccess) CC_WARN("rank %d: destroying the NCCL communicator failed: %s", m.rank, ncclGetErrorString(r));
    }
  }
  for (const Impl::Pending& p : m.pending) gpu::IgnoreCuda(cudaEventDestroy(p.event));
  for (cudaEvent_t e : m.spareEvents) gpu::IgnoreCuda(cudaEventDestroy(e));
}

ccResult_t NcclTransport::Group(const StreamTransfer* transfers, size_t n, ccStream_t stream) {
  Impl& m = *impl_;
  return m.Enter("a transfer", [&](auto&& step) {
    CC_CHECK(step(ncclGroupStart(), "ncclGroupStart"));
    ccResult_t first = ccSuccess;
    for (size_t i = 0; i < n && first == ccSuccess; ++i) {
      const StreamTransfer& t = transfers[i];
      first = t.send ? step(ncclSend(t.buf, t.bytes, ncclUint8, t.peer, m.comm, CudaStream(stream)), "ncclSend")
                     : step(ncclRecv(t.buf, t.bytes, ncclUint8, t.peer, m.comm, CudaStream(stream)), "ncclRecv");
    }
    // The group ends even after a failed call in it: NCCL's group state is per thread and must not stay open.
    ccResult_t end = step(ncclGroupEnd(), "ncclGroupEnd");
    return first != ccSuccess ? first : end;
  });
}

ccResult_t NcclTransport::AllReduce(const void* send, void* recv, size_t count, ccDataType_t dtype, ccRedOp_t op,
                                    ccStream_t stream) {
  Impl& m = *impl_;
  return m.Enter("ncclAllReduce", [&](auto&& step) {
    return step(ncclAllReduce(send, recv, count, static_cast<ncclDataType_t>(dtype), static_cast<ncclRedOp_t>(op),
                              m.comm, CudaStream(stream)),
                "ncclAllReduce");
  });
}

ccResult_t NcclTransport::ReduceScatter(const void* send, void* recv, size_t recvCount, ccDataType_t dtype,
                                        ccRedOp_t op, ccStream_t stream) {
  Impl& m = *impl_;
  return m.Enter("ncclReduceScatter", [&](auto&& step) {
    return step(ncclReduceScatter(send, recv, recvCount, static_cast<ncclDataType_t>(dtype),
                                  static_cast<ncclRedOp_t>(op), m.comm, CudaStream(stream)),
                "ncclReduceScatter");
  });
}

ccResult_t NcclTransport::AllGather(const void* send, void* recv, size_t sendCount, ccDataType_t dtype,
                                    ccStream_t stream) {
  Impl& m = *impl_;
  return m.Enter("ncclAllGather", [&](auto&& step) {
    return step(ncclAllGather(send, recv, sendCount, static_cast<ncclDataType_t>(dtype), m.comm, CudaStream(stream)),
                "ncclAllGather");
  });
}

ccResult_t NcclTransport::Broadcast(const void* send, void* recv, size_t count, ccDataType_t dtype, int root,
                                    ccStream_t stream) {
  Impl& m = *impl_;
  return m.Enter("ncclBroadcast", [&](auto&& step) {
    return step(
        ncclBroadcast(send, recv, count, static_cast<ncclDataType_t>(dtype), root, m.comm, CudaStream(stream)),
        "ncclBroadcast");
  });
}

ccResult_t NcclTransport::Reduce(const void* send, void* recv, size_t count, ccDataType_t dtype, ccRedOp_t op,
                                 int root, ccStream_t stream) {
  Impl& m = *impl_;
  return m.Enter("ncclReduce", [&](auto&& step) {
    return step(ncclReduce(send, recv, count, static_cast<ncclDataType_t>(dtype), static_cast<ncclRedOp_t>(op), root,
                           m.comm, CudaStream(stream)),
                "ncclReduce");
  });
}

void NcclTransport::Queued(ccStream_t stream) {
  Impl& m = *impl_;
  // The communicator's device: the legacy stream (stream 0) and a new event are the current device's.
  DeviceScope scope(m.device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(CudaStream(stream), &capture);
  // A captured collective runs at each launch of its graph, not now: there is nothing to watch until then.
  if (e == cudaSuccess && capture != cudaStreamCaptureStatusNone) return;
  cudaEvent_t event = nullptr;
  if (e == cudaSuccess) {
    std::lock_guard<std::mutex> lock(m.pendingMutex);
    if (!m.spareEvents.empty()) {
      event = m.spareEvents.back();
      m.spareEvents.pop_back();
    }
  }
  if (e == cudaSuccess && event == nullptr) e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(event, CudaStream(stream));
  std::lock_guard<std::mutex> lock(m.pendingMutex);
  if (e != cudaSuccess) {
    // The collective itself is queued (the peers have queued theirs): only the watch is lost, and NCCL's own
    // asynchronous error still is.
    cudaGetLastError();
    if (event != nullptr) m.spareEvents.push_back(event);
    CC_WARN("rank %d: a queued collective cannot be watched for its timeout: %s", m.rank, cudaGetErrorString(e));
    return;
  }
  m.pending.push_back(Impl::Pending{event, Clock::now()});
}

ccResult_t NcclTransport::AsyncError(std::string* why) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.errorMutex);
  if (why != nullptr) *why = m.errorSentence;
  return static_cast<ccResult_t>(m.error.load());
}

void NcclTransport::Abort(const char* reason) { impl_->AbortComm(reason); }

}  // namespace ccoll
