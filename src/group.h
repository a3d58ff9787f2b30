// ccGroupStart / ccGroupEnd: between them, this thread's calls are recorded per communicator and issued at the
// outermost ccGroupEnd: each communicator's sends and receives together (p2p.h), then its collectives in call order;
// several communicators side by side, one thread each.
#pragma once

#include <functional>

#include "ccoll.h"
#include "collectives/p2p.h"

namespace ccoll {

// Whether this thread is inside a group.
bool InGroup();

// One recorded send or receive; the entry point checked its arguments.
struct GroupedTransfer {
  PointToPoint op;
  bool onDevice = false;
  ccStream_t stream = nullptr;
};

// Records a send or receive on comm.
void GroupAddTransfer(ccComm* comm, const GroupedTransfer& t);
// Records a collective call on comm; `call` runs it at ccGroupEnd (with its own checks then). Where ccGroupEnd issues
// nothing (a send or receive of the group refused), `refuse` refuses it with that result instead, in the call check,
// so that the peers' calls fail at once rather than pair with this rank's next ones.
void GroupAddCall(ccComm* comm, std::function<ccResult_t()> call, std::function<ccResult_t(ccResult_t)> refuse);
// A call of the group failed its checks with r (its sentence in LastError): ccGroupEnd returns r and issues nothing.
void GroupFail(ccResult_t r);
// A communicator whose init was called inside the group (NCCL's way of making several ranks from one thread): its
// init already runs on a thread of its own; ccGroupEnd waits for it where `blocking`, before the group's calls.
void GroupAddInit(ccComm* comm, bool blocking);
// Whether comm's init is one of this group's (running or done: which one depends on timing, so it must not decide
// where a call goes).
bool GroupMadeComm(ccComm* comm);
// A call on such a communicator, made again (its checks then) once ccGroupEnd has waited for the inits, inside the
// group still.
void GroupDefer(std::function<ccResult_t()> call);

}  // namespace ccoll
