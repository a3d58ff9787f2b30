// Error feedback's running sums, for the tests that check that a compressor's errors do not pile up over calls.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

namespace cctest {

// The drift of the running sum of a call's outputs from that of the exact results, sum_t (out_t - exact_t), kept
// element by element over the measured elements [from, count) (Add after each call).
class Drift {
 public:
  explicit Drift(size_t count, size_t from = 0) : from_(from), sum_(count, 0.0) {}

  // out and exact: count elements each (those before `from` are not read).
  template <typename T>
  void Add(const T* out, const std::vector<double>& exact) {
    for (size_t i = from_; i < sum_.size(); ++i) sum_[i] += static_cast<double>(out[i]) - exact[i];
  }

  double SquaredNorm() const {
    double s = 0.0;
    for (size_t i = from_; i < sum_.size(); ++i) s += sum_[i] * sum_[i];
    return s;
  }
  double Norm() const { return std::sqrt(SquaredNorm()); }
  // Root mean square over the measured elements.
  double Rms() const { return std::sqrt(SquaredNorm() / static_cast<double>(sum_.size() - from_)); }
  // Norm relative to the norm of `ref` over the measured elements (one call's exact result, say).
  double Relative(const std::vector<double>& ref) const {
    double r = 0.0;
    for (size_t i = from_; i < sum_.size(); ++i) r += ref[i] * ref[i];
    return std::sqrt(SquaredNorm() / r);
  }

 private:
  size_t from_;
  std::vector<double> sum_;
};

}  // namespace cctest
