#include "collectives/stream_collectives.h"

#include "collectives/stream_compressed.h"
#include "collectives/reduce.h"
#include "core/comm.h"
#include "core/error.h"

namespace ccoll {

ccResult_t StreamExactCall(ccComm* comm, StreamKind kind, const void* send, void* recv, size_t count,
                           ccDataType_t dtype, ccRedOp_t op, int root, ccStream_t stream) {
  StreamTransport* t = comm->streamTransport.get();
  const uint64_t n = static_cast<uint64_t>(comm->nranks), bytes = count * DataTypeSize(dtype);
  uint64_t moved = 0;
  switch (kind) {
    case StreamKind::kAllReduce:
      CC_CHECK(t->AllReduce(send, recv, count, dtype, op, stream));
      moved = 2 * (n - 1) * bytes / n;
      break;
    case StreamKind::kReduceScatter:
      CC_CHECK(t->ReduceScatter(send, recv, count, dtype, op, stream));
      moved = (n - 1) * bytes;
      break;
    case StreamKind::kAllGather:
      CC_CHECK(t->AllGather(send, recv, count, dtype, stream));
      moved = (n - 1) * bytes;
      break;
    case StreamKind::kBroadcast:
      CC_CHECK(t->Broadcast(send, recv, count, dtype, root, stream));
      moved = (n - 1) * bytes / n;
      break;
    case StreamKind::kReduce:  // as a chain into root: every rank but root sends the buffer once
      CC_CHECK(t->Reduce(send, recv, count, dtype, op, root, stream));
      moved = (n - 1) * bytes / n;
      break;
  }
  comm->bytesSent.fetch_add(moved, std::memory_order_relaxed);
  comm->nominalBytesSent.fetch_add(moved, std::memory_order_relaxed);
  comm->bytesReceived.fetch_add(moved, std::memory_order_relaxed);
  return ccSuccess;
}

ccResult_t StreamCollective(ccComm* comm, StreamKind kind, const CollArgs& a, ccCompressor* compressor,
                            ccStream_t stream) {
  if (a.count > 0) {
    if (compressor != nullptr) {
      CC_CHECK(StreamCompressedAllReduce(comm, a, compressor, stream));
    } else {
      CC_CHECK(StreamExactCall(comm, kind, a.send, a.recv, a.count, a.dtype, a.op, a.root, stream));
    }
  }
  comm->streamTransport->Queued(stream);
  return ccSuccess;
}

}  // namespace ccoll
