// The stream-ordered transport interface (NCCL): transfers and exact collectives on device memory are queued on a
// CUDA stream, in order with the caller's other work there, and complete in stream order; nothing waits on the host,
// so a whole collective can be captured into a CUDA graph. Like the host transports (transport.h), it knows nothing of
// codecs or schedules.
//
// Matching is by order, not by tag: every rank queues its groups in the same order, and the k-th send from rank a to
// rank b matches the k-th receive at b from a, with the same byte count (the schedule computes both ends' sizes from
// the same arguments). A failure on the device side (a peer died, a call that never completes) cannot be returned by
// the call that queued it: it becomes the transport's asynchronous error (AsyncError), as with NCCL.
#pragma once

#include <cstddef>
#include <string>

#include "ccoll.h"

namespace ccoll {

// One send or receive of a group: `bytes` bytes of device memory at `buf`, to or from rank `peer`.
struct StreamTransfer {
  bool send = false;
  int peer = 0;
  void* buf = nullptr;
  size_t bytes = 0;
};

class StreamTransport {
 public:
  virtual ~StreamTransport() = default;
  virtual const char* Name() const = 0;

  // Queues the n transfers on `stream` as one group: they progress together, and the stream goes on once all are
  // done. A send's buffer must not change, and a receive's must not be read, until then (stream order does that).
  virtual ccResult_t Group(const StreamTransfer* transfers, size_t n, ccStream_t stream) = 0;

  // The exact collectives on device buffers, with the C API's arguments (already validated) and in-place layouts.
  virtual ccResult_t AllReduce(const void* send, void* recv, size_t count, ccDataType_t dtype, ccRedOp_t op,
                               ccStream_t stream) = 0;
  virtual ccResult_t ReduceScatter(const void* send, void* recv, size_t recvCount, ccDataType_t dtype, ccRedOp_t op,
                                   ccStream_t stream) = 0;
  virtual ccResult_t AllGather(const void* send, void* recv, size_t sendCount, ccDataType_t dtype,
                               ccStream_t stream) = 0;
  virtual ccResult_t Broadcast(const void* send, void* recv, size_t count, ccDataType_t dtype, int root,
                               ccStream_t stream) = 0;
  // recv is written (and used) on root only.
  virtual ccResult_t Reduce(const void* send, void* recv, size_t count, ccDataType_t dtype, ccRedOp_t op, int root,
                            ccStream_t stream) = 0;

  // Called once a collective's work is queued on `stream`: the transport expects the stream to get past it within the
  // communicator's timeout, and reports a failure (AsyncError) when it does not. (A collective it cannot watch is
  // logged, not failed: it is queued, and the peers have queued theirs.)
  virtual void Queued(ccStream_t stream) = 0;
  // ccSuccess, or the first failure seen since the transport was made (a peer's failure reported by the transport, a
  // queued collective past the timeout, an abort), with its sentence in *why (may be NULL).
  virtual ccResult_t AsyncError(std::string* why) = 0;
  // Stops every transfer queued and to come; the streams waiting for them go on without their data.
  virtual void Abort(const char* reason) = 0;
};

}  // namespace ccoll
