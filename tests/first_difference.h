// Where two buffers differ, in a few words. Check buffers with CHECK(cctest::FirstDifference(a, b) == "") rather
// than CHECK(a == b): on a failure Catch2 prints both vectors element by element and wraps the text, which for a
// megabyte takes minutes and megabytes of output (a failing CHECK on two vectors of 1 Mi chars: 90 s of CPU and
// 5.4 MB here), so a test of device results that are all wrong would run into its time limit and fill the log.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace cctest {

// "" when a and b hold the same bytes, else their sizes or the first element that differs. Bytes, not ==: a NaN
// equals itself here, and -0.0 differs from 0.0 (the results compared are meant to be the same bits).
template <typename T, typename A>
std::string FirstDifference(const std::vector<T, A>& a, const std::vector<T, A>& b) {
  static_assert(std::is_trivially_copyable<T>::value, "FirstDifference compares the bytes of each element");
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      return "first difference at element " + std::to_string(i) + " of " + std::to_string(a.size()) + " (" +
             std::to_string(sizeof(T)) + "-byte elements)";
    }
  }
  return "";
}

}  // namespace cctest
