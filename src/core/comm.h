// The communicator: one rank's resolved configuration, its transports to every peer, scratch memory sized once at
// init, traffic counters and error state. Schedules talk to peers only through the Isend/Irecv/Wait methods here.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ccoll.h"
#include "core/buffer_ops.h"
#include "core/device_proxy.h"
#include "core/handle_quarantine.h"
#include "transport/stream_transport.h"
#include "transport/transport.h"

namespace ccoll {

// ccConfig_t after precedence (API field > environment > default) and validation.
struct CommConfig {
  ccTransport_t transport = ccTransportAuto;
  ccAlgo_t algorithm = ccAlgoAuto;
  int timeoutMs = 300000;
  int blocking = 1;
  int cudaDev = -1;
  size_t sliceBytes = 256 << 10;
  int treeDepth = 4;
  int ringDepth = 4;  // compressed ring
  bool checkCalls = true;  // CC_CHECK_CALLS
  bool checksum = false;   // CC_CHECKSUM
  bool deviceKernels = true;  // CC_DEVICE_KERNELS
  size_t treeThreshold = 64 << 10;
  size_t checkInlineBytes = 16384;  // CC_CHECK_INLINE_BYTES (collectives/call_check.h)
};

// Copies min(config->size, sizeof) bytes of the caller's struct over CC_CONFIG_INITIALIZER, then resolves every
// field. config may be NULL. A CC_* integer variable set to something that is not an integer is ccInvalidArgument,
// naming it, whether or not the config overrides it.
ccResult_t ResolveConfig(const ccConfig_t* config, CommConfig* out);

// What CommSetup refuses on this rank alone, before it joins the group: transport nccl without NCCL or a device.
ccResult_t CheckTransportUsable(const CommConfig& config, int rank);

const char* TransportName(ccTransport_t t);
const char* AlgoName(ccAlgo_t a);

}  // namespace ccoll

struct ccComm {
  CC_QUARANTINED_HANDLE  // a destroyed communicator's address is not reused at once (core/handle_quarantine.h)

  int rank = 0;
  int nranks = 0;
  ccoll::CommConfig config;

  // Transports by peer rank (nullptr for this rank itself); owned by `transports`.
  std::vector<ccoll::Transport*> peers;
  std::vector<std::unique_ptr<ccoll::Transport>> transports;
  // Every peer has a host transport in `peers`. False only with transport nccl in a build without UCX, for ranks in
  // other processes: then host buffers cannot be carried (and calls are not checked across ranks).
  bool hostTransports = true;
  // Some rank of the communicator is bound to a CUDA device (a CUDA build, ccConfig_t.cudaDev or a current device at
  // init), so its calls may be on device buffers while others' are on host buffers: a schedule chosen by the buffers'
  // kind would differ between ranks. The same on every rank (agreed at init).
  bool anyRankOnDevice = false;
  // Some rank of the communicator runs in another process than the others: false when all ranks share one process
  // (thread ranks, whatever CC_TRANSPORT carries their messages). The same on every rank (agreed at init).
  bool acrossProcesses = false;
  // Another rank of this communicator runs in this process on this rank's CUDA device (thread ranks sharing a GPU):
  // then its device calls must not take the legacy default stream, which would serialize the ranks' waits for one
  // another (CheckDeviceCallStream).
  bool deviceSharedInProcess = false;
  // Transport nccl: device calls are queued on the caller's stream through it (collectives/stream_collectives.h).
  std::unique_ptr<ccoll::StreamTransport> streamTransport;

  // Scratch for schedules, allocated once at init: kScratchSlots slices.
  static constexpr int kScratchSlots = 2;
  std::vector<char> scratch;
  char* ScratchSlot(int i) { return scratch.data() + static_cast<size_t>(i) * config.sliceBytes; }

  uint64_t seq = 0;  // collectives started on this rank; the high bits of every tag
  // The seq of the next collective. Skips the values that UCX (which carries 24 bits of seq) would read as
  // kPointToPointSeq, the seq of every point-to-point message.
  uint64_t NextSeq() {
    ++seq;
    if ((seq & 0xffffff) == kPointToPointSeq) ++seq;
    return seq;
  }
  static constexpr uint64_t kPointToPointSeq = 0xffffff;
  // Point-to-point messages (collectives/p2p.h) sent to and received from each peer: their tags' index. Sized at
  // the first one; touched only by the thread that runs this communicator's calls.
  std::vector<uint64_t> p2pSent, p2pReceived;
  // Per peer, set at init: a point-to-point message longer than a slice travels as slices (collectives/p2p.cc). Set
  // for the peers UCX serves, except where the endpoints of both ranks send their messages through shared memory
  // (UcxTransport::PeerOverSharedMemory; there one message moves at memory speed, and slices only add wake-ups).
  // The ranks exchange what their endpoints use at init, so both ends of a pair decide alike.
  std::vector<uint8_t> p2pSliced;
  // Work of the running call that its schedule's waits run piece by piece (Inflight::Wait), set by IdleScope; only
  // the thread running the call touches it.
  ccoll::IdleWork* idleWork = nullptr;

  std::atomic<int> asyncError{ccSuccess};
  // The async error came from a call check that every rank agreed on (a device call that the ranks did not all make
  // alike): nothing moved, so the ranks are still in step, and this rank's later calls, refused, still join the check.
  std::atomic<bool> failedInStep{false};
  std::atomic<bool> aborting{false};  // set by ccCommAbort: a running non-blocking init gives up
  // Set when the communicator is freed: a bootstrap root its init started (ccCommInitFromEnv's rank 0) stops waiting
  // for ranks and frees CC_ROOT's port, for a retry, instead of holding it until its timeout.
  std::shared_ptr<std::atomic<bool>> rootStop = std::make_shared<std::atomic<bool>>(false);
  std::thread initThread;
  std::atomic<int> activeCalls{0};

  std::atomic<uint64_t> bytesSent{0};
  std::atomic<uint64_t> callCheckBytesSent{0};  // of bytesSent (ccCommStats_t)
  std::atomic<uint64_t> nominalBytesSent{0};    // of bytesSent (ccCommStats_t)
  std::atomic<uint64_t> bytesReceived{0};
  std::atomic<uint64_t> collectives{0};

  std::mutex errorMutex;
  std::string lastError;  // last error sentence recorded for this comm by any thread

  // Exact calls on device buffers that stay on the device (collectives/device_buffers.h): made by the first one, on
  // the proxy thread; the transports' DeviceCopier. Torn down after the proxy, before the transports.
  std::unique_ptr<ccoll::BufferOps> deviceBuffers;

  // Device calls (core/device_proxy.h): the proxy is created at the first one. Declared last, so that it is torn
  // down first, while the transports still work.
  std::mutex proxyMutex;
  std::unique_ptr<ccoll::DeviceProxy> proxy;

  ~ccComm();
  // Fails every pending and future transfer on this rank and its peers.
  void Abort(const char* reason);
  // The communicator's asynchronous error: a failure recorded so far, or one the stream transport has seen since (which
  // is then recorded, with its sentence as the last error).
  ccResult_t AsyncError();
  void RecordError(const std::string& sentence);
  // Whether the communicator can take a call of `fn` (its name, for the error sentence): its init has finished and it
  // has not failed.
  ccResult_t CheckUsable(const char* fn);
  // A failure of a call of `fn` once something moved: the peers are out of step, so the communicator is done for.
  // Records the last error, prefixed with `fn` once, as the communicator's and makes `r` its async error; aborts (peers
  // of this process fail at once; those over UCX find out by their timeout). Returns r.
  ccResult_t FailInCall(const char* fn, ccResult_t r);
  // The device proxy, created on first use for config.cudaDev.
  ccResult_t DeviceProxyOf(ccoll::DeviceProxy** out);
  // Blocks until the device calls queued so far have run (a host call must not overtake them).
  void DrainDevice();
};

namespace ccoll {

// Joins the group named by `id`: bootstrap, transport selection, scratch. Runs in the caller's thread (blocking
// init) or in comm->initThread (non-blocking init).
ccResult_t CommSetup(ccComm* comm, const ccUniqueId& id);

// The live-communicator table. A call Acquire()s the comm for its duration so that destroy and abort wait for it.
void RegisterComm(ccComm* comm);
// Live communicators of this process bound to CUDA device `device` (config.cudaDev).
int LiveCommsOnDevice(int device);
// The stream of a device call of comm: ccInvalidUsage naming fn
//   - when it is the legacy default stream (NULL or cudaStreamLegacy) while another rank of comm shares this rank's
//     GPU in this process (deviceSharedInProcess), outside transport nccl: each rank's stream waits for the others'
//     calls, and the legacy stream serializes with every blocking stream of the device, so the ranks would wait for
//     one another for ever;
//   - when it is a stream of another CUDA device than comm's (cudaStreamGetDevice, CUDA 12.8 runtimes; with older
//     ones the call's CUDA work fails instead). The legacy and per-thread default streams are taken as the
//     communicator's device's (the call runs with that device current).
// ccSuccess otherwise.
ccResult_t CheckDeviceCallStream(const ccComm* comm, ccStream_t stream, const char* fn);
// Takes comm out of the table and waits until no call is inside it. False where it was not in the table (another
// thread's destroy or abort took it first): the caller must not touch comm, which that thread frees.
bool UnregisterComm(ccComm* comm);
bool AcquireComm(ccComm* comm);
void ReleaseComm(ccComm* comm);

// The transfers a schedule has posted. Schedules post and wait only through this, so that an early return on an
// error never leaves a transfer pointing at a user buffer: the destructor then aborts the communicator (peers stop
// too, at once) and waits for what is still open.
class Inflight {
 public:
  // Every message posted through this carries (and every receive expects) payload kind `kind`.
  explicit Inflight(ccComm* comm, WireKind kind = kWireData) : comm_(comm), kind_(kind) {}
  ~Inflight();
  Inflight(const Inflight&) = delete;
  Inflight& operator=(const Inflight&) = delete;

  ccResult_t Send(int peer, const void* buf, size_t bytes, uint64_t tag, Request** req);
  ccResult_t Recv(int peer, void* buf, size_t bytes, uint64_t tag, Request** req);
  // A receive of at most `bytes` (Transport::IrecvAtMost): *received holds the length that arrived once Wait returns
  // success.
  ccResult_t RecvAtMost(int peer, void* buf, size_t bytes, uint64_t tag, size_t* received, Request** req);
  // Waits for req (nullptr: nothing to wait for) and sets it to nullptr, running the call's idle work meanwhile.
  ccResult_t Wait(Request** req);
  // Waits for every open transfer.
  ccResult_t WaitAll();

 private:
  void Open(Request* r);
  void Close(Request* r);

  ccComm* comm_;
  WireKind kind_;
  // The open transfers, a list through the requests themselves (Request::openPrev/openNext): schedules may hold many
  // sends open at once, and a small call should allocate nothing to track its few.
  Request* open_ = nullptr;
};

// Whether the transport to some peer runs idle work in its waits (transport.h): a network's, not the local transport.
bool WaitsRunIdleWork(const ccComm& comm);

// Gives the schedules the caller runs in its scope `work` to do while they wait for the network, then takes it back.
class IdleScope {
 public:
  IdleScope(ccComm* comm, IdleWork* work) : comm_(comm) { comm_->idleWork = work; }
  ~IdleScope() { comm_->idleWork = nullptr; }
  IdleScope(const IdleScope&) = delete;
  IdleScope& operator=(const IdleScope&) = delete;

 private:
  ccComm* comm_;
};

class CommUse {
 public:
  explicit CommUse(ccComm* comm) : comm_(AcquireComm(comm) ? comm : nullptr) {}
  ~CommUse() {
    if (comm_) ReleaseComm(comm_);
  }
  bool ok() const { return comm_ != nullptr; }

 private:
  ccComm* comm_;
};

}  // namespace ccoll
