// Memory of destroyed handles (ccComm, ccCompressor) kept out of reuse for a while. The API finds a destroyed handle
// by its address not being live; if the allocator gave that address to the next communicator or compressor at once,
// a stale handle (a second destroy, a call after destroy) would name the new object instead of failing. The
// quarantine delays the actual free of the last kQuarantinedHandles handles, as ASan's quarantine does for all
// memory.
#pragma once

#include <cstddef>

namespace ccoll {

constexpr size_t kQuarantinedHandles = 4096;

// Takes the memory of a destroyed handle (its destructor has run) and frees the oldest one held beyond the limit.
void QuarantineHandle(void* memory);

}  // namespace ccoll

// For a handle type: its memory goes to the quarantine instead of back to the allocator.
#define CC_QUARANTINED_HANDLE \
  static void operator delete(void* memory) { ccoll::QuarantineHandle(memory); }
