// C API entry points of versions, errors and communicators: argument checks, then the core.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api_guard.h"
#include "ccoll.h"
#include "core/bootstrap.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/job_secret.h"
#include "core/log.h"
#include "core/params.h"
#include "core/socket.h"
#include "group.h"
#ifdef CCOLL_HAVE_CUDA
#include "collectives/device_prepare.h"
#endif

using ccoll::Fail;
using ccoll::Guarded;

namespace {

// Frees comm once no call is inside it and its init has ended. False where another thread's destroy or abort of comm
// got there first (that thread frees it; comm must not be touched). `abortReason`: an abort whose transports were
// not aborted yet because a non-blocking init still owned them; if the init got as far as making them, they are
// aborted now, so that the peers fail at once instead of waiting for this rank until their timeout.
bool DeleteComm(ccComm* comm, const char* abortReason = nullptr) {
  if (!ccoll::UnregisterComm(comm)) return false;
  comm->rootStop->store(true);
  if (comm->initThread.joinable()) comm->initThread.join();
  if (abortReason != nullptr) comm->Abort(abortReason);
  delete comm;
  return true;
}

// Makes the unique id of a rank that was not given one (ccCommInitFromEnv: CC_ROOT's lookup, and rank 0's root), as
// the first step of its init; it gives up when *cancel becomes true (ccCommAbort of a non-blocking init), and a root
// it starts stops once *rootStop does (the communicator is freed).
using MakeId = std::function<ccResult_t(const std::atomic<bool>* cancel, std::shared_ptr<std::atomic<bool>> rootStop,
                                        ccUniqueId* id)>;

// The id (made first where `make` is given), CommSetup, then what a new communicator's device needs
// (collectives/device_prepare.h).
ccResult_t Setup(ccComm* comm, ccUniqueId id, const MakeId& make) {
  if (make) {
    CC_CHECK(make(&comm->aborting, comm->rootStop, &id));
    ccoll::UniqueIdContent content;
    CC_CHECK(ccoll::BootstrapParseId(id, &content));
  }
  CC_CHECK(ccoll::CommSetup(comm, id));
#ifdef CCOLL_HAVE_CUDA
  ccoll::PrepareNewComm(comm->config.cudaDev);
#endif
  return ccSuccess;
}

// A rank's init: its arguments are checked before it returns; the rest (`make`, then the bootstrap and transports)
// runs on a thread of its own when the config does not block. `id` is the rank's unique id, or ignored where `make`
// is given.
ccResult_t StartRank(ccComm_t* out, int nranks, const ccUniqueId& id, int rank, ccConfig_t* config, const char* fn,
                     MakeId make) {
  if (out == nullptr) return Fail(ccInvalidArgument, "%s: comm (the output pointer) is NULL", fn);
  *out = nullptr;
  if (nranks < 1 || nranks > ccoll::kMaxRanks) {
    return Fail(ccInvalidArgument, "%s: nranks %d is out of range (1 .. %d)", fn, nranks, ccoll::kMaxRanks);
  }
  if (rank < 0 || rank >= nranks) {
    return Fail(ccInvalidArgument, "%s: rank %d is out of range for nranks %d", fn, rank, nranks);
  }
  ccoll::CommConfig cfg;
  CC_CHECK(ccoll::ResolveConfig(config, &cfg));
  if (!make) {
    ccoll::UniqueIdContent content;
    CC_CHECK(ccoll::BootstrapParseId(id, &content));
  }

  auto* comm = new ccComm();
  comm->rank = rank;
  comm->nranks = nranks;
  comm->config = cfg;
  ccoll::RegisterComm(comm);
  // Inside a group (NCCL's way of making several ranks from one thread) the init runs on its own thread, as a
  // non-blocking one does; ccGroupEnd waits for it unless its config does not block.
  const bool grouped = ccoll::InGroup();
  if (!cfg.blocking || grouped) {
    comm->asyncError = ccInProgress;
    try {
      comm->initThread = std::thread([comm, id, make, fn] {
        ccResult_t r = Guarded(fn, [&] { return Setup(comm, id, make); });
        if (r != ccSuccess) comm->RecordError(ccoll::LastError());
        comm->asyncError = r;
      });
    } catch (const std::exception& e) {
      DeleteComm(comm);
      return Fail(ccSystemError, "%s: starting the init's thread failed (%s)", fn, e.what());
    }
    *out = comm;
    if (grouped) {
      ccoll::GroupAddInit(comm, cfg.blocking != 0);
      return ccSuccess;
    }
    return ccInProgress;
  }
  ccResult_t r = Setup(comm, id, make);
  if (r != ccSuccess) {
    DeleteComm(comm);
    return r;
  }
  *out = comm;
  return ccSuccess;
}

// StartRank of a rank given its id; inside a group, a failure is also the group's, whose other inits then give up at
// ccGroupEnd.
ccResult_t InitRank(ccComm_t* out, int nranks, const ccUniqueId& id, int rank, ccConfig_t* config, const char* fn) {
  const ccResult_t r = StartRank(out, nranks, id, rank, config, fn, nullptr);
  if (r != ccSuccess && ccoll::InGroup()) ccoll::GroupFail(r);
  return r;
}

}  // namespace

extern "C" {

CC_API ccResult_t ccGetVersion(int* version) {
  if (version == nullptr) return Fail(ccInvalidArgument, "ccGetVersion: version is NULL");
  *version = CC_VERSION_CODE;
  return ccSuccess;
}

CC_API const char* ccGetErrorString(ccResult_t result) {
  switch (result) {
    case ccSuccess: return "no error";
    case ccUnhandledCudaError: return "unhandled cuda error (run with CC_DEBUG=INFO for details)";
    case ccSystemError: return "unhandled system error (run with CC_DEBUG=INFO for details)";
    case ccInternalError: return "internal error - please report this issue to the ccoll developers";
    case ccInvalidArgument: return "invalid argument (ccGetLastError says which)";
    case ccInvalidUsage: return "invalid usage (ccGetLastError says why)";
    case ccRemoteError: return "remote process exited or there was a network error";
    case ccInProgress: return "operation in progress";
    case ccTimeout: return "timed out waiting for a peer";
    case ccNumResults: break;
  }
  return "unknown result code";
}

CC_API const char* ccGetLastError(ccComm_t comm) {
  static thread_local std::string copy;
  copy = ccoll::LastError();
  if (copy.empty() && comm != nullptr) {
    ccoll::CommUse use(comm);
    if (use.ok()) {
      std::lock_guard<std::mutex> lock(comm->errorMutex);
      copy = comm->lastError;
    }
  }
  return copy.c_str();
}

CC_API ccResult_t ccGetUniqueId(ccUniqueId* uniqueId) {
  return Guarded("ccGetUniqueId", [&] {
    if (uniqueId == nullptr) return Fail(ccInvalidArgument, "ccGetUniqueId: uniqueId is NULL");
    ccoll::CommConfig cfg;
    CC_CHECK(ccoll::ResolveConfig(nullptr, &cfg));
    return ccoll::BootstrapStartRoot(nullptr, nullptr, cfg.timeoutMs, uniqueId);
  });
}

CC_API ccResult_t ccCommInitRank(ccComm_t* comm, int nranks, ccUniqueId commId, int rank) {
  return Guarded("ccCommInitRank", [&] {
    ccConfig_t config = CC_CONFIG_INITIALIZER;  // blocking unless CC_BLOCKING=0, as NCCL_COMM_BLOCKING
    return InitRank(comm, nranks, commId, rank, &config, "ccCommInitRank");
  });
}

CC_API ccResult_t ccCommInitRankConfig(ccComm_t* comm, int nranks, ccUniqueId commId, int rank,
                                       ccConfig_t* config) {
  return Guarded("ccCommInitRankConfig",
                 [&] { return InitRank(comm, nranks, commId, rank, config, "ccCommInitRankConfig"); });
}

CC_API ccResult_t ccCommInitFromEnv(ccComm_t* comm, ccConfig_t* config) {
  const ccResult_t result = Guarded("ccCommInitFromEnv", [&]() -> ccResult_t {
    if (comm == nullptr) return Fail(ccInvalidArgument, "ccCommInitFromEnv: comm (the output pointer) is NULL");
    *comm = nullptr;
    int64_t rank = ccoll::ParamInt("CC_RANK"), nranks = ccoll::ParamInt("CC_NRANKS");
    std::string root = ccoll::ParamString("CC_ROOT");
    if (rank < 0 || nranks < 1 || rank >= nranks || nranks > ccoll::kMaxRanks) {
      return Fail(ccInvalidArgument, "ccCommInitFromEnv: CC_RANK=%lld and CC_NRANKS=%lld must satisfy 0 <= CC_RANK < "
                  "CC_NRANKS (both set by the launcher)", static_cast<long long>(rank), static_cast<long long>(nranks));
    }
    ccoll::CommConfig cfg;
    CC_CHECK(ccoll::ResolveConfig(config, &cfg));
    ccoll::UniqueIdContent content{};
    content.magic = ccoll::kUniqueIdMagic;
    content.version = ccoll::kBootstrapVersion;
    // CC_ROOT's form is checked here; a host name is looked up as init's first step (below), which a non-blocking
    // config runs after the call returns.
    std::string name;
    const ccResult_t parsed = ccoll::SplitSocketAddress(root, &content.root, &name);
    if (parsed != ccSuccess) {
      ccoll::SetLastError("ccCommInitFromEnv: CC_ROOT=" + ccoll::LastError());
      return parsed;
    }
    const std::string source = ccoll::JobSecret(content.secret);
    if (source.empty() && rank == 0) {
      CC_WARN("ccCommInitFromEnv: none of %s names this job, so a rank of another job given the same CC_ROOT could "
              "join this group; set CC_SECRET (or CC_JOB_ID) to one string on every rank",
              ccoll::JobSecretSources().c_str());
    }
    CC_INFO(ccoll::kLogBoot, "rank %lld: the bootstrap secret is a hash of %s", static_cast<long long>(rank),
            source.empty() ? "nothing (zeros)" : source.c_str());
    const int timeoutMs = cfg.timeoutMs;
    const bool isRoot = rank == 0;
    MakeId make = [content, root, timeoutMs, isRoot, hasName = !name.empty()](
                      const std::atomic<bool>* cancel, std::shared_ptr<std::atomic<bool>> rootStop,
                      ccUniqueId* id) mutable {
      if (hasName) {
        const ccResult_t found = ccoll::ParseSocketAddress(root, timeoutMs, &content.root, cancel);
        if (found != ccSuccess) {
          ccoll::SetLastError("ccCommInitFromEnv: CC_ROOT=" + ccoll::LastError());
          return found;
        }
      }
      if (isRoot) return ccoll::BootstrapStartRoot(&content.root, content.secret, timeoutMs, id, std::move(rootStop));
      std::memset(id, 0, sizeof(*id));
      std::memcpy(id->internal, &content, sizeof(content));
      return ccSuccess;
    };
    ccUniqueId unused{};
    return StartRank(comm, static_cast<int>(nranks), unused, static_cast<int>(rank), config, "ccCommInitFromEnv",
                     std::move(make));
  });
  // Inside a group a refusal is the group's too: those of the checks above and StartRank's (as InitRank does).
  if (result != ccSuccess && ccoll::InGroup()) ccoll::GroupFail(result);
  return result;
}

CC_API ccResult_t ccCommInitAll(ccComm_t* comms, int ndev, const int* devlist) {
  return Guarded("ccCommInitAll", [&]() -> ccResult_t {
    if (comms == nullptr) return Fail(ccInvalidArgument, "ccCommInitAll: comms is NULL");
    if (ndev < 1 || ndev > ccoll::kMaxRanks) {
      return Fail(ccInvalidArgument, "ccCommInitAll: ndev %d is out of range (1 .. %d)", ndev, ccoll::kMaxRanks);
    }
    for (int i = 0; i < ndev; ++i) comms[i] = nullptr;
    // Every rank's config is checked before any rank starts: a rank that failed alone would leave the others
    // waiting for it in the bootstrap until the timeout. (The environment first, so that its errors are not
    // blamed on a device.)
    ccoll::CommConfig resolved;
    CC_CHECK(ccoll::ResolveConfig(nullptr, &resolved));
    for (int i = 0; devlist != nullptr && i < ndev; ++i) {
      ccConfig_t config = CC_CONFIG_INITIALIZER;
      config.cudaDev = devlist[i];
      ccResult_t r = ccoll::ResolveConfig(&config, &resolved);
      if (r != ccSuccess) {
        ccoll::SetLastError("ccCommInitAll: devlist[" + std::to_string(i) + "]: " + ccoll::LastError());
        return r;
      }
    }
    ccUniqueId id;
    CC_CHECK(ccGetUniqueId(&id));
    std::vector<ccResult_t> results(ndev, ccSuccess);
    std::vector<std::string> errors(ndev);
    // The ranks start only once every thread exists: a thread that cannot be made leaves the others nothing to do
    // (they would wait for it in the bootstrap until the timeout).
    std::mutex gateMutex;
    std::condition_variable gateOpened;
    enum { kWait, kGo, kCancel } gate = kWait;
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(ndev));
    auto openGate = [&](int to) {
      {
        std::lock_guard<std::mutex> lock(gateMutex);
        gate = static_cast<decltype(gate)>(to);
      }
      gateOpened.notify_all();
    };
    try {
      for (int i = 0; i < ndev; ++i) {
        threads.emplace_back([&, i] {
          {
            std::unique_lock<std::mutex> lock(gateMutex);
            gateOpened.wait(lock, [&] { return gate != kWait; });
            if (gate == kCancel) return;
          }
          results[i] = Guarded("ccCommInitAll", [&] {
            ccConfig_t config = CC_CONFIG_INITIALIZER;
            config.blocking = 1;
            if (devlist != nullptr) config.cudaDev = devlist[i];
            return InitRank(&comms[i], ndev, id, i, &config, "ccCommInitAll");
          });
          if (results[i] != ccSuccess) errors[i] = ccoll::LastError();
        });
      }
    } catch (const std::exception& e) {
      openGate(kCancel);
      for (auto& t : threads) t.join();
      return Fail(ccSystemError, "ccCommInitAll: starting the thread of rank %zu of %d failed (%s); no communicator "
                  "was made", threads.size(), ndev, e.what());
    }
    openGate(kGo);
    for (auto& t : threads) t.join();
    // The error to report: the first rank's that did not just time out waiting for the others, if any.
    int failed = -1;
    for (int i = 0; i < ndev; ++i) {
      if (results[i] != ccSuccess && (failed < 0 || (results[failed] == ccTimeout && results[i] != ccTimeout))) {
        failed = i;
      }
    }
    if (failed < 0) return ccSuccess;
    for (int j = 0; j < ndev; ++j) {
      if (comms[j] != nullptr) DeleteComm(comms[j]);
      comms[j] = nullptr;
    }
    ccoll::SetLastError("ccCommInitAll: rank " + std::to_string(failed) + " failed: " + errors[failed]);
    return results[failed];
  });
}

CC_API ccResult_t ccCommDestroy(ccComm_t comm) {
  return Guarded("ccCommDestroy", [&] {
    if (comm == nullptr) return ccSuccess;
    {
      ccoll::CommUse use(comm);
      if (!use.ok()) {
        return Fail(ccInvalidArgument, "ccCommDestroy: comm %p is not a live communicator (destroyed twice?)",
                    static_cast<void*>(comm));
      }
      // A non-blocking init still running gives up within ~50 ms, as for ccCommAbort, rather than finish (or time
      // out) for nothing.
      if (comm->asyncError.load() == ccInProgress) comm->aborting = true;
    }
    if (!DeleteComm(comm)) {
      return Fail(ccInvalidArgument, "ccCommDestroy: comm %p was destroyed or aborted by another thread meanwhile",
                  static_cast<void*>(comm));
    }
    return ccSuccess;
  });
}

CC_API ccResult_t ccCommAbort(ccComm_t comm) {
  return Guarded("ccCommAbort", [&] {
    if (comm == nullptr) return ccSuccess;
    std::string reason;
    bool initRunning = false;
    {
      ccoll::CommUse use(comm);
      if (!use.ok()) {
        return Fail(ccInvalidArgument, "ccCommAbort: comm %p is not a live communicator", static_cast<void*>(comm));
      }
      reason = "rank " + std::to_string(comm->rank) + " aborted the communicator";
      comm->aborting = true;  // a running non-blocking init gives up within ~50 ms
      initRunning = comm->asyncError.load() == ccInProgress;
      if (!initRunning) comm->Abort(reason.c_str());  // a running init owns the transports until it ends
    }
    // Waits for the calls the abort woke up to leave, and for a running init, which may have finished after all.
    if (!DeleteComm(comm, initRunning ? reason.c_str() : nullptr)) {
      return Fail(ccInvalidArgument, "ccCommAbort: comm %p was destroyed or aborted by another thread meanwhile",
                  static_cast<void*>(comm));
    }
    return ccSuccess;
  });
}

CC_API ccResult_t ccCommCount(const ccComm_t comm, int* count) {
  return Guarded("ccCommCount", [&] {
    ccoll::CommUse use(comm);
    if (comm == nullptr || !use.ok()) return Fail(ccInvalidArgument, "ccCommCount: comm is not a live communicator");
    if (count == nullptr) return Fail(ccInvalidArgument, "ccCommCount: count is NULL");
    *count = comm->nranks;
    return ccSuccess;
  });
}

CC_API ccResult_t ccCommUserRank(const ccComm_t comm, int* rank) {
  return Guarded("ccCommUserRank", [&] {
    ccoll::CommUse use(comm);
    if (comm == nullptr || !use.ok()) {
      return Fail(ccInvalidArgument, "ccCommUserRank: comm is not a live communicator");
    }
    if (rank == nullptr) return Fail(ccInvalidArgument, "ccCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ccSuccess;
  });
}

CC_API ccResult_t ccCommCuDevice(const ccComm_t comm, int* device) {
  return Guarded("ccCommCuDevice", [&]() -> ccResult_t {
    ccoll::CommUse use(comm);
    if (comm == nullptr || !use.ok()) return Fail(ccInvalidArgument, "ccCommCuDevice: comm is not a live communicator");
    if (device == nullptr) return Fail(ccInvalidArgument, "ccCommCuDevice: device is NULL");
    *device = comm->config.cudaDev;
    return ccSuccess;
  });
}

CC_API ccResult_t ccCommGetAsyncError(ccComm_t comm, ccResult_t* asyncError) {
  return Guarded("ccCommGetAsyncError", [&] {
    ccoll::CommUse use(comm);
    if (comm == nullptr || !use.ok()) {
      return Fail(ccInvalidArgument, "ccCommGetAsyncError: comm is not a live communicator");
    }
    if (asyncError == nullptr) return Fail(ccInvalidArgument, "ccCommGetAsyncError: asyncError is NULL");
    *asyncError = comm->AsyncError();
    return ccSuccess;
  });
}

CC_API ccResult_t ccCommGetStats(ccComm_t comm, ccCommStats_t* stats) {
  return Guarded("ccCommGetStats", [&] {
    ccoll::CommUse use(comm);
    if (comm == nullptr || !use.ok()) return Fail(ccInvalidArgument, "ccCommGetStats: comm is not a live communicator");
    if (stats == nullptr) return Fail(ccInvalidArgument, "ccCommGetStats: stats is NULL");
    if (stats->size < sizeof(size_t)) {
      return Fail(ccInvalidArgument, "ccCommGetStats: stats->size %zu is too small; set it to sizeof(ccCommStats_t)",
                  stats->size);
    }
    ccCommStats_t s;
    s.size = sizeof(s);
    s.bytesSent = comm->bytesSent.load();
    s.bytesReceived = comm->bytesReceived.load();
    s.collectives = comm->collectives.load();
    s.callCheckBytesSent = comm->callCheckBytesSent.load();
    s.nominalBytesSent = comm->nominalBytesSent.load();
    size_t n = stats->size < sizeof(s) ? stats->size : sizeof(s);
    std::memcpy(reinterpret_cast<char*>(stats) + sizeof(size_t), reinterpret_cast<char*>(&s) + sizeof(size_t),
                n - sizeof(size_t));
    return ccSuccess;
  });
}

}  // extern "C"
