// Issues one communicator's sends and receives (one ccSend or ccRecv, or a group's): on host buffers in the calling
// thread, on device buffers through the stream transport or staged by the device proxy.
#pragma once

#include <vector>

#include "ccoll.h"
#include "group.h"

namespace ccoll {

// Every transfer is on host buffers, or every one on device buffers with one stream (else ccInvalidUsage). A failure
// once anything moved fails the communicator.
ccResult_t IssueTransfers(ccComm* comm, const std::vector<GroupedTransfer>& transfers);

}  // namespace ccoll
