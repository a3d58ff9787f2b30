#include "core/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/params.h"

namespace ccoll {
namespace {

socklen_t ToSockaddr(const SocketAddress& a, sockaddr_storage* ss) {
  std::memset(ss, 0, sizeof(*ss));
  if (a.family == AF_INET6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(a.port);
    std::memcpy(&s6->sin6_addr, a.addr, 16);
    return sizeof(sockaddr_in6);
  }
  auto* s4 = reinterpret_cast<sockaddr_in*>(ss);
  s4->sin_family = AF_INET;
  s4->sin_port = htons(a.port);
  std::memcpy(&s4->sin_addr, a.addr, 4);
  return sizeof(sockaddr_in);
}

void FromSockaddr(const sockaddr* sa, SocketAddress* a) {
  std::memset(a, 0, sizeof(*a));
  if (sa->sa_family == AF_INET6) {
    auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    a->family = AF_INET6;
    a->port = ntohs(s6->sin6_port);
    std::memcpy(a->addr, &s6->sin6_addr, 16);
  } else {
    auto* s4 = reinterpret_cast<const sockaddr_in*>(sa);
    a->family = AF_INET;
    a->port = ntohs(s4->sin_port);
    std::memcpy(a->addr, &s4->sin_addr, 4);
  }
}

bool MatchesIfname(const std::string& spec, const char* name) {
  bool exclude = !spec.empty() && spec[0] == '^';
  std::string list = exclude ? spec.substr(1) : spec;
  bool hit = false;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string prefix = list.substr(start, comma - start);
    if (!prefix.empty() && std::strncmp(name, prefix.c_str(), prefix.size()) == 0) hit = true;
    start = comma + 1;
  }
  return exclude ? !hit : hit;
}

// Milliseconds to block in one poll: up to the deadline, but short enough to notice a cancel request.
int PollSlice(Deadline deadline, const std::atomic<bool>* cancel) {
  int ms = RemainingMs(deadline);
  return cancel != nullptr && ms > 50 ? 50 : ms;
}

bool Cancelled(const std::atomic<bool>* cancel) { return cancel != nullptr && cancel->load(); }

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// One lookup, shared by the callers waiting for it and the thread that makes it: whichever finishes last frees it.
struct HostLookup {
  std::mutex mu;
  std::condition_variable done;
  bool finished = false;
  int rc = 0;
  int err = 0;  // errno, for EAI_SYSTEM
  SocketAddress addr{};
};

// getaddrinfo for one family: 0 and the first address, or its error.
int LookUpFamily(const std::string& host, int family, SocketAddress* addr, int* err) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  *err = errno;
  if (rc == 0 && (res == nullptr || res->ai_addr == nullptr)) rc = EAI_NONAME;
  if (rc == 0) FromSockaddr(res->ai_addr, addr);
  if (res != nullptr) freeaddrinfo(res);
  return rc;
}

// The lookups in flight, by host name: a caller that finds its name here waits for that lookup rather than starting
// another, so a lookup left behind at a deadline (a DNS server that does not answer) is not joined by one more thread
// at every retry of init. Each thread removes its entry when its lookup ends; later callers look up afresh.
std::mutex gInFlightMutex;
std::map<std::string, std::shared_ptr<HostLookup>>& InFlight() {  // under gInFlightMutex
  static auto* m = new std::map<std::string, std::shared_ptr<HostLookup>>();  // outlives threads still looking up
  return *m;
}

ccResult_t LookUpHost(const std::string& host, int timeoutMs, SocketAddress* out, const std::atomic<bool>* cancel) {
  std::shared_ptr<HostLookup> lookup;
  {
    std::lock_guard<std::mutex> lock(gInFlightMutex);
    auto it = InFlight().find(host);
    if (it != InFlight().end()) {
      lookup = it->second;
    } else {
      lookup = std::make_shared<HostLookup>();
      try {
        std::thread([lookup, host] {
          // IPv4 first, as one query: asking for both families at once waits out the resolver's timeout where a
          // server drops AAAA queries. IPv6 only for a name without an IPv4 address.
          SocketAddress addr{};
          int err = 0;
          int rc = LookUpFamily(host, AF_INET, &addr, &err);
          if (rc == EAI_NONAME || rc == EAI_NODATA || rc == EAI_ADDRFAMILY) {
            rc = LookUpFamily(host, AF_INET6, &addr, &err);
          }
          {
            std::lock_guard<std::mutex> lock(gInFlightMutex);
            InFlight().erase(host);
          }
          std::lock_guard<std::mutex> lock(lookup->mu);
          lookup->rc = rc;
          lookup->err = err;
          lookup->addr = addr;
          lookup->finished = true;
          lookup->done.notify_all();
        }).detach();
      } catch (const std::system_error& e) {
        return Fail(ccSystemError, "cannot start a thread to look up host \"%s\": %s", host.c_str(), e.what());
      }
      InFlight().emplace(host, lookup);
    }
  }
  const Deadline deadline = DeadlineIn(timeoutMs);
  std::unique_lock<std::mutex> lock(lookup->mu);
  while (!lookup->finished && !Cancelled(cancel) && RemainingMs(deadline) > 0) {
    lookup->done.wait_for(lock, std::chrono::milliseconds(PollSlice(deadline, cancel)));
  }
  if (!lookup->finished && Cancelled(cancel)) {
    return Fail(ccRemoteError, "aborted while looking up host \"%s\"", host.c_str());
  }
  if (!lookup->finished) {
    return Fail(ccTimeout, "looking up host \"%s\" took longer than the timeout, %d ms (a DNS server that does not "
                "answer?); give a numeric address, or raise CC_TIMEOUT_MS", host.c_str(), timeoutMs);
  }
  switch (lookup->rc) {
    case 0:
      *out = lookup->addr;
      return ccSuccess;
    case EAI_NONAME:
    case EAI_NODATA:
    case EAI_ADDRFAMILY:
    case EAI_FAIL:
      return Fail(ccInvalidArgument, "cannot look up host \"%s\": %s", host.c_str(), gai_strerror(lookup->rc));
    case EAI_AGAIN:
      return Fail(ccSystemError, "cannot look up host \"%s\" now: %s (the DNS server did not answer, or could not "
                  "be reached, within the resolver's own time)", host.c_str(), gai_strerror(lookup->rc));
    default:
      return Fail(ccSystemError, "cannot look up host \"%s\": %s", host.c_str(),
                  lookup->rc == EAI_SYSTEM ? std::strerror(lookup->err) : gai_strerror(lookup->rc));
  }
}

}  // namespace

std::string ToString(const SocketAddress& a) {
  char host[INET6_ADDRSTRLEN] = "";
  inet_ntop(a.family == AF_INET6 ? AF_INET6 : AF_INET, a.addr, host, sizeof(host));
  return a.family == AF_INET6 ? "[" + std::string(host) + "]:" + std::to_string(a.port)
                              : std::string(host) + ":" + std::to_string(a.port);
}

ccResult_t SplitSocketAddress(const std::string& text, SocketAddress* out, std::string* name) {
  std::memset(out, 0, sizeof(*out));
  name->clear();
  const size_t colon = text.rfind(':');
  const std::string host = colon == std::string::npos ? text : text.substr(0, colon);
  const std::string port = colon == std::string::npos ? std::string() : text.substr(colon + 1);
  // Digits only: strtol alone would take " +80".
  const long p = port.empty() || port.find_first_not_of("0123456789") != std::string::npos
                     ? 0
                     : std::strtol(port.c_str(), nullptr, 10);
  if (host.empty() || p <= 0 || p > 65535) {
    return Fail(ccInvalidArgument, "\"%s\" is not host:port (a port of 1..65535)", text.c_str());
  }
  const uint16_t port16 = static_cast<uint16_t>(p);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    out->family = AF_INET6;
    out->port = port16;
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), out->addr) == 1) return ccSuccess;
    return Fail(ccInvalidArgument, "\"%s\": %s is not an IPv6 address", text.c_str(), host.c_str());
  }
  if (host.find(':') != std::string::npos) {
    return Fail(ccInvalidArgument, "\"%s\": an IPv6 address goes in brackets, [address]:port", text.c_str());
  }
  out->family = AF_INET;
  out->port = port16;
  if (inet_pton(AF_INET, host.c_str(), out->addr) != 1) *name = host;
  return ccSuccess;
}

ccResult_t ParseSocketAddress(const std::string& text, int timeoutMs, SocketAddress* out,
                              const std::atomic<bool>* cancel) {
  std::string name;
  CC_CHECK(SplitSocketAddress(text, out, &name));
  if (name.empty()) return ccSuccess;
  const uint16_t port = out->port;
  const ccResult_t found = LookUpHost(name, timeoutMs, out, cancel);
  if (found != ccSuccess) {
    std::memset(out, 0, sizeof(*out));
    SetLastError("\"" + text + "\": " + LastError());
    return found;
  }
  out->port = port;
  return ccSuccess;
}

ccResult_t ChooseBootstrapAddress(SocketAddress* out) {
  std::string spec = ParamString("CC_SOCKET_IFNAME");
  std::memset(out, 0, sizeof(*out));
  if (spec.empty()) {
    out->family = AF_INET;
    uint32_t lo = htonl(INADDR_LOOPBACK);
    std::memcpy(out->addr, &lo, 4);
    return ccSuccess;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return Fail(ccSystemError, "getifaddrs failed: %s", std::strerror(errno));
  bool found = false;
  for (ifaddrs* it = list; it != nullptr && !found; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || !(it->ifa_flags & IFF_UP)) continue;
    if (it->ifa_addr->sa_family != AF_INET && it->ifa_addr->sa_family != AF_INET6) continue;
    if (!MatchesIfname(spec, it->ifa_name)) continue;
    FromSockaddr(it->ifa_addr, out);
    out->port = 0;
    found = true;
    CC_INFO(kLogBoot, "bootstrap interface %s address %s", it->ifa_name, ToString(*out).c_str());
  }
  freeifaddrs(list);
  if (!found) return Fail(ccSystemError, "no network interface matches CC_SOCKET_IFNAME=%s", spec.c_str());
  return ccSuccess;
}

ccResult_t Listen(SocketAddress* addr, int* fd) {
  sockaddr_storage ss;
  socklen_t len = ToSockaddr(*addr, &ss);
  int s = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return Fail(ccSystemError, "socket() failed: %s", std::strerror(errno));
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(s, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    int err = errno;
    close(s);
    return Fail(ccSystemError, "cannot bind the bootstrap listener to %s: %s", ToString(*addr).c_str(),
                std::strerror(err));
  }
  if (listen(s, 1024) != 0) {
    int err = errno;
    close(s);
    return Fail(ccSystemError, "listen() failed: %s", std::strerror(err));
  }
  len = sizeof(ss);
  getsockname(s, reinterpret_cast<sockaddr*>(&ss), &len);
  FromSockaddr(reinterpret_cast<sockaddr*>(&ss), addr);
  *fd = s;
  return ccSuccess;
}

namespace {

// One connection attempt on a non-blocking socket, waited for in poll slices so that the deadline and a cancel are
// seen while the handshake is in flight (a blocking connect to a host that drops the SYNs would sit out the kernel's
// SYN retries, about two minutes, whatever the deadline). Returns 0 with *fd connected, or the errno of the failure:
// ETIMEDOUT at the deadline, ECANCELED on a cancel.
int ConnectOnce(const sockaddr_storage& ss, socklen_t len, Deadline deadline, const std::atomic<bool>* cancel,
                int* fd) {
  const int s = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return errno;
  if (connect(s, reinterpret_cast<const sockaddr*>(&ss), len) == 0) {
    *fd = s;
    return 0;
  }
  int err = errno;
  while (err == EINPROGRESS || err == EINTR) {
    if (Cancelled(cancel)) {
      err = ECANCELED;
      break;
    }
    // At the deadline, one last look without waiting: a handshake that completed while this thread was not running
    // is a connection, not a timeout.
    const bool last = Clock::now() >= deadline;
    pollfd pfd{s, POLLOUT, 0};
    const int r = poll(&pfd, 1, last ? 0 : PollSlice(deadline, cancel));
    if (r < 0 && errno != EINTR) {
      err = errno;
      break;
    }
    if (r <= 0) {
      if (last) err = ETIMEDOUT;
      continue;
    }
    socklen_t errLen = sizeof(err);
    if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &errLen) != 0) err = errno;
    if (err == 0) {
      *fd = s;
      return 0;
    }
  }
  close(s);
  return err;
}

}  // namespace

ccResult_t Connect(const SocketAddress& addr, Deadline deadline, int* fd, const std::atomic<bool>* cancel) {
  sockaddr_storage ss;
  socklen_t len = ToSockaddr(addr, &ss);
  int delayMs = 1;
  while (true) {
    int s = -1;
    const int err = ConnectOnce(ss, len, deadline, cancel, &s);
    if (err == 0) {
      SetNoDelay(s);
      *fd = s;  // non-blocking: SendAll and RecvAll poll
      return ccSuccess;
    }
    bool retry = err == ECONNREFUSED || err == ETIMEDOUT || err == EAGAIN || err == EINTR || err == ENETUNREACH;
    if (!retry && err != ECANCELED) {
      return Fail(ccSystemError, "cannot connect to the bootstrap root %s: %s", ToString(addr).c_str(),
                  std::strerror(err));
    }
    if (Cancelled(cancel)) return Fail(ccRemoteError, "aborted while connecting to %s", ToString(addr).c_str());
    if (Clock::now() >= deadline) {
      return Fail(ccTimeout, "timed out connecting to the bootstrap root %s (last error: %s)",
                  ToString(addr).c_str(), std::strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    delayMs = delayMs < 100 ? delayMs * 2 : 100;
  }
}

ccResult_t SendAll(int fd, const void* buf, size_t bytes, Deadline deadline, const char* what,
                   const std::atomic<bool>* cancel) {
  const char* p = static_cast<const char*>(buf);
  while (bytes > 0) {
    if (Cancelled(cancel)) return Fail(ccRemoteError, "aborted while sending %s", what);
    pollfd pfd{fd, POLLOUT, 0};
    int r = poll(&pfd, 1, PollSlice(deadline, cancel));
    if (r == 0 && Clock::now() < deadline) continue;
    if (r == 0) return Fail(ccTimeout, "timed out sending %s", what);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Fail(ccSystemError, "poll failed sending %s: %s", what, std::strerror(errno));
    }
    ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Fail(ccRemoteError, "connection lost sending %s: %s", what, std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return ccSuccess;
}

ccResult_t RecvAll(int fd, void* buf, size_t bytes, Deadline deadline, const char* what,
                   const std::atomic<bool>* cancel) {
  char* p = static_cast<char*>(buf);
  while (bytes > 0) {
    if (Cancelled(cancel)) return Fail(ccRemoteError, "aborted while receiving %s", what);
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, PollSlice(deadline, cancel));
    if (r == 0 && Clock::now() < deadline) continue;
    if (r == 0) return Fail(ccTimeout, "timed out receiving %s", what);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Fail(ccSystemError, "poll failed receiving %s: %s", what, std::strerror(errno));
    }
    ssize_t n = recv(fd, p, bytes, MSG_DONTWAIT);
    if (n == 0) return Fail(ccRemoteError, "connection closed by the peer while receiving %s", what);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Fail(ccRemoteError, "connection lost receiving %s: %s", what, std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return ccSuccess;
}

void CloseFd(int fd) {
  if (fd >= 0) close(fd);
}

}  // namespace ccoll
