// Point-to-point transfers (ccSend, ccRecv): one rank's sends and receives of one group, on buffers the host
// transports can carry (host memory, or the device proxy's staging). The k-th send from rank a to rank b matches the
// k-th receive at b from a: both ends count their messages per peer (ccComm::p2pSent, p2pReceived), and the count is
// the tag's index under the seq that no collective uses (ccComm::kPointToPointSeq).
#pragma once

#include <cstddef>
#include <vector>

#include "ccoll.h"

struct ccComm;

namespace ccoll {

struct PointToPoint {
  bool send = false;
  int peer = 0;
  void* buf = nullptr;  // read by a send, written by a receive
  size_t bytes = 0;
};

// The sends of `ops` to this rank itself must pair up, in order, with its receives from itself, byte count for byte
// count: else ccInvalidUsage naming the first that does not, and nothing may move.
ccResult_t CheckSelfPairs(const ccComm& comm, const std::vector<PointToPoint>& ops);

// Copies each pair of a send to this rank and its receive, posts every other receive, then every send, and waits
// for all of them (so the order of `ops` does not matter to the peers). Over a network a message longer than a slice
// goes as slices, after its length, which the receiver checks. CheckSelfPairs first. A failure leaves the transfers
// to the caller's communicator to abort (Inflight).
ccResult_t RunPointToPoint(ccComm* comm, const std::vector<PointToPoint>& ops);

// The same on device buffers through the communicator's stream transport (transport nccl): queued on `stream` as one
// group, the sends to itself included (NCCL copies them). CheckSelfPairs first.
ccResult_t QueuePointToPoint(ccComm* comm, const std::vector<PointToPoint>& ops, ccStream_t stream);

}  // namespace ccoll
