#include "compress/lowrank.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "compress/rng.h"

namespace ccoll {

bool WorthCompressing(int64_t rows, int64_t cols, int rank) {
  if (rows < 2 || cols < 2) return false;
  const double r = static_cast<double>(std::min<int64_t>({int64_t{rank}, rows, cols}));
  return 2.0 * r * static_cast<double>(rows + cols) < static_cast<double>(rows) * static_cast<double>(cols);
}

bool PlanLowRank(const ccCompressor& c, size_t count, LowRankPlan* plan, std::string* why) {
  *plan = LowRankPlan();
  const int rank = static_cast<int>(c.Get(ccParamRank));
  std::vector<TensorShape> shapes = c.shapes;
  if (shapes.empty()) {
    int64_t rows = c.Get(ccParamRows), cols = c.Get(ccParamCols);
    const int64_t n = static_cast<int64_t>(count);
    if (rows == 0 && cols == 0) {
      // Automatic: the most square matrix with floor(sqrt(count)) rows; the remainder (< rows elements) is exact.
      rows = static_cast<int64_t>(std::sqrt(static_cast<double>(n)));
      while (rows > 0 && rows * rows > n) --rows;
      while ((rows + 1) * (rows + 1) <= n) ++rows;
      if (rows > 0) shapes.push_back({rows, n / rows});
      if (rows > 0 && n % rows != 0) shapes.push_back({n % rows, 1});
    } else if (cols == 0 || rows == 0) {
      const int64_t given = rows != 0 ? rows : cols;
      if (n % given != 0) {
        *why = "count " + std::to_string(count) + " is not a multiple of " + (rows != 0 ? "rows " : "cols ") +
               std::to_string(given);
        return false;
      }
      shapes.push_back(rows != 0 ? TensorShape{rows, n / rows} : TensorShape{n / cols, cols});
    } else {
      shapes.push_back({rows, cols});
    }
  }
  // The shapes must add up to count exactly; checked tensor by tensor so that no product or sum can overflow.
  size_t total = 0;
  for (const TensorShape& s : shapes) {
    const size_t rows = static_cast<size_t>(s.rows), cols = static_cast<size_t>(s.cols);
    if (rows == 0 || cols == 0 || rows > (count - total) / cols) {
      *why = "the shapes hold more than count " + std::to_string(count) + " elements";
      return false;
    }
    total += rows * cols;
  }
  if (total != count) {
    *why = "the shapes hold " + std::to_string(total) + " elements but count is " + std::to_string(count);
    return false;
  }
  size_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const TensorShape& s = shapes[i];
    const size_t elems = static_cast<size_t>(s.rows) * static_cast<size_t>(s.cols);
    if (WorthCompressing(s.rows, s.cols, rank)) {
      if (s.rows > INT_MAX || s.cols > INT_MAX) {
        *why = "tensor " + std::to_string(i) + " (" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
               ") has a side over 2^31-1, which the BLAS cannot index";
        return false;
      }
      LowRankMatrix m;
      m.offset = offset;
      m.rows = s.rows;
      m.cols = s.cols;
      m.rank = static_cast<int>(std::min<int64_t>({int64_t{rank}, s.rows, s.cols}));
      m.pOffset = plan->pElems;
      m.qOffset = plan->qElems;
      plan->pElems += static_cast<size_t>(m.rows) * m.rank;
      plan->qElems += static_cast<size_t>(m.cols) * m.rank;
      plan->matrices.push_back(m);
    } else if (elems > 0) {
      if (!plan->exact.empty() && plan->exact.back().first + plan->exact.back().second == offset) {
        plan->exact.back().second += elems;  // adjacent exact tensors travel as one range
      } else {
        plan->exact.emplace_back(offset, elems);
      }
      plan->exactElems += elems;
    }
    offset += elems;
  }
  return true;
}

void Orthogonalize(float* a, int64_t rows, int r, double eps, std::vector<double>* scratch) {
  const size_t elems = static_cast<size_t>(rows) * r;
  if (scratch->size() < elems + static_cast<size_t>(r)) scratch->resize(elems + static_cast<size_t>(r));
  double* w = scratch->data();
  double* before = w + elems;  // each column's squared norm before the earlier columns were taken out of it
  for (size_t i = 0; i < elems; ++i) w[i] = a[i];
  for (int j = 0; j < r; ++j) {
    double sq = 0.0;
    for (int64_t i = 0; i < rows; ++i) sq += w[i * r + j] * w[i * r + j];
    before[j] = sq;
  }
  for (int j = 0; j < r; ++j) {
    double sq = 0.0;
    for (int64_t i = 0; i < rows; ++i) sq += w[i * r + j] * w[i * r + j];
    const double denom = std::sqrt(sq) + eps;
    if (denom == 0.0 || LowRankDependent(sq, before[j])) {
      for (int64_t i = 0; i < rows; ++i) w[i * r + j] = 0.0;
      continue;
    }
    for (int64_t i = 0; i < rows; ++i) w[i * r + j] /= denom;
    const double scale = LowRankProjectionScale(sq, denom, eps);
    for (int k = j + 1; k < r; ++k) {
      double dot = 0.0;
      for (int64_t i = 0; i < rows; ++i) dot += w[i * r + j] * w[i * r + k];
      dot *= scale;
      for (int64_t i = 0; i < rows; ++i) w[i * r + k] -= dot * w[i * r + j];
    }
  }
  for (size_t i = 0; i < elems; ++i) a[i] = static_cast<float>(w[i]);
}

void RandomQ(float* q, int64_t cols, int r, uint32_t key, std::vector<double>* scratch) {
  // A sum of four uniforms (variance 1/3, rescaled to 1): close enough to normal for a random start, and plain
  // arithmetic, so every rank (whatever its libm) draws the same Q.
  const size_t n = static_cast<size_t>(cols) * r;
  for (size_t i = 0; i < n; ++i) {
    float sum = 0.0f;
    for (uint32_t k = 0; k < 4; ++k) {
      uint32_t bits = RandomWord64(key, 4 * uint64_t{i} + k);
      sum += (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f) - 0.5f;
    }
    q[i] = sum * 1.7320508f;
  }
  Orthogonalize(q, cols, r, 0.0, scratch);
}

bool UsableQ(const float* q, int64_t cols, int r) {
  std::vector<bool> nonzero(static_cast<size_t>(r), false);
  for (int64_t i = 0; i < cols; ++i) {
    for (int j = 0; j < r; ++j) {
      const float v = q[i * r + j];
      if (!std::isfinite(v)) return false;
      if (v != 0.0f) nonzero[j] = true;
    }
  }
  for (bool b : nonzero) {
    if (!b) return false;
  }
  return true;
}

}  // namespace ccoll
