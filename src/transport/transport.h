// The transport interface: non-blocking, tagged sends and receives of byte ranges between ranks. Transports know
// nothing of codecs or schedules. A send's buffer must stay untouched, and a receive's buffer unread, until the
// request completes. Every message carries a wire header (transport/wire.h): the sender stamps the payload's kind,
// the receiver says which kind it expects, and the transport checks the two (and, with CC_CHECKSUM=1, the CRC32C)
// before the receive completes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ccoll.h"
#include "transport/wire.h"

namespace ccoll {

class Transport;

// Moves the messages of a transport that carries device memory (CUDA). The transport asks it about every buffer
// posted once it has one (Transport::SetDeviceCopier).
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // Whether p points to device memory.
  virtual bool IsDevice(const void* p) const = 0;
  // Copies `bytes` bytes from src to dst, of which at least one is device memory; returns once they are there. May
  // be called from any thread.
  virtual ccResult_t CopyMessage(void* dst, const void* src, size_t bytes) = 0;
};

// One pending send or receive. Owned by its transport; freed by Wait/Test once they report completion or error.
// Every transport's request starts with the message as it was posted.
struct Request {
  Transport* owner = nullptr;
  bool isSend = false;
  int peer = 0;
  void* buf = nullptr;
  size_t bytes = 0;
  uint64_t tag = 0;
  WireKind kind = 0;  // a send's payload kind, or the kind a receive expects
  size_t* received = nullptr;  // a receive of at most `bytes` (IrecvAtMost): where the length that arrived goes
  Request* openPrev = nullptr;  // the transfers open in its Inflight (core/comm.h), a list through the requests
  Request* openNext = nullptr;

  // Whether a receive takes a payload of `length` bytes: exactly `bytes`, or at most that (IrecvAtMost).
  bool LengthFits(uint64_t length) const { return received != nullptr ? length <= bytes : length == bytes; }

  void Describe(Transport* t, bool send, int p, void* b, size_t n, uint64_t tg, WireKind k) {
    owner = t;
    isSend = send;
    peer = p;
    buf = b;
    bytes = n;
    tag = tg;
    kind = k;
  }
};

// Work a rank can do while it waits for the network, run piece by piece inside Wait: RunPiece does one piece, short
// enough (tens of microseconds) not to hold up the transfers, and returns false once nothing is left.
class IdleWork {
 public:
  virtual ~IdleWork() = default;
  virtual bool RunPiece() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* Name() const = 0;
  // Posts a send of `bytes` bytes to rank `peer`. Messages between one pair of ranks match in order of tags.
  virtual ccResult_t Isend(int peer, const void* buf, size_t bytes, uint64_t tag, WireKind kind, Request** req) = 0;
  // Posts a receive of exactly `bytes` bytes from rank `peer`; a send of another size is a ccInvalidUsage error on
  // both sides (it means the ranks called with different counts or datatypes); so is a message of another kind.
  virtual ccResult_t Irecv(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, Request** req) = 0;
  // Posts a receive of at most `bytes` bytes: a message of that length or shorter completes it, and *received (which
  // must stay valid until the request completes) then holds its length; a longer one is a ccInvalidUsage error on
  // the receiver, as a send of another size is for Irecv.
  virtual ccResult_t IrecvAtMost(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, size_t* received,
                                 Request** req) = 0;
  // Blocks until `req` completes, fails, the transport is aborted, or `timeoutMs` passes. Frees req in all cases.
  // Meanwhile, while the request is not done, runs pieces of `idle` (when given) until it has none left, when
  // RunsIdleWork(); a transport that moves the data with the CPU itself (local) ignores it.
  virtual ccResult_t Wait(Request* req, int timeoutMs, IdleWork* idle = nullptr) = 0;
  virtual bool RunsIdleWork() const { return false; }
  // Makes every pending and future Wait on this transport, and on the peers waiting for this rank, fail.
  virtual void Abort(const char* reason) = 0;

  // Whether this transport can carry device memory, given a DeviceCopier (the local transport can; UCX here cannot).
  virtual bool CarriesDeviceMemory() const { return false; }
  // From now on, a posted buffer that copier->IsDevice() says is device memory is moved with copier. Called once,
  // before any transfer of device memory; the copier outlives the transport's use of it. Only when
  // CarriesDeviceMemory().
  virtual void SetDeviceCopier(DeviceCopier* /*copier*/) {}

  // CC_CHECKSUM: sends carry the payload's CRC32C and receives verify it. Set once, before any transfer.
  void SetChecksum(bool on) { checksum_ = on; }

 protected:
  bool checksum_ = false;
};

}  // namespace ccoll
