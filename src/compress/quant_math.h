// Element math of b-bit quantization: a uniform grid of L = 2^b - 1 steps over [-s, s], codes 0..L, and the
// rounding rules (nearest, stochastic with a dither u in (0,1), or correlated: dithers stratified across ranks).
// The grid and scale rules are kept here, apart from the drivers, so that the level table can be replaced.
#pragma once

#include <cmath>
#include <cstdint>

#include "compress/float16.h"
#include "compress/host_device.h"

namespace ccoll {

enum class ScaleFormat : int { kFp32 = 0, kBf16 = 1, kFp16 = 2 };

CC_HD uint32_t Levels(int bits) { return (1u << bits) - 1u; }

// Code of x on the grid of scale s (s >= |x| after rounding the scale up), with dither u: floor(p + u) where
// p = x * invStep + shift is x's position on the grid (shift = s * invStep). u = 0.5 rounds to nearest. Non-finite
// values and a zero scale give code 0; a group with a non-finite scale decodes to non-finite values anyway, and a
// zero scale decodes to exact zeros. Built without floating-point contraction (no FMA), so every CPU and the GPU
// compute the same codes.
CC_HD uint32_t QuantizeCode(float x, float invStep, float shift, uint32_t levels, float u) {
  float v = x * invStep + shift + u;
  v = v > 0.0f ? v : 0.0f;  // also maps NaN to 0: no undefined float-to-int conversion
  v = v < static_cast<float>(levels) ? v : static_cast<float>(levels);
  return static_cast<uint32_t>(static_cast<int32_t>(v));  // v is in [0, 65535]: the signed conversion vectorizes
}

// Grid of scale s: steps of 2s/L from -s, given as half a step, half = s/L, and invStep = L/(2s) (0 for a zero
// scale), computed as (L/2)/s. Code c stands for c * 2s/L - s, computed in halves as 2 * (c * half - s/2), so that no
// value on the way exceeds s (c * step would reach 2s): every finite scale, up to FLT_MAX, has a finite grid.
// Halving and doubling are exact in float's normal range (half >= kMinScale / 65535), so these are the bits of the
// plain forms wherever those do not overflow.
CC_HD float InvStepOf(float s, uint32_t levels) { return s > 0.0f ? 0.5f * static_cast<float>(levels) / s : 0.0f; }

CC_HD void GridOf(float s, uint32_t levels, float* half, float* invStep) {
  *half = s / static_cast<float>(levels);
  *invStep = InvStepOf(s, levels);
}

CC_HD float DequantizeCode(uint32_t code, float half, float s) {
  return (static_cast<float>(code) * half - 0.5f * s) * 2.0f;
}

// The value of a sum c of nranks codes on one grid (the homomorphic lanes): c * 2s/L - nranks * s, in halves.
CC_HD float DequantizeSum(uint32_t c, float half, float s, float nranks) {
  return (static_cast<float>(c) * half - nranks * (0.5f * s)) * 2.0f;
}

// Scales below this are flushed to zero: the grid's inverse step L / (2s) would overflow float for them. Values
// that small (denormals and their neighbours) then decode to exact zeros, an absolute error below 1e-30.
constexpr float kMinScale = 1e-30f;
CC_HD float FlushTinyScale(float s) { return s < kMinScale ? 0.0f : s; }

// Rounds a positive scale up to the next value representable in `format`, so |x| <= stored scale still holds.
// Non-finite scales stay non-finite (the group then decodes to non-finite values on every rank).
CC_HD float RoundScaleUp(float s, ScaleFormat format) {
  if (format == ScaleFormat::kBf16) {
    Bf16 h = FloatToBf16(s);
    if (Bf16ToFloat(h) < s) h.bits = static_cast<uint16_t>(h.bits + 1);
    return Bf16ToFloat(h);
  }
  if (format == ScaleFormat::kFp16) {
    Half h = FloatToHalf(s);
    if (HalfToFloat(h) < s) h.bits = static_cast<uint16_t>(h.bits + 1);
    return HalfToFloat(h);
  }
  return s;
}

CC_HD int ScaleBytes(ScaleFormat format) { return format == ScaleFormat::kFp32 ? 4 : 2; }

CC_HD void StoreScale(void* dst, float s, ScaleFormat format) {
  if (format == ScaleFormat::kBf16) {
    Bf16 h = FloatToBf16(s);
    __builtin_memcpy(dst, &h, 2);
  } else if (format == ScaleFormat::kFp16) {
    Half h = FloatToHalf(s);
    __builtin_memcpy(dst, &h, 2);
  } else {
    __builtin_memcpy(dst, &s, 4);
  }
}

CC_HD float LoadScale(const void* src, ScaleFormat format) {
  if (format == ScaleFormat::kBf16) {
    Bf16 h;
    __builtin_memcpy(&h, src, 2);
    return Bf16ToFloat(h);
  }
  if (format == ScaleFormat::kFp16) {
    Half h;
    __builtin_memcpy(&h, src, 2);
    return HalfToFloat(h);
  }
  float s;
  __builtin_memcpy(&s, src, 4);
  return s;
}

// A group's scale as a message carries it: rounded up to `format` (so |x| <= scale still holds), stored at dst, and
// returned as the decoder will read it back (the grid the codes are made on).
CC_HD float StoreGroupScale(void* dst, float s, ScaleFormat format) {
  StoreScale(dst, RoundScaleUp(s, format), format);
  return LoadScale(dst, format);
}

// Correlated (stratified) rounding: rank r of n uses frac(V + r/n) with V uniform and shared by all ranks. The n
// dithers of an element are evenly spread over (0,1), so the rounding errors of the sum largely cancel, and each
// rank's dither alone is still uniform (a random cyclic shift of the strata), so every rank's rounding, and the
// sum, stay unbiased.
CC_HD float StratumShift(int rank, int nranks) { return static_cast<float>(rank) / static_cast<float>(nranks); }
CC_HD float StratifiedDither(float shared, float stratumShift) {
  float t = shared + stratumShift;  // in (0, 2)
  return t - std::floor(t);         // frac(t), without a branch (the loop around it must vectorize)
}

// Scale of a group from its max |x| and (for clipping) its RMS: min(max, k * rms) when k > 0.
CC_HD float GroupScale(float maxAbs, float rms, float clipK) {
  if (clipK > 0.0f) {
    float c = clipK * rms;
    return c < maxAbs ? c : maxAbs;
  }
  return maxAbs;
}

// The scale of a group of n values from what one pass over them gathers: the unsigned max of their sign-cleared bit
// patterns (0x7f800000 and up: not finite) and, for clipping, their squares summed in index order; as GroupScaleOf
// computes it (before rounding to the scale format). The GPU kernels gather the two in whatever pass they make.
CC_HD float GroupScaleFromStats(uint32_t maxAbsBits, float sumSquares, size_t n, float clipK) {
  float s;
  if (maxAbsBits >= 0x7f800000u) {
    s = INFINITY;
  } else {
    __builtin_memcpy(&s, &maxAbsBits, 4);
  }
  if (clipK > 0.0f) s = GroupScale(s, n ? std::sqrt(sumSquares / static_cast<float>(n)) : 0.0f, clipK);
  return FlushTinyScale(s);
}

}  // namespace ccoll
