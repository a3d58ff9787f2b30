#include "transport/ucx.h"

#include <poll.h>
#include <sched.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/fnv.h"
#include "core/log.h"

namespace ccoll {
namespace {

using Clock = std::chrono::steady_clock;

// One message: the header and the payload as one UCP iov message, or, for a payload longer than splitBytes, the
// header alone (kWireFlagSplit) and then the payload as a contiguous message with the same tag, which UCX matches in
// order. A receive of such a length posts both: the iov (header and payload) and the contiguous payload, and keeps
// the one the sender chose (a sender that did not split fills the iov; the payload receive is cancelled). A receive
// whose header says a payload follows that it did not post drains it into nothing, so that its sender completes
// (the lengths then differ: an error on the receiver).
struct UcxRequest : Request {
  void* handle = nullptr;  // the iov's (or a split send's header's) UCX request; nullptr once done or done at once
  void* dataHandle = nullptr;  // a split payload's request (a receive's: posted, or draining a payload not expected)
  WireHeader header{};  // what a send stamps, or where a receive lands the sender's; UCX holds the iov until done
  ucp_dt_iov_t iov[2]{};
  ucs_status_t status = UCS_OK;  // final status, once handle is gone
  ucp_tag_recv_info_t info{};    // a receive's sender tag and length
  bool senderSplit = false;      // a receive: the header arrived alone and says its payload follows
  ucs_status_t dataStatus = UCS_OK;  // the payload message's final status, once dataHandle is gone
  ucp_tag_recv_info_t dataInfo{};    // the payload receive's length
  uint64_t drain = 0;                // where a drained payload lands (zero bytes of it)
  bool payloadCancelled = false;     // a receive: its payload receive was cancelled (the sender did not split)
  // Retired while UCX still held it: UCX may yet read or write its header, iov and drain. Its handles that were still
  // in flight stay set (unfreed), so the transport can tell when UCX is done with them (Impl::Sweep).
  bool inUse = false;
};

// A request for one message: its iov is the wire header and the payload (an empty payload left out: *parts), and
// *param the UCP parameters of a host-memory iov transfer.
std::unique_ptr<UcxRequest> NewRequest(Transport* owner, bool isSend, int peer, void* buf, size_t bytes, uint64_t tag,
                                       WireKind kind, ucp_request_param_t* param, size_t* parts) {
  auto r = std::make_unique<UcxRequest>();
  r->Describe(owner, isSend, peer, buf, bytes, tag, kind);
  r->iov[0].buffer = &r->header;
  r->iov[0].length = sizeof(WireHeader);
  r->iov[1].buffer = buf;
  r->iov[1].length = bytes;
  *parts = bytes > 0 ? 2 : 1;
  *param = ucp_request_param_t{};
  param->op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_DATATYPE;
  param->memory_type = UCS_MEMORY_TYPE_HOST;
  param->datatype = ucp_dt_make_iov();
  return r;
}

// Host-memory contiguous bytes: a split message's header or payload, or a drain.
ucp_request_param_t ContigParam(bool recv) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.memory_type = UCS_MEMORY_TYPE_HOST;
  // A receive always gets a request, so that ucp_tag_recv_request_test reports its length (see Irecv).
  if (recv) param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  return param;
}

// UCX tags carry the source rank, so a receive matches only its peer's messages: [src:16][seq:24][index:24].
uint64_t UcxTag(int src, uint64_t tag) {
  return (static_cast<uint64_t>(src & 0xffff) << 48) | (((tag >> 32) & 0xffffffu) << 24) | (tag & 0xffffffu);
}

// DataLanesOverSharedMemory of what ucp_ep_print_info reports for ep; false where it cannot be read.
bool EndpointOverSharedMemory(ucp_ep_h ep) {
  char* text = nullptr;
  size_t length = 0;
  FILE* out = open_memstream(&text, &length);
  if (out == nullptr) return false;
  ucp_ep_print_info(ep, out);
  const bool written = std::fclose(out) == 0 && text != nullptr;
  const std::string info = written ? std::string(text, length) : std::string();
  std::free(text);
  return DataLanesOverSharedMemory(info);
}

// UCX logs two expected events as errors, and ccoll handles both: (1) shared-memory transports cannot detect a dead
// peer, so UCX refuses them for UCP_ERR_HANDLING_MODE_PEER endpoints (ccoll then falls back to an endpoint without
// peer error handling; its timeout still bounds every wait); (2) at destroy, the final flush finds a connection its
// peer already closed after receiving everything. While ccoll does either, this handler keeps those messages out of
// the user's stderr (at INFO in ccoll's log instead); every other UCX message passes through.
std::mutex gProbeMutex;

ucs_log_func_rc_t QuietExpectedErrors(const char* file, unsigned line, const char* function, ucs_log_level_t level,
                                       const ucs_log_component_config_t* comp, const char* format, va_list ap) {
  if (level != UCS_LOG_LEVEL_ERROR) return UCS_LOG_FUNC_RC_CONTINUE;
  char text[512];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof(text), format, copy);
  va_end(copy);
  if (std::strstr(text, "no peer failure handler") == nullptr && std::strstr(text, "error during flush") == nullptr) {
    return UCS_LOG_FUNC_RC_CONTINUE;
  }
  CC_INFO(kLogTransport, "UCX: %s", text);
  return UCS_LOG_FUNC_RC_STOP;
}

// The mismatch error of a receive of `r.bytes` when `what` arrived.
ccResult_t SizeMismatch(int rank, const UcxRequest& r, const std::string& what) {
  return Fail(ccInvalidUsage,
              "rank %d expected %s%zu bytes from rank %d (tag %llu) but %s arrived: the ranks "
              "called with different counts, datatypes or collectives (or a ccSend and its ccRecv differ in size)",
              rank, r.received != nullptr ? "at most " : "", r.bytes, r.peer, static_cast<unsigned long long>(r.tag),
              what.c_str());
}

// Checks a split message's receive once its header and payload arrived (or were drained).
ccResult_t FinishedSplit(int rank, const UcxRequest& r, bool checksum) {
  if (!r.LengthFits(r.header.length)) return SizeMismatch(rank, r, std::to_string(r.header.length) + " bytes");
  if (r.dataStatus != UCS_OK) {
    return Fail(ccRemoteError, "rank %d: receiving the %llu-byte payload from rank %d (tag %llu) failed: %s", rank,
                static_cast<unsigned long long>(r.header.length), r.peer, static_cast<unsigned long long>(r.tag),
                ucs_status_string(r.dataStatus));
  }
  WireHeader h = r.header;
  h.flags = static_cast<uint8_t>(h.flags & ~kWireFlagSplit);
  std::string why;
  ccResult_t hr = CheckWireHeader(h, r.kind, r.buf, r.dataInfo.length, checksum, rank, r.peer, r.tag, &why);
  if (hr != ccSuccess) return Fail(hr, "%s", why.c_str());
  if (r.received != nullptr) *r.received = r.dataInfo.length;
  return ccSuccess;
}

// Checks a request that completed: its status, and for a receive its length and wire header.
ccResult_t Finished(int rank, const UcxRequest& r, bool checksum) {
  if (r.isSend && r.status == UCS_OK && r.dataStatus != UCS_OK) {
    return Fail(ccRemoteError, "rank %d: sending the %zu-byte payload to rank %d failed: %s", rank, r.bytes, r.peer,
                ucs_status_string(r.dataStatus));
  }
  if (r.senderSplit) return FinishedSplit(rank, r, checksum);
  const size_t got = r.info.length;
  const bool fits = got >= sizeof(WireHeader) && r.LengthFits(got - sizeof(WireHeader));
  if (r.status == UCS_OK && !r.isSend && r.kind == kWirePointToPoint && r.header.kind == kWirePointToPointLength &&
      got == sizeof(WireHeader) + sizeof(uint64_t)) {
    // A point-to-point message longer than a slice goes as slices behind its length (collectives/p2p.cc), and each
    // end decides from its own size: this receive of an unsliced message met the length of a sliced one.
    uint64_t sent = 0;
    std::memcpy(&sent, r.buf, sizeof(sent));
    return Fail(ccInvalidUsage,
                "rank %d sent %llu bytes (in slices) but rank %d expects %zu bytes (tag %llu): a ccSend and its ccRecv "
                "differ in size",
                r.peer, static_cast<unsigned long long>(sent), rank, r.bytes, static_cast<unsigned long long>(r.tag));
  }
  if (r.status == UCS_ERR_MESSAGE_TRUNCATED || (r.status == UCS_OK && !r.isSend && !fits)) {
    const std::string what = r.status != UCS_OK             ? std::string("a larger message")
                             : got < sizeof(WireHeader) ? std::string("a message shorter than a wire header")
                                                        : std::to_string(got - sizeof(WireHeader)) + " bytes";
    return SizeMismatch(rank, r, what);
  }
  if (r.status != UCS_OK) {
    return Fail(ccRemoteError, "rank %d: %s rank %d failed: %s", rank, r.isSend ? "sending to" : "receiving from",
                r.peer, ucs_status_string(r.status));
  }
  if (r.payloadCancelled && r.dataStatus != UCS_ERR_CANCELED) {
    return Fail(ccRemoteError, "rank %d: a second message from rank %d arrived with tag %llu (%s)", rank, r.peer,
                static_cast<unsigned long long>(r.tag), ucs_status_string(r.dataStatus));
  }
  if (!r.isSend) {
    std::string why;
    const size_t payload = got - sizeof(WireHeader);
    ccResult_t hr = CheckWireHeader(r.header, r.kind, r.buf, payload, checksum, rank, r.peer, r.tag, &why);
    if (hr != ccSuccess) return Fail(hr, "%s", why.c_str());
    if (r.received != nullptr) *r.received = payload;
  }
  return ccSuccess;
}

// What a rank hands its peers through the bootstrap: its UCX worker address behind a header of ccoll's own. UCX
// parses a worker address without validating it and aborts the process (an assertion) on bytes it cannot read, so a
// record that is not one (a process of another job at the bootstrap root, a record cut short or corrupted) is refused
// before ucp_ep_create sees it.
struct AddressHeader {
  char magic[4];          // kAddressMagic
  uint16_t ucxMajor;      // ucp_get_version of the sender
  uint16_t ucxMinor;
  uint32_t bytes;         // the address's length
  uint32_t reserved;      // 0
  uint64_t fingerprint;   // Fnv1a of the address
};
static_assert(sizeof(AddressHeader) == 24, "a wire format");
constexpr char kAddressMagic[4] = {'C', 'C', 'U', 'A'};

std::string AddressRecord(const void* address, size_t bytes) {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  AddressHeader h{};
  std::memcpy(h.magic, kAddressMagic, sizeof(h.magic));
  h.ucxMajor = static_cast<uint16_t>(major);
  h.ucxMinor = static_cast<uint16_t>(minor);
  h.bytes = static_cast<uint32_t>(bytes);
  h.fingerprint = Fnv1a(address, bytes);
  std::string record(reinterpret_cast<const char*>(&h), sizeof(h));
  record.append(static_cast<const char*>(address), bytes);
  return record;
}

// The header and worker address of `record` (a peer's AddressRecord), or a sentence saying why there are none.
bool ParseAddressRecord(const std::string& record, AddressHeader* header, const char** address, std::string* why) {
  AddressHeader& h = *header;
  if (record.size() < sizeof(h)) {
    *why = std::to_string(record.size()) + " bytes, shorter than its header";
    return false;
  }
  std::memcpy(&h, record.data(), sizeof(h));
  if (std::memcmp(h.magic, kAddressMagic, sizeof(h.magic)) != 0) {
    *why = "not a ccoll record (another program, or another version of ccoll, at the bootstrap root?)";
    return false;
  }
  if (h.reserved != 0 || h.bytes != record.size() - sizeof(h) ||
      h.fingerprint != Fnv1a(record.data() + sizeof(h), h.bytes)) {
    *why = "its header does not match its bytes (corrupted)";
    return false;
  }
  *address = record.data() + sizeof(h);
  return true;
}

}  // namespace

struct UcxTransport::Impl {
  struct PeerCtx {
    Impl* impl;
    int peer;
  };

  int rank = 0;
  int nranks = 0;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;
  std::vector<ucp_ep_h> eps;
  std::vector<std::unique_ptr<PeerCtx>> peerCtx;
  std::vector<ucs_status_t> peerStatus;  // set by the error handler when a peer fails
  std::vector<char> peerMode;            // 1 where the endpoint has UCP_ERR_HANDLING_MODE_PEER
  std::vector<char> sharedMemory;        // 1 where the endpoint's active messages go through shared memory
  int efd = -1;                          // the worker's event fd: Wait sleeps on it once spinning stops paying
  size_t splitBytes = 0;                 // UcxOptions::splitBytes
  bool failed = false;                   // a wait failed: peers may be gone, do not wait for them at the end
  // Requests whose waits gave up while UCX still held them (UcxRequest::inUse): kept until UCX has finished them
  // (Sweep) or the worker is gone.
  std::vector<std::unique_ptr<UcxRequest>> retired;
  std::atomic<bool> aborted{false};
  std::mutex reasonMutex;
  std::string abortReason;

  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* ctx = static_cast<PeerCtx*>(arg);
    ctx->impl->peerStatus[ctx->peer] = status;
    CC_INFO(kLogTransport, "rank %d: UCX reports rank %d failed: %s", ctx->impl->rank, ctx->peer,
            ucs_status_string(status));
  }

  // Progresses the worker until `handle` completes or `deadline`; returns its final status.
  ucs_status_t Drive(void* handle, Clock::time_point deadline) {
    ucs_status_t st;
    while ((st = ucp_request_check_status(handle)) == UCS_INPROGRESS && Clock::now() < deadline) {
      if (ucp_worker_progress(worker) == 0) sched_yield();
    }
    return st;
  }

  // Closes a peer-error-handling endpoint at once; its pending sends complete with an error. Endpoints without
  // peer error handling cannot be force-closed: they stay until the worker goes.
  void ForceClose(int peer) {
    if (eps[peer] == nullptr || !peerMode[peer]) return;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* h = ucp_ep_close_nbx(eps[peer], &param);
    eps[peer] = nullptr;
    if (h != nullptr && !UCS_PTR_IS_ERR(h)) {
      Drive(h, Clock::now() + std::chrono::seconds(5));
      ucp_request_free(h);
    }
  }

  // Ends a request that will not complete normally: cancels a receive; closes the endpoint under a send where it
  // can. Never waits for a peer. What UCX still holds after that (a send over shared memory, a receive already
  // being filled) keeps its handle and marks the request inUse, and Keep must then take it over from its owner.
  void Retire(UcxRequest* r) {
    failed = true;
    for (void** h : {&r->handle, &r->dataHandle}) {
      if (*h == nullptr) continue;
      if (r->isSend) {
        ForceClose(r->peer);
      } else {
        ucp_request_cancel(worker, *h);
      }
      if (Drive(*h, Clock::now() + std::chrono::milliseconds(100)) == UCS_INPROGRESS) {
        r->inUse = true;
        continue;
      }
      ucp_request_free(*h);
      *h = nullptr;
    }
  }

  // Takes over a retired request that UCX may still touch (else lets it go with its owner).
  void Keep(std::unique_ptr<UcxRequest>* r) {
    if (*r != nullptr && (*r)->inUse) retired.push_back(std::move(*r));
  }

  // Lets go of the retired requests that UCX has finished with (it completed or cancelled them meanwhile, as the
  // worker progressed); the others stay. Cheap when there are none, as there normally are.
  void Sweep() {
    auto finished = [](const std::unique_ptr<UcxRequest>& r) {
      for (void** h : {&r->handle, &r->dataHandle}) {
        if (*h != nullptr && ucp_request_check_status(*h) != UCS_INPROGRESS) {
          ucp_request_free(*h);
          *h = nullptr;
        }
      }
      return r->handle == nullptr && r->dataHandle == nullptr;
    };
    retired.erase(std::remove_if(retired.begin(), retired.end(), finished), retired.end());
  }

  // Tests r's UCX requests without progressing the worker; true once none is in flight. When a receive's iov
  // completes, the header says whether its payload follows on its own: if so, the payload's receive goes on (or a
  // drain of it is posted, where this rank expected no split); if not, the payload receive is cancelled.
  bool Poll(UcxRequest* r) {
    if (r->handle != nullptr) {
      if (!Reap(r->isSend, &r->handle, &r->status, &r->info)) return false;
      if (!r->isSend) {
        // The header alone, as this ccoll version splits (anything else is checked as an unsplit message, and a
        // split flag on it as malformed).
        const WireHeader& h = r->header;
        r->senderSplit = r->status == UCS_OK && r->info.length == sizeof(WireHeader) && h.magic == kWireMagic &&
                         h.version == kWireVersion && h.reserved == 0 && (h.flags & kWireFlagSplit) != 0 &&
                         (h.flags & ~(kWireFlagSplit | kWireFlagCrc)) == 0 && h.length > splitBytes;
        if (r->senderSplit && r->dataHandle == nullptr) {
          ucp_request_param_t param = ContigParam(true);
          void* posted = ucp_tag_recv_nbx(worker, &r->drain, 0, UcxTag(r->peer, r->tag),
                                          ~static_cast<ucp_tag_t>(0), &param);
          if (UCS_PTR_IS_ERR(posted)) {
            r->dataStatus = UCS_PTR_STATUS(posted);
          } else {
            r->dataHandle = posted;
          }
        } else if (!r->senderSplit && r->dataHandle != nullptr) {
          // Unmatched, it completes with UCS_ERR_CANCELED; matched (a message of the same UCX tag: Finished
          // reports it), once that message is in.
          ucp_request_cancel(worker, r->dataHandle);
          r->payloadCancelled = true;
        }
      }
    }
    return r->dataHandle == nullptr || Reap(r->isSend, &r->dataHandle, &r->dataStatus, &r->dataInfo);
  }

  // Tests one UCX request of a message; once it is done, frees it (*handle = nullptr) with its final status and, for
  // a receive, its sender tag and length. False while it is in progress.
  static bool Reap(bool isSend, void** handle, ucs_status_t* status, ucp_tag_recv_info_t* info) {
    ucp_tag_recv_info_t got{};
    const ucs_status_t st = isSend ? ucp_request_check_status(*handle) : ucp_tag_recv_request_test(*handle, &got);
    if (st == UCS_INPROGRESS) return false;
    ucp_request_free(*handle);
    *handle = nullptr;
    *status = st;
    *info = got;
    return true;
  }

  ~Impl() {
    std::lock_guard<std::mutex> lock(gProbeMutex);
    ucs_log_push_handler(&QuietExpectedErrors);  // the whole teardown: flush errors surface while closing too
    Teardown();
    ucs_log_pop_handler();
  }

  void Teardown() {
    if (worker != nullptr) {
      if (!failed) {
        // Remote completion of everything this rank sent, so no peer misses data, then close the endpoints.
        ucp_request_param_t param{};
        void* h = ucp_worker_flush_nbx(worker, &param);
        if (h != nullptr && !UCS_PTR_IS_ERR(h)) {
          Drive(h, Clock::now() + std::chrono::seconds(5));
          ucp_request_free(h);
        }
      }
      for (size_t p = 0; p < eps.size(); ++p) {
        if (eps[p] == nullptr) continue;
        if (peerMode[p]) {
          ForceClose(static_cast<int>(p));
        } else if (!failed) {
          ucp_request_param_t param{};  // flush close: the peer is alive, everything was delivered
          void* h = ucp_ep_close_nbx(eps[p], &param);
          if (h != nullptr && !UCS_PTR_IS_ERR(h)) {
            Drive(h, Clock::now() + std::chrono::seconds(1));
            ucp_request_free(h);
          }
          eps[p] = nullptr;
        }
      }
      for (auto& r : retired) {  // released to UCX: the worker ends them; their memory stays until after it
        for (void** h : {&r->handle, &r->dataHandle}) {
          if (*h != nullptr) ucp_request_free(*h);
          *h = nullptr;
        }
      }
      ucp_worker_destroy(worker);
    }
    if (context != nullptr) ucp_cleanup(context);
  }
};

size_t SplitBytesFor(size_t sliceBytes) {
  const size_t cap = (size_t{1} << 20) - sizeof(WireHeader);
  return sliceBytes < cap ? sliceBytes : cap;
}

std::string RndvThreshFor(const std::string& param, size_t sliceBytes) {
  if (param != "slice") return param;
  const size_t eager = sliceBytes + 4096, cap = size_t{1} << 20;
  return std::to_string(eager < cap ? eager : cap);
}

bool DataLanesOverSharedMemory(const std::string& epInfo) {
  // Lines such as "#  lane[0]:  3:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0": the transport is the
  // name after the resource index, the lane's uses are the words after "->".
  auto among = [](const std::string& name, std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (name == n) return true;
    }
    return false;
  };
  bool amShared = false, othersShared = true;
  size_t at = 0;
  while (at < epInfo.size()) {
    size_t end = epInfo.find('\n', at);
    if (end == std::string::npos) end = epInfo.size();
    const std::string line = epInfo.substr(at, end - at);
    at = end + 1;
    const size_t lane = line.find("lane[");
    const size_t arrow = line.find("->");
    if (lane == std::string::npos || arrow == std::string::npos) continue;
    std::istringstream uses(line.substr(arrow + 2));
    std::string word;
    bool am = false, data = false;  // data: bulk active messages or rendezvous RMA (am_bw#k, rma_bw#k)
    while (uses >> word) {
      am = am || word == "am";
      data = data || word.compare(0, 5, "am_bw") == 0 || word.compare(0, 6, "rma_bw") == 0;
    }
    if (!am && !data) continue;
    std::istringstream resource(line.substr(line.find(':', lane) + 1));
    std::string name;
    resource >> name;  // "3:sysv/memory.0"
    const size_t colon = name.find(':');
    name = name.substr(colon == std::string::npos ? 0 : colon + 1);
    name = name.substr(0, name.find('/'));
    if (am) amShared = among(name, {"posix", "sysv", "xpmem"});
    if (data && !among(name, {"posix", "sysv", "xpmem", "cma", "knem"})) othersShared = false;
  }
  return amShared && othersShared;
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxTransport::~UcxTransport() = default;

ccResult_t UcxTransport::Create(int rank, int nranks, const UcxOptions& options, std::unique_ptr<UcxTransport>* out) {
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->nranks = nranks;
  impl->eps.assign(nranks, nullptr);
  impl->peerStatus.assign(nranks, UCS_OK);
  impl->peerMode.assign(nranks, 0);
  impl->sharedMemory.assign(nranks, 0);
  impl->splitBytes = options.splitBytes;
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return Fail(ccSystemError, "rank %d: ucp_config_read failed: %s", rank, ucs_status_string(st));
  if (!options.rndvThresh.empty()) {
    st = ucp_config_modify(config, "RNDV_THRESH", options.rndvThresh.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return Fail(ccInvalidArgument, "rank %d: CC_UCX_RNDV_THRESH=%s is not a UCX size: %s", rank,
                  options.rndvThresh.c_str(), ucs_status_string(st));
    }
    CC_INFO(kLogTransport, "rank %d: UCX rendezvous threshold %s", rank, options.rndvThresh.c_str());
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &impl->context);
  ucp_config_release(config);
  if (st != UCS_OK) return Fail(ccSystemError, "rank %d: ucp_init failed: %s", rank, ucs_status_string(st));
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;  // one thread uses a communicator at a time
  st = ucp_worker_create(impl->context, &wparams, &impl->worker);
  if (st != UCS_OK) return Fail(ccSystemError, "rank %d: ucp_worker_create failed: %s", rank, ucs_status_string(st));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(impl->worker, &addr, &len);
  if (st != UCS_OK) return Fail(ccSystemError, "rank %d: ucp_worker_get_address failed: %s", rank, ucs_status_string(st));
  impl->address = AddressRecord(addr, len);
  ucp_worker_release_address(impl->worker, addr);
  if (ucp_worker_get_efd(impl->worker, &impl->efd) != UCS_OK) impl->efd = -1;  // then Wait only spins and yields
  out->reset(new UcxTransport(std::move(impl)));
  return ccSuccess;
}

const std::string& UcxTransport::Address() const { return impl_->address; }

ccResult_t UcxTransport::Connect(const std::vector<int>& peers, const std::vector<std::string>& addresses,
                                 const std::vector<bool>& peerErrors) {
  AddressHeader mine{};
  std::memcpy(&mine, impl_->address.data(), sizeof(mine));
  bool warnedVersion = false;
  for (size_t i = 0; i < peers.size(); ++i) {
    const int peer = peers[i];
    if (addresses[peer].empty()) {
      return Fail(ccRemoteError, "rank %d: rank %d sent no UCX worker address", impl_->rank, peer);
    }
    AddressHeader theirs{};
    const char* address = nullptr;
    std::string why;
    if (!ParseAddressRecord(addresses[peer], &theirs, &address, &why)) {
      return Fail(ccRemoteError, "rank %d: what rank %d sent as its UCX worker address is not one: %s", impl_->rank,
                  peer, why.c_str());
    }
    if ((theirs.ucxMajor != mine.ucxMajor || theirs.ucxMinor != mine.ucxMinor) && !warnedVersion) {
      warnedVersion = true;  // once per rank, not once per peer
      CC_WARN("rank %d: rank %d runs UCX %u.%u, this rank %u.%u; where one version cannot read the other's worker "
              "addresses, UCX aborts the process", impl_->rank, peer, theirs.ucxMajor, theirs.ucxMinor, mine.ucxMajor,
              mine.ucxMinor);
    }
    impl_->peerCtx.emplace_back(new Impl::PeerCtx{impl_.get(), peer});
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(address);
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Impl::OnPeerError;
    params.err_handler.arg = impl_->peerCtx.back().get();
    ucs_status_t st = UCS_ERR_UNREACHABLE;
    if (peerErrors[i]) {
      std::lock_guard<std::mutex> lock(gProbeMutex);
      ucs_log_push_handler(&QuietExpectedErrors);
      st = ucp_ep_create(impl_->worker, &params, &impl_->eps[peer]);
      ucs_log_pop_handler();
    }
    impl_->peerMode[peer] = st == UCS_OK;
    if (st == UCS_ERR_UNREACHABLE) {
      CC_INFO(kLogTransport, "rank %d: endpoint to rank %d without peer error handling (%s); a dead peer is found "
              "by the timeout", impl_->rank, peer, peerErrors[i] ? "the transports cannot detect it" : "asked for");
      params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      params.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
      st = ucp_ep_create(impl_->worker, &params, &impl_->eps[peer]);
    }
    if (st != UCS_OK) {
      // The peer's address came from the bootstrap a moment ago: failing to reach it means it died or its host is
      // unreachable, a remote failure rather than a local one.
      return Fail(ccRemoteError, "rank %d: cannot create a UCX endpoint to rank %d (it died or is unreachable): %s",
                  impl_->rank, peer, ucs_status_string(st));
    }
    impl_->sharedMemory[peer] = EndpointOverSharedMemory(impl_->eps[peer]) ? 1 : 0;
  }
  return ccSuccess;
}

bool UcxTransport::PeerOverSharedMemory(int peer) const { return impl_->sharedMemory.at(peer) != 0; }

ccResult_t UcxTransport::Isend(int peer, const void* buf, size_t bytes, uint64_t tag, WireKind kind,
                               Request** req) {
  Impl& m = *impl_;
  m.Sweep();  // (also where the call is refused below: a failed peer leaves the most behind)
  if (m.aborted.load()) {
    std::lock_guard<std::mutex> lock(m.reasonMutex);
    return Fail(ccRemoteError, "rank %d: %s", m.rank, m.abortReason.c_str());
  }
  if (m.eps[peer] == nullptr || m.peerStatus[peer] != UCS_OK) {
    return Fail(ccRemoteError, "rank %d: rank %d is unreachable (%s)", m.rank, peer,
                ucs_status_string(m.peerStatus[peer] != UCS_OK ? m.peerStatus[peer] : UCS_ERR_NOT_CONNECTED));
  }
  ucp_request_param_t param;
  size_t parts;
  auto r = NewRequest(this, true, peer, const_cast<void*>(buf), bytes, tag, kind, &param, &parts);
  r->header = MakeWireHeader(kind, buf, bytes, checksum_);
  const bool split = bytes > m.splitBytes;
  if (split) r->header.flags = static_cast<uint8_t>(r->header.flags | kWireFlagSplit);
  ucp_request_param_t contig = ContigParam(false);
  void* h = split ? ucp_tag_send_nbx(m.eps[peer], &r->header, sizeof(WireHeader), UcxTag(m.rank, tag), &contig)
                  : ucp_tag_send_nbx(m.eps[peer], r->iov, parts, UcxTag(m.rank, tag), &param);
  if (UCS_PTR_IS_ERR(h)) {
    return Fail(ccRemoteError, "rank %d: sending %zu bytes to rank %d failed: %s", m.rank, bytes, peer,
                ucs_status_string(UCS_PTR_STATUS(h)));
  }
  r->handle = h;
  if (split) {
    void* d = ucp_tag_send_nbx(m.eps[peer], buf, bytes, UcxTag(m.rank, tag), &contig);
    if (UCS_PTR_IS_ERR(d)) {
      m.Retire(r.get());  // the header alone went: its peer fails on the payload it then waits for
      m.Keep(&r);
      return Fail(ccRemoteError, "rank %d: sending %zu bytes to rank %d failed: %s", m.rank, bytes, peer,
                  ucs_status_string(UCS_PTR_STATUS(d)));
    }
    r->dataHandle = d;
  }
  *req = r.release();
  return ccSuccess;
}

ccResult_t UcxTransport::Irecv(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, Request** req) {
  return IrecvAtMost(peer, buf, bytes, tag, kind, nullptr, req);
}

// (received null: a receive of exactly `bytes`, Irecv)
ccResult_t UcxTransport::IrecvAtMost(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, size_t* received,
                                     Request** req) {
  Impl& m = *impl_;
  m.Sweep();  // (also where the call is refused below: a failed peer leaves the most behind)
  if (m.aborted.load()) {
    std::lock_guard<std::mutex> lock(m.reasonMutex);
    return Fail(ccRemoteError, "rank %d: %s", m.rank, m.abortReason.c_str());
  }
  ucp_request_param_t param;
  size_t parts;
  auto r = NewRequest(this, false, peer, buf, bytes, tag, kind, &param, &parts);
  r->received = received;
  // Always a request, so that ucp_tag_recv_request_test reports the length (UCX 1.13 does not fill recv_info on
  // every path of an immediate completion).
  param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  void* h = ucp_tag_recv_nbx(m.worker, r->iov, parts, UcxTag(peer, tag), ~static_cast<ucp_tag_t>(0), &param);
  if (UCS_PTR_IS_ERR(h)) {
    return Fail(ccSystemError, "rank %d: posting a receive from rank %d failed: %s", m.rank, peer,
                ucs_status_string(UCS_PTR_STATUS(h)));
  }
  r->handle = h;
  if (bytes > m.splitBytes) {  // the payload as a message of its own, where the sender split it (as it should)
    ucp_request_param_t contig = ContigParam(true);
    void* d = ucp_tag_recv_nbx(m.worker, buf, bytes, UcxTag(peer, tag), ~static_cast<ucp_tag_t>(0), &contig);
    if (UCS_PTR_IS_ERR(d)) {
      m.Retire(r.get());
      m.Keep(&r);
      return Fail(ccSystemError, "rank %d: posting a receive from rank %d failed: %s", m.rank, peer,
                  ucs_status_string(UCS_PTR_STATUS(d)));
    }
    r->dataHandle = d;
  }
  *req = r.release();
  return ccSuccess;
}

ccResult_t UcxTransport::Wait(Request* request, int timeoutMs, IdleWork* idle) {
  Impl& m = *impl_;
  std::unique_ptr<UcxRequest> r(static_cast<UcxRequest*>(request));
  // On the way out (after the error below is made from r): a request UCX may still touch stays with the transport.
  struct KeepOnExit {
    Impl& m;
    std::unique_ptr<UcxRequest>& r;
    ~KeepOnExit() { m.Keep(&r); }
  } keepOnExit{m, r};
  // A small message is often in by the time it is waited for: then no clock is read. Spinning reads it every 16
  // progress calls (it cost more than the progress calls themselves), and after every yield or sleep.
  if (m.Poll(r.get())) return Finished(m.rank, *r, checksum_);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeoutMs);
  uint64_t quiet = 0;  // progress calls in a row that moved nothing (64 bits: a long quiet wait cannot wrap it)
  unsigned spins = 0;
  Clock::time_point idleSince = start;
  do {  // (the request was polled just above)
    if (m.aborted.load()) {
      m.Retire(r.get());
      // Closing every endpoint makes the peers' UCX report this rank as failed, so they stop waiting for it now
      // instead of at their timeout (where the transport can detect peer failure; shared memory cannot).
      for (int p = 0; p < m.nranks; ++p) m.ForceClose(p);
      std::lock_guard<std::mutex> lock(m.reasonMutex);
      return Fail(ccRemoteError, "rank %d: %s", m.rank, m.abortReason.c_str());
    }
    if (m.peerStatus[r->peer] != UCS_OK) {
      ucs_status_t why = m.peerStatus[r->peer];
      m.Retire(r.get());
      return Fail(ccRemoteError, "rank %d: rank %d died, aborted its communicator, or became unreachable (%s)",
                  m.rank, r->peer, ucs_status_string(why));
    }
    if ((++spins % 16 == 0 || quiet > 64) && Clock::now() >= deadline) {
      m.Retire(r.get());
      return Fail(ccTimeout, "rank %d timed out after %d ms %s rank %d (tag %llu)", m.rank, timeoutMs,
                  r->isSend ? "waiting for a send to" : "waiting for data from", r->peer,
                  static_cast<unsigned long long>(r->tag));
    }
    if (ucp_worker_progress(m.worker) != 0) {
      quiet = 0;
    } else if (idle != nullptr) {
      if (!idle->RunPiece()) idle = nullptr;  // nothing moved: a piece of the caller's work, then progress again
    } else if (++quiet == 1) {
      idleSince = Clock::now();
    } else if (quiet > 64) {
      // Nothing moved for a while: yield (a peer on this core may be the one we wait for), and after 50 us of that
      // sleep until UCX has an event, so a descheduled peer gets the core at once instead of after our timeslice.
      // The sleep ends at least every millisecond to check abort, peer failure and the deadline.
      if (m.efd >= 0 && Clock::now() - idleSince > std::chrono::microseconds(50) &&
          ucp_worker_arm(m.worker) == UCS_OK) {
        pollfd pfd{m.efd, POLLIN, 0};
        poll(&pfd, 1, 1);
      } else {
        sched_yield();
      }
    }
  } while (!m.Poll(r.get()));
  return Finished(m.rank, *r, checksum_);
}

size_t UcxTransport::HeldRequests() {
  ucp_worker_progress(impl_->worker);
  impl_->Sweep();
  return impl_->retired.size();
}

void UcxTransport::Abort(const char* reason) {
  std::lock_guard<std::mutex> lock(impl_->reasonMutex);
  if (impl_->aborted.load()) return;
  impl_->abortReason = reason;
  impl_->aborted.store(true);
}

}  // namespace ccoll
