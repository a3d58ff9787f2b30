#include "collectives/p2p.h"

#include <cstring>

#include "collectives/coll_args.h"
#include "core/comm.h"
#include "core/error.h"
#include "transport/stream_transport.h"

namespace ccoll {

ccResult_t CheckSelfPairs(const ccComm& comm, const std::vector<PointToPoint>& ops) {
  std::vector<size_t> sends, recvs;  // byte counts, in call order
  for (const PointToPoint& op : ops) {
    if (op.peer == comm.rank) (op.send ? sends : recvs).push_back(op.bytes);
  }
  for (size_t k = 0; k < sends.size() || k < recvs.size(); ++k) {
    if (k >= sends.size() || k >= recvs.size()) {
      return Fail(ccInvalidUsage, "rank %d: %s %zu to this rank itself has no matching %s in the group (a send to "
                  "the calling rank completes only with its receive, in one ccGroupStart/ccGroupEnd)", comm.rank,
                  k < sends.size() ? "send" : "receive", k + 1, k < sends.size() ? "receive" : "send");
    }
    if (sends[k] != recvs[k]) {
      return Fail(ccInvalidUsage, "rank %d: send %zu to this rank itself has %zu bytes but its receive expects %zu",
                  comm.rank, k + 1, sends[k], recvs[k]);
    }
  }
  return ccSuccess;
}

ccResult_t RunPointToPoint(ccComm* comm, const std::vector<PointToPoint>& ops) {
  CC_CHECK(CheckSelfPairs(*comm, ops));
  const size_t n = static_cast<size_t>(comm->nranks);
  if (comm->p2pSent.size() != n) {
    comm->p2pSent.assign(n, 0);
    comm->p2pReceived.assign(n, 0);
  }
  // This rank's pairs: the k-th send to itself into the k-th receive from itself (memmove: they may be one buffer).
  std::vector<const PointToPoint*> selfSends;
  size_t selfRecvs = 0;
  for (const PointToPoint& op : ops) {
    if (op.peer == comm->rank && op.send) selfSends.push_back(&op);
  }
  for (const PointToPoint& op : ops) {
    if (op.peer != comm->rank || op.send) continue;
    const PointToPoint* from = selfSends[selfRecvs++];
    if (op.bytes > 0) std::memmove(op.buf, from->buf, op.bytes);
  }
  Inflight io(comm, kWirePointToPoint);
  std::vector<Request*> reqs(ops.size(), nullptr);
  for (int pass = 0; pass < 2; ++pass) {  // receives first, so that a send can find its peer's receive posted
    for (size_t i = 0; i < ops.size(); ++i) {
      const PointToPoint& op = ops[i];
      if (op.peer == comm->rank || op.send != (pass == 1)) continue;
      if (op.send) {
        const uint64_t tag = Tag(ccComm::kPointToPointSeq, comm->p2pSent[op.peer]++);
        CC_CHECK(io.Send(op.peer, op.buf, op.bytes, tag, &reqs[i]));
      } else {
        const uint64_t tag = Tag(ccComm::kPointToPointSeq, comm->p2pReceived[op.peer]++);
        CC_CHECK(io.Recv(op.peer, op.buf, op.bytes, tag, &reqs[i]));
      }
    }
  }
  return io.WaitAll();
}

ccResult_t QueuePointToPoint(ccComm* comm, const std::vector<PointToPoint>& ops, ccStream_t stream) {
  CC_CHECK(CheckSelfPairs(*comm, ops));
  std::vector<StreamTransfer> transfers;
  uint64_t sent = 0, received = 0;
  for (const PointToPoint& op : ops) {
    transfers.push_back(StreamTransfer{op.send, op.peer, op.buf, op.bytes});
    if (op.peer != comm->rank) (op.send ? sent : received) += op.bytes;
  }
  CC_CHECK(comm->streamTransport->Group(transfers.data(), transfers.size(), stream));
  comm->bytesSent.fetch_add(sent, std::memory_order_relaxed);
  comm->nominalBytesSent.fetch_add(sent, std::memory_order_relaxed);  // (what NCCL was asked to move)
  comm->bytesReceived.fetch_add(received, std::memory_order_relaxed);
  comm->streamTransport->Queued(stream);
  return ccSuccess;
}

}  // namespace ccoll
