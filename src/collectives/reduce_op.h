// Exact reduction operators as host/device functors, and the per-datatype arithmetic they run in. 16-bit floats
// are loaded to float, combined, and rounded back once per operation (as NCCL does for bfloat16).
#pragma once

#include <cstdint>

#include "compress/float16.h"
#include "compress/host_device.h"

namespace ccoll {

// Arith<T>: Compute is the type the operators see; Load/Store convert from and to storage.
template <typename T>
struct Arith {
  using Compute = T;
  static CC_HD Compute Load(T v) { return v; }
  static CC_HD T Store(Compute v) { return v; }
};
template <>
struct Arith<Half> {
  using Compute = float;
  static CC_HD float Load(Half v) { return HalfToFloat(v); }
  static CC_HD Half Store(float v) { return FloatToHalf(v); }
};
template <>
struct Arith<Bf16> {
  using Compute = float;
  static CC_HD float Load(Bf16 v) { return Bf16ToFloat(v); }
  static CC_HD Bf16 Store(float v) { return FloatToBf16(v); }
};

struct OpSum {
  template <typename C>
  CC_HD C operator()(C a, C b) const { return a + b; }
};
struct OpProd {
  template <typename C>
  CC_HD C operator()(C a, C b) const { return a * b; }
};
struct OpMax {
  template <typename C>
  CC_HD C operator()(C a, C b) const { return b > a ? b : a; }
};
struct OpMin {
  template <typename C>
  CC_HD C operator()(C a, C b) const { return b < a ? b : a; }
};

// Integer sums wrap (two's complement) instead of overflowing into undefined behaviour.
template <>
CC_HD int32_t OpSum::operator()(int32_t a, int32_t b) const {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
template <>
CC_HD int64_t OpSum::operator()(int64_t a, int64_t b) const {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
template <>
CC_HD int32_t OpProd::operator()(int32_t a, int32_t b) const {
  return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}
template <>
CC_HD int64_t OpProd::operator()(int64_t a, int64_t b) const {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// Division of a finished sum by the number of ranks (ccAvg).
template <typename C>
CC_HD C DivideByRanks(C sum, int nranks) {
  return sum / static_cast<C>(nranks);
}

}  // namespace ccoll
