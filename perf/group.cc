#include "group.h"

#include <cstring>

namespace ccperf {

bool Group::AllOk(bool ok) {
  std::vector<uint64_t> all = GatherU64(ok ? 1 : 0);
  for (uint64_t v : all) {
    if (v == 0) return false;
  }
  return true;
}

void Group::SumDoubles(double* values, size_t n) {
  std::vector<double> all(n * static_cast<size_t>(nranks()));
  AllGather(values, n * sizeof(double), all.data());
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (int r = 0; r < nranks(); ++r) s += all[static_cast<size_t>(r) * n + i];
    values[i] = s;
  }
}

void Group::SumU64(uint64_t* values, size_t n) {
  std::vector<uint64_t> all(n * static_cast<size_t>(nranks()));
  AllGather(values, n * sizeof(uint64_t), all.data());
  for (size_t i = 0; i < n; ++i) {
    uint64_t s = 0;
    for (int r = 0; r < nranks(); ++r) s += all[static_cast<size_t>(r) * n + i];
    values[i] = s;
  }
}

void Group::Broadcast(void* buf, size_t bytes, int root) {
  std::vector<char> all(bytes * static_cast<size_t>(nranks()));
  AllGather(buf, bytes, all.data());
  std::memcpy(buf, all.data() + static_cast<size_t>(root) * bytes, bytes);
}

std::vector<uint64_t> Group::GatherU64(uint64_t value) {
  std::vector<uint64_t> all(static_cast<size_t>(nranks()));
  AllGather(&value, sizeof(value), all.data());
  return all;
}

}  // namespace ccperf
