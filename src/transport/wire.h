// The wire header: every message between ranks starts with 24 bytes that say what it is (magic, version, the kind
// of payload the sending schedule meant, its length) and, with CC_CHECKSUM=1, the CRC32C of the payload. The
// receiver names the kind and length it expects; CheckWireHeader turns any difference into an error that names the
// peer, before a codec or a reduction reads a byte of the payload. Transports stamp and check the header; they do
// not know what the kinds mean (the schedules choose them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ccoll.h"

namespace ccoll {

constexpr uint32_t kWireMagic = 0x77636363;  // "cccw" on little-endian hosts
constexpr uint8_t kWireVersion = 1;
constexpr uint8_t kWireFlagCrc = 1;  // `crc` holds the payload's CRC32C
// The payload follows as a UCP message of its own (transport/ucx.cc). The UCX transport sets it, and clears it from
// a header that it took as split before the check; on any other header the check rejects it as unknown.
constexpr uint8_t kWireFlagSplit = 2;

// What a payload is. Schedules pick the number; transports only compare it.
using WireKind = uint16_t;
constexpr WireKind kWireData = 1;           // elements of the user's datatype (exact collectives, metadata)
constexpr WireKind kWireCallCheck = 2;      // the call check's record (and the data that rides in it)
constexpr WireKind kWirePointToPoint = 3;   // a ccSend's elements
constexpr WireKind kWirePointToPointLength = 4;  // the length sent before a ccSend's slices (collectives/p2p.cc)
constexpr WireKind kWireCodecBase = 0x100;  // + ccCompressorKind_t: one codec's messages

struct WireHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t flags;
  uint16_t kind;
  uint32_t crc;       // CRC32C of the payload with kWireFlagCrc, else zero
  uint32_t reserved;  // zero
  uint64_t length;    // payload bytes that follow the header
};
static_assert(sizeof(WireHeader) == 24, "the header is a wire format");

// CRC32C (Castagnoli, as iSCSI and ext4 use it) of n bytes; 0xe3069283 for "123456789".
uint32_t Crc32c(const void* data, size_t n);
// Whether this build can compute CRC32C (it needs ISA-L); CC_CHECKSUM=1 is refused otherwise.
bool HaveCrc32c();

WireHeader MakeWireHeader(WireKind kind, const void* payload, size_t bytes, bool checksum);

// Checks a header that arrived from `peer` in front of `bytes` payload bytes, against the kind this rank expects.
// `checksum`: this rank runs with CC_CHECKSUM=1 (all ranks agree on it at init), so the header must carry a CRC and
// the payload must match it. Malformed headers and corrupted payloads are ccRemoteError; a kind or length other
// than the receiver's is ccInvalidUsage (the ranks made different calls). On failure `why` gets the sentence; the
// caller Fail()s with it in the thread that owns the receive.
ccResult_t CheckWireHeader(const WireHeader& h, WireKind expect, const void* payload, size_t bytes, bool checksum,
                           int self, int peer, uint64_t tag, std::string* why);

const char* WireKindName(WireKind kind);

}  // namespace ccoll
