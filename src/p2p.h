// Issues one communicator's sends and receives (one ccSend or ccRecv, or a group's): on host buffers in the calling
// thread, on device buffers through the stream transport or staged by the device proxy.
#pragma once

#include <vector>

#include "ccoll.h"
#include "group.h"

namespace ccoll {

// What can be refused before anything moves: a communicator that is gone or failed, transfers that mix host and
// device buffers or streams (those of no bytes go where the others go), host buffers on transport nccl, sends to this
// rank itself without their receives. Recorded on comm.
ccResult_t CheckTransfers(ccComm* comm, const std::vector<GroupedTransfer>& transfers);

// CheckTransfers, then issues them. A failure once anything moved fails the communicator.
ccResult_t IssueTransfers(ccComm* comm, const std::vector<GroupedTransfer>& transfers);

}  // namespace ccoll
