#include "compress/quant_cpu.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "compress/bitpack.h"
#include "compress/hadamard.h"
#include "compress/rng.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define CC_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CC_HOT
#endif

// Helpers are forced inline so that they are compiled into each target clone (AVX2 or baseline) of their caller.
#define CC_INLINE inline __attribute__((always_inline))

namespace ccoll {
namespace {

// out = in * (+f or -f) for 32 consecutive floats, the signs from the bits of one random word.
CC_INLINE void SignScale32(const float* in, float* out, uint32_t word, float f) {
  for (int t = 0; t < 32; ++t) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u ^= ((word >> t) & 1u) << 31;
    float g;
    std::memcpy(&g, &u, 4);
    out[t] = in[t] * g;
  }
}

// Butterflies on disjoint, contiguous halves (restrict: no aliasing checks, straight vector code).
CC_INLINE void Radix2(float* __restrict a, float* __restrict b, size_t h) {
  for (size_t j = 0; j < h; ++j) {
    float u = a[j], v = b[j];
    a[j] = u + v;
    b[j] = u - v;
  }
}

// Two stages (h and 2h) in one pass over four quarters: half the loads and stores of two radix-2 passes.
CC_INLINE void Radix4(float* __restrict a, float* __restrict b, float* __restrict c, float* __restrict d, size_t h) {
  for (size_t j = 0; j < h; ++j) {
    float p = a[j] + b[j], q = a[j] - b[j], r = c[j] + d[j], t = c[j] - d[j];
    a[j] = p + r;
    b[j] = q + t;
    c[j] = p - r;
    d[j] = q - t;
  }
}

// The unnormalized Walsh-Hadamard transform of one block. Stages commute, so the three smallest (h = 1, 2, 4) run
// together as an 8-point transform per group of 8, and the larger ones as contiguous, vectorizable butterflies.
CC_INLINE void Wht(float* x, size_t n) {
  if (n < 8) {
    Fwht(x, n);
    return;
  }
#if defined(__GNUC__) && !defined(__clang__)
  // The three smallest stages on 8 floats held in one vector: each is a lane swap, an add, a subtract and a blend,
  // computing exactly the scalar butterflies' operations (u + v in the low lane of a pair, u - v in the high one).
  typedef float V8 __attribute__((vector_size(32)));
  typedef int I8 __attribute__((vector_size(32)));
  const I8 swap1 = {1, 0, 3, 2, 5, 4, 7, 6}, swap2 = {2, 3, 0, 1, 6, 7, 4, 5}, swap4 = {4, 5, 6, 7, 0, 1, 2, 3};
  const I8 high1 = {0, -1, 0, -1, 0, -1, 0, -1}, high2 = {0, 0, -1, -1, 0, 0, -1, -1};
  const I8 high4 = {0, 0, 0, 0, -1, -1, -1, -1};
  for (size_t i = 0; i < n; i += 8) {
    V8 v, s;
    std::memcpy(&v, x + i, sizeof(v));
    s = __builtin_shuffle(v, swap1);
    v = high1 ? s - v : v + s;  // low lane of a pair: v[j] + v[j+h]; high lane: v[j-h] - v[j]
    s = __builtin_shuffle(v, swap2);
    v = high2 ? s - v : v + s;
    s = __builtin_shuffle(v, swap4);
    v = high4 ? s - v : v + s;
    std::memcpy(x + i, &v, sizeof(v));
  }
#else  // the same butterflies in scalar code (clang has no __builtin_shuffle)
  for (size_t i = 0; i < n; i += 8) {
    float* p = x + i;
    float a0 = p[0] + p[1], a1 = p[0] - p[1], a2 = p[2] + p[3], a3 = p[2] - p[3];
    float a4 = p[4] + p[5], a5 = p[4] - p[5], a6 = p[6] + p[7], a7 = p[6] - p[7];
    float b0 = a0 + a2, b1 = a1 + a3, b2 = a0 - a2, b3 = a1 - a3;
    float b4 = a4 + a6, b5 = a5 + a7, b6 = a4 - a6, b7 = a5 - a7;
    p[0] = b0 + b4;
    p[1] = b1 + b5;
    p[2] = b2 + b6;
    p[3] = b3 + b7;
    p[4] = b0 - b4;
    p[5] = b1 - b5;
    p[6] = b2 - b6;
    p[7] = b3 - b7;
  }
#endif
  size_t h = 8;
  for (; 4 * h <= n; h <<= 2) {
    for (size_t i = 0; i < n; i += 4 * h) Radix4(x + i, x + i + h, x + i + 2 * h, x + i + 3 * h, h);
  }
  for (; h < n; h <<= 1) {
    for (size_t i = 0; i < n; i += 2 * h) Radix2(x + i, x + i + h, h);
  }
}

// out = D in * f: the random signs of global elements base.., and a scale.
CC_INLINE void ApplySigns(const float* in, float* out, size_t len, uint64_t base, uint32_t key, float f) {
  if (len >= 32 && base % 32 == 0) {
    for (size_t j = 0; j < len; j += 32) {
      SignScale32(in + j, out + j, RandomWord(key, static_cast<uint32_t>((base + j) >> 5)), f);
    }
    return;
  }
  for (size_t j = 0; j < len; ++j) out[j] = in[j] * (SignBit(key, base + j) ? -f : f);
}

// On the bit patterns with the sign cleared, integer order is float order, and NaN and infinity are the patterns
// from 0x7f800000 up: one unsigned max (which vectorizes, unlike a float max or sum without -ffast-math) finds both
// the largest magnitude and whether anything is non-finite.
CC_INLINE float MaxAbsInline(const float* v, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, v + i, 4);
    u &= 0x7fffffffu;
    m = u > m ? u : m;
  }
  if (m >= 0x7f800000u) return std::numeric_limits<float>::infinity();
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

CC_INLINE float RmsInline(const float* v, size_t n) {
  float sq = 0.0f;
  for (size_t i = 0; i < n; ++i) sq += v[i] * v[i];
  return n ? std::sqrt(sq / static_cast<float>(n)) : 0.0f;
}

// Codes of v[0..n) with the dithers of global indices index0.. (Dither(key, index)), one hash per pair of
// elements. kStratified: rank r of n uses (r + u) / n. The loop has no branches, so it vectorizes.
template <bool kStratified>
CC_INLINE void QuantizeDithered(const float* v, size_t n, float inv, float shift, uint32_t levels, uint64_t index0,
                             uint32_t key, int rank, int nranks, uint16_t* codes) {
  const float shift_r = StratumShift(rank, nranks);  // once, not per element
  auto dither = [&](uint32_t bits16) {
    float u = DitherFromBits(bits16);
    return kStratified ? StratifiedDither(u, shift_r) : u;
  };
  const uint32_t i0 = static_cast<uint32_t>(index0);
  size_t i = 0;
  if ((i0 & 1) && n > 0) {
    codes[0] = static_cast<uint16_t>(QuantizeCode(v[0], inv, shift, levels, dither(RandomWord(key, i0 >> 1) >> 16)));
    i = 1;
  }
  // The word of an element pair is (its global index mod 2^32) / 2, as Dither defines it, also where a slice
  // crosses a multiple of 2^32 elements.
  const uint32_t first = i0 + static_cast<uint32_t>(i);
  const size_t pairs = (n - i) / 2;
  const float* x = v + i;
  uint16_t* c = codes + i;
  for (size_t p = 0; p < pairs; ++p) {
    uint32_t w = RandomWord(key, (first + 2u * static_cast<uint32_t>(p)) >> 1);
    c[2 * p] = static_cast<uint16_t>(QuantizeCode(x[2 * p], inv, shift, levels, dither(w & 0xffffu)));
    c[2 * p + 1] = static_cast<uint16_t>(QuantizeCode(x[2 * p + 1], inv, shift, levels, dither(w >> 16)));
  }
  i += 2 * pairs;
  if (i < n) {
    uint32_t gi = i0 + static_cast<uint32_t>(i);
    const float u = dither(RandomWord(key, gi >> 1) & 0xffffu);
    codes[i] = static_cast<uint16_t>(QuantizeCode(v[i], inv, shift, levels, u));
  }
}

// Codes of v[0..n) on the grid of scale s under `rule`.
CC_INLINE void QuantizeInline(const float* v, size_t n, float s, uint32_t levels, uint64_t index0,
                           const DitherRule& rule, uint16_t* codes) {
  float step, inv;
  GridOf(s, levels, &step, &inv);
  const float shift = s * inv;
  if (rule.rounding == 0) {
    for (size_t i = 0; i < n; ++i) codes[i] = static_cast<uint16_t>(QuantizeCode(v[i], inv, shift, levels, 0.5f));
  } else if (rule.rounding == 2) {
    QuantizeDithered<true>(v, n, inv, shift, levels, index0, rule.sharedKey, rule.rank, rule.nranks, codes);
  } else {
    QuantizeDithered<false>(v, n, inv, shift, levels, index0, rule.key, 0, 1, codes);
  }
}

}  // namespace

// The rotation is orthonormal on every block (H D / sqrt(len)), so blocks of different lengths (the tail of a
// count that is not a multiple of the block) keep the same magnitudes and can share a scale group. The block walks
// below are ForEachRotationBlock written out: a lambda would be compiled for the baseline target only, outside the
// AVX2 clone.
CC_HOT void RotateForward(const float* in, float* out, size_t count, size_t block, uint32_t signKey) {
  for (size_t off = 0; off < count;) {
    size_t len = block;
    while (len > count - off) len >>= 1;
    ApplySigns(in + off, out + off, len, off, signKey, 1.0f / std::sqrt(static_cast<float>(len)));
    Wht(out + off, len);
    off += len;
  }
}

CC_HOT void RotateInverse(float* x, size_t count, size_t block, uint32_t signKey, float scale) {
  for (size_t off = 0; off < count;) {
    size_t len = block;
    while (len > count - off) len >>= 1;
    float* p = x + off;
    Wht(p, len);
    ApplySigns(p, p, len, off, signKey, scale / std::sqrt(static_cast<float>(len)));
    off += len;
  }
}

CC_HOT float MaxAbs(const float* v, size_t n) { return MaxAbsInline(v, n); }

namespace {
CC_INLINE float GroupScaleInline(const float* v, size_t n, float clipK) {
  float m = MaxAbsInline(v, n);
  return FlushTinyScale(clipK > 0.0f ? GroupScale(m, RmsInline(v, n), clipK) : m);
}
}  // namespace

CC_HOT float GroupScaleOf(const float* v, size_t n, float clipK) { return GroupScaleInline(v, n, clipK); }

CC_INLINE size_t PackCodesInline(const uint16_t* codes, size_t n, int bits, void* out) {
  uint8_t* o = static_cast<uint8_t*>(out);
  size_t i = 0;
  if (bits == 8) {
    for (; i < n; ++i) o[i] = static_cast<uint8_t>(codes[i]);
    return n;
  }
  if (bits == 4) {
    const size_t pairs = n / 2;
    for (size_t k = 0; k < pairs; ++k) {
      o[k] = static_cast<uint8_t>((codes[2 * k] & 15u) | ((codes[2 * k + 1] & 15u) << 4));
    }
    if (n & 1) o[pairs] = static_cast<uint8_t>(codes[n - 1]);
    return PackedBytes(n, bits);
  }
  // Eight codes fill exactly `bits` bytes.
  for (; i + 8 <= n; i += 8) {
    unsigned __int128 acc = 0;
    for (int t = 0; t < 8; ++t) acc |= static_cast<unsigned __int128>(codes[i + t]) << (t * bits);
    std::memcpy(o, &acc, static_cast<size_t>(bits));
    o += bits;
  }
  BitWriter tail(o);
  for (; i < n; ++i) tail.Put(codes[i], bits);
  tail.Flush();
  return PackedBytes(n, bits);
}

CC_INLINE void UnpackCodesInline(const void* in, size_t n, int bits, uint16_t* codes) {
  const uint8_t* p = static_cast<const uint8_t*>(in);
  size_t i = 0;
  if (bits == 8) {
    for (; i < n; ++i) codes[i] = p[i];
    return;
  }
  if (bits == 4) {
    const size_t pairs = n / 2;
    for (size_t k = 0; k < pairs; ++k) {
      codes[2 * k] = p[k] & 15u;
      codes[2 * k + 1] = p[k] >> 4;
    }
    if (n & 1) codes[n - 1] = p[pairs] & 15u;
    return;
  }
  const uint32_t mask = (1u << bits) - 1u;
  for (; i + 8 <= n; i += 8) {
    unsigned __int128 acc = 0;
    std::memcpy(&acc, p, static_cast<size_t>(bits));
    for (int t = 0; t < 8; ++t) codes[i + t] = static_cast<uint16_t>(static_cast<uint32_t>(acc >> (t * bits)) & mask);
    p += bits;
  }
  BitReader tail(p);
  for (; i < n; ++i) codes[i] = static_cast<uint16_t>(tail.Get(bits));
}

size_t PackCodes(const uint16_t* codes, size_t n, int bits, void* out) { return PackCodesInline(codes, n, bits, out); }
void UnpackCodes(const void* in, size_t n, int bits, uint16_t* codes) { UnpackCodesInline(in, n, bits, codes); }

CC_HOT size_t EncodeRequantSlice(const float* v, size_t len, uint64_t index0, size_t group, int bits,
                                 ScaleFormat format, float clipK, const DitherRule& rule, uint16_t* codes,
                                 void* wireOut) {
  const uint32_t levels = Levels(bits);
  uint8_t* scales = static_cast<uint8_t*>(wireOut);
  const size_t groups = (len + group - 1) / group;
  const int sb = ScaleBytes(format);
  for (size_t g = 0; g < groups; ++g) {
    size_t begin = g * group, n = len - begin < group ? len - begin : group;
    float s = RoundScaleUp(GroupScaleInline(v + begin, n, clipK), format);
    StoreScale(scales + g * sb, s, format);
    s = LoadScale(scales + g * sb, format);  // exactly what the decoder will read
    QuantizeInline(v + begin, n, s, levels, index0 + begin, rule, codes + begin);
  }
  PackCodesInline(codes, len, bits, scales + groups * sb);
  return groups * sb + PackedBytes(len, bits);
}

CC_HOT void DecodeRequantSlice(const void* wire, size_t len, size_t group, int bits, ScaleFormat format,
                               uint16_t* codes, float* out) {
  const uint32_t levels = Levels(bits);
  const uint8_t* scales = static_cast<const uint8_t*>(wire);
  const size_t groups = (len + group - 1) / group;
  const int sb = ScaleBytes(format);
  UnpackCodesInline(scales + groups * sb, len, bits, codes);
  for (size_t g = 0; g < groups; ++g) {
    size_t begin = g * group, end = len - begin < group ? len : begin + group;
    float s = LoadScale(scales + g * sb, format), step, inv;
    GridOf(s, levels, &step, &inv);
    for (size_t j = begin; j < end; ++j) out[j] = DequantizeCode(codes[j], step, s);
  }
}

CC_HOT size_t EncodeLanesSlice(const float* v, size_t len, uint64_t index0, size_t group, const float* scales,
                               int bits, int laneBits, const DitherRule& rule, uint16_t* codes, void* wireOut) {
  const uint32_t levels = Levels(bits);
  for (size_t j = 0; j < len;) {
    size_t g = (index0 + j) / group;
    size_t end = (g + 1) * group - index0;
    if (end > len) end = len;
    QuantizeInline(v + j, end - j, scales[g], levels, index0 + j, rule, codes + j);
    j = end;
  }
  return PackCodesInline(codes, len, laneBits, wireOut);
}

CC_HOT void DecodeLanesSlice(const void* wire, size_t len, uint64_t index0, size_t group, const float* scales,
                             int bits, int laneBits, int nranks, uint16_t* codes, float* out) {
  const uint32_t levels = Levels(bits);
  UnpackCodesInline(wire, len, laneBits, codes);
  const float n = static_cast<float>(nranks);
  for (size_t j = 0; j < len;) {
    size_t g = (index0 + j) / group;
    size_t end = (g + 1) * group - index0;
    if (end > len) end = len;
    float s = scales[g], step, inv;
    GridOf(s, levels, &step, &inv);
    const float bias = n * s;
    for (; j < end; ++j) out[j] = static_cast<float>(codes[j]) * step - bias;
  }
}

}  // namespace ccoll
