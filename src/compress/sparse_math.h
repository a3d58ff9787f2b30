// Element math of the sparsifiers shared by the CPU driver (sparse.cc) and the CUDA kernels (sparse_cuda.cu): a
// chunk's squared norm, which topk's choice ranks after the norms are summed over ranks. Ranks with host buffers and
// ranks with device buffers may share one call, so both must compute the same bytes.
#pragma once

#include <cstddef>

#include "compress/host_device.h"

namespace ccoll {

// The squared L2 norm of x[0..n) in double, in an order that a CPU's vector units and one GPU thread both run fast:
// eight partial sums, sum j adding the squares of x[j], x[j + 8], x[j + 16], ... in index order, then added pairwise,
// ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)). Each square is exact in double; only the sums round. Not finite
// when x holds a non-finite value.
CC_HD double ChunkSquaredNorm(const float* x, size_t n) {
  double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int j = 0; j < 8; ++j) s[j] += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
  }
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int j = 0; j < 8; ++j) {
    if (i + static_cast<size_t>(j) < n) s[j] += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// Partial sum j (0..7) of ChunkSquaredNorm: the squares of x[j], x[j + 8], x[j + 16], ... in index order. The GPU
// gives each chunk eight threads, thread j this sum, and adds the eight with a butterfly over lanes j ^ 1, j ^ 2,
// j ^ 4: each step adds two sums of ChunkSquaredNorm's pairwise tree, in one order or the other, and
// IEEE addition is commutative, so every lane ends with ChunkSquaredNorm's bytes.
CC_HD double ChunkPartialSquares(const float* x, size_t n, unsigned j) {
  double s = 0.0;
  for (size_t i = j; i < n; i += 8) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

// The same with the error feedback's add fused in (the sparsifiers' pre-pass): acc[i] += add[i] at the positions of
// partial sum j, and the squares of those sums, as AddInto and then ChunkPartialSquares would give.
CC_HD double ChunkPartialSquaresAdding(float* acc, const float* add, size_t n, unsigned j) {
  double s = 0.0;
  for (size_t i = j; i < n; i += 8) {
    const float v = acc[i] + add[i];
    acc[i] = v;
    s += static_cast<double>(v) * static_cast<double>(v);
  }
  return s;
}

}  // namespace ccoll
