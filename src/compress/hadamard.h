// Randomized Hadamard rotation, the reference definition (host/device element math; the CPU driver in quant_cpu.cc
// and the CUDA kernels must produce the same bytes): x <- H D x / sqrt(B) on blocks of B = 2^k elements (D: random
// signs shared by all ranks, H: the Walsh-Hadamard matrix). It is orthonormal, so it preserves norms and the sum of
// rotated vectors is the rotation of the sum; it spreads outliers over the block, which makes per-group scales
// tight. The inverse is x <- D H x / sqrt(B), with an exact power of two taken out before H and put back after it
// (UnrotateBlock). A buffer whose length is not a multiple of B ends in smaller power-of-two blocks (down to 1
// element, which is only sign-flipped), so every length works and forward/inverse decompose it the same way.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "compress/host_device.h"
#include "compress/rng.h"

namespace ccoll {

// In-place unnormalized fast Walsh-Hadamard transform of n = 2^k floats.
CC_HD void Fwht(float* x, size_t n) {
  for (size_t h = 1; h < n; h <<= 1) {
    for (size_t i = 0; i < n; i += 2 * h) {
      for (size_t j = i; j < i + h; ++j) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

// Calls fn(offset, length) for the blocks that cover [0, count): full blocks of `block`, then the tail in
// decreasing powers of two.
template <typename Fn>
CC_HD void ForEachRotationBlock(size_t count, size_t block, Fn&& fn) {
  size_t off = 0;
  while (off < count) {
    size_t left = count - off;
    size_t len = block;
    while (len > left) len >>= 1;
    fn(off, len);
    off += len;
  }
}

// Forward rotation of one block starting at global element `base` (signs are indexed globally): each element is
// multiplied by +-1/sqrt(len), then transformed. This order of operations is the contract.
CC_HD void RotateBlock(float* x, size_t len, uint64_t base, uint32_t signKey) {
  const float f = 1.0f / std::sqrt(static_cast<float>(len));
  for (size_t j = 0; j < len; ++j) x[j] = x[j] * (SignBit(signKey, base + j) ? -f : f);
  Fwht(x, len);
}

// The inverse takes out 2^-ceil(log2(len) / 2) before the transform and puts it back in the final factor, so that
// the transform's sums stay within the block's largest result (sqrt(len) times it, without: an overflow above
// FLT_MAX / sqrt(len)). Both are exact powers of two: wherever no value is below float's normal range, the bytes are
// those of the plain transform followed by +-scale/sqrt(len).
CC_HD float UnrotatePrescale(size_t len) {
  int half = 0;
  while ((size_t{1} << (2 * half)) < len) ++half;
  return 1.0f / static_cast<float>(uint32_t{1} << half);
}

// The final factor of the inverse: scale/sqrt(len) rounded, times 2^ceil(log2(len) / 2) (exact).
CC_HD float UnrotateFactor(size_t len, float scale) {
  return scale / std::sqrt(static_cast<float>(len)) / UnrotatePrescale(len);
}

// The inverse, with `scale` folded in (the average's 1/n): multiply by UnrotatePrescale, transform, then multiply by
// +-UnrotateFactor. This order of operations is the contract.
CC_HD void UnrotateBlock(float* x, size_t len, uint64_t base, uint32_t signKey, float scale) {
  const float p = UnrotatePrescale(len);
  for (size_t j = 0; j < len; ++j) x[j] = x[j] * p;
  Fwht(x, len);
  const float f = UnrotateFactor(len, scale);
  for (size_t j = 0; j < len; ++j) x[j] = x[j] * (SignBit(signKey, base + j) ? -f : f);
}

}  // namespace ccoll
