// The call check: before any data moves, every rank shows its ring neighbours what it was called with (collective,
// count, datatype, op, root, compressor spec), and a rank whose neighbour made a different call fails with
// ccInvalidUsage naming both calls, then aborts the communicator so that every other rank fails at once too
// (ccRemoteError) instead of computing garbage or waiting for the timeout. Costs one exchange of a 40-byte message
// with each neighbour per collective; CC_CHECK_CALLS=0 turns it off.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ccoll.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

// What a rank was called with, as it travels (fixed layout, little-endian hosts).
struct CallDescriptor {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t kind = 0;          // 0 all-reduce, 1 reduce-scatter, 2 all-gather, 3 broadcast
  uint64_t count = 0;
  int32_t dtype = 0;
  int32_t op = 0;
  int32_t root = 0;
  uint32_t reserved = 0;
  uint64_t compressor = 0;    // hash of the compressor's canonical spec; 0 without one
};
static_assert(sizeof(CallDescriptor) == 40, "the descriptor is a wire format");

CallDescriptor DescribeCall(int kind, size_t count, ccDataType_t dtype, ccRedOp_t op, int root,
                            const ccCompressor* compressor);

// Exchanges descriptors with both ring neighbours and compares.
ccResult_t CheckCallMatches(ccComm* comm, const CallDescriptor& mine);

}  // namespace ccoll
