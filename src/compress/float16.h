// IEEE binary16 and bfloat16 storage types with round-to-nearest-even conversions from float, as host/device
// element math. Storage only: arithmetic is done in float and rounded back once per operation.
//
// Every NaN converts to one quiet NaN (bfloat16 0x7fc0, binary16 0x7e00), its sign and payload dropped: the NaN a
// float operation makes is the CPU's (an input NaN's bits, or 0xffc00000 on x86) on the host and 0x7fffffff on a GPU,
// so the same element math would otherwise narrow to other bits on the two.
#pragma once

#include <cstdint>
#include <cstring>

#include "compress/host_device.h"

namespace ccoll {

struct Half {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};

CC_HD uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

CC_HD float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

CC_HD float Bf16ToFloat(Bf16 h) { return BitsFloat(static_cast<uint32_t>(h.bits) << 16); }

CC_HD Bf16 FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest, ties to even; overflow gives inf
  return Bf16{static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded)};  // NaN: the one NaN
}

CC_HD float HalfToFloat(Half h) {
  const uint32_t shifted = static_cast<uint32_t>(h.bits & 0x7fffu) << 13;  // exponent and mantissa, float's places
  const uint32_t exp = shifted & 0x0f800000u;
  const uint32_t normal = shifted + (112u << 23);  // rebiased (15 -> 127)
  // inf and NaN: the exponent all ones again. Zero and subnormals: m * 2^-24, as (2^-14 + m 2^-24) - 2^-14 (exact).
  const uint32_t special = normal + (112u << 23);
  const float tiny = BitsFloat(normal + (1u << 23)) - BitsFloat(113u << 23);
  const uint32_t mag = exp == 0x0f800000u ? special : (exp == 0 ? FloatBits(tiny) : normal);
  return BitsFloat(mag | (static_cast<uint32_t>(h.bits & 0x8000u) << 16));
}

CC_HD Half FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  const uint32_t normal = (absu + 0xfffu + ((absu >> 13) & 1u) - 0x38000000u) >> 13;  // ties to even at bit 13
  // A result below 2^-14 (subnormal or zero): adding 0.5 (2^-1) makes the float adder round to even at 2^-24.
  const uint32_t tiny = FloatBits(BitsFloat(absu) + 0.5f) - 0x3f000000u;
  uint32_t mag = absu < 0x38800000u ? tiny : normal;
  mag = absu >= 0x477ff000u ? 0x7c00u : mag;  // rounds to 65520 or more: inf
  return Half{static_cast<uint16_t>(absu > 0x7f800000u ? 0x7e00u : (sign | mag))};  // NaN: the one quiet NaN
}

}  // namespace ccoll
