// The requant codec's tiled GPU kernels, written as phases of one thread block (a "tile"): each phase is a
// host/device function of (thread, tile) over the block's shared memory, and the kernels in quant_cuda.cu run the
// phases with a barrier between them. The CPU runs the same phases thread by thread (tests/fake_cuda/tile_emulator.h),
// so the indexing, packing and rotation fused here are checked byte for byte against the CPU codec on every machine.
//
// Why tiles: a tile loads its values with coalesced accesses into shared memory, one thread per group encodes there
// (the group's element order, hence its bytes, stay those of quant_cpu.cc), and the packed codes leave coalesced.
// The hop writes no values to device memory, and can fuse the forward rotation: it rotates the whole rotation
// blocks that cover its values from the unrotated input in shared memory (in place, the blocks it shares with other
// slices come rotated already: HopArgs::edgesRotated). The decode can fuse the inverse rotation of the blocks that
// lie inside its slice; the others are finished after the ring (RotateInverse with `done` flags).
//
// Shared memory holds 32-bit words at padded positions (one spare word per 32), values as float bit patterns and,
// after the encode, codes in the same words.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "compress/bitpack.h"
#include "compress/hadamard.h"
#include "compress/host_device.h"
#include "compress/quant_cpu.h"
#include "compress/quant_math.h"
#include "compress/rng.h"

namespace ccoll {
namespace tile {

constexpr unsigned kThreads = 256;          // threads per tile
constexpr size_t kTarget = 8192;            // values a tile aims at (whole groups, a multiple of 8 groups)
constexpr size_t kMaxGroup = 1024;          // larger groups take the one-thread-per-group kernels
constexpr size_t kMaxFusedBlock = 1024;     // larger rotation blocks are rotated in passes of their own
constexpr size_t kDecodeSpan = 8192;        // a fused decode tile: this many values, aligned to rotation blocks

CC_HD uint32_t Pad(uint32_t i) { return i + (i >> 5); }

// Groups per tile: a multiple of 8, so every tile's codes start on a byte.
CC_HD size_t TileGroups(size_t group) {
  size_t g = (kTarget / group) & ~size_t{7};
  return g < 8 ? 8 : g;
}

// Threads per group in the split phases (HopGroupStats, HopGroupScales, HopQuantize): groups of 64 values and more
// come kThreads / 2 or fewer to a tile, and one thread per group would leave most threads idle over long loops.
CC_HD unsigned GroupThreads(size_t group) {
  const size_t g = TileGroups(group);
  return g >= kThreads ? 1u : static_cast<unsigned>(kThreads / g);
}

// Shared words a hop or decode tile needs: the values (fused rotation: the covering blocks around a tile), then the
// split phases' scratch: one partial max per thread, and each group's grid (invStep, shift).
constexpr uint32_t kValueWords = static_cast<uint32_t>(kTarget + 2 * kMaxFusedBlock);
CC_HD uint32_t PartialsAt() { return Pad(kValueWords) + 1; }
CC_HD uint32_t GridsAt() { return PartialsAt() + kThreads; }
CC_HD size_t SharedWords() { return GridsAt() + kThreads; }  // at most kThreads / 2 groups when split

CC_HD bool Covers(size_t group) { return group >= 1 && group <= kMaxGroup; }
CC_HD bool CoversRotation(size_t block) { return block >= 1 && block <= kMaxFusedBlock && (block & (block - 1)) == 0; }

// The rotation block (hadamard.h's ForEachRotationBlock) that holds element i < count: full blocks, then the tail
// of count in decreasing powers of two.
CC_HD void RotationBlockOf(size_t count, size_t block, size_t i, size_t* start, size_t* len) {
  const size_t fullEnd = count & ~(block - 1);
  if (i < fullEnd) {
    *start = i & ~(block - 1);
    *len = block;
    return;
  }
  size_t s = fullEnd, l = block >> 1;
  for (; l > 0; l >>= 1) {
    if (((count - fullEnd) & l) == 0) continue;
    if (i < s + l) break;
    s += l;
  }
  *start = s;
  *len = l;
}

// The dithers of consecutive elements (rng.h's Dither under the rule's rounding), one hash per pair of elements:
// element i takes the low half of word i/2 when i is even, the high half when odd.
struct DitherStream {
  const DitherRule& rule;
  uint32_t word = 0;
  CC_HD explicit DitherStream(const DitherRule& r) : rule(r) {}
  // Element gi; `fresh`: the word of gi / 2 is not known yet (the first element, or gi even).
  CC_HD float At(uint32_t gi, bool fresh) {
    if (rule.rounding == 0) return 0.5f;
    if (fresh || (gi & 1u) == 0) word = RandomWord(rule.rounding == 2 ? rule.sharedKey : rule.key, gi >> 1);
    const float u = DitherFromBits((gi & 1u) ? (word >> 16) : (word & 0xffffu));
    return rule.rounding == 2 ? StratifiedDither(u, StratumShift(rule.rank, rule.nranks)) : u;
  }
};

// Stages 2^a .. 2^(a+S-1) of the Walsh-Hadamard transform (hadamard.h's Fwht, stage by stage; a butterfly's result
// does not depend on which thread computes it) on `total` values at x[Pad(base + i)], blocks of at least 2^(a+S)
// values: each thread takes sets of 2^S values that these stages mix only among themselves, in registers.
template <int S>
CC_HD void WhtStagesOf(uint32_t* x, uint32_t base, uint32_t total, int a, unsigned tid, unsigned threads) {
  const uint32_t sets = total >> S;
  const uint32_t low = (1u << a) - 1u;
  for (uint32_t q = tid; q < sets; q += threads) {
    const uint32_t first = base + (((q & ~low) << S) | (q & low));
    float v[1 << S];
CC_UNROLL
    for (int k = 0; k < (1 << S); ++k) v[k] = BitsFloat(x[Pad(first + (static_cast<uint32_t>(k) << a))]);
CC_UNROLL
    for (int j = 0; j < S; ++j) {
CC_UNROLL
      for (int k = 0; k < (1 << S); ++k) {
        if ((k & (1 << j)) != 0) continue;
        const float p = v[k], r = v[k | (1 << j)];
        v[k] = p + r;
        v[k | (1 << j)] = p - r;
      }
    }
CC_UNROLL
    for (int k = 0; k < (1 << S); ++k) x[Pad(first + (static_cast<uint32_t>(k) << a))] = FloatBits(v[k]);
  }
}

// Phases of the transform of blocks of 2^m values: phase p covers stages [3p, min(3p + 3, m)).
CC_HD int WhtPhases(int m) { return (m + 2) / 3; }
CC_HD void WhtPhase(uint32_t* x, uint32_t base, uint32_t total, int m, int phase, unsigned tid, unsigned threads) {
  const int a = 3 * phase, s = m - a < 3 ? m - a : 3;
  if (s == 3) {
    WhtStagesOf<3>(x, base, total, a, tid, threads);
  } else if (s == 2) {
    WhtStagesOf<2>(x, base, total, a, tid, threads);
  } else if (s == 1) {
    WhtStagesOf<1>(x, base, total, a, tid, threads);
  }
}

CC_HD int Log2(size_t p) {
  int m = 0;
  while ((size_t{1} << m) < p) ++m;
  return m;
}

// ---------------------------------------------------------------------------------------------------------------
// The hop (and the encode: nin = 0): vals = local + decode(in0) (+ decode(in1)), encoded with fresh scales.

struct HopArgs {
  // Without rotation: values[i] is element off + i. With it (rotate): values[i] is element i of the unrotated buffer
  // of `count` elements, rotated here by blocks of `block` (a power of two <= kMaxFusedBlock) with signKey.
  const float* values = nullptr;
  const uint8_t* in[2] = {nullptr, nullptr};
  int nin = 0;
  size_t off = 0, len = 0;
  size_t group = 32;
  int bits = 4;
  ScaleFormat format = ScaleFormat::kFp32;
  float clipK = 0.0f;
  DitherRule rule;
  uint8_t* out = nullptr;
  bool rotate = false;
  size_t count = 0, block = 1;
  uint32_t signKey = 0;
  // With rotation, in an in-place call: the blocks that hold the slice's first and last element, when they reach
  // past the slice, were rotated in place before this hop (values holds their rotated values), so that no hop reads
  // the input of another slice, which that slice's decode may have overwritten already.
  bool edgesRotated = false;
};

// The arguments of a hop of [off, off + len): values[i] is element off + i; RotatedFrom switches to the rotation.
CC_HD HopArgs HopArgsOf(const float* values, const void* const* wiresIn, int nin, size_t off, size_t len, size_t group,
                        int bits, ScaleFormat format, float clipK, const DitherRule& rule, void* out) {
  HopArgs a;
  a.values = values;
  for (int k = 0; k < nin && k < 2; ++k) a.in[k] = static_cast<const uint8_t*>(wiresIn[k]);
  a.nin = nin;
  a.off = off;
  a.len = len;
  a.group = group;
  a.bits = bits;
  a.format = format;
  a.clipK = clipK;
  a.rule = rule;
  a.out = static_cast<uint8_t*>(out);
  return a;
}

// The same hop with its values rotated from `input`, the whole unrotated buffer of `count` values.
CC_HD HopArgs RotatedFrom(HopArgs a, const float* input, size_t count, size_t block, uint32_t signKey,
                          bool edgesRotated) {
  a.values = input;
  a.rotate = true;
  a.count = count;
  a.block = block;
  a.signKey = signKey;
  a.edgesRotated = edgesRotated;
  return a;
}

CC_HD size_t HopTiles(const HopArgs& a) {
  const size_t per = TileGroups(a.group) * a.group;
  return (a.len + per - 1) / per;
}

// What tile t covers: slice values [t0, t0 + tl); with rotation, the covering blocks [r0, r1) of the buffer are in
// shared memory and slice value i sits at word Pad(shift + i - t0). Words [x0, x1) are rotated here; the rest of
// the region (an edge block rotated already, edgesRotated) is loaded as it is.
struct HopTile {
  size_t t0 = 0, tl = 0;
  size_t r0 = 0, r1 = 0;
  uint32_t shift = 0;
  bool fullBlocks = true;  // [r0, r1) holds full blocks only (else the tail's smaller blocks too)
  size_t head0 = 0, head1 = 0, tail0 = 0, tail1 = 0;  // the rotated edge blocks (empty when none)
  uint32_t x0 = 0, x1 = 0;
};

// The block that holds element i, when it reaches past [off, off + len): [*b0, *b1), else empty.
CC_HD void EdgeBlockOf(const HopArgs& a, size_t i, size_t* b0, size_t* b1) {
  size_t s, l;
  RotationBlockOf(a.count, a.block, i, &s, &l);
  const bool edge = s < a.off || s + l > a.off + a.len;
  *b0 = edge ? s : 0;
  *b1 = edge ? s + l : 0;
}

CC_HD bool InEdge(const HopTile& h, size_t gi) {
  return (gi >= h.head0 && gi < h.head1) || (gi >= h.tail0 && gi < h.tail1);
}

CC_HD HopTile HopTileOf(const HopArgs& a, size_t t) {
  HopTile h;
  const size_t per = TileGroups(a.group) * a.group;
  h.t0 = t * per;
  h.tl = a.len - h.t0 < per ? a.len - h.t0 : per;
  if (a.rotate) {
    size_t s, l;
    RotationBlockOf(a.count, a.block, a.off + h.t0, &s, &l);
    h.r0 = s;
    RotationBlockOf(a.count, a.block, a.off + h.t0 + h.tl - 1, &s, &l);
    h.r1 = s + l;
    h.shift = static_cast<uint32_t>(a.off + h.t0 - h.r0);
    h.fullBlocks = h.r1 <= (a.count & ~(a.block - 1));
    h.x1 = static_cast<uint32_t>(h.r1 - h.r0);
    if (a.edgesRotated) {
      EdgeBlockOf(a, a.off, &h.head0, &h.head1);
      EdgeBlockOf(a, a.off + a.len - 1, &h.tail0, &h.tail1);
      // An edge block can only be the first or the last block of a region.
      if (h.head1 > h.head0 && h.r0 == h.head0) h.x0 = static_cast<uint32_t>(h.head1 - h.r0);
      if (h.tail1 > h.tail0 && h.r1 == h.tail1) h.x1 = static_cast<uint32_t>(h.tail0 - h.r0);
      if (h.x1 < h.x0) h.x1 = h.x0;
    }
  }
  return h;
}

// Loads a thread issues before it uses any, so that enough reads are in flight to keep device memory busy (one at a
// time per thread would not): values, and the codes of each arriving message in HopGroupStats (fewer: two messages'
// codes take registers).
constexpr unsigned kLoadBatch = 8;
constexpr unsigned kCodeBatch = 4;

// Phase 1: the tile's values into shared memory (with rotation: the covering blocks, sign-flipped and scaled), the
// kLoadBatch loads of a thread coalesced across the threads for each k.
CC_HD void HopLoad(const HopArgs& a, const HopTile& h, uint32_t* x, unsigned tid, unsigned threads) {
  const float* src = a.rotate ? a.values + h.r0 : a.values + h.t0;
  const uint32_t n = a.rotate ? static_cast<uint32_t>(h.r1 - h.r0) : static_cast<uint32_t>(h.tl);
  const float fFull = a.rotate ? 1.0f / sqrtf(static_cast<float>(a.block)) : 1.0f;
  for (uint32_t i0 = tid; i0 < n; i0 += threads * kLoadBatch) {
    float v[kLoadBatch];
CC_UNROLL
    for (unsigned k = 0; k < kLoadBatch; ++k) {
      const uint32_t i = i0 + k * threads;
      v[k] = i < n ? src[i] : 0.0f;
    }
CC_UNROLL
    for (unsigned k = 0; k < kLoadBatch; ++k) {
      const uint32_t i = i0 + k * threads;
      if (i >= n) continue;
      if (!a.rotate) {
        x[Pad(i)] = FloatBits(v[k]);
        continue;
      }
      const size_t gi = h.r0 + i;
      float f = fFull;
      if (!h.fullBlocks) {
        size_t s, l;
        RotationBlockOf(a.count, a.block, gi, &s, &l);
        f = 1.0f / sqrtf(static_cast<float>(l));
      }
      x[Pad(i)] = FloatBits(InEdge(h, gi) ? v[k] : v[k] * (SignBit(a.signKey, gi) ? -f : f));
    }
  }
}

// Phases 2..: the transform, with a barrier after each. Full blocks: WhtPhases(log2 block) phases in registers;
// with the tail's smaller blocks: one phase per stage, butterfly by butterfly (the buffer's last tile only).
CC_HD int HopRotatePhases(const HopArgs& a, const HopTile& h) {
  if (!a.rotate) return 0;
  const int m = Log2(a.block);
  return h.fullBlocks ? WhtPhases(m) : m;
}

CC_HD void HopRotate(const HopArgs& a, const HopTile& h, uint32_t* x, int phase, unsigned tid, unsigned threads) {
  if (h.fullBlocks) {
    WhtPhase(x, h.x0, h.x1 - h.x0, Log2(a.block), phase, tid, threads);
    return;
  }
  const size_t stride = size_t{1} << phase;
  for (uint32_t i = h.x0 + tid; i < h.x1; i += threads) {
    size_t s, l;
    RotationBlockOf(a.count, a.block, h.r0 + i, &s, &l);
    if (stride >= l || ((h.r0 + i - s) & stride) != 0) continue;
    const uint32_t j = i + static_cast<uint32_t>(stride);
    const float p = BitsFloat(x[Pad(i)]), r = BitsFloat(x[Pad(j)]);
    x[Pad(i)] = FloatBits(p + r);
    x[Pad(j)] = FloatBits(p - r);
  }
}

// Next: one thread per group adds the arriving messages' values (in order, in fp32), finds the scale (as
// GroupScaleOf: max |v|, clip point from the squares summed in order), stores it, and leaves the codes in place.
CC_HD void HopEncodeGroups(const HopArgs& a, const HopTile& h, uint32_t* x, unsigned tid, unsigned threads) {
  const size_t groups = (a.len + a.group - 1) / a.group;
  const int sb = ScaleBytes(a.format);
  const uint32_t levels = Levels(a.bits);
  const uint32_t tileGroups = static_cast<uint32_t>((h.tl + a.group - 1) / a.group);
  for (uint32_t gl = tid; gl < tileGroups; gl += threads) {
    const size_t g = h.t0 / a.group + gl;
    const uint32_t n = static_cast<uint32_t>(a.len - g * a.group < a.group ? a.len - g * a.group : a.group);
    const uint32_t base = h.shift + gl * static_cast<uint32_t>(a.group);
    float s[2] = {0.0f, 0.0f}, half[2] = {0.0f, 0.0f};
    BitReader r[2] = {BitReader(nullptr), BitReader(nullptr)};
CC_UNROLL
    for (int k = 0; k < 2; ++k) {
      if (k >= a.nin) continue;
      float inv;
      s[k] = LoadScale(a.in[k] + g * sb, a.format);
      GridOf(s[k], levels, &half[k], &inv);
      const size_t bit = g * a.group * static_cast<size_t>(a.bits);
      r[k] = BitReader(a.in[k] + groups * sb + bit / 8);
      if (bit % 8 != 0) r[k].Get(static_cast<int>(bit % 8));
    }
    uint32_t m = 0;
    float sq = 0.0f;
    for (uint32_t j = 0; j < n; ++j) {
      float v = BitsFloat(x[Pad(base + j)]);
CC_UNROLL
      for (int k = 0; k < 2; ++k) {
        if (k < a.nin) v += DequantizeCode(r[k].Get(a.bits), half[k], s[k]);
      }
      if (a.nin > 0) x[Pad(base + j)] = FloatBits(v);
      const uint32_t u = FloatBits(v) & 0x7fffffffu;
      m = u > m ? u : m;
      if (a.clipK > 0.0f) sq += v * v;
    }
    const float sc = StoreGroupScale(a.out + g * sb, GroupScaleFromStats(m, sq, n, a.clipK), a.format);
    const float inv = InvStepOf(sc, levels);
    const float shift = sc * inv;
    const uint32_t gi0 = static_cast<uint32_t>(a.off + g * a.group);
    DitherStream dither(a.rule);
    for (uint32_t j = 0; j < n; ++j) {
      x[Pad(base + j)] = QuantizeCode(BitsFloat(x[Pad(base + j)]), inv, shift, levels, dither.At(gi0 + j, j == 0));
    }
  }
}

// Groups of 64 values and more (GroupThreads > 1): HopEncodeGroups' work in three phases, T = GroupThreads(group)
// threads per group, thread `lane` of a group taking its values lane, lane + T, ... The bytes stay the CPU's: a max
// does not depend on the order, the clip point's squares are still summed in index order by one thread, and a
// value's code depends only on the value, its group's grid and its own dither.
struct GroupSlot {
  size_t g = 0;         // the group's index in the slice
  uint32_t n = 0;       // its values
  uint32_t base = 0;    // the word of its first value (before Pad)
};

CC_HD uint32_t TileGroupCount(const HopArgs& a, const HopTile& h) {
  return static_cast<uint32_t>((h.tl + a.group - 1) / a.group);
}

CC_HD GroupSlot GroupSlotOf(const HopArgs& a, const HopTile& h, uint32_t gl) {
  GroupSlot s;
  s.g = h.t0 / a.group + gl;
  s.n = static_cast<uint32_t>(a.len - s.g * a.group < a.group ? a.len - s.g * a.group : a.group);
  s.base = h.shift + gl * static_cast<uint32_t>(a.group);
  return s;
}

// First: the arriving messages' values added (each code read where it lies), and each thread's max |v| of its values
// (the unsigned max of the sign-cleared bit patterns) left in the partials.
CC_HD void HopGroupStats(const HopArgs& a, const HopTile& h, uint32_t* x, unsigned tid, unsigned threads) {
  const unsigned T = GroupThreads(a.group);
  const uint32_t tileGroups = TileGroupCount(a, h);
  const size_t groups = (a.len + a.group - 1) / a.group;
  const int sb = ScaleBytes(a.format);
  const size_t codeBytes = PackedBytes(a.len, a.bits);
  const uint32_t levels = Levels(a.bits);
  for (unsigned t = tid; t < kThreads; t += threads) {
    const uint32_t gl = t / T, lane = t % T;
    uint32_t m = 0;
    if (gl < tileGroups) {
      const GroupSlot gs = GroupSlotOf(a, h, gl);
      float s[2] = {0.0f, 0.0f}, half[2] = {0.0f, 0.0f};
CC_UNROLL
      for (int k = 0; k < 2; ++k) {
        if (k >= a.nin) continue;
        float inv;
        s[k] = LoadScale(a.in[k] + gs.g * sb, a.format);
        GridOf(s[k], levels, &half[k], &inv);
      }
      // The codes of kCodeBatch values per message are read before any is used.
      for (uint32_t j0 = lane; j0 < gs.n; j0 += T * kCodeBatch) {
        uint32_t c[2][kCodeBatch];
CC_UNROLL
        for (int k = 0; k < 2; ++k) {
CC_UNROLL
          for (unsigned b = 0; b < kCodeBatch; ++b) {
            const uint32_t j = j0 + b * T;
            const size_t bit = (gs.g * a.group + j) * static_cast<size_t>(a.bits);
            c[k][b] = k < a.nin && j < gs.n ? ReadBits(a.in[k] + groups * sb, codeBytes, bit, a.bits) : 0u;
          }
        }
CC_UNROLL
        for (unsigned b = 0; b < kCodeBatch; ++b) {
          const uint32_t j = j0 + b * T;
          if (j >= gs.n) continue;
          float v = BitsFloat(x[Pad(gs.base + j)]);
CC_UNROLL
          for (int k = 0; k < 2; ++k) {
            if (k < a.nin) v += DequantizeCode(c[k][b], half[k], s[k]);
          }
          if (a.nin > 0) x[Pad(gs.base + j)] = FloatBits(v);
          const uint32_t u = FloatBits(v) & 0x7fffffffu;
          m = u > m ? u : m;
        }
      }
    }
    x[PartialsAt() + t] = m;
  }
}

// The max |v| of local group gl from its threads' partials.
CC_HD uint32_t PartialMax(const uint32_t* x, uint32_t gl, unsigned T) {
  uint32_t m = 0;
  for (unsigned l = 0; l < T; ++l) m = x[PartialsAt() + gl * T + l] > m ? x[PartialsAt() + gl * T + l] : m;
  return m;
}

// The sum of squares of a group's values in index order (the clip point's; one thread).
CC_HD float GroupSquares(const uint32_t* x, const GroupSlot& gs) {
  float sq = 0.0f;
  for (uint32_t j = 0; j < gs.n; ++j) {
    const float v = BitsFloat(x[Pad(gs.base + j)]);
    sq += v * v;
  }
  return sq;
}

// Then one thread per group: its scale (as HopEncodeGroups finds it) stored, and its grid left for the quantization.
CC_HD void HopGroupScales(const HopArgs& a, const HopTile& h, uint32_t* x, unsigned tid, unsigned threads) {
  const unsigned T = GroupThreads(a.group);
  const int sb = ScaleBytes(a.format);
  const uint32_t levels = Levels(a.bits);
  for (uint32_t gl = tid; gl < TileGroupCount(a, h); gl += threads) {
    const GroupSlot gs = GroupSlotOf(a, h, gl);
    const float sq = a.clipK > 0.0f ? GroupSquares(x, gs) : 0.0f;
    const float sc =
        StoreGroupScale(a.out + gs.g * sb, GroupScaleFromStats(PartialMax(x, gl, T), sq, gs.n, a.clipK), a.format);
    const float inv = InvStepOf(sc, levels);
    x[GridsAt() + 2 * gl] = FloatBits(inv);
    x[GridsAt() + 2 * gl + 1] = FloatBits(sc * inv);
  }
}

// Last of the three: the codes, in place of the values (a thread takes pairs of values, so that a pair whose indices
// share a dither word hashes it once).
CC_HD void HopQuantize(const HopArgs& a, const HopTile& h, uint32_t* x, unsigned tid, unsigned threads) {
  const unsigned T = GroupThreads(a.group);
  const uint32_t tileGroups = TileGroupCount(a, h);
  const uint32_t levels = Levels(a.bits);
  for (unsigned t = tid; t < kThreads; t += threads) {
    const uint32_t gl = t / T, lane = t % T;
    if (gl >= tileGroups) continue;
    const GroupSlot gs = GroupSlotOf(a, h, gl);
    const float inv = BitsFloat(x[GridsAt() + 2 * gl]), shift = BitsFloat(x[GridsAt() + 2 * gl + 1]);
    const uint32_t gi0 = static_cast<uint32_t>(a.off + gs.g * a.group);
    DitherStream dither(a.rule);
    for (uint32_t j = 2 * lane; j < gs.n; j += 2 * T) {
      for (uint32_t k = j; k < j + 2 && k < gs.n; ++k) {
        uint32_t& w = x[Pad(gs.base + k)];
        w = QuantizeCode(BitsFloat(w), inv, shift, levels, dither.At(gi0 + k, k == j));
      }
    }
  }
}

// Last: the tile's packed codes (it starts on a byte), one thread per byte, as the little-endian stream of the CPU.
CC_HD void HopPack(const HopArgs& a, const HopTile& h, const uint32_t* x, unsigned tid, unsigned threads) {
  const size_t groups = (a.len + a.group - 1) / a.group;
  uint8_t* packed = a.out + groups * ScaleBytes(a.format) + h.t0 * static_cast<size_t>(a.bits) / 8;
  auto code = [&](size_t e) { return x[Pad(h.shift + static_cast<uint32_t>(e))]; };
  const size_t bytes = PackedBytes(h.tl, a.bits);
  for (size_t b = tid; b < bytes; b += threads) packed[b] = PackedByteAt(code, h.tl, a.bits, b);
}

// The encode after the load and rotation phases, with a barrier between phases: HopEncodeGroups, or the three split
// phases for large groups; then HopPack.
CC_HD int HopEncodePhases(const HopArgs& a) { return GroupThreads(a.group) > 1 ? 4 : 2; }
CC_HD void HopEncodePhase(const HopArgs& a, const HopTile& h, uint32_t* x, int phase, unsigned tid,
                          unsigned threads) {
  if (phase == HopEncodePhases(a) - 1) {
    HopPack(a, h, x, tid, threads);
  } else if (GroupThreads(a.group) == 1) {
    HopEncodeGroups(a, h, x, tid, threads);
  } else if (phase == 0) {
    HopGroupStats(a, h, x, tid, threads);
  } else if (phase == 1) {
    HopGroupScales(a, h, x, tid, threads);
  } else {
    HopQuantize(a, h, x, tid, threads);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The decode. Without rotation: tiles of whole groups, decoded by group into shared memory, written coalesced. With
// the inverse rotation fused (rotate): tiles of kDecodeSpan buffer elements aligned to rotation blocks; the full
// blocks that lie inside the slice are rotated back (and scaled) and marked in done[block index]; the rest of the
// slice is written decoded, for RotateInverse's pass over the unmarked blocks after the ring.

struct DecodeArgs {
  const uint8_t* wire = nullptr;
  size_t off = 0, len = 0;
  size_t group = 32;
  int bits = 4;
  ScaleFormat format = ScaleFormat::kFp32;
  float* out = nullptr;  // out[i] is element off + i
  bool rotate = false;
  size_t count = 0, block = 1;
  uint32_t signKey = 0;
  float scale = 1.0f;
  uint8_t* done = nullptr;
  // Lane sums of the homomorphic mode instead (lanes_tile.h's LanesFrom): the agreed scales by global group, the
  // lanes' width and the ranks summed; bits are the codes'.
  const float* agreed = nullptr;
  int laneBits = 0;
  int nranks = 1;
};

// The arguments of a decode of [off, off + len) into out (element off at out[0]), and the same with the blocks
// inside the slice rotated back (scale folded in) and marked in done.
CC_HD DecodeArgs DecodeArgsOf(const void* wire, size_t off, size_t len, size_t group, int bits, ScaleFormat format,
                              float* out) {
  DecodeArgs a;
  a.wire = static_cast<const uint8_t*>(wire);
  a.off = off;
  a.len = len;
  a.group = group;
  a.bits = bits;
  a.format = format;
  a.out = out;
  return a;
}

CC_HD DecodeArgs RotatedBack(DecodeArgs a, size_t count, size_t block, uint32_t signKey, float scale,
                             uint8_t* done) {
  a.rotate = true;
  a.count = count;
  a.block = block;
  a.signKey = signKey;
  a.scale = scale;
  a.done = done;
  return a;
}

// Tile t: buffer elements [lo, hi) of the slice, staged at word Pad(i - base); blocks [f0, f1) are rotated back, and
// their values are staged times `prescale` (UnrotateBlock's).
struct DecodeTile {
  size_t lo = 0, hi = 0, base = 0, f0 = 0, f1 = 0;
  float prescale = 1.0f;
};

// The word staged for decoded value v of buffer element i.
CC_HD uint32_t StagedDecode(const DecodeTile& d, size_t i, float v) {
  return FloatBits(i >= d.f0 && i < d.f1 ? v * d.prescale : v);
}

CC_HD size_t DecodeTiles(const DecodeArgs& a) {
  if (!a.rotate) {
    const size_t per = TileGroups(a.group) * a.group;
    return (a.len + per - 1) / per;
  }
  const size_t first = a.off & ~(kDecodeSpan - 1);
  return (a.off + a.len - first + kDecodeSpan - 1) / kDecodeSpan;
}

CC_HD DecodeTile DecodeTileOf(const DecodeArgs& a, size_t t) {
  DecodeTile d;
  if (!a.rotate) {
    const size_t per = TileGroups(a.group) * a.group;
    d.base = a.off + t * per;
    d.lo = d.base;
    d.hi = a.len - t * per < per ? a.off + a.len : d.base + per;
    return d;
  }
  d.base = (a.off & ~(kDecodeSpan - 1)) + t * kDecodeSpan;
  d.lo = a.off > d.base ? a.off : d.base;
  d.hi = a.off + a.len < d.base + kDecodeSpan ? a.off + a.len : d.base + kDecodeSpan;
  const size_t fullEnd = a.count & ~(a.block - 1);
  d.f0 = (d.lo + a.block - 1) & ~(a.block - 1);
  const size_t end = d.hi < fullEnd ? d.hi : fullEnd;
  d.f1 = end & ~(a.block - 1);
  if (d.f1 < d.f0) d.f1 = d.f0;
  d.prescale = UnrotatePrescale(a.block);
  return d;
}

// Phase 1 of requant messages (lane sums: lanes_tile.h's DecodeLaneUnits): one thread per group (or the part of a
// group inside the tile; GroupThreads per group for large groups) decodes into shared memory.
CC_HD void DecodeGroups(const DecodeArgs& a, const DecodeTile& d, uint32_t* x, unsigned tid, unsigned threads) {
  const size_t groups = (a.len + a.group - 1) / a.group;
  const int sb = ScaleBytes(a.format);
  const uint32_t levels = Levels(a.bits);
  const uint8_t* codes = a.wire + groups * sb;
  const size_t codeBytes = PackedBytes(a.len, a.bits);
  const size_t g0 = (d.lo - a.off) / a.group, g1 = (d.hi - a.off + a.group - 1) / a.group;
  // Groups of 64 and more: T threads per group (as the hop's split phases), each code read where it lies.
  const unsigned T = GroupThreads(a.group);
  const uint32_t items = static_cast<uint32_t>((g1 - g0) * T);  // about kThreads: the tile's groups, T each
  for (uint32_t w = tid; w < items; w += threads) {
    const size_t g = g0 + w / T;
    const unsigned lane = w % T;
    size_t e0 = g * a.group, e1 = e0 + a.group;
    if (e0 < d.lo - a.off) e0 = d.lo - a.off;
    if (e1 > d.hi - a.off) e1 = d.hi - a.off;
    const float s = LoadScale(a.wire + g * sb, a.format);
    float half, inv;
    GridOf(s, levels, &half, &inv);
    if (T > 1) {  // kLoadBatch codes read before any is used
      for (size_t f = e0 + lane; f < e1; f += T * kLoadBatch) {
        uint32_t c[kLoadBatch];
CC_UNROLL
        for (unsigned b = 0; b < kLoadBatch; ++b) {
          const size_t e = f + b * T;
          c[b] = e < e1 ? ReadBits(codes, codeBytes, e * static_cast<size_t>(a.bits), a.bits) : 0u;
        }
CC_UNROLL
        for (unsigned b = 0; b < kLoadBatch; ++b) {
          const size_t e = f + b * T;
          if (e < e1) {
            const float v = DequantizeCode(c[b], half, s);
            x[Pad(static_cast<uint32_t>(a.off + e - d.base))] = StagedDecode(d, a.off + e, v);
          }
        }
      }
      continue;
    }
    const size_t bit = e0 * static_cast<size_t>(a.bits);
    BitReader r(codes + bit / 8);
    if (bit % 8 != 0) r.Get(static_cast<int>(bit % 8));
    for (size_t e = e0; e < e1; ++e) {
      const float v = DequantizeCode(r.Get(a.bits), half, s);
      x[Pad(static_cast<uint32_t>(a.off + e - d.base))] = StagedDecode(d, a.off + e, v);
    }
  }
}

CC_HD int DecodeRotatePhases(const DecodeArgs& a, const DecodeTile& d) {
  return a.rotate && d.f1 > d.f0 ? WhtPhases(Log2(a.block)) : 0;
}

CC_HD void DecodeRotate(const DecodeArgs& a, const DecodeTile& d, uint32_t* x, int phase, unsigned tid,
                        unsigned threads) {
  WhtPhase(x, static_cast<uint32_t>(d.f0 - d.base), static_cast<uint32_t>(d.f1 - d.f0), Log2(a.block), phase, tid,
           threads);
}

// Last: the tile's values out, coalesced; the rotated-back ones with their signs and scale (UnrotateBlock's order).
CC_HD void DecodeStore(const DecodeArgs& a, const DecodeTile& d, const uint32_t* x, unsigned tid, unsigned threads) {
  const float f = a.rotate ? UnrotateFactor(a.block, a.scale) : 1.0f;
  for (size_t i = d.lo + tid; i < d.hi; i += threads) {
    float v = BitsFloat(x[Pad(static_cast<uint32_t>(i - d.base))]);
    if (i >= d.f0 && i < d.f1) v = v * (SignBit(a.signKey, i) ? -f : f);
    a.out[i - a.off] = v;
  }
  if (a.done != nullptr) {
    for (size_t b = d.f0 + tid * a.block; b < d.f1; b += threads * a.block) a.done[b / a.block] = 1;
  }
}

}  // namespace tile
}  // namespace ccoll
