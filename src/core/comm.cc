#include "core/comm.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>

#ifdef CCOLL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "core/bootstrap.h"
#include "core/error.h"
#include "core/log.h"
#include "core/params.h"
#include "transport/local.h"
#ifdef CCOLL_HAVE_NCCL
#include "transport/nccl.h"
#endif
#ifdef CCOLL_HAVE_UCX
#include "transport/ucx.h"
#endif

namespace ccoll {
namespace {

std::mutex gLiveMutex;
std::unordered_set<ccComm*>& Live() {
  static auto* live = new std::unordered_set<ccComm*>();
  return *live;
}

// What each rank tells the others at bootstrap.
struct RankInfo {
  uint8_t processToken[16];  // random per process: equal tokens mean "same process, use the local transport"
  int32_t pid;
  char host[64];
  int32_t checkCalls;        // CC_CHECK_CALLS: it changes the messages of every call, so all ranks must agree
  int32_t checksum;          // CC_CHECKSUM: likewise
  int32_t transport;         // CC_TRANSPORT: the bootstrap rounds that follow depend on it
  int32_t onDevice;          // bound to a CUDA device: its calls may take device buffers (ccComm::anyRankOnDevice)
  int32_t cudaDev;           // that device (-1 none): thread ranks sharing one (ccComm::deviceSharedInProcess); read
                             // only for ranks of this process, which run this very library
  uint64_t sliceBytes;       // CC_SLICE_BYTES: the rings' and the point-to-point slices, so all ranks must agree
  uint64_t checkInlineBytes;  // CC_CHECK_INLINE_BYTES: which calls ride in the call check and what its receives take
  // The settings that choose an all-reduce's schedule or shape it: ranks that disagree run schedules whose messages
  // never pair, and would wait for each other until the timeout.
  int32_t algorithm;       // CC_ALGO or ccConfig_t.algorithm
  int32_t treeDepth;       // CC_TREE_DEPTH: slices the exact tree sends up before it sends any down
  int32_t ringDepth;       // CC_RING_DEPTH: slices the compressed ring keeps in flight, in turn
  int32_t reserved;        // zero
  uint64_t treeThreshold;  // CC_TREE_THRESHOLD: where auto turns from the tree to the ring
};

const uint8_t* ProcessToken() {
  static uint8_t token[16];
  static std::once_flag once;
  std::call_once(once, [] {
    if (RandomBytes(token, sizeof(token)) != ccSuccess) {
      uint64_t fallback[2] = {static_cast<uint64_t>(getpid()),
                              static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
      std::memcpy(token, fallback, sizeof(token));
    }
  });
  return token;
}

std::string Hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

ccResult_t ParseTransport(const std::string& s, ccTransport_t* out) {
  if (s == "auto") *out = ccTransportAuto;
  else if (s == "local") *out = ccTransportLocal;
  else if (s == "ucx") *out = ccTransportUcx;
  else if (s == "nccl") *out = ccTransportNccl;
  else return Fail(ccInvalidArgument, "CC_TRANSPORT=%s is not one of auto, local, ucx, nccl", s.c_str());
  return ccSuccess;
}

ccResult_t ParseAlgo(const std::string& s, ccAlgo_t* out) {
  if (s == "auto") *out = ccAlgoAuto;
  else if (s == "ring") *out = ccAlgoRing;
  else if (s == "tree") *out = ccAlgoTree;
  else return Fail(ccInvalidArgument, "CC_ALGO=%s is not one of auto, ring, tree", s.c_str());
  return ccSuccess;
}

}  // namespace

const char* TransportName(ccTransport_t t) {
  switch (t) {
    case ccTransportAuto: return "auto";
    case ccTransportLocal: return "local";
    case ccTransportUcx: return "ucx";
    case ccTransportNccl: return "nccl";
  }
  return "unknown";
}

const char* AlgoName(ccAlgo_t a) {
  switch (a) {
    case ccAlgoAuto: return "auto";
    case ccAlgoRing: return "ring";
    case ccAlgoTree: return "tree";
  }
  return "unknown";
}

ccResult_t ResolveConfig(const ccConfig_t* user, CommConfig* out) {
  ccConfig_t cfg = CC_CONFIG_INITIALIZER;
  if (user != nullptr) {
    if (user->size < offsetof(ccConfig_t, transport) || user->magic != CC_CONFIG_MAGIC) {
      return Fail(ccInvalidArgument,
                  "ccConfig_t was not initialized with CC_CONFIG_INITIALIZER (size %zu, magic 0x%x)", user->size,
                  user->size >= offsetof(ccConfig_t, version) ? user->magic : 0u);
    }
    std::memcpy(&cfg, user, user->size < sizeof(cfg) ? user->size : sizeof(cfg));
  }
  *out = CommConfig();
  std::string text;
  if (const char* name = MalformedIntParam(&text)) {
    return Fail(ccInvalidArgument, "%s=\"%s\" is not an integer (nor a size such as 64K)", name, text.c_str());
  }
  if (cfg.transport != CC_CONFIG_UNDEF_INT) {
    if (cfg.transport < ccTransportAuto || cfg.transport > ccTransportNccl) {
      return Fail(ccInvalidArgument, "ccConfig_t.transport %d is not a ccTransport_t", cfg.transport);
    }
    out->transport = static_cast<ccTransport_t>(cfg.transport);
  } else {
    CC_CHECK(ParseTransport(ParamString("CC_TRANSPORT"), &out->transport));
  }
  if (cfg.algorithm != CC_CONFIG_UNDEF_INT) {
    if (cfg.algorithm < ccAlgoAuto || cfg.algorithm > ccAlgoTree) {
      return Fail(ccInvalidArgument, "ccConfig_t.algorithm %d is not a ccAlgo_t", cfg.algorithm);
    }
    out->algorithm = static_cast<ccAlgo_t>(cfg.algorithm);
  } else {
    CC_CHECK(ParseAlgo(ParamString("CC_ALGO"), &out->algorithm));
  }
  int64_t timeout = cfg.timeoutMs != CC_CONFIG_UNDEF_INT ? cfg.timeoutMs : ParamInt("CC_TIMEOUT_MS");
  if (timeout <= 0 || timeout > (1LL << 30)) {
    return Fail(ccInvalidArgument, "timeout %lld ms is out of range (1 .. 2^30)", static_cast<long long>(timeout));
  }
  out->timeoutMs = static_cast<int>(timeout);
  int64_t blocking = cfg.blocking != CC_CONFIG_UNDEF_INT ? cfg.blocking : ParamInt("CC_BLOCKING");
  if (blocking != 0 && blocking != 1) {
    return Fail(ccInvalidArgument, "blocking %lld must be 0 or 1", static_cast<long long>(blocking));
  }
  out->blocking = static_cast<int>(blocking);
  out->cudaDev = cfg.cudaDev != CC_CONFIG_UNDEF_INT ? cfg.cudaDev : -1;
  if (cfg.cudaDev != CC_CONFIG_UNDEF_INT && cfg.cudaDev < 0) {
    return Fail(ccInvalidArgument, "ccConfig_t.cudaDev %d is negative (leave it CC_CONFIG_UNDEF_INT for the device "
                "current at init)", cfg.cudaDev);
  }
#ifdef CCOLL_HAVE_CUDA
  int devices = 0;  // where the runtime cannot count them (no driver), the first device call says so instead
  if (out->cudaDev >= 0 && cudaGetDeviceCount(&devices) == cudaSuccess && out->cudaDev >= devices) {
    return Fail(ccInvalidArgument, "ccConfig_t.cudaDev %d: this process sees %d CUDA device%s (CUDA_VISIBLE_DEVICES "
                "may hide some)", out->cudaDev, devices, devices == 1 ? "" : "s");
  }
  cudaGetLastError();
  if (out->cudaDev < 0) {  // bound to the device current at init, when there is one
    int dev = -1;
    if (cudaGetDevice(&dev) == cudaSuccess) {
      out->cudaDev = dev;
    } else {
      cudaGetLastError();
    }
  }
#endif
  int64_t slice = ParamInt("CC_SLICE_BYTES");
  if (slice < 64 || slice > (1LL << 30)) {
    return Fail(ccInvalidArgument, "CC_SLICE_BYTES=%lld is out of range (64 .. 1G)", static_cast<long long>(slice));
  }
  out->sliceBytes = static_cast<size_t>(slice) & ~static_cast<size_t>(7);  // whole elements of every dtype
  int64_t depth = ParamInt("CC_TREE_DEPTH");
  if (depth < 1 || depth > 64) {
    return Fail(ccInvalidArgument, "CC_TREE_DEPTH=%lld is out of range (1 .. 64)", static_cast<long long>(depth));
  }
  out->treeDepth = static_cast<int>(depth);
  int64_t ringDepth = ParamInt("CC_RING_DEPTH");
  if (ringDepth < 1 || ringDepth > 64) {
    return Fail(ccInvalidArgument, "CC_RING_DEPTH=%lld is out of range (1 .. 64)", static_cast<long long>(ringDepth));
  }
  out->ringDepth = static_cast<int>(ringDepth);
  int64_t kernels = ParamInt("CC_DEVICE_KERNELS");
  if (kernels != 0 && kernels != 1) {
    return Fail(ccInvalidArgument, "CC_DEVICE_KERNELS=%lld must be 0 or 1", static_cast<long long>(kernels));
  }
  out->deviceKernels = kernels == 1;
  int64_t check = ParamInt("CC_CHECK_CALLS");
  if (check != 0 && check != 1) {
    return Fail(ccInvalidArgument, "CC_CHECK_CALLS=%lld must be 0 or 1", static_cast<long long>(check));
  }
  out->checkCalls = check == 1;
  int64_t inlineBytes = ParamInt("CC_CHECK_INLINE_BYTES");
  if (inlineBytes < 0 || inlineBytes > 65536) {
    return Fail(ccInvalidArgument, "CC_CHECK_INLINE_BYTES=%lld is out of range (0 .. 65536)",
                static_cast<long long>(inlineBytes));
  }
  out->checkInlineBytes = static_cast<size_t>(inlineBytes);
  int64_t checksum = ParamInt("CC_CHECKSUM");
  if (checksum != 0 && checksum != 1) {
    return Fail(ccInvalidArgument, "CC_CHECKSUM=%lld must be 0 or 1", static_cast<long long>(checksum));
  }
  if (checksum == 1 && !HaveCrc32c()) {
    return Fail(ccInvalidUsage, "CC_CHECKSUM=1 needs CRC32C, and this build has none (configure with libisal-dev "
                "installed)");
  }
  out->checksum = checksum == 1;
  int64_t threshold = ParamInt("CC_TREE_THRESHOLD");
  if (threshold < 0) return Fail(ccInvalidArgument, "CC_TREE_THRESHOLD=%lld is negative", (long long)threshold);
  out->treeThreshold = static_cast<size_t>(threshold);
  return ccSuccess;
}

ccResult_t CheckTransportUsable(const CommConfig& config, int rank) {
  if (config.transport == ccTransportNccl) {
#ifndef CCOLL_HAVE_NCCL
    return Fail(ccInvalidUsage, "rank %d: transport nccl was asked for, but this build of ccoll has no NCCL (configure "
                "with CUDA, nccl.h and libnccl found)", rank);
#endif
    if (config.cudaDev < 0) {
      return Fail(ccInvalidUsage, "rank %d: transport nccl needs a CUDA device, and there was none current at init "
                  "(set ccConfig_t.cudaDev)", rank);
    }
  }
  return ccSuccess;
}

ccResult_t CommSetup(ccComm* comm, const ccUniqueId& id) {
  UniqueIdContent content;
  CC_CHECK(BootstrapParseId(id, &content));
  const int rank = comm->rank, n = comm->nranks;
  const ccTransport_t want = comm->config.transport;
  CC_CHECK(CheckTransportUsable(comm->config, rank));
  std::string key = Hex(content.secret, sizeof(content.secret)) + "@" + ToString(content.root);
  std::unique_ptr<LocalTransport> local;
  CC_CHECK(LocalTransport::Create(key, rank, n, &local));

  // Round 1: who is where.
  BootstrapSession session(content, rank, n, comm->config.timeoutMs, &comm->aborting);
#ifdef CCOLL_HAVE_UCX
  std::unique_ptr<UcxTransport> ucx;  // (declared here: a failed init says why before its UCX teardown, which waits)
#endif
  // An init that fails after joining tells the root why, and the root tells the ranks still in the bootstrap (they
  // would otherwise hear only that this rank left, while the cause, a peer that died, is elsewhere). It also aborts
  // the local group: a thread rank of this process whose bootstrap had already ended (an abort of this rank's
  // non-blocking init can come after the root answered) fails its calls at once, instead of waiting for this rank
  // until its timeout.
  struct LeaveOnFailure {
    BootstrapSession& session;
    LocalTransport* local;
    int rank;
    bool succeeded = false;
    ~LeaveOnFailure() {
      if (succeeded) return;
      const std::string why = LastError();
      session.Leave(why);
      local->Abort(("rank " + std::to_string(rank) + "'s init failed: " + why).c_str());
    }
  } leaveOnFailure{session, local.get(), rank};
  RankInfo info{};
  std::memcpy(info.processToken, ProcessToken(), sizeof(info.processToken));
  info.pid = getpid();
  gethostname(info.host, sizeof(info.host) - 1);
  info.checkCalls = comm->config.checkCalls ? 1 : 0;
  info.checksum = comm->config.checksum ? 1 : 0;
  info.transport = static_cast<int32_t>(want);
  info.cudaDev = -1;
#ifdef CCOLL_HAVE_CUDA
  info.onDevice = comm->config.cudaDev >= 0 ? 1 : 0;
  info.cudaDev = comm->config.cudaDev;
#endif
  info.sliceBytes = static_cast<uint64_t>(comm->config.sliceBytes);
  info.checkInlineBytes = static_cast<uint64_t>(comm->config.checkInlineBytes);
  info.algorithm = static_cast<int32_t>(comm->config.algorithm);
  info.treeDepth = comm->config.treeDepth;
  info.ringDepth = comm->config.ringDepth;
  info.treeThreshold = static_cast<uint64_t>(comm->config.treeThreshold);
  std::vector<std::string> all;
  CC_CHECK(session.AllGather(std::string(reinterpret_cast<const char*>(&info), sizeof(info)), &all));
  std::vector<RankInfo> infos(n);
  bool anyRemote = false;  // the same answer on every rank: it decides whether round 2 happens
  for (int peer = 0; peer < n; ++peer) {
    if (all[peer].size() != sizeof(RankInfo)) {
      return Fail(ccRemoteError, "rank %d: rank %d sent a %zu-byte bootstrap record (expected %zu)", rank, peer,
                  all[peer].size(), sizeof(RankInfo));
    }
    std::memcpy(&infos[peer], all[peer].data(), sizeof(RankInfo));
    infos[peer].host[sizeof(infos[peer].host) - 1] = '\0';
    anyRemote |= std::memcmp(infos[peer].processToken, infos[0].processToken, sizeof(info.processToken)) != 0;
    comm->anyRankOnDevice = comm->anyRankOnDevice || infos[peer].onDevice != 0;
  }
  comm->acrossProcesses = anyRemote;
  // A setting every rank needs the same value of: here on this rank, there on peer.
  auto same = [&](const char* name, uint64_t here, uint64_t there, int peer) -> ccResult_t {
    if (here == there) return ccSuccess;
    return Fail(ccInvalidUsage,
                "rank %d: %s is %llu here but %llu on rank %d (pid %d on %s); every rank needs the same setting", rank,
                name, static_cast<unsigned long long>(here), static_cast<unsigned long long>(there), peer,
                infos[peer].pid, infos[peer].host);
  };
  for (int peer = 0; peer < n; ++peer) {
    CC_CHECK(same("CC_CHECK_CALLS", static_cast<uint64_t>(info.checkCalls),
                  static_cast<uint64_t>(infos[peer].checkCalls), peer));
    if (infos[peer].transport != info.transport) {
      return Fail(ccInvalidUsage, "rank %d: CC_TRANSPORT is %s here but %s on rank %d (pid %d on %s); every rank "
                  "needs the same transport", rank, TransportName(want),
                  TransportName(static_cast<ccTransport_t>(infos[peer].transport)), peer, infos[peer].pid,
                  infos[peer].host);
    }
    CC_CHECK(same("CC_SLICE_BYTES", info.sliceBytes, infos[peer].sliceBytes, peer));
    CC_CHECK(same("CC_CHECK_INLINE_BYTES", info.checkInlineBytes, infos[peer].checkInlineBytes, peer));
    CC_CHECK(
        same("CC_CHECKSUM", static_cast<uint64_t>(info.checksum), static_cast<uint64_t>(infos[peer].checksum), peer));
    if (infos[peer].algorithm != info.algorithm) {
      return Fail(ccInvalidUsage,
                  "rank %d: the algorithm (CC_ALGO or ccConfig_t.algorithm) is %s here but %s on rank "
                  "%d (pid %d on %s); every rank needs the same algorithm",
                  rank, AlgoName(comm->config.algorithm), AlgoName(static_cast<ccAlgo_t>(infos[peer].algorithm)), peer,
                  infos[peer].pid, infos[peer].host);
    }
    CC_CHECK(same("CC_TREE_THRESHOLD", info.treeThreshold, infos[peer].treeThreshold, peer));
    CC_CHECK(same("CC_TREE_DEPTH", static_cast<uint64_t>(info.treeDepth), static_cast<uint64_t>(infos[peer].treeDepth),
                  peer));
    CC_CHECK(same("CC_RING_DEPTH", static_cast<uint64_t>(info.ringDepth), static_cast<uint64_t>(infos[peer].ringDepth),
                  peer));
  }
  auto sameProcess = [&](int peer) {
    return std::memcmp(infos[peer].processToken, info.processToken, sizeof(info.processToken)) == 0;
  };
  for (int peer = 0; peer < n; ++peer) {
    if (peer != rank && info.cudaDev >= 0 && sameProcess(peer) && infos[peer].cudaDev == info.cudaDev) {
      comm->deviceSharedInProcess = true;
    }
  }
  if (want == ccTransportLocal) {
    for (int peer = 0; peer < n; ++peer) {
      if (!sameProcess(peer)) {
        return Fail(ccInvalidUsage, "rank %d: transport local was asked for, but rank %d runs in another process "
                    "(pid %d on %s)", rank, peer, infos[peer].pid, infos[peer].host);
      }
    }
  }

  comm->peers.assign(n, nullptr);
  comm->p2pSliced.assign(n, 0);
  int ucxPeers = 0, slicedPeers = 0;
  if (want == ccTransportUcx || anyRemote) {
#ifdef CCOLL_HAVE_UCX
    // Round 2: UCX worker addresses, then endpoints to every peer that UCX serves.
    UcxOptions options;
    options.splitBytes = SplitBytesFor(comm->config.sliceBytes);  // (the slice: agreed by every rank above)
    if (!ForeignEnvIsSet("UCX_RNDV_THRESH")) {
      options.rndvThresh = RndvThreshFor(ParamString("CC_UCX_RNDV_THRESH"), comm->config.sliceBytes);
    }
    CC_CHECK(UcxTransport::Create(rank, n, options, &ucx));
    CC_CHECK(session.AllGather(ucx->Address(), &all));
    std::vector<int> remote;
    std::vector<bool> peerErrors;
    std::string mode = ParamString("CC_UCX_ERR_MODE");
    if (mode != "auto" && mode != "peer" && mode != "none") {
      return Fail(ccInvalidArgument, "CC_UCX_ERR_MODE=%s is not one of auto, peer, none", mode.c_str());
    }
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank || (want != ccTransportUcx && sameProcess(peer))) continue;
      remote.push_back(peer);
      bool sameHost = std::strcmp(infos[peer].host, info.host) == 0;
      peerErrors.push_back(mode == "peer" || (mode == "auto" && !sameHost));
    }
    CC_CHECK(ucx->Connect(remote, all, peerErrors));
    // Round 2b: the peers each rank's endpoints reach through shared memory, as a list of ranks (int32; peers on
    // other hosts are not in it, so the records stay small). A pair's point-to-point messages go unsliced only where
    // both ends' endpoints use shared memory (ccComm::p2pSliced), so both ends decide alike.
    std::vector<int32_t> mine;
    for (int peer : remote) {
      if (ucx->PeerOverSharedMemory(peer)) mine.push_back(peer);
    }
    CC_CHECK(session.AllGather(std::string(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(int32_t)),
                               &all));
    std::vector<uint8_t> sharedBoth(n, 0);  // 1: this rank lists the peer and the peer lists this rank
    for (int32_t peer : mine) sharedBoth[peer] = 1;
    for (int peer : remote) {
      const std::string& theirs = all[peer];
      if (theirs.size() % sizeof(int32_t) != 0) {
        return Fail(ccRemoteError, "rank %d: rank %d sent a %zu-byte shared-memory record (not a list of ranks)", rank,
                    peer, theirs.size());
      }
      bool listsMe = false;
      for (size_t at = 0; at < theirs.size(); at += sizeof(int32_t)) {
        int32_t r;
        std::memcpy(&r, theirs.data() + at, sizeof(r));
        listsMe = listsMe || r == rank;
      }
      sharedBoth[peer] = sharedBoth[peer] != 0 && listsMe ? 1 : 0;
    }
    for (int peer : remote) {
      comm->peers[peer] = ucx.get();
      ++ucxPeers;
      comm->p2pSliced[peer] = sharedBoth[peer] != 0 ? 0 : 1;
      slicedPeers += comm->p2pSliced[peer];
    }
    comm->transports.push_back(std::move(ucx));
#else
    for (int peer = 0; peer < n && want == ccTransportNccl; ++peer) {
      // Device buffers travel through NCCL; host buffers between processes would need UCX.
      if (!sameProcess(peer)) comm->hostTransports = false;
    }
    for (int peer = 0; peer < n && want != ccTransportNccl; ++peer) {
      if (!sameProcess(peer) || want == ccTransportUcx) {
        return Fail(ccInvalidUsage, "rank %d: rank %d runs in another process (pid %d on %s), but this build has no "
                    "UCX transport (configure with -DCCOLL_ENABLE_UCX=ON and libucx-dev)", rank, peer,
                    infos[peer].pid, infos[peer].host);
      }
    }
#endif
  }
  for (int peer = 0; peer < n; ++peer) {
    if (peer == rank || comm->peers[peer] != nullptr || !sameProcess(peer)) continue;
    if (!local->PeerPresent(peer)) {
      return Fail(ccInternalError, "rank %d: rank %d is in this process but not in its local group", rank, peer);
    }
    comm->peers[peer] = local.get();
  }
  comm->transports.push_back(std::move(local));
  for (auto& t : comm->transports) t->SetChecksum(comm->config.checksum);
#ifdef CCOLL_HAVE_NCCL
  if (want == ccTransportNccl) {
    // Round 3: rank 0's NCCL id, then every rank joins the private NCCL communicator.
    std::string mine;
    if (rank == 0) CC_CHECK(NcclTransport::MakeId(&mine));
    CC_CHECK(session.AllGather(mine, &all));
    std::unique_ptr<NcclTransport> nccl;
    CC_CHECK(NcclTransport::Create(all[0], rank, n, comm->config.cudaDev, comm->config.timeoutMs, &comm->aborting,
                                   &nccl));
    comm->streamTransport = std::move(nccl);
  }
#endif
  comm->scratch.assign(comm->config.sliceBytes * ccComm::kScratchSlots, 0);
  const char* between = want == ccTransportNccl ? (comm->hostTransports ? " (host buffers: local and ucx)"
                                                                        : " (host buffers: none between processes)")
                        : anyRemote             ? " (ucx between processes)"
                                                : "";
  CC_INFO(kLogInit, "rank %d of %d ready: transport %s%s, algorithm %s, slice %zu bytes, timeout %d ms, "
          "point-to-point messages sliced to %d of %d ucx peers", rank, n, TransportName(want), between,
          AlgoName(comm->config.algorithm), comm->config.sliceBytes, comm->config.timeoutMs, slicedPeers, ucxPeers);
  leaveOnFailure.succeeded = true;
  return ccSuccess;
}

Inflight::~Inflight() {
  if (open_ == nullptr) return;
  std::string reason = "rank " + std::to_string(comm_->rank) + " failed: " + LastError();
  std::string keep = LastError();
  comm_->Abort(reason.c_str());
  for (Request* r = open_; r != nullptr;) {
    Request* next = r->openNext;  // (Wait frees r)
    r->owner->Wait(r, comm_->config.timeoutMs);
    r = next;
  }
  SetLastError(keep);  // the first failure is the one to report, not the aborts it caused
}

void Inflight::Open(Request* r) {
  r->openPrev = nullptr;
  r->openNext = open_;
  if (open_ != nullptr) open_->openPrev = r;
  open_ = r;
}

void Inflight::Close(Request* r) {
  if (r->openPrev != nullptr) {
    r->openPrev->openNext = r->openNext;
  } else {
    open_ = r->openNext;
  }
  if (r->openNext != nullptr) r->openNext->openPrev = r->openPrev;
}

ccResult_t Inflight::Send(int peer, const void* buf, size_t bytes, uint64_t tag, Request** req) {
  *req = nullptr;
  CC_CHECK(comm_->peers[peer]->Isend(peer, buf, bytes, tag, kind_, req));
  Open(*req);
  comm_->bytesSent.fetch_add(bytes, std::memory_order_relaxed);
  return ccSuccess;
}

ccResult_t Inflight::Recv(int peer, void* buf, size_t bytes, uint64_t tag, Request** req) {
  *req = nullptr;
  CC_CHECK(comm_->peers[peer]->Irecv(peer, buf, bytes, tag, kind_, req));
  Open(*req);
  comm_->bytesReceived.fetch_add(bytes, std::memory_order_relaxed);
  return ccSuccess;
}

ccResult_t Inflight::RecvAtMost(int peer, void* buf, size_t bytes, uint64_t tag, size_t* received, Request** req) {
  *req = nullptr;
  CC_CHECK(comm_->peers[peer]->IrecvAtMost(peer, buf, bytes, tag, kind_, received, req));
  Open(*req);  // bytesReceived: in Wait, once the length is known
  return ccSuccess;
}

ccResult_t Inflight::Wait(Request** req) {
  Request* r = *req;
  if (r == nullptr) return ccSuccess;
  *req = nullptr;
  Close(r);
  size_t* received = r->received;  // (the transport's Wait frees r)
  CC_CHECK(r->owner->Wait(r, comm_->config.timeoutMs, comm_->idleWork));
  if (received != nullptr) comm_->bytesReceived.fetch_add(*received, std::memory_order_relaxed);
  return ccSuccess;
}

ccResult_t Inflight::WaitAll() {
  while (open_ != nullptr) {
    Request* r = open_;
    CC_CHECK(Wait(&r));
  }
  return ccSuccess;
}

void RegisterComm(ccComm* comm) {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  Live().insert(comm);
}

ccResult_t CheckDeviceCallStream(const ccComm* comm, ccStream_t stream, const char* fn) {
#ifdef CCOLL_HAVE_CUDA
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const bool legacy = s == nullptr || s == cudaStreamLegacy;
  if (legacy && comm->deviceSharedInProcess && !comm->streamTransport) {
    return Fail(ccInvalidUsage, "%s: rank %d shares CUDA device %d with another rank of this communicator in this "
                "process, and its stream is the legacy default stream (NULL or cudaStreamLegacy), which would make "
                "the ranks' device calls wait for one another for ever; give each rank a stream of its own "
                "(cudaStreamCreateWithFlags with cudaStreamNonBlocking)", fn, comm->rank, comm->config.cudaDev);
  }
#if CUDART_VERSION >= 12080
  if (legacy || s == cudaStreamPerThread) return ccSuccess;  // the current device's: the communicator's for the call
  int device = -1;
  const cudaError_t e = cudaStreamGetDevice(s, &device);
  if (e != cudaSuccess) {
    cudaGetLastError();  // (not a stream: left to the call's CUDA work, which reports it)
    return ccSuccess;
  }
  if (device != comm->config.cudaDev) {
    return Fail(ccInvalidUsage, "%s: the stream is on CUDA device %d, but the communicator is bound to device %d "
                "(rank %d); give a stream of the communicator's device", fn, device, comm->config.cudaDev, comm->rank);
  }
#endif
#else
  (void)comm;
  (void)stream;
  (void)fn;
#endif
  return ccSuccess;
}

int LiveCommsOnDevice(int device) {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  int n = 0;
  for (const ccComm* c : Live()) n += c->config.cudaDev == device ? 1 : 0;
  return n;
}

bool UnregisterComm(ccComm* comm) {
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    if (Live().erase(comm) == 0) return false;  // another thread's destroy or abort took it: comm may be gone
  }
  while (comm->activeCalls.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  return true;
}

bool AcquireComm(ccComm* comm) {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  if (Live().count(comm) == 0) return false;
  comm->activeCalls.fetch_add(1);
  return true;
}

void ReleaseComm(ccComm* comm) { comm->activeCalls.fetch_sub(1); }

bool WaitsRunIdleWork(const ccComm& comm) {
  for (const Transport* t : comm.peers) {
    if (t != nullptr && t->RunsIdleWork()) return true;
  }
  return false;
}

}  // namespace ccoll

ccComm::~ccComm() { proxy.reset(); }

ccResult_t ccComm::DeviceProxyOf(ccoll::DeviceProxy** out) {
  std::lock_guard<std::mutex> lock(proxyMutex);
  if (!proxy) {
    if (config.cudaDev < 0) {
      return ccoll::Fail(ccInvalidUsage, "rank %d: the communicator is bound to no CUDA device (there was none at "
                         "init; set ccConfig_t.cudaDev)", rank);
    }
    CC_CHECK(ccoll::DeviceProxy::Create(this, config.cudaDev, &proxy));
  }
  *out = proxy.get();
  return ccSuccess;
}

void ccComm::DrainDevice() {
  ccoll::DeviceProxy* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(proxyMutex);
    p = proxy.get();
  }
  if (p != nullptr) p->Drain();
}

void ccComm::Abort(const char* reason) {
  for (auto& t : transports) t->Abort(reason);
  if (streamTransport) streamTransport->Abort(reason);
}

ccResult_t ccComm::AsyncError() {
  int now = asyncError.load();
  if (now != ccSuccess || !streamTransport) return static_cast<ccResult_t>(now);
  std::string why;
  const ccResult_t r = streamTransport->AsyncError(&why);
  if (r == ccSuccess) return ccSuccess;
  int expected = ccSuccess;
  if (asyncError.compare_exchange_strong(expected, r)) {
    RecordError(why);
    return r;
  }
  return static_cast<ccResult_t>(expected);
}

void ccComm::RecordError(const std::string& sentence) {
  std::lock_guard<std::mutex> lock(errorMutex);
  lastError = sentence;
}

ccResult_t ccComm::CheckUsable(const char* fn) {
  const int async = AsyncError();
  if (async == ccInProgress) {
    return ccoll::Fail(ccInvalidUsage, "%s: rank %d: the communicator's non-blocking init has not finished (poll "
                "ccCommGetAsyncError)", fn, rank);
  }
  if (async != ccSuccess) {
    return ccoll::Fail(static_cast<ccResult_t>(async), "%s: rank %d: the communicator failed earlier (%s); destroy it", fn,
                rank, ccoll::ResultName(static_cast<ccResult_t>(async)));
  }
  return ccSuccess;
}

ccResult_t ccComm::FailInCall(const char* fn, ccResult_t r) {
  const std::string prefix = std::string(fn) + ": ";
  const std::string& last = ccoll::LastError();
  const std::string sentence = last.rfind(prefix, 0) == 0 ? last : prefix + last;
  ccoll::SetLastError(sentence);
  RecordError(sentence);
  failedInStep = false;
  asyncError = r;
  Abort(("rank " + std::to_string(rank) + " failed: " + sentence).c_str());
  return r;
}
