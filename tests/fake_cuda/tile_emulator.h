// The tile kernels of quant_cuda.cu run on the CPU: every tile's phases (compress/requant_tile.h, lanes_tile.h) in the
// kernels' order, each phase for every thread of the tile before the next phase starts (the kernels' barriers). The
// threads of a phase run in a shuffled order, so a phase whose threads read what other threads write in the same
// phase (a race on the GPU) gives wrong bytes here too. Shared memory starts poisoned for every tile, so a phase that
// reads a word nothing wrote does as well. The fake runtime's codec kernels use it (fake_codec_kernels.cc), and
// tests/test_compression.cc checks it against the CPU codec.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "compress/hadamard.h"
#include "compress/quant_cpu.h"
#include "compress/lanes_tile.h"

namespace cctest {

class TileEmulator {
 public:
  explicit TileEmulator(uint32_t seed = 1) : gen_(seed), shared_(ccoll::tile::SharedWords()) {}

  void Hop(const ccoll::tile::HopArgs& a) {
    using namespace ccoll::tile;
    for (size_t t = 0; t < HopTiles(a); ++t) {
      Poison();
      const HopTile h = HopTileOf(a, t);
      Phase([&](unsigned tid) { HopLoad(a, h, shared_.data(), tid, kThreads); });
      for (int p = 0; p < HopRotatePhases(a, h); ++p) {
        Phase([&](unsigned tid) { HopRotate(a, h, shared_.data(), p, tid, kThreads); });
      }
      if (GroupThreads(a.group) > 1) {  // HopTileKernel's sequence, as it spells it out
        Phase([&](unsigned tid) { HopGroupStats(a, h, shared_.data(), tid, kThreads); });
        Phase([&](unsigned tid) { HopGroupScales(a, h, shared_.data(), tid, kThreads); });
        Phase([&](unsigned tid) { HopQuantize(a, h, shared_.data(), tid, kThreads); });
      } else {
        Phase([&](unsigned tid) { HopEncodeGroups(a, h, shared_.data(), tid, kThreads); });
      }
      Phase([&](unsigned tid) { HopPack(a, h, shared_.data(), tid, kThreads); });
    }
  }

  // LanesTileKernel: the hop's load and rotation, then the mode's phases.
  void Lanes(const ccoll::tile::LanesArgs& a) {
    using namespace ccoll::tile;
    for (size_t t = 0; t < HopTiles(a.hop); ++t) {
      Poison();
      const HopTile h = HopTileOf(a.hop, t);
      Phase([&](unsigned tid) { HopLoad(a.hop, h, shared_.data(), tid, kThreads); });
      for (int p = 0; p < HopRotatePhases(a.hop, h); ++p) {
        Phase([&](unsigned tid) { HopRotate(a.hop, h, shared_.data(), p, tid, kThreads); });
      }
      for (int p = 0; p < LanesPhases(a); ++p) {
        Phase([&](unsigned tid) { LanesPhase(a, h, shared_.data(), p, tid, kThreads); });
      }
    }
  }

  void Decode(const ccoll::tile::DecodeArgs& a) {
    using namespace ccoll::tile;
    for (size_t t = 0; t < DecodeTiles(a); ++t) {
      Poison();
      const DecodeTile d = DecodeTileOf(a, t);
      Phase([&](unsigned tid) {  // DecodeTileKernel<true> for lane sums, <false> for requant messages
        if (a.agreed != nullptr) {
          DecodeLaneUnits(a, d, shared_.data(), tid, kThreads);
        } else {
          DecodeGroups(a, d, shared_.data(), tid, kThreads);
        }
      });
      for (int p = 0; p < DecodeRotatePhases(a, d); ++p) {
        Phase([&](unsigned tid) { DecodeRotate(a, d, shared_.data(), p, tid, kThreads); });
      }
      Phase([&](unsigned tid) { DecodeStore(a, d, shared_.data(), tid, kThreads); });
    }
  }

 private:
  void Poison() { std::fill(shared_.begin(), shared_.end(), 0x7fc0dead); }  // a NaN

  template <typename Fn>
  void Phase(Fn&& fn) {
    std::vector<unsigned> order(ccoll::tile::kThreads);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), gen_);
    for (unsigned tid : order) fn(tid);
  }

  std::mt19937 gen_;
  std::vector<uint32_t> shared_;
};

// RotateInverse of quant_cuda.cu with `done` flags (the finish after fused decodes): every rotation block not marked
// (the tail's smaller blocks never are) rotated back by the CPU's one-block function.
inline void RotateInverseUnmarked(float* x, size_t count, size_t block, uint32_t key, float scale,
                                  const uint8_t* done) {
  ccoll::ForEachRotationBlock(count, block, [&](size_t off, size_t len) {
    if (done != nullptr && len == block && done[off / block] != 0) return;
    ccoll::RotateBlockInverse(x + off, len, off, key, scale);
  });
}

}  // namespace cctest
