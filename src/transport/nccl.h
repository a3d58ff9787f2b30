// The NCCL transport (a StreamTransport): a private NCCL communicator of the group's ranks, made at init from an id
// that rank 0 creates and ccoll's bootstrap hands round, so the application's own NCCL communicators are untouched.
// A group of transfers is ncclSend/ncclRecv between ncclGroupStart and ncclGroupEnd; the exact collectives are NCCL's
// own (ncclAllReduce, ...). Everything is queued on the caller's stream, so it can be captured into a CUDA graph.
//
// A dead peer: NCCL's kernels wait for it forever, and a blocking NCCL communicator can block the calling thread too
// (NCCL connects peers lazily, inside the first calls that use them, and waits for the peer there). So the
// communicator is non-blocking (ncclConfig_t.blocking = 0), as NCCL's fault-tolerance model asks: a call that NCCL is
// still queueing returns ncclInProgress and is polled (ncclCommGetAsyncError) until it is queued, at most
// CC_TIMEOUT_MS, before anything else is issued. And a watchdog thread (as PyTorch's ProcessGroupNCCL has) polls
// NCCL's asynchronous error and the completion of every collective queued outside graph capture; on a failure, or
// when a collective has not completed within the timeout, it aborts the NCCL communicator (which releases the waiting
// kernels) and records the error, which ccCommGetAsyncError and every later call report.
//
// NCCL refuses two ranks on one GPU of one host ("Duplicate GPU detected"). Ranks that share a GPU must be processes
// with different NCCL_HOSTID values: NCCL then takes them for hosts of their own and connects them through its
// network transport. That is how perf/gpu_check.sh runs it on a one-GPU machine.
//
// Only built with CCOLL_HAVE_NCCL (CUDA and NCCL found at configure time).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "transport/stream_transport.h"

namespace ccoll {

class NcclTransport : public StreamTransport {
 public:
  // A fresh NCCL unique id, as bytes for the bootstrap to hand round (rank 0 calls it).
  static ccResult_t MakeId(std::string* id);
  // Joins the NCCL communicator of `id` as `rank` of `nranks` on CUDA device `device` (every rank calls it; it
  // returns when all have, or after timeoutMs, or when *cancel becomes true: ccCommAbort of a non-blocking init).
  // timeoutMs also bounds how long a call may wait for NCCL to queue it, and how long a queued collective may take
  // before the watchdog fails it.
  static ccResult_t Create(const std::string& id, int rank, int nranks, int device, int timeoutMs,
                           const std::atomic<bool>* cancel, std::unique_ptr<NcclTransport>* out);
  // Stops the watchdog; destroys the NCCL communicator after the work queued on it (or aborts it, after a failure).
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  const char* Name() const override { return "nccl"; }
  ccResult_t Group(const StreamTransfer* transfers, size_t n, ccStream_t stream) override;
  ccResult_t AllReduce(const void* send, void* recv, size_t count, ccDataType_t dtype, ccRedOp_t op,
                       ccStream_t stream) override;
  ccResult_t ReduceScatter(const void* send, void* recv, size_t recvCount, ccDataType_t dtype, ccRedOp_t op,
                           ccStream_t stream) override;
  ccResult_t AllGather(const void* send, void* recv, size_t sendCount, ccDataType_t dtype,
                       ccStream_t stream) override;
  ccResult_t Broadcast(const void* send, void* recv, size_t count, ccDataType_t dtype, int root,
                       ccStream_t stream) override;
  ccResult_t Reduce(const void* send, void* recv, size_t count, ccDataType_t dtype, ccRedOp_t op, int root,
                    ccStream_t stream) override;
  void Queued(ccStream_t stream) override;
  ccResult_t AsyncError(std::string* why) override;
  void Abort(const char* reason) override;

  struct Impl;

 private:
  explicit NcclTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ccoll
