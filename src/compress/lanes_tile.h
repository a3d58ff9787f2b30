// The homomorphic quantization mode's tiled GPU kernels, as phases of one thread block over shared memory (the
// structure of compress/requant_tile.h, whose load, rotation, encode and store phases they reuse). Homomorphic codes
// sit on scales the ranks agreed on before the ring, in lanes wide enough that the codes of every rank add as
// integers; so a value's code depends only on the value, its global group's agreed scale and its dither, and one
// thread takes a unit of 8 values, whose 8 lanes fill exactly laneBits bytes of the stream.
//
// Three kernels, one tile layout (HopTileOf):
// - kScales: the group scales of the values (the metadata the ranks agree on by max), rotated on the fly from the
//   unrotated input when the rotation is fused, so that no pass writes the rotated buffer;
// - kLanes: the hop: the values' lane codes plus the arriving lane streams, one integer add per unit;
// - kRequant: the last reduce hop when the all-gather is requantized: the same lane sums, decoded in shared memory
//   and encoded as a requant message with fresh scales (requant_tile.h's encode phases, HopEncodePhase).
// The decode of lane sums is a first phase for requant_tile.h's decode tile (DecodeLaneUnits instead of DecodeGroups),
// so the inverse rotation fuses there as it does for requant messages.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/bitpack.h"
#include "compress/host_device.h"
#include "compress/quant_math.h"
#include "compress/requant_tile.h"

namespace ccoll {
namespace tile {

enum class LanesMode : int { kScales = 0, kLanes = 1, kRequant = 2 };

struct LanesArgs {
  // The values and the slice as a hop's (values, rotation, off, len, group, rule); kLanes and kRequant: the arriving
  // lane streams in[0..nin) and the output; kRequant: the message's bits, format and clipK too. bits: the codes'.
  HopArgs hop;
  LanesMode mode = LanesMode::kLanes;
  float* scalesOut = nullptr;       // kScales: one scale per group of the slice (off = 0: the buffer's groups)
  const float* agreed = nullptr;    // kLanes, kRequant: the agreed scales, indexed by global group
  int laneBits = 0;
  int nranks = 1;
};

// What the kernel relies on (the launchers refuse anything else): a group the tiles cover (and a rotation block, when
// fused), 0..2 arriving streams, lanes of 1..16 bits (8 fill at most 128 bits) and codes that fit them, the scales to
// write or read, and an output for the hops. kRequant's output must not overlap an arriving stream (one tile's
// message bytes would land on lanes another tile still reads); kLanes may add in place.
CC_HD bool LanesArgsValid(const LanesArgs& a) {
  if (!Covers(a.hop.group) || (a.hop.rotate && !CoversRotation(a.hop.block))) return false;
  if (a.hop.values == nullptr) return false;
  if (a.mode == LanesMode::kScales) return a.scalesOut != nullptr;
  return a.agreed != nullptr && a.hop.out != nullptr && a.hop.nin >= 0 && a.hop.nin <= 2 && a.laneBits >= 1 &&
         a.laneBits <= 16 && a.hop.bits >= 1 && a.hop.bits <= a.laneBits && a.nranks >= 1;
}

// kScales of values[0..count) (rotate with RotatedFrom on .hop).
CC_HD LanesArgs ScalesArgsOf(const float* values, size_t count, size_t group, float clipK, float* scalesOut) {
  LanesArgs a;
  a.hop = HopArgsOf(values, nullptr, 0, 0, count, group, 1, ScaleFormat::kFp32, clipK, DitherRule(), nullptr);
  a.mode = LanesMode::kScales;
  a.scalesOut = scalesOut;
  return a;
}

// kLanes (requant false) or kRequant of a hop whose arriving messages are lane streams.
CC_HD LanesArgs LanesArgsOf(const HopArgs& hop, const float* agreed, int laneBits, int nranks, bool requant) {
  LanesArgs a;
  a.hop = hop;
  a.mode = requant ? LanesMode::kRequant : LanesMode::kLanes;
  a.agreed = agreed;
  a.laneBits = laneBits;
  a.nranks = nranks;
  return a;
}

// The grid of one global group's agreed scale, found again when a unit's values cross into the next group.
struct AgreedGrid {
  const float* agreed;
  size_t group;
  uint32_t levels;
  size_t g = 0, next = 0;  // group g holds global indices [next - group, next)
  float s = 0.0f, half = 0.0f, inv = 0.0f;
  CC_HD AgreedGrid(const float* scales, size_t groupSize, int bits, uint64_t gi)
      : agreed(scales), group(groupSize), levels(Levels(bits)) {
    g = gi / group;  // the unit's one division
    next = (g + 1) * group;
    Load();
  }
  CC_HD void Load() {
    s = agreed[g];
    GridOf(s, levels, &half, &inv);
  }
  CC_HD void At(uint64_t gi) {
    if (gi < next) return;
    ++g;
    next += group;
    Load();
  }
  // The value of a lane sum of nranks codes (as DecodeLanesSlice): C * step - nranks * s, as DequantizeSum.
  CC_HD float SumValue(uint32_t c, float nranks) const { return DequantizeSum(c, half, s, nranks); }
};

// kScales, after the load and rotation phases: one thread per group, its scale as GroupScaleOf computes it.
CC_HD void LanesScales(const LanesArgs& a, const HopTile& h, const uint32_t* x, unsigned tid, unsigned threads) {
  for (uint32_t gl = tid; gl < TileGroupCount(a.hop, h); gl += threads) {
    const GroupSlot gs = GroupSlotOf(a.hop, h, gl);
    uint32_t m = 0;
    float sq = 0.0f;
    for (uint32_t j = 0; j < gs.n; ++j) {
      const float v = BitsFloat(x[Pad(gs.base + j)]);
      const uint32_t u = FloatBits(v) & 0x7fffffffu;
      m = u > m ? u : m;
      if (a.hop.clipK > 0.0f) sq += v * v;
    }
    a.scalesOut[gs.g] = GroupScaleFromStats(m, sq, gs.n, a.hop.clipK);
  }
}

// Groups of 64 values and more (GroupThreads > 1): the max split over the group's threads (requant_tile.h's
// HopGroupStats, without messages), then one thread per group combines it (and sums the squares, clipping).
CC_HD void LanesGroupScales(const LanesArgs& a, const HopTile& h, const uint32_t* x, unsigned tid, unsigned threads) {
  const unsigned T = GroupThreads(a.hop.group);
  for (uint32_t gl = tid; gl < TileGroupCount(a.hop, h); gl += threads) {
    const GroupSlot gs = GroupSlotOf(a.hop, h, gl);
    const float sq = a.hop.clipK > 0.0f ? GroupSquares(x, gs) : 0.0f;
    a.scalesOut[gs.g] = GroupScaleFromStats(PartialMax(x, gl, T), sq, gs.n, a.hop.clipK);
  }
}

// kLanes and kRequant: one thread per unit of 8 values codes them (as EncodeLanesSlice) and adds the arriving
// streams' unit (as AddPackedStreams: no lane overflows, so no carry leaves a unit). kLanes stores the sum; kRequant
// decodes it (as DecodeLanesSlice) into the values' words, for the requant encode phases that follow.
CC_HD void LanesEncode(const LanesArgs& a, const HopTile& h, uint32_t* x, unsigned tid, unsigned threads) {
  const HopArgs& p = a.hop;
  const uint32_t units = static_cast<uint32_t>((h.tl + 7) / 8);
  const size_t unitBytes = static_cast<size_t>(a.laneBits);
  const float nranks = static_cast<float>(a.nranks);
  for (uint32_t u = tid; u < units; u += threads) {
    const uint32_t e0 = 8 * u, n = h.tl - e0 < 8 ? static_cast<uint32_t>(h.tl - e0) : 8u;
    const uint64_t gi0 = p.off + h.t0 + e0;
    AgreedGrid grid(a.agreed, p.group, p.bits, gi0);
    DitherStream dither(p.rule);
    Bits128 sum;
    for (uint32_t j = 0; j < n; ++j) {
      grid.At(gi0 + j);
      const float v = BitsFloat(x[Pad(h.shift + e0 + j)]);
      const uint32_t code =
          QuantizeCode(v, grid.inv, grid.s * grid.inv, grid.levels, dither.At(static_cast<uint32_t>(gi0 + j), j == 0));
      PutBits(&sum, code, static_cast<int>(j) * a.laneBits);
    }
    const size_t at = (h.t0 / 8 + u) * unitBytes, bytes = PackedBytes(n, a.laneBits);
    for (int k = 0; k < p.nin; ++k) sum = AddBits(sum, LoadBits(p.in[k] + at, bytes));
    if (a.mode == LanesMode::kLanes) {
      StoreBits(sum, p.out + at, bytes);
      continue;
    }
    AgreedGrid back(a.agreed, p.group, p.bits, gi0);
    for (uint32_t j = 0; j < n; ++j) {
      back.At(gi0 + j);
      const uint32_t c = GetBits(sum, static_cast<int>(j) * a.laneBits, a.laneBits);
      x[Pad(h.shift + e0 + j)] = FloatBits(back.SumValue(c, nranks));
    }
  }
}

// The phases after the load and rotation, a barrier between them: kScales as above; kLanes: LanesEncode; kRequant:
// LanesEncode, then requant_tile.h's encode phases on the decoded sums.
CC_HD int LanesPhases(const LanesArgs& a) {
  if (a.mode == LanesMode::kScales) return GroupThreads(a.hop.group) > 1 ? 2 : 1;
  return a.mode == LanesMode::kLanes ? 1 : 1 + HopEncodePhases(a.hop);
}

CC_HD void LanesPhase(const LanesArgs& a, const HopTile& h, uint32_t* x, int phase, unsigned tid, unsigned threads) {
  HopArgs values = a.hop;
  values.nin = 0;  // the requant phases encode the decoded lane sums; the scales read the values only
  if (a.mode == LanesMode::kScales) {
    if (GroupThreads(a.hop.group) == 1) {
      LanesScales(a, h, x, tid, threads);
    } else if (phase == 0) {
      HopGroupStats(values, h, x, tid, threads);
    } else {
      LanesGroupScales(a, h, x, tid, threads);
    }
    return;
  }
  if (phase == 0) {
    LanesEncode(a, h, x, tid, threads);
  } else {
    HopEncodePhase(values, h, x, phase - 1, tid, threads);
  }
}

// The decode tile's first phase for lane sums (DecodeArgs with lanes set: LanesFrom): one thread per unit of 8 lanes
// that reaches into the tile decodes its values there, x = C * step - nranks * s.
CC_HD DecodeArgs LanesFrom(DecodeArgs a, const float* agreed, int laneBits, int nranks) {
  a.agreed = agreed;
  a.laneBits = laneBits;
  a.nranks = nranks;
  return a;
}

// What the decode tile relies on (the launchers refuse anything else): a group the tiles cover (and a rotation
// block, when fused); for lane sums, lanes of 1..16 bits that hold the codes.
CC_HD bool DecodeArgsValid(const DecodeArgs& a) {
  if (!Covers(a.group) || (a.rotate && !CoversRotation(a.block))) return false;
  return a.agreed == nullptr || (a.laneBits >= 1 && a.laneBits <= 16 && a.bits >= 1 && a.bits <= a.laneBits);
}

CC_HD void DecodeLaneUnits(const DecodeArgs& a, const DecodeTile& d, uint32_t* x, unsigned tid, unsigned threads) {
  const size_t lo = d.lo - a.off, hi = d.hi - a.off;  // slice positions
  const size_t u0 = lo / 8, u1 = (hi + 7) / 8;
  const size_t unitBytes = static_cast<size_t>(a.laneBits);
  const float nranks = static_cast<float>(a.nranks);
  for (size_t u = u0 + tid; u < u1; u += threads) {
    const size_t e0 = 8 * u, n = a.len - e0 < 8 ? a.len - e0 : 8;
    const Bits128 sum = LoadBits(a.wire + u * unitBytes, PackedBytes(n, a.laneBits));
    const size_t j0 = lo > e0 ? lo - e0 : 0, j1 = hi < e0 + n ? hi - e0 : n;
    AgreedGrid grid(a.agreed, a.group, a.bits, a.off + e0 + j0);
    for (size_t j = j0; j < j1; ++j) {
      grid.At(a.off + e0 + j);
      const uint32_t c = GetBits(sum, static_cast<int>(j) * a.laneBits, a.laneBits);
      const size_t i = a.off + e0 + j;
      x[Pad(static_cast<uint32_t>(i - d.base))] = StagedDecode(d, i, grid.SumValue(c, nranks));
    }
  }
}

}  // namespace tile
}  // namespace ccoll
