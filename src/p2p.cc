// C API entry points ccSend and ccRecv: arguments checked here, before anything moves; then the transfer is issued
// at once, or recorded for ccGroupEnd inside a group.
#include "p2p.h"

#include <cstdint>
#include <string>
#include <vector>

#include "api_guard.h"
#include "collectives/p2p.h"
#include "collectives/reduce.h"
#include "core/comm.h"
#include "core/device_proxy.h"
#include "core/error.h"
#include "core/memory.h"
#include "raw_enum.h"
#ifdef CCOLL_HAVE_CUDA
#include "collectives/device_prepare.h"
#endif

using ccoll::Fail;

namespace ccoll {
namespace {

// Refused before anything moved: the communicator stays usable, and the sentence is recorded on it.
ccResult_t Refuse(ccComm* comm, const char* fn, ccResult_t r) {
  const std::string prefix = std::string(fn) + ": ";
  if (LastError().rfind(prefix, 0) != 0) SetLastError(prefix + LastError());
  comm->RecordError(LastError());
  return r;
}

std::vector<PointToPoint> Ops(const std::vector<GroupedTransfer>& transfers) {
  std::vector<PointToPoint> ops;
  for (const GroupedTransfer& t : transfers) ops.push_back(t.op);
  return ops;
}

// What identifies a staged batch's scratch (core/device_proxy.h, StagedCall::shape): each transfer's direction, peer
// and size.
uint64_t ShapeOf(const std::vector<PointToPoint>& ops) {
  std::vector<uint64_t> key;
  for (const PointToPoint& op : ops) {
    key.push_back(op.send ? 1u : 0u);
    key.push_back(static_cast<uint64_t>(op.peer));
    key.push_back(op.bytes);
  }
  return CallShape(key);
}

// Device buffers of a communicator without a stream transport: the proxy thread runs the transfers on a staging
// buffer (each transfer at its own offset, in call order: sends copied in before, receives copied out after), in
// order with the communicator's other device calls.
// *queued: the proxy holds the call (it runs it whatever failed after).
ccResult_t EnqueueStaged(ccComm* comm, const char* fn, const std::vector<PointToPoint>& ops, ccStream_t stream,
                         bool* queued) {
  *queued = false;
  CC_CHECK(DeviceProxy::RefuseCapture(comm->rank, stream));  // before anything a capture forbids
#ifdef CCOLL_HAVE_CUDA
  CC_CHECK(PrepareDevice(comm->config.cudaDev));  // before any stream of the device waits for the proxy
#endif
  DeviceProxy* proxy = nullptr;
  CC_CHECK(comm->DeviceProxyOf(&proxy));
  StagedCall staged;
  staged.stream = stream;
  std::vector<size_t> offsets;
  size_t at = 0;
  for (const PointToPoint& op : ops) {
    offsets.push_back(at);
    (op.send ? staged.ins : staged.outs).push_back(StagedCopy{op.buf, at, op.bytes});
    at += (op.bytes + 63) / 64 * 64;  // each transfer on a cache line of its own
  }
  staged.stagingBytes = at;
  if (proxy->UsesShapes()) staged.shape = ShapeOf(ops);
  const std::string name = fn;
  return proxy->Enqueue(staged, [comm, ops, offsets, name](char* staging) {
    if (staging == nullptr) return;  // skipped
    std::vector<PointToPoint> run = ops;
    for (size_t i = 0; i < run.size(); ++i) run[i].buf = staging + offsets[i];
    Guarded(name.c_str(), [&] {
      const ccResult_t r = RunPointToPoint(comm, run);
      return r == ccSuccess ? r : comm->FailInCall(name.c_str(), r);
    });
  }, queued);
}

}  // namespace

namespace {

const char* NameOf(const std::vector<GroupedTransfer>& transfers) {
  return transfers.size() == 1 ? (transfers[0].op.send ? "ccSend" : "ccRecv") : "ccGroupEnd";
}

// Where the transfers run: the buffers' kind and stream of those that move bytes (which must agree), or, when none
// does, device buffers on the given stream where one is given or the communicator queues on streams.
ccResult_t Placement(ccComm* comm, const std::vector<GroupedTransfer>& transfers, bool* onDevice, ccStream_t* stream) {
  const GroupedTransfer* first = nullptr;
  for (const GroupedTransfer& t : transfers) {
    if (t.op.bytes == 0) continue;
    if (first == nullptr) {
      first = &t;
    } else if (t.onDevice != first->onDevice || t.stream != first->stream) {
      return Fail(ccInvalidUsage, "rank %d: the sends and receives of one communicator in one group take host "
                  "buffers, or device buffers on one stream; this group mixes %s", comm->rank,
                  t.onDevice != first->onDevice ? "host and device buffers" : "streams");
    }
  }
  *stream = first != nullptr ? first->stream : transfers.front().stream;
  *onDevice = first != nullptr ? first->onDevice : *stream != nullptr || comm->streamTransport != nullptr;
  if (comm->streamTransport && !*onDevice) {
    return Fail(ccInvalidUsage, "rank %d: transport nccl sends and receives device buffers only (NCCL matches its "
                "messages in an order of its own, apart from the host transports')", comm->rank);
  }
  return ccSuccess;
}

}  // namespace

ccResult_t CheckTransfers(ccComm* comm, const std::vector<GroupedTransfer>& transfers) {
  const char* fn = NameOf(transfers);
  CommUse use(comm);
  if (!use.ok()) {
    return Fail(ccInvalidArgument, "%s: comm %p is not a live communicator (destroyed or aborted since the call)", fn,
                static_cast<void*>(comm));
  }
  CC_CHECK(comm->CheckUsable(fn));
  bool onDevice = false;
  ccStream_t stream = nullptr;
  ccResult_t r = Placement(comm, transfers, &onDevice, &stream);
  if (r == ccSuccess) r = CheckSelfPairs(*comm, Ops(transfers));
  return r == ccSuccess ? r : Refuse(comm, fn, r);
}

ccResult_t IssueTransfers(ccComm* comm, const std::vector<GroupedTransfer>& transfers) {
  const char* fn = NameOf(transfers);
  CommUse use(comm);  // (CheckTransfers refuses a communicator that is not live)
  CC_CHECK(CheckTransfers(comm, transfers));
  bool onDevice = false;
  ccStream_t stream = nullptr;
  CC_CHECK(Placement(comm, transfers, &onDevice, &stream));
  const std::vector<PointToPoint> ops = Ops(transfers);
  ccResult_t r = ccSuccess;
  if (onDevice && comm->streamTransport) {
    r = QueuePointToPoint(comm, ops, stream);
    return r == ccSuccess ? r : comm->FailInCall(fn, r);
  }
  if (onDevice) {
    bool queued = false;
    r = EnqueueStaged(comm, fn, ops, stream, &queued);
    if (r != ccSuccess && !queued) return Refuse(comm, fn, r);
    if (r != ccSuccess) comm->RecordError(LastError());
    return r;
  }
  comm->DrainDevice();  // device calls queued earlier run first
  const int async = comm->AsyncError();
  if (async != ccSuccess) {
    return Fail(static_cast<ccResult_t>(async), "%s: rank %d: a device call queued earlier failed (%s); destroy the "
                "communicator", fn, comm->rank, ResultName(static_cast<ccResult_t>(async)));
  }
  r = RunPointToPoint(comm, ops);
  return r == ccSuccess ? r : comm->FailInCall(fn, r);
}

namespace {

// Checks one ccSend or ccRecv, then issues it or records it in the group.
ccResult_t Transfer(bool send, void* buf, size_t count, int rawDtype, int peer, ccComm* comm, ccStream_t stream) {
  const char* fn = send ? "ccSend" : "ccRecv";
  const char* name = send ? "sendbuff" : "recvbuff";
  ccResult_t r = [&]() -> ccResult_t {
    if (comm == nullptr) return Fail(ccInvalidArgument, "%s: comm is NULL", fn);
    CommUse use(comm);
    if (!use.ok()) {
      return Fail(ccInvalidArgument, "%s: comm %p is not a live communicator (destroyed, aborted or never "
                  "initialized)", fn, static_cast<void*>(comm));
    }
    if (InGroup() && GroupMadeComm(comm)) {  // its init is this group's: checked and recorded at ccGroupEnd
      GroupDefer([=] {
        return send ? ccSend(buf, count, static_cast<ccDataType_t>(rawDtype), peer, comm, stream)
                    : ccRecv(buf, count, static_cast<ccDataType_t>(rawDtype), peer, comm, stream);
      });
      return ccSuccess;
    }
    CC_CHECK(comm->CheckUsable(fn));
    const int rank = comm->rank;
    CC_CHECK(CheckDataType(fn, rawDtype, rank));
    const ccDataType_t dtype = static_cast<ccDataType_t>(rawDtype);
    const size_t es = DataTypeSize(dtype);
    if (count > (static_cast<size_t>(1) << 62) / es) {
      return Fail(ccInvalidArgument, "%s: count %zu of %s overflows the address space (rank %d)", fn, count,
                  DataTypeName(dtype), rank);
    }
    if (count > 0 && buf == nullptr) {
      return Fail(ccInvalidArgument, "%s: %s is NULL but count is %zu on rank %d", fn, name, count, rank);
    }
    if (peer < 0 || peer >= comm->nranks) {
      return Fail(ccInvalidArgument, "%s: peer %d is out of range for %d ranks (rank %d)", fn, peer, comm->nranks,
                  rank);
    }
    GroupedTransfer t;
    t.op = PointToPoint{send, peer, buf, count * es};
    t.stream = stream;
    if (count > 0) {  // (a message of no bytes is still one of the k-th matches; it goes where the others go)
      const int dev = PointerDevice(buf);
      t.onDevice = dev >= 0;
      if (t.onDevice && comm->config.cudaDev < 0) {
        return Fail(ccInvalidUsage, "%s: %s is device memory, but the communicator is bound to no CUDA device (set "
                    "ccConfig_t.cudaDev) on rank %d", fn, name, rank);
      }
      if (t.onDevice && dev != comm->config.cudaDev) {
        return Fail(ccInvalidUsage, "%s: %s is on CUDA device %d, but the communicator is bound to device %d (rank "
                    "%d)", fn, name, dev, comm->config.cudaDev, rank);
      }
      if (t.onDevice) CC_CHECK(CheckDeviceCallStream(comm, stream, fn));
      if (!t.onDevice && stream != nullptr) {
        return Fail(ccInvalidUsage, "%s: stream must be NULL for host buffers (rank %d)", fn, rank);
      }
      if (!t.onDevice && !comm->hostTransports && peer != rank) {
        return Fail(ccInvalidUsage, "%s: host buffers, but this communicator (transport nccl, in a build without "
                    "UCX) carries only device buffers between processes (rank %d)", fn, rank);
      }
    }
    if (InGroup()) {
      GroupAddTransfer(comm, t);
      return ccSuccess;
    }
    if (peer == rank) {
      return Fail(ccInvalidUsage, "%s: peer %d is this rank itself: a send to itself completes only with its receive, "
                  "so both must be in one ccGroupStart/ccGroupEnd", fn, peer);
    }
    return IssueTransfers(comm, {t});
  }();
  if (r != ccSuccess && InGroup()) GroupFail(r);
  return r;
}

}  // namespace
}  // namespace ccoll

extern "C" {

CC_API ccResult_t ccSend(const void* sendbuff, size_t count, ccDataType_t datatype, int peer, ccComm_t comm,
                         ccStream_t stream) {
  return ccoll::Guarded("ccSend", [&] {
    return ccoll::Transfer(true, const_cast<void*>(sendbuff), count, ccoll::RawEnum(datatype), peer, comm, stream);
  });
}

CC_API ccResult_t ccRecv(void* recvbuff, size_t count, ccDataType_t datatype, int peer, ccComm_t comm,
                         ccStream_t stream) {
  return ccoll::Guarded("ccRecv", [&] {
    return ccoll::Transfer(false, recvbuff, count, ccoll::RawEnum(datatype), peer, comm, stream);
  });
}

}  // extern "C"
