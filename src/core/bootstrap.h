// Bootstrap over TCP, like NCCL's: ccGetUniqueId starts a root listener whose address and a random secret travel
// in the unique id; every rank connects to the root, proves it knows the secret, and receives the blobs of all
// ranks (an all-gather of transport addresses). Connections that do not speak the protocol, or do not know the
// secret, are dropped without disturbing the job.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ccoll.h"
#include "core/socket.h"

namespace ccoll {

constexpr uint32_t kUniqueIdMagic = 0x44495543;   // "CUID"
constexpr uint32_t kBootstrapMagic = 0x53424343;  // "CCBS"
constexpr uint32_t kBootstrapVersion = 3;  // 3: a rank that gives up between rounds says why (Leave)
constexpr uint32_t kMaxRankInfoBytes = 1 << 16;   // bound on one rank's blob
constexpr int kMaxRanks = 1 << 16;
constexpr int kSecretBytes = 16;

// The unique id's content (fits in CC_UNIQUE_ID_BYTES).
struct UniqueIdContent {
  uint32_t magic;
  uint32_t version;
  SocketAddress root;
  uint8_t secret[kSecretBytes];
};
static_assert(sizeof(UniqueIdContent) <= CC_UNIQUE_ID_BYTES, "unique id too small");

// Fills `secret` from the kernel's random source.
ccResult_t RandomBytes(void* out, size_t bytes);

// Starts a root listener thread on an address chosen by CC_SOCKET_IFNAME (or `root` when given, for CC_ROOT
// launches) and writes the id. The thread ends once all ranks have been answered or after `timeoutMs`, or, while
// ranks have still to join, within 100 ms of `*stop` becoming true (when given: its owner gave up), telling the ranks
// that joined and closing its port.
ccResult_t BootstrapStartRoot(const SocketAddress* root, const uint8_t* secret, int timeoutMs, ccUniqueId* id,
                              std::shared_ptr<std::atomic<bool>> stop = nullptr);

// The root's side of the protocol (what the listener thread runs) over connections that are already open instead of
// a listener: hellos, rounds and replies, until each connection was dropped or joined and the rounds ended. Takes
// the fds. For the fuzzer (tests/fuzz), which feeds the root untrusted bytes through socketpairs.
void BootstrapServeConnections(const std::vector<int>& fds, const uint8_t* secret, int timeoutMs);

// Decodes and validates an id.
ccResult_t BootstrapParseId(const ccUniqueId& id, UniqueIdContent* out);

// One rank's connection to the root. The first all-gather joins the group; later ones (AllGather again) reuse the
// connection, every rank the same number of times. Destroying the session tells the root this rank is done.
class BootstrapSession {
 public:
  // cancel (may be null): when it becomes true, a pending AllGather gives up within ~50 ms (ccCommAbort).
  BootstrapSession(const UniqueIdContent& id, int rank, int nranks, int timeoutMs,
                   const std::atomic<bool>* cancel = nullptr)
      : id_(id), rank_(rank), nranks_(nranks), timeoutMs_(timeoutMs), cancel_(cancel) {}
  ~BootstrapSession();
  BootstrapSession(const BootstrapSession&) = delete;
  BootstrapSession& operator=(const BootstrapSession&) = delete;

  // Sends `mine` and receives every rank's blob, index = rank.
  ccResult_t AllGather(const std::string& mine, std::vector<std::string>* all);

  // For a rank that gives up after joining (its init failed between rounds): tells the root why, in place of its
  // next round, so that the ranks still in the bootstrap hear the cause ("rank 1 of 4 left the bootstrap: rank 1:
  // cannot create a UCX endpoint to rank 0 ...") rather than only that this rank left. Best effort, within half a
  // second; nothing is sent where the connection is not between rounds (never joined, or a round half sent). The
  // text is cut at kMaxLeaveText bytes. Then closes the connection.
  void Leave(const std::string& why);

 private:
  ccResult_t ReceiveAll(std::vector<std::string>* all, Deadline deadline);
  UniqueIdContent id_;
  int rank_;
  int nranks_;
  int timeoutMs_;
  const std::atomic<bool>* cancel_;
  int fd_ = -1;
  bool betweenRounds_ = false;  // joined, and no round half sent: the root reads what comes next as a round header
};

constexpr uint32_t kMaxLeaveText = 240;  // a leaving rank's reason, as the root passes it on

// A one-round session: join, all-gather once, leave.
ccResult_t BootstrapAllGather(const UniqueIdContent& id, int rank, int nranks, const std::string& myInfo,
                              int timeoutMs, std::vector<std::string>* all);

}  // namespace ccoll
