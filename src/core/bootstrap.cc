#include "core/bootstrap.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/job_secret.h"
#include "core/log.h"

namespace ccoll {
namespace {

// Rank -> root, followed by infoLen bytes of blob.
struct HelloHeader {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[kSecretBytes];
  int32_t rank;
  int32_t nranks;
  uint32_t infoLen;
  uint32_t timeoutMs;  // the rank's timeout: the root gives up on missing ranks after the shortest one it hears
};

// Rank -> root for every all-gather after the first, followed by len bytes. With kLeaveMagic instead (a rank that
// gives up, BootstrapSession::Leave) the bytes are its reason, at most kMaxLeaveText of them.
struct RoundHeader {
  uint32_t magic;
  uint32_t len;
};
constexpr uint32_t kLeaveMagic = 0x4c424343;  // "CCBL"

// Why the root turned a rank away (ReplyHeader::reason, with status ccInvalidUsage).
enum TurnAway : uint32_t {
  kNotTurnedAway = 0,
  kOtherSecret = 1,
  kOtherNranks = 2,
  kJoinedTwice = 3,
  kOtherVersion = 4,
};

// Root -> rank, followed (when status == 0) by nranks records of {uint32 len, len bytes}; otherwise by `textLen`
// bytes saying why: which ranks never joined (ccTimeout), which were lost (ccRemoteError), or why this rank was
// turned away (ccInvalidUsage, with the reason).
struct ReplyHeader {
  uint32_t magic;
  uint32_t status;  // 0 ok; otherwise a ccResult_t
  int32_t nranks;
  uint32_t textLen;
  uint32_t reason;  // a TurnAway
  uint32_t reserved;
};
// Every version's reply begins with magic, status, nranks and textLen (version 1's was only these): a rank of another
// ccoll version is answered with them and a text, which it reads as why it was turned away.
constexpr size_t kReplyPrefixBytes = offsetof(ReplyHeader, reason);
static_assert(kReplyPrefixBytes == 16 && sizeof(ReplyHeader) == 24, "the reply's layout is part of the protocol");
constexpr uint32_t kMaxReplyText = 512;
constexpr int kRootVerdictGraceMs = 1000;

bool SecretEqual(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;  // constant time: do not leak how much of a guess was right
  for (int i = 0; i < kSecretBytes; ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

// One accepted connection whose hello is still arriving.
struct Pending {
  int fd = -1;
  Deadline deadline;
  HelloHeader header{};
  size_t got = 0;  // bytes of header + info received
  std::string info;
  bool stranger = false;  // its secret or version is not the root's: its info is read and dropped, then it is turned
                          // away
};

class Root {
 public:
  // listenFd < 0: no listener; the root serves the connections in `open` only and returns once each was dropped or
  // joined (BootstrapServeConnections).
  Root(int listenFd, const uint8_t* secret, int timeoutMs, std::vector<int> open = {},
       std::shared_ptr<std::atomic<bool>> stop = nullptr)
      : listenFd_(listenFd), timeoutMs_(timeoutMs), open_(std::move(open)), stop_(std::move(stop)) {
    std::memcpy(secret_, secret, kSecretBytes);
  }
  void Run();

 private:
  // Returns false when the connection must be dropped; sets *complete when the hello is whole and valid.
  bool Advance(Pending* p, bool* complete);
  bool Accept(Pending* p);
  bool Reply();
  void ReplyMissing();  // after a timeout: tells the ranks that joined which ones did not
  void ReplyLost();     // after a rank was lost between rounds: tells the others which one
  // Reads every rank's next blob; false when the ranks are done (or one failed).
  bool NextRound();
  // Reads the reason of rank r's Leave (its header, of `len`, already read) into leftWhy_.
  void ReadLeave(int r, uint32_t len, Deadline deadline);
  // Gives up the round on rank r (silent, malformed or cut short): lost are r, the ranks that `left` earlier in the
  // round, and any later rank that has already closed or whose Leave already waits (read without blocking), so the
  // others hear why.
  bool GiveUp(int r, const std::vector<int>& left);

  int listenFd_;
  int timeoutMs_;
  Deadline end_{};  // when the root stops waiting for ranks to join
  std::vector<int> open_;
  std::shared_ptr<std::atomic<bool>> stop_;  // BootstrapStartRoot's `stop`
  bool stopped_ = false;                     // it stopped the wait for ranks
  uint8_t secret_[kSecretBytes];
  int nranks_ = -1;
  std::vector<int> rankFd_;
  std::vector<std::string> infos_;
  int joined_ = 0;
  std::vector<int> lost_;  // ranks that died or left while the others continued
  std::vector<std::string> leftWhy_;  // per rank: the reason a rank that left gave (Leave), else empty
  std::vector<std::string> turnedAway_;  // the first few hellos turned away, for the ranks still waiting
  std::string acceptError_;              // why accepting a connection failed (out of file descriptors), for them too
  Deadline acceptRest_{};                // the listener is not polled before then
};

bool Root::Advance(Pending* p, bool* complete) {
  *complete = false;
  char* hdr = reinterpret_cast<char*>(&p->header);
  char sink[4096];  // a stranger's info goes here, unread
  while (true) {
    size_t want;
    char* dst;
    if (p->got < sizeof(HelloHeader)) {
      want = sizeof(HelloHeader) - p->got;
      dst = hdr + p->got;
    } else {
      size_t infoGot = p->got - sizeof(HelloHeader);
      want = p->header.infoLen - infoGot;
      if (want == 0) break;
      if (p->stranger) {
        want = std::min(want, sizeof(sink));
        dst = sink;
      } else {
        dst = &p->info[infoGot];
      }
    }
    ssize_t n = recv(p->fd, dst, want, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    p->got += static_cast<size_t>(n);
    if (p->got == sizeof(HelloHeader)) {
      const HelloHeader& h = p->header;
      if (h.magic != kBootstrapMagic) {
        CC_WARN("bootstrap root: dropped a connection with a bad magic (0x%x)", h.magic);
        return false;
      }
      if (h.infoLen > kMaxRankInfoBytes || h.nranks < 1 || h.nranks > kMaxRanks || h.rank < 0 ||
          h.rank >= h.nranks) {
        CC_WARN("bootstrap root: dropped a hello with rank %d nranks %d info %u bytes", h.rank, h.nranks,
                h.infoLen);
        return false;
      }
      // A hello without the secret is read to its end (so that closing does not reset the connection under the
      // answer) but not kept: a stranger costs the root nothing but its socket.
      p->stranger = !SecretEqual(h.secret, secret_) || h.version != kBootstrapVersion;
      if (!p->stranger) p->info.assign(h.infoLen, '\0');
    }
  }
  *complete = true;
  return true;
}

bool Root::Accept(Pending* p) {
  const HelloHeader& h = p->header;
  // A rejected rank is told why; the hello is read whole first, so that closing does not reset the connection
  // under the answer. The version and the secret first: a hello without them says nothing about the group.
  std::string why;
  const bool knowsSecret = !p->stranger;  // and speaks this version
  if (knowsSecret && nranks_ < 0) {
    nranks_ = h.nranks;
    rankFd_.assign(nranks_, -1);
    infos_.assign(nranks_, std::string());
  }
  std::string brief;  // for the ranks that wait for the group
  TurnAway reason = kNotTurnedAway;
  if (h.version != kBootstrapVersion) {
    why = "the ranks run different ccoll versions: bootstrap protocol " + std::to_string(h.version) +
          " at this rank, " + std::to_string(kBootstrapVersion) + " at the root";
    brief = "bootstrap protocol " + std::to_string(h.version);
    reason = kOtherVersion;
  } else if (!knowsSecret) {
    why = "its secret differs from the root's (the unique id's; with ccCommInitFromEnv, a hash of CC_SECRET or of "
          "the job's id, the same on every rank of a job): a rank of another job given the same address is turned "
          "away";
    brief = "another secret";
    reason = kOtherSecret;
  } else if (h.nranks != nranks_) {
    why = "it announced nranks " + std::to_string(h.nranks) + ", the group has " + std::to_string(nranks_) + " ranks";
    brief = "nranks " + std::to_string(h.nranks);
    reason = kOtherNranks;
  } else if (rankFd_[h.rank] >= 0) {
    why = "rank " + std::to_string(h.rank) + " joined already";
    brief = "joined twice";
    reason = kJoinedTwice;
  }
  if (!why.empty()) {
    CC_WARN("bootstrap root: turned away a rank %d: %s", h.rank, why.c_str());
    if (turnedAway_.size() < 4) turnedAway_.push_back("a rank " + std::to_string(h.rank) + " (" + brief + ")");
    why.resize(std::min<size_t>(why.size(), kMaxReplyText));
    ReplyHeader bad{kBootstrapMagic, static_cast<uint32_t>(ccInvalidUsage), nranks_, static_cast<uint32_t>(why.size()),
                    reason, 0};
    const size_t headerBytes = reason == kOtherVersion ? kReplyPrefixBytes : sizeof(bad);
    if (SendAll(p->fd, &bad, headerBytes, DeadlineIn(1000), "bootstrap rejection") == ccSuccess) {
      SendAll(p->fd, why.data(), why.size(), DeadlineIn(1000), "bootstrap rejection");
    }
    return false;
  }
  rankFd_[h.rank] = p->fd;
  if (h.timeoutMs > 0 && h.timeoutMs < static_cast<uint32_t>(timeoutMs_)) {
    // The ranks wait this long for the root's answer: give up on missing ranks by then, and say so in time.
    timeoutMs_ = static_cast<int>(h.timeoutMs);
    end_ = std::min(end_, Clock::now() + std::chrono::milliseconds(timeoutMs_));
  }
  infos_[h.rank] = std::move(p->info);
  ++joined_;
  CC_INFO(kLogBoot, "bootstrap root: rank %d of %d joined", h.rank, nranks_);
  return true;
}

void Root::ReadLeave(int r, uint32_t len, Deadline deadline) {
  std::string why(len, '\0');
  if (len > 0 && RecvAll(rankFd_[r], &why[0], len, deadline, "a bootstrap leave") != ccSuccess) why.clear();
  for (char& c : why) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';  // (untrusted bytes, to be shown to users)
  }
  leftWhy_.resize(nranks_);
  leftWhy_[r] = why;
}

bool Root::GiveUp(int r, const std::vector<int>& left) {
  lost_ = left;
  lost_.push_back(r);
  for (int q = r + 1; q < nranks_; ++q) {
    RoundHeader h{};
    const ssize_t got = recv(rankFd_[q], &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      lost_.push_back(q);  // closed (or broken) without a word
      continue;
    }
    if (got != static_cast<ssize_t>(sizeof(h)) || h.magic != kLeaveMagic || h.len > kMaxLeaveText) continue;
    if (recv(rankFd_[q], &h, sizeof(h), MSG_DONTWAIT) != static_cast<ssize_t>(sizeof(h))) continue;
    ReadLeave(q, h.len, DeadlineIn(100));
    lost_.push_back(q);
  }
  return false;
}

bool Root::NextRound() {
  Deadline deadline = DeadlineIn(timeoutMs_);
  std::vector<int> left;  // ranks that closed their connection, or left saying why (Leave)
  for (int r = 0; r < nranks_; ++r) {
    RoundHeader h{};
    char probe;
    // A rank that closed its connection is done with the bootstrap; all ranks make the same choice.
    pollfd pfd{rankFd_[r], POLLIN, 0};
    if (poll(&pfd, 1, RemainingMs(deadline)) <= 0) {
      CC_WARN("bootstrap root: rank %d neither continued nor left within %d ms", r, timeoutMs_);
      return GiveUp(r, left);
    }
    ssize_t n = recv(rankFd_[r], &probe, 1, MSG_PEEK);
    if (n <= 0) {
      left.push_back(r);
      continue;
    }
    if (RecvAll(rankFd_[r], &h, sizeof(h), deadline, "a bootstrap round") != ccSuccess) {
      CC_WARN("bootstrap root: rank %d sent part of a round header", r);
      return GiveUp(r, left);
    }
    if (h.magic == kLeaveMagic && h.len <= kMaxLeaveText) {
      ReadLeave(r, h.len, deadline);
      left.push_back(r);
      continue;
    }
    if (h.magic != kBootstrapMagic || h.len > kMaxRankInfoBytes) {
      CC_WARN("bootstrap root: rank %d sent a malformed round", r);
      return GiveUp(r, left);
    }
    infos_[r].resize(h.len);
    if (RecvAll(rankFd_[r], &infos_[r][0], h.len, deadline, "a bootstrap round") != ccSuccess) {
      return GiveUp(r, left);
    }
  }
  const int closed = static_cast<int>(left.size());
  if (closed != 0 && closed != nranks_) {
    CC_WARN("bootstrap root: %d of %d ranks left before a round", closed, nranks_);
    lost_ = left;
  }
  return closed == 0;
}

bool Root::Reply() {
  std::string payload;
  for (const std::string& info : infos_) {
    uint32_t len = static_cast<uint32_t>(info.size());
    payload.append(reinterpret_cast<const char*>(&len), sizeof(len));
    payload.append(info);
  }
  ReplyHeader ok{kBootstrapMagic, 0, nranks_, 0, kNotTurnedAway, 0};
  Deadline deadline = DeadlineIn(timeoutMs_);
  // Every rank gets its answer even when one cannot be reached (it died after joining): the others then find the
  // dead peer when they connect to it, at once, instead of waiting for the timeout.
  bool all = true;
  for (int r = 0; r < nranks_; ++r) {
    if (SendAll(rankFd_[r], &ok, sizeof(ok), deadline, "bootstrap reply") != ccSuccess ||
        SendAll(rankFd_[r], payload.data(), payload.size(), deadline, "bootstrap reply") != ccSuccess) {
      CC_WARN("bootstrap root: could not answer rank %d", r);
      lost_.push_back(r);
      all = false;
    }
  }
  return all;
}

void Root::ReplyMissing() {
  std::string missing;
  int count = 0;
  for (int r = 0; r < nranks_; ++r) {
    if (rankFd_[r] >= 0) continue;
    if (count < 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    ++count;
  }
  if (count > 16) missing += ", ...";
  std::string text = "rank" + std::string(count > 1 ? "s " : " ") + missing + " of " + std::to_string(nranks_) +
                     " did not join within " + std::to_string(timeoutMs_) + " ms";
  if (stopped_) {
    text = "the root's rank gave up its init (ccCommAbort or ccCommDestroy) before rank" +
           std::string(count > 1 ? "s " : " ") + missing + " of " + std::to_string(nranks_) + " joined";
  }
  for (size_t i = 0; i < turnedAway_.size(); ++i) text += (i == 0 ? "; turned away: " : ", ") + turnedAway_[i];
  if (!acceptError_.empty()) text += "; the root could not accept connections for a while: " + acceptError_;
  text.resize(std::min<size_t>(text.size(), kMaxReplyText));
  const auto status = static_cast<uint32_t>(stopped_ ? ccRemoteError : ccTimeout);
  ReplyHeader fail{kBootstrapMagic, status, nranks_, static_cast<uint32_t>(text.size()), kNotTurnedAway, 0};
  Deadline deadline = DeadlineIn(1000);
  for (int r = 0; r < nranks_; ++r) {
    if (rankFd_[r] < 0) continue;
    if (SendAll(rankFd_[r], &fail, sizeof(fail), deadline, "bootstrap reply") == ccSuccess) {
      SendAll(rankFd_[r], text.data(), text.size(), deadline, "bootstrap reply");
    }
  }
}

void Root::ReplyLost() {
  if (lost_.empty()) return;
  // First the ranks that died or lost their connection (or failed where they could not say), the likelier cause;
  // then the ranks that said why they left, each with its reason, as far as the reply's text allows.
  std::string text;
  std::vector<int> silent, said;
  for (int r : lost_) {
    (r < static_cast<int>(leftWhy_.size()) && !leftWhy_[r].empty() ? said : silent).push_back(r);
  }
  if (!silent.empty()) {
    std::string list;
    for (size_t i = 0; i < silent.size() && i < 16; ++i) list += (i ? ", " : "") + std::to_string(silent[i]);
    if (silent.size() > 16) list += ", ...";
    text = "rank" + std::string(silent.size() > 1 ? "s " : " ") + list + " of " + std::to_string(nranks_) +
           " left the bootstrap while the others continued (died, stalled, or its connection was lost)";
  }
  for (int r : said) {
    text += (text.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " of " + std::to_string(nranks_) +
            " left the bootstrap: " + leftWhy_[r];
  }
  text.resize(std::min<size_t>(text.size(), kMaxReplyText));
  ReplyHeader fail{kBootstrapMagic, static_cast<uint32_t>(ccRemoteError), nranks_,
                   static_cast<uint32_t>(text.size()), kNotTurnedAway, 0};
  std::vector<pollfd> open;
  Deadline deadline = DeadlineIn(1000);
  for (int r = 0; r < nranks_; ++r) {
    if (rankFd_[r] < 0 || std::find(lost_.begin(), lost_.end(), r) != lost_.end()) continue;
    // A rank reads this as the answer to its next (or current) round.
    if (SendAll(rankFd_[r], &fail, sizeof(fail), deadline, "bootstrap reply") == ccSuccess &&
        SendAll(rankFd_[r], text.data(), text.size(), deadline, "bootstrap reply") == ccSuccess) {
      open.push_back({rankFd_[r], POLLIN, 0});
    }
  }
  // Closing now would reset the connection of a rank that is still sending its round, and it would see a broken
  // pipe instead of this answer: read (and drop) what the ranks send until they close, for a bounded time.
  Deadline end = DeadlineIn(std::min(timeoutMs_, 5000));
  char sink[4096];
  while (!open.empty() && Clock::now() < end) {
    if (poll(open.data(), open.size(), std::max(1, RemainingMs(end))) <= 0) break;
    std::vector<pollfd> next;
    for (const pollfd& p : open) {
      if (p.revents == 0 || recv(p.fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) next.push_back({p.fd, POLLIN, 0});
    }
    open.swap(next);
  }
}

void Root::Run() {
  end_ = DeadlineIn(timeoutMs_);
  std::vector<Pending> pending;
  const int kHandshakeMs = 10000;  // a connection must deliver its hello within this time
  for (int fd : open_) {
    Pending p;
    p.fd = fd;
    p.deadline = DeadlineIn(kHandshakeMs);
    pending.push_back(std::move(p));
  }
  // The loop wakes every 100 ms for as long as the root waits, in a detached thread that may still be waiting when
  // the process exits, so its vectors keep their memory from turn to turn instead of allocating anew each time.
  // (LeakSanitizer, checking at exit, once caught such a turn's allocation in flight, and reported it as leaked.)
  std::vector<pollfd> fds;
  std::vector<Pending> next;
  while (nranks_ < 0 || joined_ < nranks_) {
    if (Clock::now() >= end_) {
      CC_WARN("bootstrap root: timed out after %d ms with %d of %d ranks joined", timeoutMs_, joined_, nranks_);
      break;
    }
    if (listenFd_ < 0 && pending.empty()) break;  // nothing more can arrive
    if (stop_ && stop_->load()) {
      CC_INFO(kLogBoot, "bootstrap root: its rank gave up its init, with %d of %d ranks joined", joined_, nranks_);
      stopped_ = true;
      break;
    }
    fds.clear();
    // While accepting fails for want of resources, the connection stays queued and the listener readable: the
    // listener rests out of the poll for 100 ms at a time (poll ignores a negative fd) rather than spin on it.
    const bool resting = Clock::now() < acceptRest_;
    fds.push_back({resting ? -1 : listenFd_, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    int r = poll(fds.data(), fds.size(), std::max(0, std::min(100, RemainingMs(end_))));
    if (r < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      int fd = accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        Pending p;
        p.fd = fd;
        p.deadline = DeadlineIn(kHandshakeMs);
        pending.push_back(std::move(p));
      } else if (const int err = errno; err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        if (acceptError_.empty()) {
          acceptError_ = std::string(std::strerror(err)) +
                         (err == EMFILE ? " (raise the limit of open files, ulimit -n, on rank 0's host)" : "");
          CC_WARN("bootstrap root: cannot accept a rank's connection: %s; retrying every 100 ms",
                  acceptError_.c_str());
        }
        acceptRest_ = DeadlineIn(100);
      }
    }
    next.clear();
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      bool keep = true;
      bool complete = false;
      if (i + 1 < fds.size() && fds[i + 1].revents != 0) keep = Advance(&p, &complete);
      if (keep && !complete && Clock::now() >= p.deadline) {
        CC_WARN("bootstrap root: dropped a connection that sent no complete hello within %d ms", kHandshakeMs);
        keep = false;
      }
      if (keep && complete) {
        if (!Accept(&p)) CloseFd(p.fd);
        continue;
      }
      if (keep) {
        next.push_back(std::move(p));
      } else {
        CloseFd(p.fd);
      }
    }
    pending.swap(next);
  }
  for (Pending& p : pending) CloseFd(p.fd);
  CloseFd(listenFd_);
  if (nranks_ > 0 && joined_ == nranks_) {
    while (Reply() && NextRound()) {
    }
    ReplyLost();
  } else if (nranks_ > 0) {
    ReplyMissing();  // the ranks that joined learn who is missing instead of timing out on their own
  }
  for (int fd : rankFd_) CloseFd(fd);
}

// For a rank turned away for its secret: where the secret came from, when it is ccCommInitFromEnv's (a hash of the
// job's environment); "" for a unique id's random secret.
std::string SecretHint(const uint8_t* secret) {
  uint8_t fromEnv[kSecretBytes];
  const std::string source = JobSecret(fromEnv);
  if (std::memcmp(fromEnv, secret, kSecretBytes) != 0) return "";
  return " (this rank's secret: a hash of " + (source.empty() ? std::string("nothing, zeros") : source) +
         "; ranks started by different launchers or launcher steps share CC_SECRET or CC_JOB_ID)";
}

}  // namespace

ccResult_t RandomBytes(void* out, size_t bytes) {
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Fail(ccSystemError, "cannot open /dev/urandom: %s", std::strerror(errno));
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    ssize_t n = read(fd, p, bytes);
    if (n <= 0) {
      close(fd);
      return Fail(ccSystemError, "cannot read /dev/urandom");
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  close(fd);
  return ccSuccess;
}

ccResult_t BootstrapStartRoot(const SocketAddress* root, const uint8_t* secret, int timeoutMs, ccUniqueId* id,
                              std::shared_ptr<std::atomic<bool>> stop) {
  UniqueIdContent content{};
  content.magic = kUniqueIdMagic;
  content.version = kBootstrapVersion;
  if (root != nullptr) {
    content.root = *root;
  } else {
    CC_CHECK(ChooseBootstrapAddress(&content.root));
  }
  if (secret != nullptr) {
    std::memcpy(content.secret, secret, kSecretBytes);
  } else {
    CC_CHECK(RandomBytes(content.secret, kSecretBytes));
  }
  int fd = -1;
  CC_CHECK(Listen(&content.root, &fd));
  try {
    auto root = std::make_shared<Root>(fd, content.secret, timeoutMs, std::vector<int>{}, std::move(stop));
    std::thread([root] { root->Run(); }).detach();
  } catch (const std::exception& e) {
    CloseFd(fd);
    return Fail(ccSystemError, "cannot start the bootstrap root thread: %s", e.what());
  }
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, &content, sizeof(content));
  CC_INFO(kLogBoot, "bootstrap root listening on %s", ToString(content.root).c_str());
  return ccSuccess;
}

void BootstrapServeConnections(const std::vector<int>& fds, const uint8_t* secret, int timeoutMs) {
  Root root(-1, secret, timeoutMs, fds);
  root.Run();
}

ccResult_t BootstrapParseId(const ccUniqueId& id, UniqueIdContent* out) {
  std::memcpy(out, id.internal, sizeof(*out));
  if (out->magic != kUniqueIdMagic || out->version != kBootstrapVersion ||
      (out->root.family != AF_INET && out->root.family != AF_INET6) || out->root.port == 0) {
    return Fail(ccInvalidArgument,
                "the unique id is not one made by ccGetUniqueId of this ccoll version (magic 0x%x version %u)",
                out->magic, out->version);
  }
  return ccSuccess;
}

BootstrapSession::~BootstrapSession() { CloseFd(fd_); }

void BootstrapSession::Leave(const std::string& why) {
  if (fd_ >= 0 && betweenRounds_) {
    // Header and reason in one buffer, sent without blocking for more than half a second and without a word of its
    // own: a root that is gone or not reading just misses it (the caller's error is the one that counts).
    const std::string text = why.substr(0, kMaxLeaveText);
    const RoundHeader h{kLeaveMagic, static_cast<uint32_t>(text.size())};
    std::string bytes(reinterpret_cast<const char*>(&h), sizeof(h));
    bytes += text;
    const Deadline deadline = DeadlineIn(500);
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || RemainingMs(deadline) <= 0) break;
      pollfd pfd{fd_, POLLOUT, 0};
      const int ready = poll(&pfd, 1, RemainingMs(deadline));
      if (ready == 0 || (ready < 0 && errno != EINTR)) break;
    }
  }
  CloseFd(fd_);
  fd_ = -1;
  betweenRounds_ = false;
}

ccResult_t BootstrapSession::AllGather(const std::string& mine, std::vector<std::string>* all) {
  if (mine.size() > kMaxRankInfoBytes) {
    return Fail(ccInternalError, "bootstrap blob of %zu bytes exceeds %u", mine.size(), kMaxRankInfoBytes);
  }
  Deadline deadline = DeadlineIn(timeoutMs_);
  betweenRounds_ = false;
  if (fd_ < 0) {
    CC_CHECK(Connect(id_.root, deadline, &fd_, cancel_));
    HelloHeader hello{};
    hello.magic = kBootstrapMagic;
    hello.version = kBootstrapVersion;
    std::memcpy(hello.secret, id_.secret, kSecretBytes);
    hello.rank = rank_;
    hello.nranks = nranks_;
    hello.infoLen = static_cast<uint32_t>(mine.size());
    hello.timeoutMs = timeoutMs_ > 0 ? static_cast<uint32_t>(timeoutMs_) : 0;
    CC_CHECK(SendAll(fd_, &hello, sizeof(hello), deadline, "the bootstrap hello", cancel_));
  } else {
    RoundHeader h{kBootstrapMagic, static_cast<uint32_t>(mine.size())};
    CC_CHECK(SendAll(fd_, &h, sizeof(h), deadline, "a bootstrap round", cancel_));
  }
  CC_CHECK(SendAll(fd_, mine.data(), mine.size(), deadline, "a bootstrap blob", cancel_));
  betweenRounds_ = true;  // whatever comes of the reply, the root reads this rank's next bytes as its next round
  // The root answers within its own timeout, also when it gives up (then it names the ranks that never joined):
  // wait a little longer than that for its answer, so a rank reports the root's verdict rather than a bare timeout.
  return ReceiveAll(all, deadline + std::chrono::milliseconds(kRootVerdictGraceMs));
}

ccResult_t BootstrapSession::ReceiveAll(std::vector<std::string>* all, Deadline deadline) {
  ReplyHeader reply{};
  ccResult_t r = RecvAll(fd_, &reply, sizeof(reply), deadline, "the bootstrap reply", cancel_);
  if (r != ccSuccess) {
    return Fail(r, "rank %d of %d: no answer from the bootstrap root %s (%s); did every rank start?", rank_, nranks_,
                ToString(id_.root).c_str(), LastError().c_str());
  }
  if (reply.magic != kBootstrapMagic) return Fail(ccRemoteError, "bootstrap root sent a malformed reply");
  if ((reply.status == static_cast<uint32_t>(ccTimeout) || reply.status == static_cast<uint32_t>(ccRemoteError)) &&
      reply.textLen <= kMaxReplyText) {
    std::string text(reply.textLen, '\0');
    if (RecvAll(fd_, &text[0], text.size(), deadline, "the bootstrap reply", cancel_) != ccSuccess) text = "?";
    return Fail(static_cast<ccResult_t>(reply.status), "rank %d of %d: the bootstrap root gave up: %s", rank_, nranks_,
                text.c_str());
  }
  if (reply.status != 0) {
    std::string why(reply.textLen <= kMaxReplyText ? reply.textLen : 0, '\0');
    if (why.empty() || RecvAll(fd_, &why[0], why.size(), deadline, "the bootstrap reply", cancel_) != ccSuccess) {
      why = "nranks " + std::to_string(nranks_) + ", the group has " + std::to_string(reply.nranks) +
            " ranks, or rank " + std::to_string(rank_) + " joined twice";
    }
    if (reply.reason == kOtherSecret) why += SecretHint(id_.secret);
    return Fail(ccInvalidUsage, "rank %d of %d: the bootstrap root %s turned this rank away: %s", rank_, nranks_,
                ToString(id_.root).c_str(), why.c_str());
  }
  if (reply.nranks != nranks_) {
    return Fail(ccRemoteError, "bootstrap reply has %d ranks, expected %d", reply.nranks, nranks_);
  }
  all->assign(nranks_, std::string());
  for (int i = 0; i < nranks_; ++i) {
    uint32_t len = 0;
    CC_CHECK(RecvAll(fd_, &len, sizeof(len), deadline, "the bootstrap reply", cancel_));
    if (len > kMaxRankInfoBytes) return Fail(ccRemoteError, "bootstrap reply record %d is %u bytes", i, len);
    (*all)[i].resize(len);
    CC_CHECK(RecvAll(fd_, &(*all)[i][0], len, deadline, "the bootstrap reply", cancel_));
  }
  return ccSuccess;
}

ccResult_t BootstrapAllGather(const UniqueIdContent& id, int rank, int nranks, const std::string& myInfo,
                              int timeoutMs, std::vector<std::string>* all) {
  BootstrapSession session(id, rank, nranks, timeoutMs);
  return session.AllGather(myInfo, all);
}

}  // namespace ccoll
