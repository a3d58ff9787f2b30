#include "transport/wire.h"

#include <cstdarg>
#include <cstdio>

#ifdef CCOLL_HAVE_ISAL
#include <isa-l/crc.h>
#endif

namespace ccoll {

bool HaveCrc32c() {
#ifdef CCOLL_HAVE_ISAL
  return true;
#else
  return false;
#endif
}

uint32_t Crc32c(const void* data, size_t n) {
#ifdef CCOLL_HAVE_ISAL
  // ISA-L's crc32_iscsi is the reflected CRC32C register without the final inversion, and takes int lengths.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t crc = 0xffffffffu;
  constexpr size_t kPiece = size_t{1} << 30;
  while (n > 0) {
    const size_t piece = n < kPiece ? n : kPiece;
    crc = crc32_iscsi(p, static_cast<int>(piece), crc);
    p += piece;
    n -= piece;
  }
  return ~crc;
#else
  (void)data;
  (void)n;
  return 0;  // unreachable: CC_CHECKSUM=1 is refused at init without ISA-L
#endif
}

const char* WireKindName(WireKind kind) {
  switch (kind) {
    case kWireData:
      return "data message";
    case kWireCallCheck:
      return "call-check record";
    case kWirePointToPoint:
      return "point-to-point message";
    case kWirePointToPointLength:
      return "point-to-point length (sent before a message of more than a slice)";
    case kWireCodecBase + ccCompressCast16:
      return "cast16 payload";
    case kWireCodecBase + ccCompressQuant:
      return "quant payload";
    case kWireCodecBase + ccCompressTopkChunk:
      return "topk payload";
    case kWireCodecBase + ccCompressRandk:
      return "randk payload";
    case kWireCodecBase + ccCompressPowerSGD:
      return "powersgd payload";
    default:
      return "unknown payload";
  }
}

WireHeader MakeWireHeader(WireKind kind, const void* payload, size_t bytes, bool checksum) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = kind;
  h.length = bytes;
  if (checksum) {
    h.flags = kWireFlagCrc;
    h.crc = Crc32c(payload, bytes);
  }
  return h;
}

namespace {

ccResult_t Explain(std::string* why, ccResult_t result, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
ccResult_t Explain(std::string* why, ccResult_t result, const char* fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  *why = text;
  return result;
}

}  // namespace

ccResult_t CheckWireHeader(const WireHeader& h, WireKind expect, const void* payload, size_t bytes, bool checksum,
                           int self, int peer, uint64_t tag, std::string* why) {
  const auto t = static_cast<unsigned long long>(tag);
  if (h.magic != kWireMagic || h.version != kWireVersion || (h.flags & ~kWireFlagCrc) != 0 || h.reserved != 0) {
    return Explain(why, ccRemoteError,
                   "rank %d received a malformed message from rank %d (tag %llu): magic 0x%08x version "
                   "%u flags 0x%x; expected magic 0x%08x version %u (a foreign or corrupted message, or another ccoll "
                   "version)",
                   self, peer, t, h.magic, h.version, h.flags, kWireMagic, kWireVersion);
  }
  const bool pointToPoint = (h.kind == kWirePointToPoint || h.kind == kWirePointToPointLength) &&
                            (expect == kWirePointToPoint || expect == kWirePointToPointLength);
  if (h.kind != expect && pointToPoint) {
    return Explain(why, ccInvalidUsage,
                   "rank %d expected a %s from rank %d (tag %llu) but got a %s: a ccSend and its ccRecv differ in "
                   "size",
                   self, WireKindName(expect), peer, t, WireKindName(h.kind));
  }
  if (h.kind != expect) {
    return Explain(why, ccInvalidUsage,
                   "rank %d expected a %s from rank %d (tag %llu) but got a %s: the ranks called "
                   "different collectives or compressors",
                   self, WireKindName(expect), peer, t, WireKindName(h.kind));
  }
  if (h.length != bytes) {
    return Explain(why, ccRemoteError,
                   "rank %d received a message from rank %d (tag %llu) whose header says %llu bytes but "
                   "%zu arrived",
                   self, peer, t, static_cast<unsigned long long>(h.length), bytes);
  }
  // All ranks agreed on CC_CHECKSUM at init, so the flag must be this rank's setting, and without a checksum the
  // field is zero: every bit of the header is checked.
  if (((h.flags & kWireFlagCrc) != 0) != checksum || (!checksum && h.crc != 0)) {
    return Explain(why, ccRemoteError,
                   "rank %d runs with CC_CHECKSUM=%d but the message from rank %d (tag %llu) has checksum flag %d and "
                   "field 0x%08x (a corrupted header)",
                   self, checksum ? 1 : 0, peer, t, h.flags & kWireFlagCrc, h.crc);
  }
  if (checksum) {
    const uint32_t crc = Crc32c(payload, bytes);
    if (crc != h.crc) {
      return Explain(why, ccRemoteError,
                     "rank %d: the %zu-byte %s from rank %d (tag %llu) is corrupted: CRC32C 0x%08x, "
                     "sent as 0x%08x",
                     self, bytes, WireKindName(h.kind), peer, t, crc, h.crc);
    }
  }
  return ccSuccess;
}

}  // namespace ccoll
