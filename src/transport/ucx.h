// The UCX transport: ranks in other processes (or hosts) exchange data with UCP tagged messages. One UCP worker
// per communicator, one endpoint per remote peer, created from worker addresses exchanged at bootstrap. Endpoints
// use UCP_ERR_HANDLING_MODE_PEER, so a dead peer turns into an error instead of a hang. UCX_TLS and the other UCX_*
// variables pass through to UCX untouched. A message is the wire header and the payload as one UCP iov message (no
// copy to join them), or, for a payload longer than UcxOptions::splitBytes, the header and then the payload as a
// contiguous message of its own, which UCX's rendezvous can move in one copy (cma, knem, xpmem, RDMA): UCX 1.13's
// rendezvous reads only contiguous data that way, an iov goes in pieces through its bounce buffers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace ccoll {

// UCX settings ccoll chooses (only where the user left UCX's own variable unset).
struct UcxOptions {
  std::string rndvThresh;  // UCX RNDV_THRESH; empty: UCX's default
  // Payloads longer than this travel after their header as a message of their own. Both ends of a message decide
  // from its length alone, so every rank needs the same value (comm.cc: SplitBytesFor of the agreed slice).
  size_t splitBytes = size_t{256} << 10;
};

// The UcxOptions::splitBytes for a communicator's slice: the slice, at most 1 MiB less a wire header. With
// RndvThreshFor's rendezvous threshold ("slice": a slice and 4 KiB, at most 1 MiB) every message that goes by
// rendezvous is then split, so its payload is contiguous, and a slice of less than 1 MiB stays one message with its
// header (a larger one is split too). A UCX_RNDV_THRESH of the user's below the slice sends unsplit messages above
// it by rendezvous as iovs.
size_t SplitBytesFor(size_t sliceBytes);

// The UCX RNDV_THRESH for CC_UCX_RNDV_THRESH=`param`: for "slice", the smaller of sliceBytes + 4 KiB (a slice and
// its wire header go eagerly, anything larger by rendezvous) and 1 MiB; any other value as it is.
std::string RndvThreshFor(const std::string& param, size_t sliceBytes);

// Whether an endpoint description, as ucp_ep_print_info writes it, moves every message through shared memory: its
// active-message lane (eager messages, rendezvous control) on posix, sysv or xpmem, and every bulk lane (am_bw,
// rma_bw: rendezvous data) on those or cma or knem. Pure; for UcxTransport and tests.
bool DataLanesOverSharedMemory(const std::string& epInfo);

class UcxTransport : public Transport {
 public:
  // Creates the worker; Address() is then what peers need to connect.
  static ccResult_t Create(int rank, int nranks, const UcxOptions& options, std::unique_ptr<UcxTransport>* out);
  ~UcxTransport() override;

  const std::string& Address() const;
  // Creates endpoints to the given peers (addresses indexed by rank; others ignored). peerErrors[i] asks for
  // UCP_ERR_HANDLING_MODE_PEER towards peers[i] (falling back to none where the transports cannot provide it).
  ccResult_t Connect(const std::vector<int>& peers, const std::vector<std::string>& addresses,
                     const std::vector<bool>& peerErrors);
  // After Connect: whether UCX chose shared memory for the messages to `peer` (DataLanesOverSharedMemory of its
  // endpoint). This rank's view only; its peer's endpoint may differ.
  bool PeerOverSharedMemory(int peer) const;

  const char* Name() const override { return "ucx"; }
  ccResult_t Isend(int peer, const void* buf, size_t bytes, uint64_t tag, WireKind kind, Request** req) override;
  ccResult_t Irecv(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, Request** req) override;
  ccResult_t IrecvAtMost(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, size_t* received,
                         Request** req) override;
  ccResult_t Wait(Request* req, int timeoutMs, IdleWork* idle = nullptr) override;
  bool RunsIdleWork() const override { return true; }
  // Only sets a flag (safe from another thread): the waiting thread cancels its requests and returns.
  void Abort(const char* reason) override;
  // How many requests of waits that gave up UCX still holds (their memory stays with the transport until UCX is done
  // with them; each Isend and Irecv lets go of the finished ones, as this does after progressing the worker once).
  // From the thread using the transport.
  size_t HeldRequests();

  struct Impl;

 private:
  explicit UcxTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ccoll
