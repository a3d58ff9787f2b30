// PowerSGD's pieces (low-rank compression): how a bucket splits into matrices compressed at rank r and parts sent
// exactly, the random start of Q, Gram-Schmidt, and the three products, which go to a BLAS (never hand-written).
// Matrices are row-major; P is rows x r and Q is cols x r, both row-major. The collective driver lives in
// collectives/lowrank.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "compress/compressor.h"
#include "compress/host_device.h"

namespace ccoll {

struct LowRankMatrix {
  size_t offset = 0;       // first element in the bucket
  int64_t rows = 0, cols = 0;
  int rank = 0;            // min(r, rows, cols)
  size_t pOffset = 0;      // in the P buffer
  size_t qOffset = 0;      // in the Q buffer
};

struct LowRankPlan {
  std::vector<LowRankMatrix> matrices;               // compressed
  std::vector<std::pair<size_t, size_t>> exact;      // (offset, length) of every part sent exactly
  size_t pElems = 0, qElems = 0, exactElems = 0;
};

// True when a rows x cols matrix gains at least 2x from rank r (as PyTorch's PowerSGD hook decides): otherwise it
// is sent exactly.
bool WorthCompressing(int64_t rows, int64_t cols, int rank);

// Splits a bucket of `count` elements by the compressor's shapes (or rows/cols, or the automatic square-ish
// matrix). False, with the reason in *why, when the shapes do not add up to count.
bool PlanLowRank(const ccCompressor& c, size_t count, LowRankPlan* plan, std::string* why);

// Whether a column is numerically dependent on the earlier ones: what is left of it once they are taken out
// (squared norm `left`) is below float32's precision of the column itself (squared norm `before`). That rest is
// rounding, not a direction: normalized it could point along an earlier column (rows that are all equal give a
// rest that is a multiple of the first column), and P would hold one direction twice, so P P^T M would count it
// twice (PowerSGD returned 2x the average of a constant matrix at rank 4). Such a column becomes zero instead.
// Non-finite columns are left to the usual path (they make the call's result non-finite on every rank, and error
// feedback drops them).
CC_HD bool LowRankDependent(double left, double before) {
  return before <= 1.7976931348623157e308 && left <= 1e-14 * before;
}

// The factor on a dot product with column j, once divided by denom = ||column j|| + eps (its squared norm was sq), that
// removes all of column j's direction from a later column: its squared length is now sq / denom^2, below 1 with
// eps > 0, and subtracting just dot times it left a share of the direction behind (about 2 eps / ||column j||), which
// normalized became a second copy of column j: PowerSGD returned 2x the average of a constant matrix with eps > 0.
// Exactly 1 with eps = 0, so that the bytes are those of plain modified Gram-Schmidt (as PyTorch's hook computes).
CC_HD double LowRankProjectionScale(double sq, double denom, double eps) {
  return eps > 0.0 ? denom * denom / sq : 1.0;
}

// Orthonormalizes the r columns of the row-major rows x r matrix a in place by modified Gram-Schmidt in double
// precision: column j /= (||column j|| + eps), then its direction is removed from the later columns (with
// LowRankProjectionScale). A column with nothing
// left (norm + eps == 0, e.g. an all-zero input), or dependent on the earlier ones (LowRankDependent), becomes
// zero instead. Deterministic: the same input gives the same bytes on every rank. scratch: grown to rows * r + r
// doubles and kept by the caller (no allocation per call).
void Orthogonalize(float* a, int64_t rows, int r, double eps, std::vector<double>* scratch);

// Fills q (cols x r) with N(0, 1)-like values from the stream `key`, then orthonormalizes it.
void RandomQ(float* q, int64_t cols, int r, uint32_t key, std::vector<double>* scratch);

// False when q has a non-finite value or an all-zero column (a warm start from it would stay stuck).
bool UsableQ(const float* q, int64_t cols, int r);

// The products on a CPU BLAS (lowrank_blas.cc; CCOLL_HAVE_BLAS builds). On device buffers: lowrank_cuda.h.
// p = m q (rows x r).
void ProductMQ(const float* m, int64_t rows, int64_t cols, const float* q, int r, float* p);
// q = m^T p (cols x r).
void ProductMtP(const float* m, int64_t rows, int64_t cols, const float* p, int r, float* q);
// out = p q^T (rows x cols, row-major with leading dimension cols).
void ProductPQt(const float* p, const float* q, int64_t rows, int64_t cols, int r, float* out);

}  // namespace ccoll
