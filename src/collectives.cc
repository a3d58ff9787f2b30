// C API entry points of the collectives: every argument is checked here, before any byte moves, so that bad input
// gets a specific error and leaves recvbuff untouched; then the schedule runs.
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api_guard.h"
#include "ccoll.h"
#include "collectives/algo.h"
#include "collectives/call_check.h"
#include "collectives/compressed.h"
#include "collectives/inline_call.h"
#ifdef CCOLL_HAVE_LOWRANK
#include "collectives/lowrank.h"
#endif
#include "compress/codecs.h"
#include "compress/compressor.h"
#include "compress/sparse.h"
#include "compress/widen.h"
#ifdef CCOLL_HAVE_CUDA
#include "collectives/device_buffers.h"
#include "collectives/device_compressed.h"
#include "collectives/device_prepare.h"
#include "compress/device_codec.h"
#endif
#ifdef CCOLL_HAVE_NCCL
#include "collectives/stream_collectives.h"
#include "collectives/stream_compressed.h"
#endif
#include "collectives/reduce.h"
#include "collectives/ring.h"
#include "core/comm.h"
#include "core/device_proxy.h"
#include "core/error.h"
#include "core/memory.h"
#include "group.h"
#include "raw_enum.h"

using ccoll::CollArgs;
using ccoll::Fail;

namespace {

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce };
// The call check and the calls that ride in it number them alike (collectives/inline_call.h).
static_assert(static_cast<int>(Kind::kAllReduce) == ccoll::kCallAllReduce &&
                  static_cast<int>(Kind::kReduceScatter) == ccoll::kCallReduceScatter &&
                  static_cast<int>(Kind::kAllGather) == ccoll::kCallAllGather &&
                  static_cast<int>(Kind::kBroadcast) == ccoll::kCallBroadcast &&
                  static_cast<int>(Kind::kReduce) == ccoll::kCallReduce,
              "collective numbers");

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce: return "ccAllReduce";
    case Kind::kReduceScatter: return "ccReduceScatter";
    case Kind::kAllGather: return "ccAllGather";
    case Kind::kBroadcast: return "ccBroadcast";
    case Kind::kReduce: return "ccReduce";
  }
  return "?";
}

struct Call {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;  // as the caller passed it
  int dtype;     // raw values until validated (see raw_enum.h)
  int op;        // ignored for all-gather and broadcast
  int root;      // broadcast and reduce only
  ccCompressor_t compressor;
  ccStream_t stream;
};

// True when a compressed all-reduce on device buffers runs on them with the device codecs and drivers
// (collectives/device_compressed.h); else it is staged through host memory and runs the host drivers.
bool RunsDeviceCodec(const ccComm* comm, const ccCompressor* comp) {
#ifdef CCOLL_HAVE_CUDA
  return comp != nullptr && comm->config.deviceKernels && ccoll::DeviceCodecCovers(*comp);
#else
  return false;
#endif
}

// True when an exact call on device buffers runs on them (collectives/device_buffers.h); else it is staged.
bool ExactOnDevice(const ccComm* comm) {
#ifdef CCOLL_HAVE_CUDA
  return ccoll::MessagesStayOnDevice(comm);
#else
  (void)comm;
  return false;
#endif
}

// Where a compressor's error-feedback memory lives: host calls (and staged device calls) keep it in host memory,
// device codecs (and every device call of a communicator with a stream transport) in device memory. One compressor
// serves one kind.
int MemoryOf(const ccComm* comm, const ccCompressor* comp, bool onDevice) {
  const bool device = onDevice && (comm->streamTransport || RunsDeviceCodec(comm, comp));
  return device ? ccCompressor::kMemoryDevice : ccCompressor::kMemoryHost;
}

bool KeepsMemory(const ccCompressor& comp) {
  const bool fed = comp.kind == ccCompressTopkChunk || comp.kind == ccCompressRandk || comp.kind == ccCompressPowerSGD;
  return fed && comp.Get(ccParamErrorFeedback) != 0;
}

// One call's use of its compressor (ccCompressor::user): taken when the call is validated, given back when the call is
// done, which for a device call is when the proxy has run it (EnqueueOnDevice takes it over), and for a stream-ordered
// one (transport nccl) when it is queued: its kernels then wait on the device for the compressor's last call, on
// whatever stream that was queued (DeviceCodecState::BeginCallOnStream). A compressor is one bucket's state on one
// rank, and two ranks (thread ranks of one process) using one at once would mix their states, so a call of another
// communicator while it is in use is refused. Several communicators of one rank may use it, one call after the
// other.
class CompressorUse {
 public:
  CompressorUse() = default;
  CompressorUse(const CompressorUse&) = delete;
  CompressorUse& operator=(const CompressorUse&) = delete;
  ~CompressorUse() { Release(comp_, false); }

  // When only device calls of another communicator, queued on its proxy, hold it (one rank's communicators one after
  // the other on its stream), waits for them, at most the communicator's timeout.
  // The liveness check and the use are one step for ccCompressorDestroy (PinLiveCompressor): it refuses a
  // compressor that a call is taking or holds, rather than free it under the call.
  ccResult_t Take(const ccComm* comm, ccCompressor* comp, const char* fn) {
    if (!ccoll::PinLiveCompressor(comp)) {
      return Fail(ccInvalidArgument, "%s: compressor %p is not a live compressor (destroyed?) on rank %d", fn,
                  static_cast<void*>(comp), comm->rank);
    }
    std::unique_lock<std::mutex> lock(comp->useMutex);
    --comp->taking;  // from here on the lock, then the use, keeps it
    if (comp->changing) {
      return Fail(ccInvalidUsage,
                  "%s: the compressor's parameters or shapes are being changed by another thread "
                  "(ccCompressorSetParam, ccCompressorSetShapes) on rank %d",
                  fn, comm->rank);
    }
    if (comp->uses > 0 && comp->user != comm && comp->queuedUses == comp->uses) {
      ++comp->taking;  // waiting (without the lock) still counts
      comp->useFreed.wait_for(lock, std::chrono::milliseconds(comm->config.timeoutMs),
                              [comp] { return comp->uses == 0; });
      --comp->taking;
    }
    if (comp->uses > 0 && comp->user != comm) {
      return Fail(ccInvalidUsage, "%s: the compressor is in use by a call of another communicator (another rank's?); "
                  "a compressor is one bucket's state on one rank: use one per bucket per rank (rank %d)", fn,
                  comm->rank);
    }
    comp->user = comm;
    ++comp->uses;
    comp_ = comp;
    return ccSuccess;
  }
  // A queued device call takes the use over; it gives it back with Release(comp, true) once it is gone.
  void HandToQueue() {
    if (comp_ == nullptr) return;
    std::lock_guard<std::mutex> lock(comp_->useMutex);
    ++comp_->queuedUses;
    comp_ = nullptr;
  }
  static void Release(ccCompressor* comp, bool queued) {
    if (comp == nullptr) return;
    std::lock_guard<std::mutex> lock(comp->useMutex);
    if (queued) --comp->queuedUses;
    if (--comp->uses == 0) {
      comp->user = nullptr;
      comp->useFreed.notify_all();
    }
  }

 private:
  ccCompressor* comp_ = nullptr;
};

// Checks everything that can be checked locally, and takes the compressor's use. On success fills *args.
ccResult_t Validate(ccComm* comm, const Call& c, CollArgs* args, bool* onDevice, CompressorUse* use) {
  const char* fn = KindName(c.kind);
  const int rank = comm->rank, n = comm->nranks;
  CC_CHECK(ccoll::CheckDataType(fn, c.dtype, rank));
  const ccDataType_t dtype = static_cast<ccDataType_t>(c.dtype);
  const size_t es = ccoll::DataTypeSize(dtype);
  bool reduces = c.kind == Kind::kAllReduce || c.kind == Kind::kReduceScatter || c.kind == Kind::kReduce;
  if (reduces && !ccoll::IsValidRedOp(c.op)) {
    return Fail(ccInvalidArgument, "%s: op %d is not a ccRedOp_t (rank %d)", fn, c.op, rank);
  }
  const ccRedOp_t op = reduces ? static_cast<ccRedOp_t>(c.op) : ccSum;
  // Elements that the largest buffer holds: per-rank counts are multiplied by nranks.
  bool perRank = c.kind == Kind::kReduceScatter || c.kind == Kind::kAllGather;
  const size_t kMaxBytes = static_cast<size_t>(1) << 62;
  if (c.count > kMaxBytes / es / (perRank ? static_cast<size_t>(n) : 1)) {
    return Fail(ccInvalidArgument, "%s: count %zu of %s%s overflows the address space (rank %d)", fn, c.count,
                ccoll::DataTypeName(dtype), perRank ? " times nranks" : "", rank);
  }
  const bool rooted = c.kind == Kind::kBroadcast || c.kind == Kind::kReduce;
  if (c.count > 0) {
    if ((c.kind != Kind::kBroadcast || rank == c.root) && c.send == nullptr) {
      return Fail(ccInvalidArgument, "%s: sendbuff is NULL but count is %zu on rank %d", fn, c.count, rank);
    }
    if ((c.kind != Kind::kReduce || rank == c.root) && c.recv == nullptr) {
      return Fail(ccInvalidArgument, "%s: recvbuff is NULL but count is %zu on rank %d", fn, c.count, rank);
    }
  }
  if (rooted && (c.root < 0 || c.root >= n)) {
    return Fail(ccInvalidArgument, "%s: root %d is out of range for %d ranks (rank %d)", fn, c.root, n, rank);
  }
  if (c.compressor != nullptr) {
    CC_CHECK(use->Take(comm, c.compressor, fn));
    if (dtype != ccFloat32 && !ccoll::IsHalfFloat(dtype)) {
      return Fail(ccInvalidUsage, "%s: compressed all-reduce takes float32, bfloat16 or float16 data, not %s (rank "
                  "%d)", fn, ccoll::DataTypeName(dtype), rank);
    }
    if (op != ccSum && op != ccAvg) {
      return Fail(ccInvalidUsage, "%s: compressed all-reduce takes op sum or avg, not %s (rank %d)", fn,
                  ccoll::RedOpName(op), rank);
    }
    const size_t bound = c.compressor->boundCount.load();
    if (bound != 0 && bound != c.count) {
      return Fail(ccInvalidUsage, "%s: the compressor is bound to a bucket of %zu elements but count is %zu (use one "
                  "compressor per bucket) on rank %d", fn, bound, c.count, rank);
    }
    std::string why;
#ifdef CCOLL_HAVE_LOWRANK
    if (c.compressor->kind == ccCompressPowerSGD && !ccoll::LowRankShapesFit(*c.compressor, c.count, &why)) {
      return Fail(ccInvalidUsage, "%s: powersgd: %s (rank %d)", fn, why.c_str(), rank);
    }
#endif
    if ((c.compressor->kind == ccCompressTopkChunk || c.compressor->kind == ccCompressRandk) &&
        !ccoll::ChunksFit(c.count, static_cast<size_t>(c.compressor->Get(ccParamChunkSize)), &why)) {
      return Fail(ccInvalidUsage, "%s: %s: %s (rank %d)", fn, ccoll::KindName(c.compressor->kind), why.c_str(), rank);
    }
    if (c.compressor->kind == ccCompressQuant && !ccoll::QuantFitsRanks(*c.compressor, n, &why)) {
      return Fail(ccInvalidUsage, "%s: quant: %s (rank %d)", fn, why.c_str(), rank);
    }
    if (!ccoll::CompressorCombinationValid(*c.compressor, &why)) {
      return Fail(ccInvalidUsage, "%s: %s: %s (rank %d)", fn, ccoll::KindName(c.compressor->kind), why.c_str(), rank);
    }
  }
  // Where the buffers live: both on the communicator's device (stream-ordered), or both in host memory (blocking).
  // A non-root's sendbuff (broadcast) or recvbuff (reduce) is ignored.
  const bool needSend = c.count > 0 && (c.kind != Kind::kBroadcast || rank == c.root);
  const bool needRecv = c.count > 0 && (c.kind != Kind::kReduce || rank == c.root);
  const int sendDev = needSend ? ccoll::PointerDevice(c.send) : -1;
  const int recvDev = !needRecv ? -1 : needSend && c.recv == c.send ? sendDev : ccoll::PointerDevice(c.recv);
  *onDevice = sendDev >= 0 || recvDev >= 0;
  if (*onDevice) {
    if ((needSend && sendDev < 0) || (needRecv && recvDev < 0)) {
      return Fail(ccInvalidUsage, "%s: %s is device memory but %s is host memory; both must be on the "
                  "communicator's device, or both in host memory (rank %d)", fn, sendDev >= 0 ? "sendbuff" : "recvbuff",
                  sendDev >= 0 ? "recvbuff" : "sendbuff", rank);
    }
    if (comm->config.cudaDev < 0) {
      return Fail(ccInvalidUsage, "%s: device buffers, but the communicator is bound to no CUDA device (set "
                  "ccConfig_t.cudaDev) on rank %d", fn, rank);
    }
    const int dev = needSend ? sendDev : recvDev;
    if ((needSend && sendDev != comm->config.cudaDev) || (needRecv && recvDev != comm->config.cudaDev)) {
      return Fail(ccInvalidUsage, "%s: buffers on CUDA device %d, but the communicator is bound to device %d (rank "
                  "%d)", fn, needSend && sendDev != comm->config.cudaDev ? dev : recvDev, comm->config.cudaDev, rank);
    }
    CC_CHECK(ccoll::CheckDeviceCallStream(comm, c.stream, fn));
  } else if (c.stream != nullptr && c.count > 0) {
    return Fail(ccInvalidUsage, "%s: stream must be NULL for host buffers (rank %d)", fn, rank);
  } else if (!comm->hostTransports && c.count > 0) {
    return Fail(ccInvalidUsage, "%s: host buffers, but this communicator (transport nccl, in a build without UCX) "
                "carries only device buffers between processes (rank %d)", fn, rank);
  }
#ifdef CCOLL_HAVE_NCCL
  if (*onDevice && comm->streamTransport && c.compressor != nullptr && !ccoll::StreamCodecCovers(*c.compressor)) {
    return Fail(ccInvalidUsage, "%s: compressor %s does not run on the nccl transport (powersgd needs a build with "
                "cuBLAS; quant rotation blocks of at most 16384) (rank %d)", fn,
                ccoll::CompressorSpec(*c.compressor).c_str(), rank);
  }
#endif
  if (c.compressor != nullptr && c.count > 0) {
    const int where = MemoryOf(comm, c.compressor, *onDevice);
    const int was = c.compressor->memory.load();
    const char* names[] = {"", "host", "device"};
    if (KeepsMemory(*c.compressor) && was != ccCompressor::kMemoryNone && was != where) {
      return Fail(ccInvalidUsage, "%s: the compressor's error-feedback memory is in %s memory from its earlier calls, "
                  "but this call keeps it in %s memory; use one compressor per bucket and kind of buffer (rank %d)", fn,
                  names[was], names[where], rank);
    }
#ifndef CCOLL_HAVE_BLAS
    if (c.compressor->kind == ccCompressPowerSGD && where == ccCompressor::kMemoryHost) {
      return Fail(ccInvalidUsage, "%s: powersgd on %s needs a CPU BLAS, and this build of ccoll has only cuBLAS (device "
                  "buffers with CC_DEVICE_KERNELS=1) (rank %d)", fn,
                  *onDevice ? "staged device buffers" : "host buffers", rank);
    }
#endif
  }
  if (perRank && c.count > 0) {
    // The only overlap allowed is the in-place layout; anything else would read what the call has written.
    const char* s = static_cast<const char*>(c.send);
    const char* r = static_cast<const char*>(c.recv);
    size_t sendBytes = c.count * es * (c.kind == Kind::kReduceScatter ? n : 1);
    size_t recvBytes = c.count * es * (c.kind == Kind::kAllGather ? n : 1);
    const char* inPlace = c.kind == Kind::kReduceScatter ? s + rank * c.count * es : r + rank * c.count * es;
    bool overlap = s < r + recvBytes && r < s + sendBytes;
    if (overlap && (c.kind == Kind::kReduceScatter ? r : s) != inPlace) {
      return Fail(ccInvalidArgument, "%s: sendbuff and recvbuff overlap but are not the in-place layout (%s == "
                  "%s + rank * count) on rank %d", fn, c.kind == Kind::kReduceScatter ? "recvbuff" : "sendbuff",
                  c.kind == Kind::kReduceScatter ? "sendbuff" : "recvbuff", rank);
    }
  }
  if (!perRank && needSend && needRecv && c.send != c.recv) {
    const char* s = static_cast<const char*>(c.send);
    const char* r = static_cast<const char*>(c.recv);
    size_t bytes = c.count * es;
    if (s < r + bytes && r < s + bytes) {
      return Fail(ccInvalidArgument, "%s: sendbuff and recvbuff overlap without being equal (in place means "
                  "sendbuff == recvbuff) on rank %d", fn, rank);
    }
  }
  args->send = c.send;
  args->recv = c.recv;
  args->count = c.count;
  args->dtype = dtype;
  args->op = op;
  args->root = c.root;
  args->eltSize = es;
  return ccSuccess;
}

// The cross-rank call check (CC_CHECK_CALLS) over the host transports. *agreed: every rank saw the same mismatch
// and returns it (recorded here); nothing moved, so the communicator stays usable (unless nobody is left to return it
// to). Any other failure is the transports'.
// onStream: a stream-ordered call (QueueOnStream); else a host call, or a device call the proxy runs (args.onDevice
// when it runs on the device buffers themselves). *everyRankOnHost (when not null): the check ran and no rank runs the
// call in a device codec. small (when not null): this rank's call rides in the check where it can
// (collectives/inline_call.h); small->done says whether it ran there.
ccResult_t CheckAcrossRanks(ccComm* comm, const Call& c, const CollArgs& args, bool deferred, bool onStream,
                            bool* agreed, bool* everyRankOnHost = nullptr, ccoll::InlineCall* small = nullptr) {
  *agreed = false;
  if (everyRankOnHost != nullptr) *everyRankOnHost = false;
  if (!comm->config.checkCalls || !comm->hostTransports) return ccSuccess;
  const bool reduces = c.kind == Kind::kAllReduce || c.kind == Kind::kReduceScatter || c.kind == Kind::kReduce;
  int path = onStream ? ccoll::kPathStream : 0;
  if ((onStream || args.onDevice) && c.compressor != nullptr && c.compressor->kind == ccCompressPowerSGD) {
    path |= ccoll::kPathDeviceProducts;  // on the NCCL stream or in the proxy's device codec: cuBLAS
  }
  const bool deviceCodec = args.onDevice && c.compressor != nullptr && !onStream;
  if (small != nullptr && c.compressor == nullptr && !onStream &&
      ccoll::RidesInCallCheck(comm, static_cast<int>(c.kind), args)) {
    small->rides = true;
    small->kind = static_cast<int>(c.kind);
    small->args = args;
  }
  bool anyDeviceCodec = true;
  ccResult_t r = ccoll::CheckCallMatches(
      comm,
      ccoll::DescribeCall(static_cast<int>(c.kind), args.count, args.dtype, reduces ? args.op : ccSum, args.root,
                          c.compressor, path, deviceCodec),
      agreed, &anyDeviceCodec, small);
  if (r == ccSuccess && everyRankOnHost != nullptr) *everyRankOnHost = !anyDeviceCodec;
  if (*agreed) {
    std::string sentence = std::string(KindName(c.kind)) + ": " + ccoll::LastError();
    ccoll::SetLastError(sentence);
    comm->RecordError(sentence);
    if (deferred) {
      comm->failedInStep = true;
      comm->asyncError = r;
    }
  }
  return r;
}

// Runs a validated call: the cross-rank call check, then the schedule. `deferred`: a device call on the proxy
// thread, whose caller has already returned, so that every error becomes the communicator's async error.
ccResult_t Execute(ccComm* comm, const Call& c, const CollArgs& checked, bool deferred) {
  bool agreed = false;
  CollArgs args = checked;
  ccoll::InlineCall small;
  ccResult_t r = CheckAcrossRanks(comm, c, args, deferred, false, &agreed, &args.everyRankOnHost, &small);
  if (agreed) return r;
  if (r == ccSuccess && small.done) {  // it ran in the check
    comm->collectives.fetch_add(1, std::memory_order_relaxed);
    return ccSuccess;
  }
#ifdef CCOLL_HAVE_CUDA
  if (r == ccSuccess && args.onDevice && c.compressor == nullptr) r = ccoll::EnsureDeviceBuffers(comm);
#endif
  if (r == ccSuccess) {
    switch (c.kind) {
      case Kind::kAllReduce:
        r = c.compressor != nullptr ? ccoll::CompressedAllReduce(comm, args, c.compressor)
                                    : ccoll::AllReduce(comm, args);
        break;
      case Kind::kReduceScatter: r = ccoll::RingReduceScatter(comm, args); break;
      case Kind::kAllGather: r = ccoll::RingAllGather(comm, args); break;
      case Kind::kBroadcast: r = ccoll::RingBroadcast(comm, args); break;
      case Kind::kReduce: r = ccoll::RingReduce(comm, args); break;
    }
  }
  if (r != ccSuccess) return comm->FailInCall(KindName(c.kind), r);
  comm->collectives.fetch_add(1, std::memory_order_relaxed);
  return ccSuccess;
}

#ifdef CCOLL_HAVE_NCCL
// A call on device buffers of a communicator with a stream-ordered transport (collectives/stream_collectives.h):
// checked across ranks as a host call is, then queued on the caller's stream by this thread. A compressed call has
// reserved its scratch before (Run).
ccResult_t QueueOnStream(ccComm* comm, const Call& c, const CollArgs& args) {
  bool agreed = false;
  ccResult_t r = CheckAcrossRanks(comm, c, args, false, true, &agreed);
  if (agreed) return r;
  if (r == ccSuccess) {
    ccoll::StreamKind kind = ccoll::StreamKind::kAllReduce;
    switch (c.kind) {
      case Kind::kAllReduce: kind = ccoll::StreamKind::kAllReduce; break;
      case Kind::kReduceScatter: kind = ccoll::StreamKind::kReduceScatter; break;
      case Kind::kAllGather: kind = ccoll::StreamKind::kAllGather; break;
      case Kind::kBroadcast: kind = ccoll::StreamKind::kBroadcast; break;
      case Kind::kReduce: kind = ccoll::StreamKind::kReduce; break;
    }
    try {
      r = ccoll::StreamCollective(comm, kind, args, c.compressor, c.stream);
    } catch (const std::exception& e) {  // part of the call may be queued: it fails the communicator, as any failure
      r = Fail(ccSystemError, "%s: rank %d: %s", KindName(c.kind), comm->rank, e.what());
    }
  }
  if (r != ccSuccess) return comm->FailInCall(KindName(c.kind), r);
  comm->collectives.fetch_add(1, std::memory_order_relaxed);
  return ccSuccess;
}
#endif

// What identifies a device call's scratch (core/device_proxy.h, StagedCall::shape): its kind, sizes, datatype, op and
// root, where it runs, and its compressor with the parameters it has now and since its last reset (which drops its
// device state).
uint64_t ShapeOf(const Call& c, const CollArgs& a, bool resident) {
  std::vector<uint64_t> key = {static_cast<uint64_t>(c.kind), a.count, a.eltSize, static_cast<uint64_t>(a.dtype),
                               static_cast<uint64_t>(a.op), static_cast<uint64_t>(a.root), resident ? 1u : 0u,
                               reinterpret_cast<uintptr_t>(c.compressor)};
  if (c.compressor != nullptr) {
    key.push_back(c.compressor->resets);
    for (const auto& [param, value] : c.compressor->values) {
      key.push_back(static_cast<uint64_t>(param));
      key.push_back(static_cast<uint64_t>(value));
    }
    for (const ccoll::TensorShape& t : c.compressor->shapes) {
      key.push_back(static_cast<uint64_t>(t.rows));
      key.push_back(static_cast<uint64_t>(t.cols));
    }
  }
  return ccoll::CallShape(key);
}

// A call on device buffers, run by the communicator's proxy thread in call order (core/device_proxy.h). A compressed
// all-reduce whose codec has CUDA kernels runs on the device buffers themselves (compress/device_codec.h), and so do
// exact calls when every transport of the communicator carries device memory (collectives/device_buffers.h), but for
// the small ones that ride in the call check. Every other call is staged through host memory, where the host
// schedules run in place on the staging buffer: all-reduce and broadcast on the whole buffer, reduce-scatter and
// all-gather in their in-place layouts (this rank's block at rank * count).
ccResult_t EnqueueOnDevice(ccComm* comm, const Call& c, const CollArgs& args, CompressorUse* use, bool* queued) {
  *queued = false;
  CC_CHECK(ccoll::DeviceProxy::RefuseCapture(comm->rank, c.stream));  // before anything a capture forbids
#ifdef CCOLL_HAVE_CUDA
  CC_CHECK(ccoll::PrepareDevice(comm->config.cudaDev));  // before any stream of the device waits for the proxy
#endif
  ccoll::DeviceProxy* proxy = nullptr;
  CC_CHECK(comm->DeviceProxyOf(&proxy));
  // An exact call small enough to ride in the call check (collectives/inline_call.h) is staged: copies of at most
  // CC_CHECK_INLINE_BYTES instead of the device schedule's steps, and the host call's bits.
  const bool rides = c.compressor == nullptr && ccoll::RidesInCallCheck(comm, static_cast<int>(c.kind), args);
  const bool resident = c.compressor != nullptr ? RunsDeviceCodec(comm, c.compressor) : ExactOnDevice(comm) && !rides;
#ifdef CCOLL_HAVE_CUDA
  if (resident && c.compressor != nullptr) ccoll::PrimeDeviceCodec(comm, args, c.compressor);
#endif
  const size_t bytes = args.count * args.eltSize;
  const size_t n = static_cast<size_t>(comm->nranks), mine = static_cast<size_t>(comm->rank) * bytes;
  ccoll::StagedCall staged;
  staged.stream = c.stream;
  if (proxy->UsesShapes()) staged.shape = ShapeOf(c, args, resident);
  void* in = const_cast<void*>(args.send);
  size_t hostSend = 0, hostRecv = 0;  // offsets of the host schedule's buffers in the staging buffer
  if (!resident) {  // (resident: nothing staged, the proxy runs the call on the device buffers)
    switch (c.kind) {
      case Kind::kAllReduce:
      case Kind::kBroadcast:
      case Kind::kReduce:
        staged.stagingBytes = bytes;
        if (c.kind != Kind::kBroadcast || comm->rank == args.root) staged.ins.push_back({in, 0, bytes});
        if (c.kind != Kind::kReduce || comm->rank == args.root) staged.outs.push_back({args.recv, 0, bytes});
        break;
      case Kind::kReduceScatter:
        staged.stagingBytes = n * bytes;
        staged.ins.push_back({in, 0, n * bytes});
        staged.outs.push_back({args.recv, mine, bytes});
        hostRecv = mine;
        break;
      case Kind::kAllGather:
        staged.stagingBytes = n * bytes;
        staged.ins.push_back({in, mine, bytes});
        staged.outs.push_back({args.recv, 0, n * bytes});
        hostSend = mine;
        break;
    }
  }
  // The compressor counts the queued call until the work is gone (run, skipped, or never queued), so that
  // destroying or changing it waits for the call.
  std::shared_ptr<void> hold;
  if (c.compressor != nullptr) {
    c.compressor->boundCount = args.count;  // the next call's check sees the binding before this one runs
    c.compressor->inFlight.fetch_add(1);
    use->HandToQueue();  // given back when the call is gone, before the count that lets it be destroyed
    hold.reset(c.compressor, [](ccCompressor* comp) {
      CompressorUse::Release(comp, true);
      comp->inFlight.fetch_sub(1);
    });
  }
  return proxy->Enqueue(staged, [comm, c, args, resident, hostSend, hostRecv, hold](char* staging) {
    if (staging == nullptr) return;  // skipped
    CollArgs run = args;
    if (resident) {
      run.onDevice = true;
    } else {
      run.send = staging + hostSend;
      run.recv = staging + hostRecv;
    }
    ccoll::Guarded(KindName(c.kind), [&] { return Execute(comm, c, run, true); });
  }, queued);
}

// A call this rank refuses (r, with its sentence in LastError): the other ranks are making theirs, so they learn of it
// in the call check, where every rank returns an error, nothing moves and the communicator stays usable, instead of
// waiting for this rank until the timeout. Device calls queued earlier run first, as before a host call. Without
// the call check (CC_CHECK_CALLS=0) it returns at once.
ccResult_t Refuse(ccComm* comm, const Call& c, ccResult_t r) {
  const std::string why = ccoll::LastError();
  comm->RecordError(why);
  if (!comm->config.checkCalls || !comm->hostTransports || comm->nranks == 1) return r;
  comm->DrainDevice();
  const int async = comm->AsyncError();
  if (!comm->aborting.load() && (async == ccSuccess || comm->failedInStep)) {
    bool agreed = false;
    const ccResult_t told = ccoll::CheckCallMatches(
        comm, ccoll::RefusedCall(static_cast<int>(c.kind), c.count, c.dtype, c.op, c.root, r), &agreed);
    if (!agreed) {  // the exchange failed (a peer is gone, or never made its call): the group is out of step
      const std::string sentence = why + "; telling the other ranks failed too (" + ccoll::LastError() +
                                   "), so the communicator is aborted";
      comm->RecordError(sentence);
      comm->failedInStep = false;
      comm->asyncError = told;
      comm->Abort(("rank " + std::to_string(comm->rank) + " failed: " + sentence).c_str());
      ccoll::SetLastError(sentence);
      return r;
    }
  }
  ccoll::SetLastError(why);  // the check left its own sentence; this rank's is what it refused
  return r;
}

// A call this rank cannot make although its arguments were fine: refused as bad arguments are where the call check
// tells the peers. Where it cannot (CC_CHECK_CALLS=0, no host transport), a usage error (a capture, a compressor the
// path cannot run) is the same on every rank that made the same calls, and is refused alike; any other failure (a
// device or scratch that could not be prepared or allocated) is this rank's alone while the peers have queued the
// call, so the communicator is failed, as after a failure in a call.
ccResult_t RefuseOrFail(ccComm* comm, const Call& c, ccResult_t r) {
  if (r != ccInvalidUsage && comm->nranks > 1 && (!comm->config.checkCalls || !comm->hostTransports)) {
    return comm->FailInCall(KindName(c.kind), r);
  }
  return Refuse(comm, c, r);
}

ccResult_t Run(ccComm* comm, const Call& c) {
  const char* fn = KindName(c.kind);
  return ccoll::Guarded(fn, [&]() -> ccResult_t {
    if (ccoll::InGroup()) {  // made, with its checks, at ccGroupEnd
      ccoll::GroupAddCall(
          comm, [comm, c] { return Run(comm, c); },
          [comm, c](ccResult_t refused) {
            ccoll::CommUse use(comm);
            return comm != nullptr && use.ok() ? Refuse(comm, c, refused) : refused;
          });
      return ccSuccess;
    }
    ccoll::CommUse use(comm);
    if (comm == nullptr) return Fail(ccInvalidArgument, "%s: comm is NULL", fn);
    if (!use.ok()) {
      return Fail(ccInvalidArgument, "%s: comm %p is not a live communicator (destroyed, aborted or never "
                  "initialized)", fn, static_cast<void*>(comm));
    }
    ccResult_t r = comm->CheckUsable(KindName(c.kind));
    // A communicator that failed in step refuses its calls, and its peers learn it in the call check instead of
    // waiting for this rank until the timeout.
    if (r != ccSuccess && comm->failedInStep && comm->AsyncError() != ccInProgress) return Refuse(comm, c, r);
    if (r != ccSuccess) {
      comm->RecordError(ccoll::LastError());
      return r;
    }
    CollArgs args;
    bool onDevice = false;
    CompressorUse compressorUse;  // given back when this returns, unless a queued device call took it over
    r = Validate(comm, c, &args, &onDevice, &compressorUse);
    if (r != ccSuccess) return Refuse(comm, c, r);
    // No elements (no buffer to say where they live) and no host transport to check the call with: nothing to do,
    // as for NCCL.
    if (c.count == 0 && !comm->hostTransports) return ccSuccess;
    if (c.compressor != nullptr && c.count > 0) {
      c.compressor->memory = MemoryOf(comm, c.compressor, onDevice);
    }
#ifdef CCOLL_HAVE_NCCL
    if (onDevice && comm->streamTransport) {
      // The compressor's scratch first, before the call check: a rank refused it (inside a graph capture, where the
      // scratch cannot grow) joins the check as any refusing rank does, so that no rank queues the call.
      if (c.compressor != nullptr) {
        r = ccoll::StreamCompressedReserve(comm, args, c.compressor, c.stream);
        if (r != ccSuccess) {
          ccoll::SetLastError(std::string(fn) + ": " + ccoll::LastError());
          return RefuseOrFail(comm, c, r);
        }
      }
      return QueueOnStream(comm, c, args);
    }
#endif
    if (onDevice) {
      // Refused before it was queued (a capture, a device that cannot be prepared, staging that cannot be
      // allocated): the peers learn it in the call check, as for a refusal of the arguments. Once queued, the proxy
      // runs it whatever failed after (the peers expect it).
      // A stream that did not reach the call before last within the timeout (ccTimeout) fails the communicator: the
      // proxy still waits for that stream, so the call check could not be joined in time either.
      bool queued = false;
      r = EnqueueOnDevice(comm, c, args, &compressorUse, &queued);
      if (r == ccSuccess) return r;
      if (!queued && r != ccTimeout) return RefuseOrFail(comm, c, r);
      if (!queued) return comm->FailInCall(KindName(c.kind), r);
      comm->RecordError(ccoll::LastError());
      return r;
    }
    comm->DrainDevice();  // device calls queued earlier run first, on every rank alike
    const int async = comm->AsyncError();
    if (async != ccSuccess) {
      return Fail(static_cast<ccResult_t>(async), "%s: rank %d: a device call queued earlier failed (%s); destroy "
                  "the communicator", fn, comm->rank, ccoll::ResultName(static_cast<ccResult_t>(async)));
    }
    return Execute(comm, c, args, false);
  });
}

}  // namespace

extern "C" {

CC_API ccResult_t ccAllReduce(const void* sendbuff, void* recvbuff, size_t count, ccDataType_t datatype,
                              ccRedOp_t op, ccCompressor_t compressor, ccComm_t comm, ccStream_t stream) {
  return Run(comm, Call{Kind::kAllReduce, sendbuff, recvbuff, count, ccoll::RawEnum(datatype), ccoll::RawEnum(op), 0,
                        compressor, stream});
}

CC_API ccResult_t ccReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ccDataType_t datatype,
                                  ccRedOp_t op, ccComm_t comm, ccStream_t stream) {
  return Run(comm, Call{Kind::kReduceScatter, sendbuff, recvbuff, recvcount, ccoll::RawEnum(datatype),
                        ccoll::RawEnum(op), 0, nullptr, stream});
}

CC_API ccResult_t ccAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ccDataType_t datatype,
                              ccComm_t comm, ccStream_t stream) {
  return Run(comm, Call{Kind::kAllGather, sendbuff, recvbuff, sendcount, ccoll::RawEnum(datatype), ccSum, 0, nullptr,
                        stream});
}

CC_API ccResult_t ccBroadcast(const void* sendbuff, void* recvbuff, size_t count, ccDataType_t datatype, int root,
                              ccComm_t comm, ccStream_t stream) {
  return Run(comm, Call{Kind::kBroadcast, sendbuff, recvbuff, count, ccoll::RawEnum(datatype), ccSum, root, nullptr,
                        stream});
}

CC_API ccResult_t ccReduce(const void* sendbuff, void* recvbuff, size_t count, ccDataType_t datatype, ccRedOp_t op,
                           int root, ccComm_t comm, ccStream_t stream) {
  return Run(comm, Call{Kind::kReduce, sendbuff, recvbuff, count, ccoll::RawEnum(datatype), ccoll::RawEnum(op), root,
                        nullptr, stream});
}

}  // extern "C"
