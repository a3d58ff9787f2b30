// The call check: before any data moves, the ranks agree on what they were called with (collective, count,
// datatype, op, root, compressor spec and call number, and where the call runs) and on whether every rank took its
// arguments; they also learn whether any rank runs the call in a device codec. Each field's lowest and highest value
// over all ranks, with the ranks that hold them, travel in a 264-byte record through ceil(log2 n) steps of an
// exchange: recursive doubling where the messages have a room (below), else dissemination (step k: send to rank
// r + 2^k, receive from r - 2^k; min and max do not mind seeing a rank twice). Every rank ends with the same record,
// so on a mismatch every rank returns ccInvalidUsage naming the field and the ranks that differ (or the rank that
// refused the call), nothing is written, and the communicator stays usable. CC_CHECK_CALLS=0 turns it off.
//
// A small exact collective rides in the check (CC_CHECK_INLINE_BYTES, where n is a power of two): the exchange is
// then recursive doubling (step k: with rank r ^ 2^k), and each check message carries, after its record, what that
// step sends of the rank's partial result (collectives/inline_call.h says what, and how the two partial results
// combine, for each collective). A receive takes up to a whole room, so a rank whose call does not ride sends its
// record alone. Whether every rank's data rode is a field of the record; where it did and the calls match, each rank
// writes the result and the call is done in ceil(log2 n) exchanges instead of the check's and then the schedule's
// (for an all-reduce the tree's 2 log2 n, for the others the ring's n - 1 or more). Otherwise what rode is ignored
// and the call runs its schedule as without it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ccoll.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

struct InlineCall;

// Bytes of the record each rank sends in each step of the check.
constexpr size_t kCallCheckRecordBytes = 264;

// The most bytes a check message carries after its record on comm (its room): CC_CHECK_INLINE_BYTES where nranks is
// a power of two, else 0.
size_t CallCheckInlineBytes(const ccComm* comm);

// What a rank was called with.
struct CallDescriptor {
  int kind = 0;  // 0 all-reduce, 1 reduce-scatter, 2 all-gather, 3 broadcast, 4 reduce
  uint64_t count = 0;
  int dtype = 0;
  int op = 0;
  int root = 0;
  uint64_t compressor = 0;  // hash of the compressor's canonical spec; 0 without one
  uint64_t calls = 0;       // the compressor's calls since its state was made or reset (its dithers and chunk
                            // choices follow it); 0 without one
  // Where the call runs, as far as the ranks must agree (kPath*): host buffers and device buffers may meet in one call
  // where the device path exchanges the host schedule's messages, but not a stream-ordered call (transport nccl)
  // and a host one, nor PowerSGD products on cuBLAS and on the CPU BLAS (their results would differ by rank).
  int path = 0;
  // This rank runs the compressed schedule on its device buffers in the proxy's device codec (args.onDevice), which
  // has no segments (compressed.cc's SegmentsOf). Not compared: the ranks only learn whether any rank does.
  int deviceCodec = 0;
  int refused = 0;          // a ccResult_t: this rank refused its arguments (then the fields above are not compared)
  std::string spec;         // the spec itself (for this rank's error message; it does not travel)
};

constexpr int kPathStream = 1;          // queued on the caller's stream through NCCL (transport nccl)
constexpr int kPathDeviceProducts = 2;  // PowerSGD's products on cuBLAS

CallDescriptor DescribeCall(int kind, size_t count, ccDataType_t dtype, ccRedOp_t op, int root,
                            const ccCompressor* compressor, int path, bool deviceCodec);

// The call of a rank that refused its arguments with error `refused` (the raw values it was called with; nothing of
// a compressor, which may not even be one).
CallDescriptor RefusedCall(int kind, size_t count, int dtype, int op, int root, ccResult_t refused);

// Agrees on the call with every other rank. Returns ccInvalidUsage with *agreed = true when the ranks made
// different calls (every rank returns the same verdict; nothing is left in flight); any other failure (a dead peer,
// a timeout) leaves *agreed false and the group out of step. On success, *anyDeviceCodec (when not null) says whether
// any rank's deviceCodec was set: the same answer on every rank.
// With `small` (not null, small->rides set): this rank's data rides in its messages (see the top of this file, and
// collectives/inline_call.h).
ccResult_t CheckCallMatches(ccComm* comm, const CallDescriptor& mine, bool* agreed, bool* anyDeviceCodec = nullptr,
                            InlineCall* small = nullptr);

}  // namespace ccoll
