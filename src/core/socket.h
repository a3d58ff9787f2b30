// Thin, deadline-aware TCP helpers for the bootstrap. Every blocking operation takes an absolute deadline so a
// silent peer is a ccTimeout, never a hang.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ccoll.h"

namespace ccoll {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline DeadlineIn(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }
inline int RemainingMs(Deadline d) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left > 1 << 30 ? 1 << 30 : left);
}

// An IPv4 or IPv6 socket address in a fixed-size, byte-copyable form (it travels inside the unique id).
struct SocketAddress {
  uint16_t family;  // AF_INET or AF_INET6
  uint16_t port;    // host byte order
  uint8_t addr[16];
};

std::string ToString(const SocketAddress& a);
// Parses "host:port" or "[v6]:port"; host is a numeric address, or a name looked up within timeoutMs (its first
// IPv4 address, else its first IPv6 one). getaddrinfo has no deadline of its own (a DNS server that does not answer
// holds it for the resolver's retries: 10 s with glibc's defaults, more with longer resolver options), so the lookup
// runs on a thread of its own that is left behind at the deadline, running until the resolver gives up; a lookup of
// the same name while it runs waits for it rather than starting another thread.
// ccInvalidArgument: not host:port, or a name that does not exist; ccTimeout: the lookup outlasted timeoutMs;
// ccSystemError: the resolver gave up first (EAI_AGAIN: no DNS server answered), or another system failure;
// ccRemoteError: *cancel became true first (the wait notices within 50 ms), when cancel is given.
ccResult_t ParseSocketAddress(const std::string& text, int timeoutMs, SocketAddress* out,
                              const std::atomic<bool>* cancel = nullptr);
// ParseSocketAddress's checks without the lookup: a numeric address is filled in and *name left empty; for a host
// name, *name is the name and only out->port is meaningful.
ccResult_t SplitSocketAddress(const std::string& text, SocketAddress* out, std::string* name);
// The address of the interface CC_SOCKET_IFNAME names (prefix match, ^ to exclude), or loopback when unset.
ccResult_t ChooseBootstrapAddress(SocketAddress* out);

// Opens a listening socket on `addr` (port 0 picks a free port; the chosen port is written back).
ccResult_t Listen(SocketAddress* addr, int* fd);
// Connects to `addr`, retrying refused connections until the deadline (the listener may not be up yet).
// Every blocking helper also gives up (ccRemoteError) soon after *cancel becomes true, when cancel is given.
ccResult_t Connect(const SocketAddress& addr, Deadline deadline, int* fd, const std::atomic<bool>* cancel = nullptr);
// Sends / receives exactly `bytes` bytes before the deadline.
ccResult_t SendAll(int fd, const void* buf, size_t bytes, Deadline deadline, const char* what,
                   const std::atomic<bool>* cancel = nullptr);
ccResult_t RecvAll(int fd, void* buf, size_t bytes, Deadline deadline, const char* what,
                   const std::atomic<bool>* cancel = nullptr);
void CloseFd(int fd);

}  // namespace ccoll
