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
  // Over a network, a message longer than a slice travels as slices (UCX's tcp moves one large message at a third of
  // the rate of slices in flight), after an 8-byte message with its length, which the receiver checks: slices of two
  // different lengths would otherwise pair up without an error. The length is a payload kind of its own, so that it
  // cannot pair with an 8-byte message either. Not where UCX chose shared memory (ccComm::p2pSliced): there the 3
  // peers' slices of a 4-process all-to-all cost it up to 10x on a 2-core host.
  const size_t slice = comm->config.sliceBytes;
  auto sliced = [&](const PointToPoint& op) { return op.bytes > slice && comm->p2pSliced[op.peer] != 0; };
  Inflight io(comm, kWirePointToPoint), lengthIo(comm, kWirePointToPointLength);
  std::vector<uint64_t> lengths(ops.size(), 0);  // a sliced send's length, or the length a sliced receive got
  std::vector<Request*> lengthReqs(ops.size(), nullptr);
  for (int pass = 0; pass < 2; ++pass) {  // receives first, so that a send can find its peer's receive posted
    for (size_t i = 0; i < ops.size(); ++i) {
      const PointToPoint& op = ops[i];
      if (op.peer == comm->rank || op.send != (pass == 1)) continue;
      uint64_t& counter = op.send ? comm->p2pSent[op.peer] : comm->p2pReceived[op.peer];
      auto post = [&](Inflight& on, void* buf, size_t bytes, Request** req) {
        const uint64_t tag = Tag(ccComm::kPointToPointSeq, counter++);
        return op.send ? on.Send(op.peer, buf, bytes, tag, req) : on.Recv(op.peer, buf, bytes, tag, req);
      };
      if (!sliced(op)) {
        Request* req = nullptr;
        CC_CHECK(post(io, op.buf, op.bytes, &req));
        continue;
      }
      if (op.send) lengths[i] = op.bytes;
      CC_CHECK(post(lengthIo, &lengths[i], sizeof(uint64_t), &lengthReqs[i]));
      for (size_t at = 0; at < op.bytes; at += slice) {
        Request* req = nullptr;
        CC_CHECK(post(io, static_cast<char*>(op.buf) + at, op.bytes - at < slice ? op.bytes - at : slice, &req));
      }
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {  // the lengths first: a receive of another length fails at once
    if (lengthReqs[i] == nullptr) continue;  // not sliced
    const ccResult_t got = lengthIo.Wait(&lengthReqs[i]);
    if (got == ccInvalidUsage && !ops[i].send) {
      // Where the two sizes fall on the two sides of a slice, the sender's unsliced message met this length's receive.
      return Fail(ccInvalidUsage, "rank %d expects %zu bytes from rank %d, more than a slice (CC_SLICE_BYTES, %zu), "
                  "but rank %d sent a message of at most a slice: a ccSend and its ccRecv differ in size",
                  comm->rank, ops[i].bytes, ops[i].peer, slice, ops[i].peer);
    }
    CC_CHECK(got);
    if (!ops[i].send && lengths[i] != ops[i].bytes) {
      return Fail(ccInvalidUsage, "rank %d sent %llu bytes but rank %d expects %zu bytes (a point-to-point message): "
                  "a ccSend and its ccRecv differ in size", ops[i].peer, static_cast<unsigned long long>(lengths[i]),
                  comm->rank, ops[i].bytes);
    }
  }
  CC_CHECK(lengthIo.WaitAll());
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
