#include "compress/quant_cpu.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "compress/bitpack.h"
#include "compress/cpu_clones.h"
#include "compress/hadamard.h"
#include "compress/rng.h"
#include "core/params.h"

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
  const float inv = InvStepOf(s, levels);
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

namespace {

// AVX2 kernels of the rotation and of requant encoding (groups of a multiple of 32 elements from an even global
// index: the codec's slices). A group stays in registers from its max |x| to its packed codes, with no uint16
// staging pass, and the sign flips ride along with the Walsh-Hadamard passes. They compute exactly the operations
// of the scalar code above, in the same order and with the same operands (no FMA: the target has none), so not a
// byte changes. They are target("avx2") functions behind a CPU check rather than target_clones, because intrinsics
// cannot be compiled into the baseline clone.
#if defined(__x86_64__) && defined(__GNUC__)
#define CC_HAVE_AVX2_KERNELS 1
#define CC_AVX2 __attribute__((target("avx2")))
#define CC_AVX2_INLINE inline __attribute__((target("avx2"), always_inline))

// CC_CPU_BASELINE=1 keeps to the scalar code (the bytes are the same: the tests run both).
bool CpuHasAvx2() {
  static const bool has = [] {
    if (ParamInt("CC_CPU_BASELINE") == 1) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

namespace avx2 {

CC_AVX2_INLINE __m256i Mix32V(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  return x;
}

// RandomWord(key, counter) for 8 counters.
CC_AVX2_INLINE __m256i RandomWordV(__m256i key, __m256i counter) {
  return Mix32V(_mm256_xor_si256(key, Mix32V(_mm256_add_epi32(counter, _mm256_set1_epi32(0x632be5ab)))));
}

// The rounding of one group's quantizer: kMode 0 nearest, 1 stochastic, 2 stratified (see QuantizeInline).
template <int kMode>
struct Dithers {
  __m256i key, counter;  // counter: the hash counters of the next 16 elements' 8 pairs
  __m256 shiftR;
  // Dithers of the next 16 elements (d0: elements 0..7, d1: 8..15), advancing by 16 elements.
  CC_AVX2_INLINE void Next(__m256* d0, __m256* d1) {
    if (kMode == 0) {
      *d0 = *d1 = _mm256_set1_ps(0.5f);
      return;
    }
    __m256i w = RandomWordV(key, _mm256_srli_epi32(counter, 1));
    counter = _mm256_add_epi32(counter, _mm256_set1_epi32(16));
    __m256i b0 = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(w));  // element 2p: low half, 2p+1: high half
    __m256i b1 = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(w, 1));
    const __m256 half = _mm256_set1_ps(0.5f), unit = _mm256_set1_ps(1.0f / 65536.0f);
    __m256 u0 = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(b0), half), unit);
    __m256 u1 = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(b1), half), unit);
    if (kMode == 2) {
      u0 = _mm256_add_ps(u0, shiftR);
      u0 = _mm256_sub_ps(u0, _mm256_floor_ps(u0));
      u1 = _mm256_add_ps(u1, shiftR);
      u1 = _mm256_sub_ps(u1, _mm256_floor_ps(u1));
    }
    *d0 = u0;
    *d1 = u1;
  }
};

template <int kMode>
CC_AVX2_INLINE Dithers<kMode> MakeDithers(const DitherRule& rule, uint64_t index0) {
  Dithers<kMode> d;
  const uint32_t key = kMode == 2 ? rule.sharedKey : rule.key;
  d.key = _mm256_set1_epi32(static_cast<int>(key));
  // Counters as QuantizeDithered forms them: (first + 2p) >> 1 in 32-bit arithmetic (index0 is even here).
  d.counter = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(index0))),
                               _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
  d.shiftR = _mm256_set1_ps(kMode == 2 ? StratumShift(rule.rank, rule.nranks) : 0.0f);
  return d;
}

// QuantizeCode of 8 values, up to its clamp at 0: min(L, v) keeps a NaN (minps returns its second operand then),
// which converts to INT_MIN like any v <= -1, and the unsigned saturation of Pack32's first pack then gives 0, as
// does truncating any v in (-1, 0]. So the lanes that Pack32 writes are QuantizeCode's codes.
CC_AVX2_INLINE __m256i Quantize8(__m256 x, __m256 inv, __m256 shift, __m256 lev, __m256 u) {
  __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(x, inv), shift), u);
  return _mm256_cvttps_epi32(_mm256_min_ps(lev, v));
}

// RoundScaleUp(s, kBf16) of 8 scales (s >= 0, finite or +inf), stored as StoreScale does, returned as LoadScale
// reads them back: FloatToBf16's round to nearest even (a NaN becomes the one quiet NaN, for completeness), one up
// when that came out below s. The rounded value is a bf16, so storing it again gives the same 16 bits.
CC_AVX2_INLINE __m256 RoundStoreBf16(__m256 s, uint8_t* out) {
  const __m256i u = _mm256_castps_si256(s);
  __m256i h = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                                 _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))),
                                16);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  h = _mm256_blendv_epi8(h, _mm256_set1_epi32(0x7fc0), nan);
  const __m256 below = _mm256_cmp_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), s, _CMP_LT_OQ);
  h = _mm256_sub_epi32(h, _mm256_castps_si256(below));  // + 1 where below (the mask is -1)
  __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

// Packs 32 codes (c0..c3; at most 255, a negative lane meaning 0: see Quantize8) of kBits bits (0: `bits` at run
// time) into 4 * bits bytes.
template <int kBits>
CC_AVX2_INLINE void Pack32(__m256i c0, __m256i c1, __m256i c2, __m256i c3, int bits, uint8_t* out) {
  // Bytes after the two packs, per 128-bit lane: [c0 0..3, c1 0..3, c2 0..3, c3 0..3 | c0 4..7, c1 4..7, ...];
  // the dword permutation puts them in element order.
  __m256i z = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
  z = _mm256_permutevar8x32_epi32(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if (kBits == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), z);
  } else if (kBits == 4) {
    __m256i p = _mm256_maddubs_epi16(z, _mm256_set1_epi16(0x1001));  // z[2k] + 16 z[2k+1], at most 255
    p = _mm256_permute4x64_epi64(_mm256_packus_epi16(p, p), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(p));
  } else if (kBits == 2) {
    __m256i p = _mm256_maddubs_epi16(z, _mm256_set1_epi16(0x0401));  // z[2k] + 4 z[2k+1], at most 15
    p = _mm256_packus_epi16(p, p);                                    // per lane: its 8 pairs, twice
    p = _mm256_maddubs_epi16(p, _mm256_set1_epi16(0x1001));          // 4 codes per byte, at most 255
    p = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p, p), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(p));
  } else {
    alignas(32) uint8_t e[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(e), z);
    for (int h = 0; h < 4; ++h) {
      uint64_t acc = 0;  // 8 codes of at most 8 bits
      for (int t = 0; t < 8; ++t) acc |= static_cast<uint64_t>(e[8 * h + t]) << (t * bits);
      std::memcpy(out + h * bits, &acc, static_cast<size_t>(bits));
    }
  }
}

// Sign-cleared patterns of n (a multiple of 16) floats, folded with an unsigned max down to 8 lanes.
CC_AVX2_INLINE __m256i MaxAbsFold(const float* v, size_t n) {
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  for (size_t i = 0; i < n; i += 16) {
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i)), mask));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i + 8)), mask));
  }
  return _mm256_max_epu32(m0, m1);
}

// Max |x| bits over n (a multiple of 16) floats, as MaxAbsInline's unsigned max of the sign-cleared patterns.
CC_AVX2_INLINE uint32_t MaxAbsBits(const float* v, size_t n) {
  __m256i m = MaxAbsFold(v, n);
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(h));
}

// Lane k: the max |x| bits of group k of 8 consecutive groups of n elements each.
CC_AVX2_INLINE __m256i MaxAbsBits8(const float* v, size_t n) {
  __m256i m[8];
  for (int k = 0; k < 8; ++k) m[k] = MaxAbsFold(v + k * n, n);
  __m256i t[4];
  for (int k = 0; k < 4; ++k) {
    t[k] =
        _mm256_max_epu32(_mm256_unpacklo_epi32(m[2 * k], m[2 * k + 1]), _mm256_unpackhi_epi32(m[2 * k], m[2 * k + 1]));
  }
  __m256i u0 = _mm256_max_epu32(_mm256_unpacklo_epi64(t[0], t[1]), _mm256_unpackhi_epi64(t[0], t[1]));
  __m256i u1 = _mm256_max_epu32(_mm256_unpacklo_epi64(t[2], t[3]), _mm256_unpackhi_epi64(t[2], t[3]));
  return _mm256_max_epu32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

// Quantizes and packs n (a multiple of 32) elements of one group, drawing their dithers.
template <int kBits, int kMode>
CC_AVX2_INLINE void QuantizeGroup(const float* x, size_t n, __m256 inv, __m256 shift, __m256 lev, Dithers<kMode>& dith,
                                  int bits, uint8_t* out) {
  for (size_t j = 0; j < n; j += 32) {
    __m256 d0, d1, d2, d3;
    dith.Next(&d0, &d1);
    dith.Next(&d2, &d3);
    __m256i c0 = Quantize8(_mm256_loadu_ps(x + j), inv, shift, lev, d0);
    __m256i c1 = Quantize8(_mm256_loadu_ps(x + j + 8), inv, shift, lev, d1);
    __m256i c2 = Quantize8(_mm256_loadu_ps(x + j + 16), inv, shift, lev, d2);
    __m256i c3 = Quantize8(_mm256_loadu_ps(x + j + 24), inv, shift, lev, d3);
    Pack32<kBits>(c0, c1, c2, c3, bits, out + j / 8 * static_cast<size_t>(bits));
  }
}

// Full groups of a requant message: kGroup (0: `group` at run time, a multiple of 32) elements each; returns the
// number of elements done (the caller finishes the tail group).
template <int kGroup, int kBits, int kMode>
CC_AVX2 size_t EncodeRequantGroups(const float* v, size_t len, uint64_t index0, size_t group, int bits,
                                   ScaleFormat format, float clipK, const DitherRule& rule, uint8_t* scales,
                                   uint8_t* packed) {
  const size_t G = kGroup ? static_cast<size_t>(kGroup) : group;
  const size_t full = len / G;
  const uint32_t levels = Levels(bits);
  const __m256 lev = _mm256_set1_ps(static_cast<float>(levels));
  const int sb = ScaleBytes(format);
  const size_t groupBytes = G / 8 * static_cast<size_t>(bits);
  Dithers<kMode> dith = MakeDithers<kMode>(rule, index0);
  size_t g = 0;
  if (G == 32 && (format == ScaleFormat::kFp32 || format == ScaleFormat::kBf16) && clipK <= 0.0f) {
    // 8 groups at a time, their scales as one vector: the scale is max |x| (+inf when non-finite), flushed to zero
    // below kMinScale, rounded up to the format and stored; InvStepOf's division once for 8 groups.
    const __m256 halfLev = _mm256_set1_ps(0.5f * static_cast<float>(levels)), zero = _mm256_setzero_ps();
    for (; g + 8 <= full; g += 8) {
      const float* x = v + g * G;
      __m256i mb = MaxAbsBits8(x, G);
      mb = _mm256_blendv_epi8(mb, _mm256_set1_epi32(0x7f800000), _mm256_cmpgt_epi32(mb, _mm256_set1_epi32(0x7f7fffff)));
      __m256 s = _mm256_castsi256_ps(mb);
      s = _mm256_andnot_ps(_mm256_cmp_ps(s, _mm256_set1_ps(kMinScale), _CMP_LT_OQ), s);
      if (format == ScaleFormat::kBf16) {
        s = RoundStoreBf16(s, scales + g * 2);
      } else {
        _mm256_storeu_ps(reinterpret_cast<float*>(scales + g * 4), s);
      }
      __m256 inv = _mm256_and_ps(_mm256_cmp_ps(s, zero, _CMP_GT_OQ), _mm256_div_ps(halfLev, s));
      __m256 shift = _mm256_mul_ps(s, inv);
      for (int k = 0; k < 8; ++k) {
        const __m256i idx = _mm256_set1_epi32(k);
        QuantizeGroup<kBits, kMode>(x + k * G, G, _mm256_permutevar8x32_ps(inv, idx),
                                    _mm256_permutevar8x32_ps(shift, idx), lev, dith, bits,
                                    packed + (g + k) * groupBytes);
      }
    }
  }
  for (; g < full; ++g) {
    const float* x = v + g * G;
    uint32_t mb = MaxAbsBits(x, G);
    float m = mb >= 0x7f800000u ? std::numeric_limits<float>::infinity() : BitsFloat(mb);
    const float raw = FlushTinyScale(clipK > 0.0f ? GroupScale(m, RmsInline(x, G), clipK) : m);
    const float s = StoreGroupScale(scales + g * sb, raw, format);
    const float inv = InvStepOf(s, levels);
    QuantizeGroup<kBits, kMode>(x, G, _mm256_set1_ps(inv), _mm256_set1_ps(s * inv), lev, dith, bits,
                                packed + g * groupBytes);
  }
  return full * G;
}

template <int kGroup, int kBits>
size_t EncodeRequantGroupsMode(const float* v, size_t len, uint64_t index0, size_t group, int bits, ScaleFormat format,
                               float clipK, const DitherRule& rule, uint8_t* scales, uint8_t* packed) {
  if (rule.rounding == 0) {
    return EncodeRequantGroups<kGroup, kBits, 0>(v, len, index0, group, bits, format, clipK, rule, scales, packed);
  }
  if (rule.rounding == 2) {
    return EncodeRequantGroups<kGroup, kBits, 2>(v, len, index0, group, bits, format, clipK, rule, scales, packed);
  }
  return EncodeRequantGroups<kGroup, kBits, 1>(v, len, index0, group, bits, format, clipK, rule, scales, packed);
}

template <int kGroup>
size_t EncodeRequantGroupsBits(const float* v, size_t len, uint64_t index0, size_t group, int bits, ScaleFormat format,
                               float clipK, const DitherRule& rule, uint8_t* scales, uint8_t* packed) {
  if (bits == 4)
    return EncodeRequantGroupsMode<kGroup, 4>(v, len, index0, group, bits, format, clipK, rule, scales, packed);
  if (bits == 8)
    return EncodeRequantGroupsMode<kGroup, 8>(v, len, index0, group, bits, format, clipK, rule, scales, packed);
  if (bits == 2)
    return EncodeRequantGroupsMode<kGroup, 2>(v, len, index0, group, bits, format, clipK, rule, scales, packed);
  return EncodeRequantGroupsMode<kGroup, 0>(v, len, index0, group, bits, format, clipK, rule, scales, packed);
}

// Entry: the number of leading elements done in whole groups (0 when the AVX2 kernel does not apply).
size_t EncodeRequantFast(const float* v, size_t len, uint64_t index0, size_t group, int bits, ScaleFormat format,
                         float clipK, const DitherRule& rule, uint8_t* scales, uint8_t* packed) {
  if (group % 32 != 0 || (index0 & 1) || len < group || !CpuHasAvx2()) return 0;
  if (group == 32) return EncodeRequantGroupsBits<32>(v, len, index0, group, bits, format, clipK, rule, scales, packed);
  return EncodeRequantGroupsBits<0>(v, len, index0, group, bits, format, clipK, rule, scales, packed);
}

// --- Homomorphic lanes of b = laneBits (2..16) bits, for slices from a multiple of 32 with groups of a multiple of
// 32 elements: 8 codes fill exactly b bytes. A code of lane t sits at bits t*b.. of those, inside the 4 bytes from
// byte t*b/8 (shift t*b%8 + b <= 23 bits).

// Unpacks 8 codes from a 16-byte window: a byte shuffle puts each code's 4 bytes in its lane, then a shift and a
// mask. Bytes past the window are only ever past the code's bits, and read as zero.
struct LaneUnpack {
  __m256i ctrl, shifts, mask;
};

CC_AVX2_INLINE LaneUnpack MakeLaneUnpack(int b) {
  alignas(32) int8_t ctrl[32];
  alignas(32) int32_t shifts[8];
  for (int t = 0; t < 8; ++t) {
    const int bit = t * b, o = bit >> 3;
    shifts[t] = bit & 7;
    for (int k = 0; k < 4; ++k) ctrl[4 * t + k] = static_cast<int8_t>(o + k <= 15 ? o + k : -128);
  }
  LaneUnpack u;
  u.ctrl = _mm256_load_si256(reinterpret_cast<const __m256i*>(ctrl));  // both halves index the same 16 bytes
  u.shifts = _mm256_load_si256(reinterpret_cast<const __m256i*>(shifts));
  u.mask = _mm256_set1_epi32(static_cast<int>((1u << b) - 1u));
  return u;
}

CC_AVX2_INLINE __m256i Unpack8(const uint8_t* in, const LaneUnpack& u) {
  __m256i src = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(src, u.ctrl), u.shifts), u.mask);
}

// Packs 8 codes (lanes of c, each below 2^b) into b bytes at out, writing up to 16 bytes (the ones past b are zeros,
// and the next 8 codes or the caller's tail overwrite them): pairs of codes into 64-bit lanes, pairs of those inside
// each 128-bit half, then the two halves next to each other.
CC_AVX2_INLINE void Pack8Lanes(__m256i c, int b, uint8_t* out) {
  const __m128i cb = _mm_cvtsi32_si128(b), c2b = _mm_cvtsi32_si128(2 * b);
  __m256i p = _mm256_or_si256(_mm256_and_si256(c, _mm256_set1_epi64x(0xffffffff)),
                              _mm256_sll_epi64(_mm256_srli_epi64(c, 32), cb));
  p = _mm256_or_si256(p, _mm256_sll_epi64(_mm256_bsrli_epi128(p, 8), c2b));
  if ((b & 1) == 0) {  // the high half starts on byte b / 2: two 8-byte stores, the second over the first's zeros
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(p));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + b / 2), _mm256_extracti128_si256(p, 1));
    return;
  }
  const uint64_t lo = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm256_castsi256_si128(p)));
  const uint64_t hi = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm256_extracti128_si256(p, 1)));
  const unsigned __int128 r = lo | (static_cast<unsigned __int128>(hi) << (4 * b));
  std::memcpy(out, &r, 16);
}

// Codes of the leading multiple of 32 elements, packed in lanes; returns the elements done. out has `room` bytes.
template <int kMode>
CC_AVX2 size_t EncodeLanesGroups(const float* v, size_t len, uint64_t index0, size_t group, const float* scales,
                                 int bits, int b, const DitherRule& rule, uint8_t* out, size_t room) {
  const uint32_t levels = Levels(bits);
  const __m256 lev = _mm256_set1_ps(static_cast<float>(levels));
  const __m256i zero = _mm256_setzero_si256();
  Dithers<kMode> dith = MakeDithers<kMode>(rule, index0);
  const size_t bb = static_cast<size_t>(b);
  size_t j = 0;
  while (j + 32 <= len && (j / 8 + 3) * bb + 16 <= room) {
    const size_t g = (index0 + j) / group;
    size_t end = (g + 1) * group - index0;
    if (end > len) end = len;
    const float inv = InvStepOf(scales[g], levels);
    const __m256 vinv = _mm256_set1_ps(inv), vshift = _mm256_set1_ps(scales[g] * inv);
    for (; j + 32 <= end && (j / 8 + 3) * bb + 16 <= room; j += 32) {
      __m256 d0, d1, d2, d3;
      dith.Next(&d0, &d1);
      dith.Next(&d2, &d3);
      uint8_t* o = out + j / 8 * bb;
      Pack8Lanes(_mm256_max_epi32(Quantize8(_mm256_loadu_ps(v + j), vinv, vshift, lev, d0), zero), b, o);
      Pack8Lanes(_mm256_max_epi32(Quantize8(_mm256_loadu_ps(v + j + 8), vinv, vshift, lev, d1), zero), b, o + bb);
      Pack8Lanes(_mm256_max_epi32(Quantize8(_mm256_loadu_ps(v + j + 16), vinv, vshift, lev, d2), zero), b, o + 2 * bb);
      Pack8Lanes(_mm256_max_epi32(Quantize8(_mm256_loadu_ps(v + j + 24), vinv, vshift, lev, d3), zero), b, o + 3 * bb);
    }
    if (j < end) break;  // out of room: the caller does the rest
  }
  return j;
}

size_t EncodeLanesFast(const float* v, size_t len, uint64_t index0, size_t group, const float* scales, int bits,
                       int laneBits, const DitherRule& rule, uint8_t* out) {
  if (group % 32 != 0 || index0 % 32 != 0 || laneBits < 2 || laneBits > 16 || !CpuHasAvx2()) return 0;
  const size_t room = PackedBytes(len, laneBits);
  if (rule.rounding == 0) return EncodeLanesGroups<0>(v, len, index0, group, scales, bits, laneBits, rule, out, room);
  if (rule.rounding == 2) return EncodeLanesGroups<2>(v, len, index0, group, scales, bits, laneBits, rule, out, room);
  return EncodeLanesGroups<1>(v, len, index0, group, scales, bits, laneBits, rule, out, room);
}

// The decoding of the leading multiple of 32 elements (x = C * step - nranks * s, as DequantizeSum); returns the
// elements done.
CC_AVX2 size_t DecodeLanesFast(const uint8_t* in, size_t len, uint64_t index0, size_t group, const float* scales,
                               int bits, int b, int nranks, float* out) {
  if (group % 32 != 0 || index0 % 32 != 0 || b < 2 || b > 16 || !CpuHasAvx2()) return 0;
  const size_t room = PackedBytes(len, b), bb = static_cast<size_t>(b);
  const LaneUnpack u = MakeLaneUnpack(b);
  const uint32_t levels = Levels(bits);
  const float n = static_cast<float>(nranks);
  size_t j = 0;
  while (j + 32 <= len && (j / 8 + 3) * bb + 16 <= room) {
    const size_t g = (index0 + j) / group;
    size_t end = (g + 1) * group - index0;
    if (end > len) end = len;
    float s = scales[g], half, inv;
    GridOf(s, levels, &half, &inv);
    const __m256 vhalf = _mm256_set1_ps(half), bias = _mm256_set1_ps(n * (0.5f * s)), two = _mm256_set1_ps(2.0f);
    for (; j + 32 <= end && (j / 8 + 3) * bb + 16 <= room; j += 32) {
      const uint8_t* p = in + j / 8 * bb;
      for (int k = 0; k < 4; ++k) {
        __m256 c = _mm256_cvtepi32_ps(Unpack8(p + k * bb, u));
        _mm256_storeu_ps(out + j + 8 * k, _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(c, vhalf), bias), two));
      }
    }
    if (j < end) break;
  }
  return j;
}

// The decoding of a requant message's leading whole groups (group a multiple of 8 elements, bits 1..8): x =
// C * step - s per element, as DequantizeCode, plus add[j] in front when kAdd (add may be out). Returns the elements
// done: whole groups, stopping where an 8-code window of 16 bytes would read past the packed codes.
template <bool kAdd>
CC_AVX2 size_t DecodeRequantGroups(const uint8_t* scales, const uint8_t* packed, size_t room, size_t len, size_t group,
                                   int bits, ScaleFormat format, const float* add, float* out, const float* ahead,
                                   size_t aheadLen) {
  const size_t groups = (len + group - 1) / group, bb = static_cast<size_t>(bits);
  const size_t sb = static_cast<size_t>(ScaleBytes(format));
  const LaneUnpack u = MakeLaneUnpack(bits);
  const uint32_t levels = Levels(bits);
  size_t j = 0;
  for (size_t g = 0; g < groups; ++g) {
    const size_t end = (g + 1) * group;
    if (end > len || (end / 8 - 1) * bb + 16 > room) break;
    float s = LoadScale(scales + g * sb, format), half, inv;
    GridOf(s, levels, &half, &inv);
    const __m256 vhalf = _mm256_set1_ps(half), vs = _mm256_set1_ps(0.5f * s), two = _mm256_set1_ps(2.0f);
    for (; j < end; j += 8) {
      if (j % 16 == 0 && j < aheadLen) _mm_prefetch(reinterpret_cast<const char*>(ahead + j), _MM_HINT_T0);
      __m256 x = _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(Unpack8(packed + j / 8 * bb, u)), vhalf), vs);
      x = _mm256_mul_ps(x, two);
      if (kAdd) x = _mm256_add_ps(_mm256_loadu_ps(add + j), x);
      _mm256_storeu_ps(out + j, x);
    }
  }
  return j;
}

// room: the bytes from packed on that may be read. ahead[0..aheadLen): memory to prefetch meanwhile.
size_t DecodeRequantFast(const uint8_t* scales, const uint8_t* packed, size_t room, size_t len, size_t group, int bits,
                         ScaleFormat format, const float* add, float* out, const float* ahead, size_t aheadLen) {
  if (group % 8 != 0 || bits < 1 || bits > 8 || !CpuHasAvx2()) return 0;
  if (add) return DecodeRequantGroups<true>(scales, packed, room, len, group, bits, format, add, out, ahead, aheadLen);
  return DecodeRequantGroups<false>(scales, packed, room, len, group, bits, format, nullptr, out, ahead, aheadLen);
}

// --- Rotation. A block of len >= 32 floats at a multiple of 32: its sign words first (8 hashes per vector), then the
// sign flip is fused into the pass of the three smallest Walsh-Hadamard stages (forward), or into the pass of the
// last stages (inverse), saving one pass over the block. Every stage computes the same butterflies, in the same
// order and with the same operands, as Wht and SignScale32.

// words[k] = RandomWord(key, (base >> 5) + k) (32-bit counter) for k < n (n a multiple of 8 or less than 8).
CC_AVX2_INLINE void SignWords(uint64_t base, size_t n, uint32_t key, uint32_t* words) {
  const __m256i vkey = _mm256_set1_epi32(static_cast<int>(key));
  __m256i c = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 5))),
                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + k), RandomWordV(vkey, c));
    c = _mm256_add_epi32(c, _mm256_set1_epi32(8));
  }
  for (; k < n; ++k) words[k] = RandomWord(key, static_cast<uint32_t>(base >> 5) + static_cast<uint32_t>(k));
}

// x * (+f or -f) for the 8 elements i..i+7 of a block (i a multiple of 8), the signs from bits i % 32.. of
// words[i / 32]: each bit is shifted to the top of its lane, where blendv picks -f (exactly f with its sign flipped).
CC_AVX2_INLINE __m256 SignScale8(__m256 x, const uint32_t* words, size_t i, __m256 f) {
  alignas(32) static const int32_t kShifts[4][8] = {{31, 30, 29, 28, 27, 26, 25, 24},
                                                    {23, 22, 21, 20, 19, 18, 17, 16},
                                                    {15, 14, 13, 12, 11, 10, 9, 8},
                                                    {7, 6, 5, 4, 3, 2, 1, 0}};
  __m256i bits = _mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(words[i >> 5])),
                                   _mm256_load_si256(reinterpret_cast<const __m256i*>(kShifts[(i >> 3) & 3])));
  __m256 nf = _mm256_xor_ps(f, _mm256_set1_ps(-0.0f));
  return _mm256_mul_ps(x, _mm256_blendv_ps(f, nf, _mm256_castsi256_ps(bits)));
}

// Wht's three smallest stages on 8 floats: the low lane of a pair gets v + s, the high lane s - v.
CC_AVX2_INLINE __m256 Wht8(__m256 v) {
  __m256 s = _mm256_permute_ps(v, 0xb1);
  v = _mm256_blend_ps(_mm256_add_ps(v, s), _mm256_sub_ps(s, v), 0xaa);
  s = _mm256_permute_ps(v, 0x4e);
  v = _mm256_blend_ps(_mm256_add_ps(v, s), _mm256_sub_ps(s, v), 0xcc);
  s = _mm256_permute2f128_ps(v, v, 0x01);
  return _mm256_blend_ps(_mm256_add_ps(v, s), _mm256_sub_ps(s, v), 0xf0);
}

// The stages h = h0, 4 h0, ... < n of Wht in radix-4 passes, then a radix-2 one if a stage is left, as Wht walks
// them; with kSigned the last pass applies the signs and f to its outputs.
template <bool kSigned>
CC_AVX2_INLINE void WhtUpper(float* x, size_t n, size_t h0, const uint32_t* words, float fs) {
  const __m256 f = _mm256_set1_ps(fs);
  size_t h = h0;
  for (; 4 * h <= n; h <<= 2) {
    const bool last = 4 * h == n;
    for (size_t i = 0; i < n; i += 4 * h) {
      float *a = x + i, *b = a + h, *c = b + h, *d = c + h;
      for (size_t j = 0; j < h; j += 8) {
        __m256 va = _mm256_loadu_ps(a + j), vb = _mm256_loadu_ps(b + j), vc = _mm256_loadu_ps(c + j),
               vd = _mm256_loadu_ps(d + j);
        __m256 p = _mm256_add_ps(va, vb), q = _mm256_sub_ps(va, vb), r = _mm256_add_ps(vc, vd),
               t = _mm256_sub_ps(vc, vd);
        __m256 oa = _mm256_add_ps(p, r), ob = _mm256_add_ps(q, t), oc = _mm256_sub_ps(p, r), od = _mm256_sub_ps(q, t);
        if (kSigned && last) {
          const size_t ia = i + j, ib = ia + h, ic = ib + h, id = ic + h;
          oa = SignScale8(oa, words, ia, f);
          ob = SignScale8(ob, words, ib, f);
          oc = SignScale8(oc, words, ic, f);
          od = SignScale8(od, words, id, f);
        }
        _mm256_storeu_ps(a + j, oa);
        _mm256_storeu_ps(b + j, ob);
        _mm256_storeu_ps(c + j, oc);
        _mm256_storeu_ps(d + j, od);
      }
    }
  }
  if (h < n) {  // one radix-2 stage left: h = n / 2
    float *a = x, *b = x + h;
    for (size_t j = 0; j < h; j += 8) {
      __m256 u = _mm256_loadu_ps(a + j), v = _mm256_loadu_ps(b + j);
      __m256 oa = _mm256_add_ps(u, v), ob = _mm256_sub_ps(u, v);
      if (kSigned) {
        oa = SignScale8(oa, words, j, f);
        ob = SignScale8(ob, words, j + h, f);
      }
      _mm256_storeu_ps(a + j, oa);
      _mm256_storeu_ps(b + j, ob);
    }
  }
}

// u + v into a, u - v into b.
CC_AVX2_INLINE void Butterfly(__m256& a, __m256& b) {
  __m256 u = a;
  a = _mm256_add_ps(u, b);
  b = _mm256_sub_ps(u, b);
}

// The stages h = 1 .. 4 kVecs of one chunk of 8 kVecs floats held in registers (kVecs 4 or 8): Wht8 on each
// vector, then the stages across vectors. kSignIn: signs and f applied to the inputs (forward); otherwise the inputs
// are multiplied by p (the inverse's prescale). kSignOut: signs and f applied to the outputs (inverse, when the
// chunk is the whole block).
template <int kVecs, bool kSignIn, bool kSignOut>
CC_AVX2_INLINE void WhtChunk(const float* in, float* out, size_t i0, const uint32_t* words, __m256 p, __m256 f) {
  __m256 v[kVecs];
  for (int k = 0; k < kVecs; ++k) {
    __m256 x = _mm256_loadu_ps(in + 8 * k);
    x = kSignIn ? SignScale8(x, words, i0 + 8 * k, f) : _mm256_mul_ps(x, p);
    v[k] = Wht8(x);
  }
  for (int h = 1; h < kVecs; h <<= 1) {
    for (int k = 0; k < kVecs; ++k) {
      if ((k & h) == 0) Butterfly(v[k], v[k + h]);
    }
  }
  for (int k = 0; k < kVecs; ++k) {
    __m256 x = v[k];
    if (kSignOut) x = SignScale8(x, words, i0 + 8 * k, f);
    _mm256_storeu_ps(out + 8 * k, x);
  }
}

// Forward rotation of one block: len >= 32 and a power of two, base a multiple of 32. Six stages (with the signs)
// in one pass over chunks of 64, the rest in radix-4 passes.
CC_AVX2 void RotateBlockForwardAvx2(const float* in, float* out, size_t len, uint64_t base, uint32_t key, float fs) {
  alignas(32) uint32_t words[16384 / 32];
  SignWords(base, len / 32, key, words);
  const __m256 f = _mm256_set1_ps(fs);
  if (len == 32) {
    WhtChunk<4, true, false>(in, out, 0, words, f, f);
    return;
  }
  for (size_t i = 0; i < len; i += 64) WhtChunk<8, true, false>(in + i, out + i, i, words, f, f);
  WhtUpper<false>(out, len, 64, words, fs);
}

// Inverse rotation of one block (in place): len >= 32 and a power of two, base a multiple of 32. The prescale ps
// rides along with the first pass's loads.
CC_AVX2 void RotateBlockInverseAvx2(float* x, size_t len, uint64_t base, uint32_t key, float ps, float fs) {
  alignas(32) uint32_t words[16384 / 32];
  SignWords(base, len / 32, key, words);
  const __m256 p = _mm256_set1_ps(ps), f = _mm256_set1_ps(fs);
  if (len == 32) {
    WhtChunk<4, false, true>(x, x, 0, words, p, f);
  } else if (len == 64) {
    WhtChunk<8, false, true>(x, x, 0, words, p, f);
  } else {
    for (size_t i = 0; i < len; i += 64) WhtChunk<8, false, false>(x + i, x + i, i, words, p, f);
    WhtUpper<true>(x, len, 64, words, fs);
  }
}

}  // namespace avx2
#endif  // CC_HAVE_AVX2_KERNELS
}  // namespace

// The rotation is orthonormal on every block (H D / sqrt(len)), so blocks of different lengths (the tail of a
// count that is not a multiple of the block) keep the same magnitudes and can share a scale group. Each block goes
// through the dispatched (AVX2 or baseline) one-block functions.
CC_HOT void RotateBlockForward(const float* in, float* out, size_t len, uint64_t base, uint32_t signKey) {
  const float f = 1.0f / std::sqrt(static_cast<float>(len));
#ifdef CC_HAVE_AVX2_KERNELS
  if (len >= 32 && len <= 16384 && base % 32 == 0 && CpuHasAvx2()) {
    avx2::RotateBlockForwardAvx2(in, out, len, base, signKey, f);
    return;
  }
#endif
  ApplySigns(in, out, len, base, signKey, f);
  Wht(out, len);
}

CC_HOT void RotateBlockInverse(float* x, size_t len, uint64_t base, uint32_t signKey, float scale) {
  const float p = UnrotatePrescale(len), f = UnrotateFactor(len, scale);
#ifdef CC_HAVE_AVX2_KERNELS
  if (len >= 32 && len <= 16384 && base % 32 == 0 && CpuHasAvx2()) {
    avx2::RotateBlockInverseAvx2(x, len, base, signKey, p, f);
    return;
  }
#endif
  for (size_t j = 0; j < len; ++j) x[j] = x[j] * p;
  Wht(x, len);
  ApplySigns(x, x, len, base, signKey, f);
}

void RotateForward(const float* in, float* out, size_t count, size_t block, uint32_t signKey) {
  ForEachRotationBlock(count, block,
                       [&](size_t off, size_t len) { RotateBlockForward(in + off, out + off, len, off, signKey); });
}

void RotateInverse(float* x, size_t count, size_t block, uint32_t signKey, float scale) {
  ForEachRotationBlock(count, block,
                       [&](size_t off, size_t len) { RotateBlockInverse(x + off, len, off, signKey, scale); });
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

// A run of whole groups of a requant message (the last one may be short): n elements from global index index0, their
// scales written at `scales` and their codes at `packed`.
CC_INLINE void EncodeRequantPart(const float* v, size_t n, uint64_t index0, size_t group, int bits, ScaleFormat format,
                                 float clipK, const DitherRule& rule, uint16_t* codes, uint8_t* scales,
                                 uint8_t* packed) {
  const uint32_t levels = Levels(bits);
  const size_t groups = (n + group - 1) / group;
  const int sb = ScaleBytes(format);
  size_t done = 0;
#ifdef CC_HAVE_AVX2_KERNELS
  done = avx2::EncodeRequantFast(v, n, index0, group, bits, format, clipK, rule, scales, packed);
#endif
  // The rest (all of it without the kernel, else the tail group) in scalar code; done is a multiple of 8 elements,
  // so the rest of the codes start on a byte.
  for (size_t g = done / group; g < groups; ++g) {
    size_t begin = g * group, m = n - begin < group ? n - begin : group;
    const float s = StoreGroupScale(scales + g * sb, GroupScaleInline(v + begin, m, clipK), format);
    QuantizeInline(v + begin, m, s, levels, index0 + begin, rule, codes + begin);
  }
  PackCodesInline(codes + done, n - done, bits, packed + done / 8 * static_cast<size_t>(bits));
}

// The decoding of such a run: out[j] = the value (add[j] + the value when add is not null; add may be out). room: the
// bytes of the message from `packed` on (the vector kernel reads 16-byte windows).
CC_INLINE void DecodeRequantPart(const uint8_t* scales, const uint8_t* packed, size_t room, size_t n, size_t group,
                                 int bits, ScaleFormat format, uint16_t* codes, float* out, const float* add,
                                 const float* ahead = nullptr, size_t aheadLen = 0) {
  const uint32_t levels = Levels(bits);
  const size_t groups = (n + group - 1) / group;
  const int sb = ScaleBytes(format);
  size_t done = 0;
#ifdef CC_HAVE_AVX2_KERNELS
  done = avx2::DecodeRequantFast(scales, packed, room, n, group, bits, format, add, out, ahead, aheadLen);
#endif
  // The rest (all of it without the kernel, else the last groups) in scalar code; done is a multiple of 8 elements,
  // so the rest of the codes start on a byte.
  UnpackCodesInline(packed + done / 8 * static_cast<size_t>(bits), n - done, bits, codes + done);
  for (size_t g = done / group; g < groups; ++g) {
    size_t begin = g * group, end = n - begin < group ? n : begin + group;
    float s = LoadScale(scales + g * sb, format), half, inv;
    GridOf(s, levels, &half, &inv);
    if (add) {
      for (size_t j = begin; j < end; ++j) out[j] = add[j] + DequantizeCode(codes[j], half, s);
    } else {
      for (size_t j = begin; j < end; ++j) out[j] = DequantizeCode(codes[j], half, s);
    }
  }
}

CC_HOT size_t EncodeRequantSlice(const float* v, size_t len, uint64_t index0, size_t group, int bits,
                                 ScaleFormat format, float clipK, const DitherRule& rule, uint16_t* codes,
                                 void* wireOut) {
  uint8_t* scales = static_cast<uint8_t*>(wireOut);
  const size_t groups = (len + group - 1) / group, sb = static_cast<size_t>(ScaleBytes(format));
  EncodeRequantPart(v, len, index0, group, bits, format, clipK, rule, codes, scales, scales + groups * sb);
  return groups * sb + PackedBytes(len, bits);
}

CC_HOT void DecodeRequantSlice(const void* wire, size_t len, size_t group, int bits, ScaleFormat format,
                               uint16_t* codes, float* out) {
  const uint8_t* scales = static_cast<const uint8_t*>(wire);
  const size_t groups = (len + group - 1) / group, sb = static_cast<size_t>(ScaleBytes(format));
  DecodeRequantPart(scales, scales + groups * sb, PackedBytes(len, bits), len, group, bits, format, codes, out,
                    nullptr);
}

CC_HOT size_t HopRequantSlice(const void* const* wiresIn, int nin, const float* local, size_t len, uint64_t index0,
                              size_t group, int bits, ScaleFormat format, float clipK, const DitherRule& rule,
                              float* vals, uint16_t* codes, void* wireOut) {
  const size_t groups = (len + group - 1) / group, sb = static_cast<size_t>(ScaleBytes(format));
  const size_t room = PackedBytes(len, bits), bb = static_cast<size_t>(bits);
  // Parts of whole groups and of a multiple of 8 elements (their codes start on a byte), or the whole slice.
  const size_t part = group % 8 == 0 ? group * (kHopPart > group ? kHopPart / group : 1) : len;
  uint8_t* out = static_cast<uint8_t*>(wireOut);
  for (size_t b = 0; b < len; b += part) {
    const size_t n = len - b < part ? len - b : part, g0 = b / group, c0 = b / 8 * bb;
    // While the first message is added to this part of `local`, the next part is fetched into the cache, to be
    // there when this part's encoding is done.
    const size_t next = b + n, nextLen = len - next < part ? len - next : part;
    for (int k = 0; k < nin; ++k) {
      const uint8_t* in = static_cast<const uint8_t*>(wiresIn[k]);
      DecodeRequantPart(in + g0 * sb, in + groups * sb + c0, room - c0, n, group, bits, format, codes, vals,
                        k == 0 ? local + b : vals, k == 0 ? local + next : nullptr, k == 0 ? nextLen : 0);
    }
    EncodeRequantPart(vals, n, index0 + b, group, bits, format, clipK, rule, codes, out + g0 * sb,
                      out + groups * sb + c0);
  }
  return groups * sb + room;
}

CC_HOT size_t EncodeLanesSlice(const float* v, size_t len, uint64_t index0, size_t group, const float* scales,
                               int bits, int laneBits, const DitherRule& rule, uint16_t* codes, void* wireOut) {
  const uint32_t levels = Levels(bits);
  size_t done = 0;
#ifdef CC_HAVE_AVX2_KERNELS
  done = avx2::EncodeLanesFast(v, len, index0, group, scales, bits, laneBits, rule, static_cast<uint8_t*>(wireOut));
#endif
  // The rest in scalar code; done is a multiple of 8, so its codes start on a byte.
  for (size_t j = done; j < len;) {
    size_t g = (index0 + j) / group;
    size_t end = (g + 1) * group - index0;
    if (end > len) end = len;
    QuantizeInline(v + j, end - j, scales[g], levels, index0 + j, rule, codes + j);
    j = end;
  }
  PackCodesInline(codes + done, len - done, laneBits,
                  static_cast<uint8_t*>(wireOut) + done / 8 * static_cast<size_t>(laneBits));
  return PackedBytes(len, laneBits);
}

CC_HOT void DecodeLanesSlice(const void* wire, size_t len, uint64_t index0, size_t group, const float* scales,
                             int bits, int laneBits, int nranks, uint16_t* codes, float* out) {
  const uint32_t levels = Levels(bits);
  size_t j = 0;
#ifdef CC_HAVE_AVX2_KERNELS
  j = avx2::DecodeLanesFast(static_cast<const uint8_t*>(wire), len, index0, group, scales, bits, laneBits, nranks, out);
#endif
  // The rest in scalar code; j is a multiple of 8, so its codes start on a byte.
  UnpackCodesInline(static_cast<const uint8_t*>(wire) + j / 8 * static_cast<size_t>(laneBits), len - j, laneBits,
                    codes + j);
  const float n = static_cast<float>(nranks);
  while (j < len) {
    size_t g = (index0 + j) / group;
    size_t end = (g + 1) * group - index0;
    if (end > len) end = len;
    float s = scales[g], half, inv;
    GridOf(s, levels, &half, &inv);
    for (; j < end; ++j) out[j] = DequantizeSum(codes[j], half, s, n);
  }
}

}  // namespace ccoll
