// C API entry points ccGroupStart and ccGroupEnd, and the recording of the calls made between them.
#include "group.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "api_guard.h"
#include "core/comm.h"
#include "core/error.h"
#include "p2p.h"

namespace ccoll {
namespace {

// What the group holds for one communicator, in call order.
struct Batch {
  ccComm* comm = nullptr;
  std::vector<GroupedTransfer> transfers;
  std::vector<std::function<ccResult_t()>> calls;
  std::vector<std::function<ccResult_t(ccResult_t)>> refusals;  // of the calls, one each (GroupAddCall)
};

struct GroupState {
  int depth = 0;
  std::vector<std::pair<ccComm*, bool>> inits;  // communicators whose init the group started, and whether it blocks
  std::vector<std::function<ccResult_t()>> deferred;  // calls on those communicators, made again once they are up
  std::vector<Batch> batches;  // by first use of the communicator
  ccResult_t failed = ccSuccess;
  std::string failure;  // the first failed call's sentence
};

thread_local GroupState gGroup;

Batch& BatchOf(ccComm* comm) {
  for (Batch& b : gGroup.batches) {
    if (b.comm == comm) return b;
  }
  gGroup.batches.push_back(Batch{});
  gGroup.batches.back().comm = comm;
  return gGroup.batches.back();
}

struct Outcome {
  ccResult_t result = ccSuccess;
  std::string error;
};

// The transfers together, then each collective; every call is made, and the first failure is the batch's.
Outcome RunBatch(const Batch& b) {
  Outcome o;
  auto note = [&o](ccResult_t r) {
    if (r != ccSuccess && o.result == ccSuccess) {
      o.result = r;
      o.error = LastError();
    }
  };
  if (!b.transfers.empty()) note(Guarded("ccGroupEnd", [&] { return IssueTransfers(b.comm, b.transfers); }));
  for (const auto& call : b.calls) note(call());
  return o;
}

// Runs work(i) for every batch: here for one, else on a thread each, so that the ranks of one process that this
// thread drives do not wait for one another (a thread that cannot start leaves its batch to this thread, after).
void ForEachBatch(size_t count, const std::function<void(size_t)>& work) {
  std::vector<std::thread> threads;
  std::vector<size_t> here;
  for (size_t i = 0; i < count; ++i) {
    if (count == 1) {
      here.push_back(i);
      continue;
    }
    try {
      threads.emplace_back([&work, i] { work(i); });
    } catch (const std::system_error&) {
      here.push_back(i);
    }
  }
  for (size_t i : here) work(i);
  for (std::thread& t : threads) t.join();
}

// A group that issues nothing (r, its sentence in LastError): each collective it holds is refused in the call check,
// so that the peers' calls of the same collectives fail at once, in step. Before, the peers' calls paired with this
// rank's next calls, unrelated ones, and returned ccSuccess with data mixed from the two. (Its sends and receives
// have no such check: their peers wait until their timeout, as in NCCL.) Restores r's sentence.
void RefuseBatches(const std::vector<Batch>& batches, ccResult_t r) {
  const std::string why = LastError();
  ForEachBatch(batches.size(), [&](size_t i) {
    for (const auto& refuse : batches[i].refusals) {
      Guarded("ccGroupEnd", [&] {
        SetLastError(why);  // the sentence a refusal records and tells (a thread of its own has none)
        return refuse(r);
      });
    }
  });
  SetLastError(why);
}

}  // namespace

bool InGroup() { return gGroup.depth > 0; }

void GroupAddTransfer(ccComm* comm, const GroupedTransfer& t) { BatchOf(comm).transfers.push_back(t); }

void GroupAddCall(ccComm* comm, std::function<ccResult_t()> call, std::function<ccResult_t(ccResult_t)> refuse) {
  Batch& b = BatchOf(comm);
  b.calls.push_back(std::move(call));
  b.refusals.push_back(std::move(refuse));
}

void GroupAddInit(ccComm* comm, bool blocking) { gGroup.inits.emplace_back(comm, blocking); }

bool GroupMadeComm(ccComm* comm) {
  for (const auto& init : gGroup.inits) {
    if (init.first == comm) return true;
  }
  return false;
}

void GroupDefer(std::function<ccResult_t()> call) { gGroup.deferred.push_back(std::move(call)); }

// Waits for the inits the group started: those of blocking configs until they end, the others not (ccInProgress while
// one runs). The first that fails (or, with abortAll, every one at once) makes the others give up, as ccCommAbort
// does, so that none waits for its timeout for a rank that will not come; the first failure is the result, its
// sentence in LastError.
ccResult_t WaitForInits(const std::vector<std::pair<ccComm*, bool>>& inits, bool abortAll) {
  std::vector<std::unique_ptr<CommUse>> uses;  // one destroyed (or aborted) before ccGroupEnd is skipped
  std::vector<std::pair<ccComm*, bool>> live;
  for (const auto& init : inits) {
    uses.push_back(std::make_unique<CommUse>(init.first));
    if (uses.back()->ok()) live.push_back(init);
  }
  auto abortOthers = [&] {
    for (const auto& init : live) init.first->aborting = true;
  };
  if (abortAll) abortOthers();
  ccResult_t result = ccSuccess;
  std::string error;
  for (;;) {
    bool waiting = false, running = false;
    for (const auto& [comm, blocking] : live) {
      const ccResult_t state = static_cast<ccResult_t>(comm->asyncError.load());
      running = running || state == ccInProgress;
      waiting = waiting || (blocking && state == ccInProgress);
      if (state != ccSuccess && state != ccInProgress && result == ccSuccess && !abortAll) {
        result = state;
        std::lock_guard<std::mutex> lock(comm->errorMutex);
        error = comm->lastError;
        abortOthers();
      }
    }
    if (!waiting) {
      if (result != ccSuccess) return Fail(result, "ccGroupEnd: a communicator's init failed: %s", error.c_str());
      return running ? ccInProgress : ccSuccess;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void GroupFail(ccResult_t r) {
  if (gGroup.failed != ccSuccess) return;
  gGroup.failed = r;
  gGroup.failure = LastError();
}

}  // namespace ccoll

extern "C" {

CC_API ccResult_t ccGroupStart(void) {
  return ccoll::Guarded("ccGroupStart", [] {
    ++ccoll::gGroup.depth;
    return ccSuccess;
  });
}

CC_API ccResult_t ccGroupEnd(void) {
  using ccoll::gGroup;
  return ccoll::Guarded("ccGroupEnd", []() -> ccResult_t {
    if (gGroup.depth == 0) return ccoll::Fail(ccInvalidUsage, "ccGroupEnd: this thread has no open ccGroupStart");
    if (--gGroup.depth > 0) return ccSuccess;
    std::vector<ccoll::Batch> batches = std::move(gGroup.batches);
    gGroup.batches.clear();
    const std::vector<std::pair<ccComm*, bool>> inits = std::move(gGroup.inits);
    gGroup.inits.clear();
    std::vector<std::function<ccResult_t()>> deferred = std::move(gGroup.deferred);
    gGroup.deferred.clear();
    // The group's inits first: its calls may use the communicators they make. A call that failed its checks (an init
    // among them) makes them all give up.
    const ccResult_t initialized = ccoll::WaitForInits(inits, gGroup.failed != ccSuccess);
    if (initialized != ccSuccess && initialized != ccInProgress) {
      gGroup.failed = ccSuccess;
      gGroup.failure.clear();
      return initialized;
    }
    // The sends and receives on those communicators, recorded now that they are up (they were only kept), into the
    // batches that hold the group's other calls (its collectives, recorded as made, and the transfers on the other
    // communicators): every send and receive on such a communicator was kept, so its transfers keep their call order.
    if (gGroup.failed == ccSuccess && !deferred.empty()) {
      gGroup.batches = std::move(batches);
      gGroup.depth = 1;
      for (const auto& call : deferred) {
        const ccResult_t r = call();
        if (r != ccSuccess) ccoll::GroupFail(r);
      }
      gGroup.depth = 0;
      batches = std::move(gGroup.batches);
      gGroup.batches.clear();
    }
    const ccResult_t failed = gGroup.failed;
    const std::string failure = std::move(gGroup.failure);
    gGroup.failed = ccSuccess;
    gGroup.failure.clear();
    if (failed != ccSuccess) {
      ccoll::Fail(failed, "ccGroupEnd: a call of the group failed its checks, so none was issued (%s)",
                  failure.c_str());
      ccoll::RefuseBatches(batches, failed);
      return failed;
    }
    // What can be refused before anything moves is, for every communicator, before any of them starts.
    for (const ccoll::Batch& b : batches) {
      if (b.transfers.empty()) continue;
      const ccResult_t r = ccoll::CheckTransfers(b.comm, b.transfers);
      if (r != ccSuccess) {
        ccoll::Fail(r, "ccGroupEnd: refused, so no call of the group was issued: %s", ccoll::LastError().c_str());
        ccoll::RefuseBatches(batches, r);
        return r;
      }
    }
    // One communicator: its calls run here. Several: one thread each.
    std::vector<ccoll::Outcome> outcomes(batches.size());
    ccoll::ForEachBatch(batches.size(), [&](size_t i) { outcomes[i] = ccoll::RunBatch(batches[i]); });
    for (const ccoll::Outcome& o : outcomes) {
      if (o.result != ccSuccess) {
        ccoll::SetLastError(o.error);
        return o.result;
      }
    }
    return initialized;
  });
}

}  // extern "C"
