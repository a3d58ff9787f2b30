// The in-process transport: ranks that are threads of one process exchange data by a single memcpy from the
// sender's buffer into the receiver's; the wire header goes beside it and is checked like any other. Device memory
// (thread ranks on GPUs of one process) is copied by the DeviceCopier of the side whose buffer is on a device, on the
// thread that completes the match; such a message carries no CRC32C under CC_CHECKSUM=1 (a copy within one process,
// with no wire to corrupt it), its header is checked all the same. Ranks find each
// other through a process-wide table keyed by the group's secret (from the unique id), filled before the bootstrap
// all-gather completes.
#pragma once

#include <memory>
#include <string>

#include "transport/transport.h"

namespace ccoll {

class LocalGroup;

class LocalTransport : public Transport {
 public:
  // Registers `rank` in the process-wide group `key` (created by its first rank).
  static ccResult_t Create(const std::string& key, int rank, int nranks, std::unique_ptr<LocalTransport>* out);
  ~LocalTransport() override;

  const char* Name() const override { return "local"; }
  ccResult_t Isend(int peer, const void* buf, size_t bytes, uint64_t tag, WireKind kind, Request** req) override;
  ccResult_t Irecv(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, Request** req) override;
  ccResult_t IrecvAtMost(int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, size_t* received,
                         Request** req) override;
  ccResult_t Wait(Request* req, int timeoutMs, IdleWork* idle = nullptr) override;
  void Abort(const char* reason) override;
  bool CarriesDeviceMemory() const override { return true; }
  void SetDeviceCopier(DeviceCopier* copier) override { copier_ = copier; }

  // True once rank `peer` has joined the group, also if it has left since (used at init to check that peers really
  // are in this process: a peer that finished its init first may already have destroyed its communicator).
  bool PeerPresent(int peer) const;

 private:
  ccResult_t AbortedError();
  ccResult_t Post(bool isSend, int peer, void* buf, size_t bytes, uint64_t tag, WireKind kind, size_t* received,
                  Request** req);
  LocalTransport(std::shared_ptr<LocalGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  std::shared_ptr<LocalGroup> group_;
  int rank_;
  DeviceCopier* copier_ = nullptr;
};

}  // namespace ccoll
