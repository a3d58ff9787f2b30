#include "compress/widen.h"

#include <algorithm>
#include <cstdint>

#include "compress/cpu_clones.h"  // the loops vectorize: integer selects, float adds in a fixed order, no contraction
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

namespace {

// Nonzero when the float32 bits are those of an infinity or a NaN (all exponent bits set).
inline uint32_t NonFinite(float f) { return static_cast<uint32_t>((FloatBits(f) & 0x7f800000u) == 0x7f800000u); }

template <typename W, typename Wire>
inline void NarrowSumLoop(const float* local, const W* a, const W* b, int nin, size_t count, W* out, float* lost,
                          Wire wire) {
  if (lost != nullptr) {
    for (size_t i = 0; i < count; ++i) {
      float v = local[i];
      if (nin > 0) v += wire.Load(a[i]);
      if (nin > 1) v += wire.Load(b[i]);
      out[i] = wire.Store(v);
      lost[i] = v - wire.Load(out[i]);  // exact: a float minus its own 16-bit rounding
    }
  } else if (nin == 0) {
    for (size_t i = 0; i < count; ++i) out[i] = wire.Store(local[i]);
  } else if (nin == 1) {
    for (size_t i = 0; i < count; ++i) out[i] = wire.Store(local[i] + wire.Load(a[i]));
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = wire.Store(local[i] + wire.Load(a[i]) + wire.Load(b[i]));
  }
}

struct Bf16Wire {
  float Load(uint16_t v) const { return Bf16ToFloat(Bf16{v}); }
  uint16_t Store(float v) const { return FloatToBf16(v).bits; }
};
struct HalfWire {
  float Load(uint16_t v) const { return HalfToFloat(Half{v}); }
  uint16_t Store(float v) const { return FloatToHalf(v).bits; }
};

template <typename Wire, bool kScaled, bool kAdd>
inline void NarrowingLossLoop(const float* v, size_t count, float share, float* lost, Wire wire) {
  for (size_t i = 0; i < count; ++i) {
    float l = v[i] - wire.Load(wire.Store(v[i]));  // exact, as NarrowSumLoop's
    if (kScaled) l *= share;
    l = NonFinite(l) != 0 ? 0.0f : l;  // v overflows 16 bits (or is not finite): nothing to keep
    lost[i] = kAdd ? lost[i] + l : l;
  }
}

template <typename Wire>
inline void NarrowingLossOf(const float* v, size_t count, float share, bool add, float* lost, Wire wire) {
  if (share != 1.0f) {
    if (add) {
      NarrowingLossLoop<Wire, true, true>(v, count, share, lost, wire);
    } else {
      NarrowingLossLoop<Wire, true, false>(v, count, share, lost, wire);
    }
  } else if (add) {
    NarrowingLossLoop<Wire, false, true>(v, count, share, lost, wire);
  } else {
    NarrowingLossLoop<Wire, false, false>(v, count, share, lost, wire);
  }
}

template <typename Wire>
inline void NarrowKeepingLoop(const float* v, size_t count, float share, float* lost, uint16_t* out, Wire wire) {
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h = wire.Store(v[i]);
    out[i] = h;
    const float l = (v[i] - wire.Load(h)) * share;  // (times 1 is exact)
    const float kept = lost[i] + (NonFinite(l) != 0 ? 0.0f : l);
    lost[i] = NonFinite(kept) != 0 ? 0.0f : kept;
  }
}

// AddChecked's loop over values of type T, each widened to float by `widen` (exact).
template <typename T, typename W>
inline AddReport AddLoop(const T* in, size_t count, float* acc, W widen) {
  uint32_t badIn = 0, badSum = 0;
  for (size_t i = 0; i < count; ++i) {
    const float v = widen(in[i]);
    const float s = acc[i] + v;
    acc[i] = s;
    badIn |= NonFinite(v);  // widening is exact: non-finite exactly when the input value is
    badSum |= NonFinite(s);
  }
  AddReport r;
  r.inputFinite = badIn == 0;
  r.sumsFinite = badSum == 0;
  return r;
}

}  // namespace

CC_HOT CC_FLATTEN void NarrowSum(ccDataType_t dtype, const float* local, const void* const* in, int nin, size_t count,
                                  void* out, float* lost) {
  const uint16_t* a = nin > 0 ? static_cast<const uint16_t*>(in[0]) : nullptr;
  const uint16_t* b = nin > 1 ? static_cast<const uint16_t*>(in[1]) : nullptr;
  uint16_t* o = static_cast<uint16_t*>(out);
  if (dtype == ccBfloat16) {
    NarrowSumLoop(local, a, b, nin, count, o, lost, Bf16Wire());
  } else {
    NarrowSumLoop(local, a, b, nin, count, o, lost, HalfWire());
  }
}

CC_HOT CC_FLATTEN void NarrowingLoss(ccDataType_t dtype, const float* v, size_t count, float share, bool add,
                                      float* lost) {
  if (dtype == ccBfloat16) {
    NarrowingLossOf(v, count, share, add, lost, Bf16Wire());
  } else {
    NarrowingLossOf(v, count, share, add, lost, HalfWire());
  }
}

CC_HOT CC_FLATTEN void NarrowKeeping(ccDataType_t dtype, const float* v, size_t count, float share, float* lost,
                                      void* out) {
  uint16_t* h = static_cast<uint16_t*>(out);
  if (dtype == ccBfloat16) {
    NarrowKeepingLoop(v, count, share, lost, h, Bf16Wire());
  } else {
    NarrowKeepingLoop(v, count, share, lost, h, HalfWire());
  }
}

CC_HOT AddReport AddChecked(ccDataType_t dtype, const void* in, size_t count, float* acc) {
  if (dtype == ccFloat32) return AddLoop(static_cast<const float*>(in), count, acc, [](float v) { return v; });
  const uint16_t* h = static_cast<const uint16_t*>(in);
  if (dtype == ccBfloat16) return AddLoop(h, count, acc, [](uint16_t b) { return Bf16ToFloat(Bf16{b}); });
  return AddLoop(h, count, acc, [](uint16_t b) { return HalfToFloat(Half{b}); });
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
