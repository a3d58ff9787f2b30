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
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{0x7fc0};  // NaN: the one quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; overflow correctly becomes inf
  return Bf16{static_cast<uint16_t>(u >> 16)};
}

CC_HD float HalfToFloat(Half h) {
  uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in float
    float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

CC_HD Half FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return Half{0x7e00};  // NaN: the one quiet NaN
  if (absu >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (absu < 0x38800000u) {
    // Result is subnormal or zero: add 0.5 (2^-1) so the float adder does the ties-to-even rounding at 2^-24.
    float a = BitsFloat(absu) + 0.5f;
    return Half{static_cast<uint16_t>(sign | (FloatBits(a) - 0x3f000000u))};
  }
  uint32_t rounded = absu + 0xfffu + ((absu >> 13) & 1u);  // ties to even at bit 13
  return Half{static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
}

}  // namespace ccoll
