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
// Floating-point max and min are IEEE 754-2019's maximum and minimum: a NaN operand gives NaN (written as the one
// quiet NaN of the type, its sign and payload dropped), and +0 is above -0. So both are commutative and associative
// to the bit, and every schedule (ring, tree, ccReduce's chain, any number of ranks) gives the same bytes. A plain
// `b > a ? b : a` is neither: it keeps a NaN only when it is the left operand, and either zero of an equal pair.
// Written as selects on the bits, without early returns, so that the host loops vectorize.
template <typename C>
CC_HD C IeeeMaxMin(C a, C b, bool max) {
  using U = typename std::conditional<sizeof(C) == 4, uint32_t, uint64_t>::type;
  const U quietNaN = sizeof(C) == 4 ? U(0x7fc00000u) : U(0x7ff8000000000000ull);
  U x, y, r;
  __builtin_memcpy(&x, &a, sizeof(C));
  __builtin_memcpy(&y, &b, sizeof(C));
  const C m = max ? (b > a ? b : a) : (b < a ? b : a);
  __builtin_memcpy(&r, &m, sizeof(C));
  r = a == b ? (max ? (x & y) : (x | y)) : r;  // equal values have the same bits, but for +0 and -0
  r = (a != a || b != b) ? quietNaN : r;
  C v;
  __builtin_memcpy(&v, &r, sizeof(C));
  return v;
}

struct OpMax {
  template <typename C>
  CC_HD C operator()(C a, C b) const {
    if constexpr (std::is_floating_point<C>::value) {
      return IeeeMaxMin(a, b, true);
    } else {
      return b > a ? b : a;
    }
  }
};
struct OpMin {
  template <typename C>
  CC_HD C operator()(C a, C b) const {
    if constexpr (std::is_floating_point<C>::value) {
      return IeeeMaxMin(a, b, false);
    } else {
      return b < a ? b : a;
    }
  }
};

// The factor of a rank's input to a ccAvg of floating-point data (collectives/average.h): 1 / nranks rounded to the
// datatype T, as NCCL's ncclAvg multiplies (its PreMulSum); the input is v * factor in T's compute type. For 16-bit
// types the product of two such values is exact in float, so the one rounding is Store's. Loops compute it once.
template <typename T>
CC_HD typename Arith<T>::Compute AverageFactor(int nranks) {
  using A = Arith<T>;
  return A::Load(A::Store(static_cast<typename Arith<T>::Compute>(1.0 / static_cast<double>(nranks))));
}

// Division of a finished sum by the number of ranks (ccAvg of integers); rounds toward zero, in 64 bits (nranks need
// not fit in an 8-bit type).
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
