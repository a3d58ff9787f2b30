// Exact reduction operators as host/device functors, and the per-datatype arithmetic they run in. 16-bit floats
// are loaded to float, combined, and rounded back once per operation (as NCCL does for bfloat16).
#pragma once

#include <cstdint>
#include <type_traits>

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

// Integer sums and products wrap (modulo 2^bits) instead of overflowing into undefined behaviour: they are computed
// in an unsigned type at least as wide as unsigned int (so that nothing is promoted to int), then narrowed.
template <typename C>
struct Wrapping {
  using W = typename std::common_type<typename std::make_unsigned<C>::type, unsigned>::type;
  static CC_HD C Sum(C a, C b) { return static_cast<C>(static_cast<W>(a) + static_cast<W>(b)); }
  static CC_HD C Prod(C a, C b) { return static_cast<C>(static_cast<W>(a) * static_cast<W>(b)); }
};

struct OpSum {
  template <typename C>
  CC_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral<C>::value) {
      return Wrapping<C>::Sum(a, b);
    } else {
      return a + b;
    }
  }
};
struct OpProd {
  template <typename C>
  CC_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral<C>::value) {
      return Wrapping<C>::Prod(a, b);
    } else {
      return a * b;
    }
  }
};
struct OpMax {
  template <typename C>
  CC_HD C operator()(C a, C b) const { return b > a ? b : a; }
};
struct OpMin {
  template <typename C>
  CC_HD C operator()(C a, C b) const { return b < a ? b : a; }
};

// Division of a finished sum by the number of ranks (ccAvg); integers round toward zero, and are divided in 64 bits
// (nranks need not fit in an 8-bit type).
template <typename C>
CC_HD C DivideByRanks(C sum, int nranks) {
  if constexpr (std::is_integral<C>::value && std::is_signed<C>::value) {
    return static_cast<C>(static_cast<int64_t>(sum) / static_cast<int64_t>(nranks));
  } else if constexpr (std::is_integral<C>::value) {
    return static_cast<C>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(nranks));
  } else {
    return sum / static_cast<C>(nranks);
  }
}

}  // namespace ccoll
