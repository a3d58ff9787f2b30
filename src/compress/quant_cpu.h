// CPU drivers of the quantization codec's hot loops, built for x86-64-v3 (AVX2/FMA) with a baseline fallback
// chosen at run time (GCC target_clones), so the library still runs on any x86-64. Each loop is written so that it
// vectorizes: randomness comes from one counter-based hash per 32 signs or per 2 dithers, the small Hadamard
// stages stay in registers, and codes are packed 8 at a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/quant_math.h"

namespace ccoll {

// out = rotate(in) over blocks of `block` (tail in smaller powers of two): H D x / sqrt(len) per block (random
// signs, then the Walsh-Hadamard transform). in may equal out.
void RotateForward(const float* in, float* out, size_t count, size_t block, uint32_t signKey);
// The inverse: x = D H x * scale / sqrt(len) per block (scale folds the average in).
void RotateInverse(float* x, size_t count, size_t block, uint32_t signKey, float scale);
// One block of either: len a power of two, base the global index of its first element (the signs' counter).
void RotateBlockForward(const float* in, float* out, size_t len, uint64_t base, uint32_t signKey);
void RotateBlockInverse(float* x, size_t len, uint64_t base, uint32_t signKey, float scale);

// How dithers are drawn. rounding: 0 nearest, 1 stochastic (per-rank stream `key`), 2 correlated (the shared
// stream, stratified: see StratifiedDither).
struct DitherRule {
  int rounding = 1;
  uint32_t key = 0;
  uint32_t sharedKey = 0;
  int rank = 0;
  int nranks = 1;
};

// Max |v| over n values; +inf when any value is non-finite (so the scale, and every decode, stays non-finite).
float MaxAbs(const float* v, size_t n);
// The scale of a group: max |v|, or the clip point clipK * rms when smaller (clipK > 0), flushed to zero below
// kMinScale; +inf when non-finite. Homomorphic agreed scales and requant message scales both come from here.
float GroupScaleOf(const float* v, size_t n, float clipK);

// Packs n codes of `bits` (1..16) bits into a little-endian bit stream (returns the bytes written), and back.
size_t PackCodes(const uint16_t* codes, size_t n, int bits, void* out);
void UnpackCodes(const void* in, size_t n, int bits, uint16_t* codes);

// A requant message for v[0..len) (global index of v[0]: index0): per group of `group` elements a scale (max |v| or
// the clip point clipK * rms, rounded up to `format`), then the packed `bits`-bit codes. codes: len scratch.
size_t EncodeRequantSlice(const float* v, size_t len, uint64_t index0, size_t group, int bits, ScaleFormat format,
                          float clipK, const DitherRule& rule, uint16_t* codes, void* wireOut);
void DecodeRequantSlice(const void* wire, size_t len, size_t group, int bits, ScaleFormat format, uint16_t* codes,
                        float* out);

// The requant hop: local + the decoded messages wiresIn[0..nin), in that order, in fp32, encoded as a requant
// message (EncodeRequantSlice's bytes exactly). It runs in parts of about kHopPart elements, each decoded, summed
// and encoded while it is in L1 (the next part of `local` is prefetched meanwhile, so reading it from memory overlaps
// the encoding). vals and codes: len elements of scratch, of which one part at a time is used.
constexpr size_t kHopPart = 1024;
size_t HopRequantSlice(const void* const* wiresIn, int nin, const float* local, size_t len, uint64_t index0,
                       size_t group, int bits, ScaleFormat format, float clipK, const DitherRule& rule, float* vals,
                       uint16_t* codes, void* wireOut);

// Homomorphic lanes: codes of v[0..len) (global index index0) with the agreed scales of global groups, packed in
// `laneBits` lanes; and the decoding of lane sums of nranks ranks: x = C * step - nranks * s.
size_t EncodeLanesSlice(const float* v, size_t len, uint64_t index0, size_t group, const float* scales, int bits,
                        int laneBits, const DitherRule& rule, uint16_t* codes, void* wireOut);
void DecodeLanesSlice(const void* wire, size_t len, uint64_t index0, size_t group, const float* scales, int bits,
                      int laneBits, int nranks, uint16_t* codes, float* out);

}  // namespace ccoll
