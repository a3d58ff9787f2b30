// libFuzzer target: the wire header check (transport/wire.h) on arbitrary headers and payloads, which is what a
// receiver runs on every message before anything reads the payload. Two modes, chosen by the first byte:
//   raw:     24 arbitrary header bytes and a payload; the check must not crash or read past the payload (a heap block
//            of exactly its size), and a success with CC_CHECKSUM=1 must mean the CRC matches.
//   flipped: a header made by MakeWireHeader for the payload, then one bit flipped (in the header or the payload) or
//            none; the check must accept the untouched message, reject every flipped header bit, and reject every
//            flipped payload bit exactly when it keeps a checksum.
// Input: mode (u8), checksum (u8 bit 0), kind (u16), flip position (u32), then the header (raw mode) and payload.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz_input.h"
#include "transport/wire.h"

namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_wire: property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ccoll_fuzz::Input in(data, size);
  const uint8_t mode = in.U8() & 1;
  const bool checksum = (in.U8() & 1) != 0 && ccoll::HaveCrc32c();
  const ccoll::WireKind kind = in.U16();
  const uint32_t flip = in.U32();
  ccoll::WireHeader h{};
  if (mode == 0) in.Bytes(&h, sizeof(h));
  const size_t bytes = in.left();
  std::unique_ptr<uint8_t[]> payload(new uint8_t[bytes ? bytes : 1]);
  in.Bytes(payload.get(), bytes);
  std::string why;
  if (mode == 0) {
    const ccResult_t rc = ccoll::CheckWireHeader(h, kind, payload.get(), bytes, checksum, 0, 1, 7, &why);
    Require(rc == ccSuccess || !why.empty(), "a rejection without a reason");
    if (rc == ccSuccess && checksum) Require(ccoll::Crc32c(payload.get(), bytes) == h.crc, "accepted a bad CRC");
    return 0;
  }
  h = ccoll::MakeWireHeader(kind, payload.get(), bytes, checksum);
  Require(ccoll::CheckWireHeader(h, kind, payload.get(), bytes, checksum, 0, 1, 7, &why) == ccSuccess,
          "rejected an untouched message");
  const size_t bits = (sizeof(h) + bytes) * 8;
  const size_t bit = flip % (bits + 1);
  if (bit == bits) return 0;  // no flip this time
  bool mustFail;
  if (bit < sizeof(h) * 8) {
    reinterpret_cast<uint8_t*>(&h)[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    mustFail = true;
  } else {
    const size_t b = bit - sizeof(h) * 8;
    payload[b / 8] ^= static_cast<uint8_t>(1u << (b % 8));
    mustFail = checksum;
  }
  const ccResult_t rc = ccoll::CheckWireHeader(h, kind, payload.get(), bytes, checksum, 0, 1, 7, &why);
  Require((rc != ccSuccess) == mustFail, mustFail ? "accepted a flipped bit" : "rejected a harmless flip");
  return 0;
}
