#include "compress/widen.h"

#include <algorithm>
#include <cstdint>

#include "compress/cpu_clones.h"  // the loops vectorize; integer and exact float operations: the same bytes
#include "compress/float16.h"

namespace ccoll {

bool IsHalfFloat(ccDataType_t dtype) { return dtype == ccBfloat16 || dtype == ccFloat16; }

CC_HOT void Widen(ccDataType_t dtype, const void* in, size_t count, float* out) {
  const uint16_t* h = static_cast<const uint16_t*>(in);
  if (dtype == ccBfloat16) {
    for (size_t i = 0; i < count; ++i) out[i] = Bf16ToFloat(Bf16{h[i]});
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = HalfToFloat(Half{h[i]});
  }
}

CC_HOT void Narrow(ccDataType_t dtype, const float* in, size_t count, void* out) {
  uint16_t* h = static_cast<uint16_t*>(out);
  if (dtype == ccBfloat16) {
    for (size_t i = 0; i < count; ++i) h[i] = FloatToBf16(in[i]).bits;
  } else {
    for (size_t i = 0; i < count; ++i) h[i] = FloatToHalf(in[i]).bits;
  }
}

CC_HOT void AddWidened(ccDataType_t dtype, const void* in, size_t count, float* acc) {
  const uint16_t* h = static_cast<const uint16_t*>(in);
  if (dtype == ccBfloat16) {
    for (size_t i = 0; i < count; ++i) acc[i] += Bf16ToFloat(Bf16{h[i]});
  } else {
    for (size_t i = 0; i < count; ++i) acc[i] += HalfToFloat(Half{h[i]});
  }
}

namespace {

// Nonzero when the float32 bits are those of an infinity or a NaN (all exponent bits set).
inline uint32_t NonFinite(float f) { return static_cast<uint32_t>((FloatBits(f) & 0x7f800000u) == 0x7f800000u); }

}  // namespace

CC_HOT AddReport AddChecked(ccDataType_t dtype, const void* in, size_t count, float* acc) {
  uint32_t badIn = 0, badSum = 0;
  if (dtype == ccFloat32) {
    const float* f = static_cast<const float*>(in);
    for (size_t i = 0; i < count; ++i) {
      const float s = acc[i] + f[i];
      acc[i] = s;
      badIn |= NonFinite(f[i]);
      badSum |= NonFinite(s);
    }
  } else if (dtype == ccBfloat16) {  // widening is exact: non-finite exactly when the 16-bit value is
    const uint16_t* h = static_cast<const uint16_t*>(in);
    for (size_t i = 0; i < count; ++i) {
      const float v = Bf16ToFloat(Bf16{h[i]});
      const float s = acc[i] + v;
      acc[i] = s;
      badIn |= NonFinite(v);
      badSum |= NonFinite(s);
    }
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(in);
    for (size_t i = 0; i < count; ++i) {
      const float v = HalfToFloat(Half{h[i]});
      const float s = acc[i] + v;
      acc[i] = s;
      badIn |= NonFinite(v);
      badSum |= NonFinite(s);
    }
  }
  AddReport r;
  r.inputFinite = badIn == 0;
  r.sumsFinite = badSum == 0;
  return r;
}

CC_HOT bool AllFinite(ccDataType_t dtype, const void* in, size_t count) {
  // Infinity and NaN are the values whose exponent bits are all ones.
  uint32_t bad = 0;
  if (dtype == ccFloat32) {
    const float* f = static_cast<const float*>(in);
    for (size_t i = 0; i < count; ++i) bad |= NonFinite(f[i]);
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(in);
    const uint16_t exponent = dtype == ccBfloat16 ? 0x7f80 : 0x7c00;
    for (size_t i = 0; i < count; ++i) bad |= static_cast<uint32_t>((h[i] & exponent) == exponent);
  }
  return bad == 0;
}

void FillNarrowed(ccDataType_t dtype, float value, size_t count, void* out) {
  const uint16_t bits = dtype == ccBfloat16 ? FloatToBf16(value).bits : FloatToHalf(value).bits;
  std::fill(static_cast<uint16_t*>(out), static_cast<uint16_t*>(out) + count, bits);
}

}  // namespace ccoll
