#include "transport/local.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace ccoll {
namespace {

enum class State { kPosted, kCopying, kDone, kError };

constexpr int kSpinYields = 256;

struct LocalRequest : Request {
  int self = 0;
  bool checksum = false;
  DeviceCopier* copier = nullptr;  // set when buf is device memory: the poster's copier moves it
  WireHeader header{};             // a send's header, stamped when it is posted
  std::atomic<State> state{State::kPosted};  // written under the mailbox lock; read without it only to spin
  ccResult_t error = ccSuccess;
  std::string message;
};

// Everything addressed to one rank: the sends other ranks posted to it that it has not received yet, and its
// receives that no send has matched yet. The mutex guards both queues and the state of every request in them,
// sends and receives alike; waiters of either kind sleep on the cv.
struct Mailbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::deque<LocalRequest*>> unmatchedSends;  // by source rank
  std::vector<std::deque<LocalRequest*>> postedRecvs;     // by source rank
  bool present = false;  // a rank's transport holds this mailbox now
  bool joined = false;   // one has, since the group was made: a rank may finish its init and leave before its
                         // slower peers check that it joined (LocalTransport::PeerPresent)
};

LocalRequest* TakeMatch(std::deque<LocalRequest*>* queue, uint64_t tag) {
  for (auto it = queue->begin(); it != queue->end(); ++it) {
    if ((*it)->tag == tag) {
      LocalRequest* r = *it;
      queue->erase(it);
      return r;
    }
  }
  return nullptr;
}

bool Remove(std::deque<LocalRequest*>* queue, LocalRequest* req) {
  for (auto it = queue->begin(); it != queue->end(); ++it) {
    if (*it == req) {
      queue->erase(it);
      return true;
    }
  }
  return false;
}

}  // namespace

class LocalGroup {
 public:
  explicit LocalGroup(int nranks) : nranks(nranks) {
    for (int i = 0; i < nranks; ++i) {
      boxes.emplace_back(new Mailbox());
      boxes.back()->unmatchedSends.resize(nranks);
      boxes.back()->postedRecvs.resize(nranks);
    }
  }
  const int nranks;
  std::vector<std::unique_ptr<Mailbox>> boxes;
  std::atomic<bool> aborted{false};
  std::mutex abortMutex;
  std::string abortReason;
};

namespace {

std::mutex gRegistryMutex;
std::map<std::string, std::weak_ptr<LocalGroup>>& Registry() {
  static auto* registry = new std::map<std::string, std::weak_ptr<LocalGroup>>();
  return *registry;
}

// Copies a matched pair outside the mailbox lock, checks the sender's header against the receive, then publishes
// the result under the lock. A size mismatch fails both sides; a bad header only the receive (the sender did its
// part; the receiver's failure aborts the group).
void Complete(Mailbox* box, LocalRequest* send, LocalRequest* recv) {
  const bool sizeOk = recv->LengthFits(send->bytes);
  DeviceCopier* copier = send->copier != nullptr ? send->copier : recv->copier;
  ccResult_t copyResult = ccSuccess;
  std::string copyError;
  if (sizeOk && send->bytes > 0) {
    if (copier == nullptr) {
      std::memcpy(recv->buf, send->buf, send->bytes);
    } else if ((copyResult = copier->CopyMessage(recv->buf, send->buf, send->bytes)) != ccSuccess) {
      copyError = LastError();
    }
  }
  ccResult_t headerResult = ccSuccess;
  std::string headerError;
  if (sizeOk && copyResult == ccSuccess) {
    WireHeader header = send->header;
    bool checksum = recv->checksum;
    if (copier != nullptr) {  // no CRC on device memory (a host sender stamped one; the payload is not read here)
      header.flags = static_cast<uint8_t>(header.flags & ~kWireFlagCrc);
      header.crc = 0;
      checksum = false;
    }
    headerResult = CheckWireHeader(header, recv->kind, recv->buf, send->bytes, checksum, recv->self, send->self,
                                   send->tag, &headerError);
  }
  std::lock_guard<std::mutex> lock(box->mutex);
  if (sizeOk && copyResult != ccSuccess) {
    for (LocalRequest* r : {send, recv}) {
      r->state = State::kError;
      r->error = copyResult;
      r->message = copyError;
    }
  } else if (!sizeOk) {
    char msg[256];
    std::snprintf(msg, sizeof(msg),
                  "rank %d sent %zu bytes but rank %d expects %s%zu bytes (tag %llu): the ranks called with "
                  "different counts, datatypes or collectives (or a ccSend and its ccRecv differ in size)",
                  send->self, send->bytes, recv->self, recv->received != nullptr ? "at most " : "", recv->bytes,
                  static_cast<unsigned long long>(send->tag));
    for (LocalRequest* r : {send, recv}) {
      r->state = State::kError;
      r->error = ccInvalidUsage;
      r->message = msg;
    }
  } else if (headerResult != ccSuccess) {
    send->state = State::kDone;
    recv->state = State::kError;
    recv->error = headerResult;
    recv->message = headerError;
  } else {
    if (recv->received != nullptr) *recv->received = send->bytes;
    send->state = State::kDone;
    recv->state = State::kDone;
  }
  box->cv.notify_all();
}

}  // namespace

ccResult_t LocalTransport::Create(const std::string& key, int rank, int nranks,
                                  std::unique_ptr<LocalTransport>* out) {
  std::shared_ptr<LocalGroup> group;
  {
    std::lock_guard<std::mutex> lock(gRegistryMutex);
    auto& registry = Registry();
    auto it = registry.find(key);
    if (it != registry.end()) group = it->second.lock();
    if (!group) {
      group = std::make_shared<LocalGroup>(nranks);
      registry[key] = group;
    }
    if (group->nranks != nranks) {
      return Fail(ccInvalidUsage, "rank %d was initialized with nranks %d but another rank of this process used %d",
                  rank, nranks, group->nranks);
    }
    Mailbox* box = group->boxes[rank].get();
    std::lock_guard<std::mutex> boxLock(box->mutex);
    if (box->present) {
      return Fail(ccInvalidUsage, "rank %d joined the same group twice in this process", rank);
    }
    box->present = true;
    box->joined = true;
    // Drop registry entries whose groups are gone.
    for (auto i = registry.begin(); i != registry.end();) {
      i = i->second.expired() ? registry.erase(i) : std::next(i);
    }
  }
  out->reset(new LocalTransport(std::move(group), rank));
  return ccSuccess;
}

LocalTransport::~LocalTransport() {
  Mailbox* box = group_->boxes[rank_].get();
  std::lock_guard<std::mutex> lock(box->mutex);
  box->present = false;
}

bool LocalTransport::PeerPresent(int peer) const {
  Mailbox* box = group_->boxes[peer].get();
  std::lock_guard<std::mutex> lock(box->mutex);
  return box->joined;
}

// Posts a send (isSend) or a receive. Both sides match in the mailbox of the receiving rank: the new request takes
// the first opposite request with its tag from the queue of its peer pair, or waits in its own queue.
ccResult_t LocalTransport::Post(bool isSend, int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind,
                                size_t* received, Request** req) {
  if (group_->aborted.load()) return AbortedError();
  auto* r = new LocalRequest();
  r->Describe(this, isSend, peer, buf, bytes, tag, kind);
  r->received = received;
  r->self = rank_;
  r->checksum = checksum_;
  if (copier_ != nullptr && bytes > 0 && copier_->IsDevice(buf)) r->copier = copier_;
  if (isSend) r->header = MakeWireHeader(kind, buf, bytes, checksum_ && r->copier == nullptr);
  const int receiver = isSend ? peer : rank_, sender = isSend ? rank_ : peer;
  Mailbox* box = group_->boxes[receiver].get();
  auto& opposite = isSend ? box->postedRecvs[sender] : box->unmatchedSends[sender];
  auto& mine = isSend ? box->unmatchedSends[sender] : box->postedRecvs[sender];
  LocalRequest* match = nullptr;
  {
    std::lock_guard<std::mutex> lock(box->mutex);
    match = TakeMatch(&opposite, tag);
    if (match == nullptr) {
      mine.push_back(r);
    } else {
      r->state = State::kCopying;
      match->state = State::kCopying;
    }
  }
  if (match != nullptr) Complete(box, isSend ? r : match, isSend ? match : r);
  *req = r;
  return ccSuccess;
}

ccResult_t LocalTransport::Isend(int peer, const void* buf, size_t bytes, uint64_t tag, WireKind kind,
                                 Request** req) {
  return Post(true, peer, const_cast<void*>(buf), bytes, tag, kind, nullptr, req);
}

ccResult_t LocalTransport::Irecv(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, Request** req) {
  return Post(false, peer, buf, bytes, tag, kind, nullptr, req);
}

ccResult_t LocalTransport::IrecvAtMost(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, size_t* received,
                                       Request** req) {
  return Post(false, peer, buf, bytes, tag, kind, received, req);
}

// No idle work here: a transfer between thread ranks is a copy by one of them, not time on a network, so there is
// nothing to hide it behind, and on a machine with fewer cores than ranks the work would only keep a peer's copy from
// running.
ccResult_t LocalTransport::Wait(Request* request, int timeoutMs, IdleWork* /*idle*/) {
  auto* r = static_cast<LocalRequest*>(request);
  std::unique_ptr<LocalRequest> owned(r);
  Mailbox* box = group_->boxes[r->isSend ? r->peer : r->self].get();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  // Peers usually answer within microseconds: yield a little before paying for a sleep and a wake-up.
  for (int spin = 0; spin < kSpinYields && r->state.load(std::memory_order_acquire) != State::kDone &&
                     r->state.load(std::memory_order_acquire) != State::kError && !group_->aborted.load();
       ++spin) {
    std::this_thread::yield();
  }
  std::unique_lock<std::mutex> lock(box->mutex);
  while (true) {
    if (r->state == State::kDone) return ccSuccess;
    if (r->state == State::kError) return Fail(r->error, "%s", r->message.c_str());
    bool aborted = group_->aborted.load();
    bool timedOut = std::chrono::steady_clock::now() >= deadline;
    if (r->state == State::kPosted && (aborted || timedOut)) {
      auto& queue = r->isSend ? box->unmatchedSends[r->self] : box->postedRecvs[r->peer];
      Remove(&queue, r);
      lock.unlock();
      if (aborted) return AbortedError();
      if (r->isSend) {
        return Fail(ccTimeout, "rank %d timed out after %d ms waiting for rank %d to receive (tag %llu)", r->self,
                    timeoutMs, r->peer, static_cast<unsigned long long>(r->tag));
      }
      return Fail(ccTimeout, "rank %d timed out after %d ms waiting for data from rank %d (tag %llu)", r->self,
                  timeoutMs, r->peer, static_cast<unsigned long long>(r->tag));
    }
    if (r->state == State::kCopying) {
      box->cv.wait(lock);  // a copy in progress finishes without waiting on anyone, even past the deadline
    } else {
      box->cv.wait_until(lock, deadline);
    }
  }
}

ccResult_t LocalTransport::AbortedError() {
  std::lock_guard<std::mutex> lock(group_->abortMutex);
  return Fail(ccRemoteError, "rank %d: %s", rank_, group_->abortReason.c_str());
}

void LocalTransport::Abort(const char* reason) {
  {
    std::lock_guard<std::mutex> lock(group_->abortMutex);
    if (group_->aborted.load()) return;
    group_->abortReason = reason;
    group_->aborted.store(true);
  }
  for (auto& box : group_->boxes) {
    std::lock_guard<std::mutex> lock(box->mutex);
    box->cv.notify_all();
  }
}

}  // namespace ccoll
