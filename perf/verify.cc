#include "verify.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace ccperf {
namespace {

// splitmix64's finalizer: a bijection, so distinct keys give distinct bits.
inline uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Element indices stay below 2^44 and ranks below 2^20, so (rank, index) pairs never share a key.
inline uint64_t Key(uint64_t seedMix, int rank, size_t index) {
  return seedMix ^ (static_cast<uint64_t>(rank) << 44) ^ static_cast<uint64_t>(index);
}

inline double Gaussianish(uint64_t h) {
  double s = 0;
  for (int k = 0; k < 4; ++k) s += (static_cast<double>((h >> (16 * k)) & 0xffffu) + 0.5) * (1.0 / 65536.0);
  return (s - 2.0) * 1.7320508075688772;  // Irwin-Hall(4) has variance 1/3
}

// One rank's input for one element, as the value the dtype stores (floats already rounded to the dtype).
struct Value {
  double f;   // floating-point types
  int64_t i;  // integer types
};

inline Value Input(const InputSpec& spec, uint64_t seedMix, int rank, size_t index) {
  const uint64_t h = Mix(Key(seedMix, rank, index));
  Value v{0, 0};
  if (!Info(spec.dtype).isFloat) {
    v.i = spec.op == Op::kProd ? static_cast<int64_t>(h % 5) - 2 : static_cast<int64_t>(h % 201) - 100;
    v.f = static_cast<double>(v.i);
    return v;
  }
  double x = Gaussianish(h);
  if (spec.op == Op::kProd) {
    x = 1.0 + x / 16.0;
  } else if (spec.dist != Dist::kIid) {
    // Rank -1 keys the values every rank shares: the common gradient, block scales and outlier positions.
    const uint64_t shared = Mix(Key(seedMix, (1 << 20) - 1, index));
    x = Gaussianish(shared) + 0.5 * x;
    if (spec.dist == Dist::kHeavy) {
      const uint64_t block = Mix(Key(seedMix, (1 << 20) - 2, index / 4096));
      x *= std::exp(1.5 * Gaussianish(block));
      if (Mix(shared ^ 0x0123456789abcdefull) % 10000 == 0) x *= 100.0;
    }
  }
  switch (spec.dtype) {
    case DType::kFloat32: v.f = static_cast<float>(x); break;
    case DType::kFloat16: v.f = HalfBitsToFloat(FloatToHalfBits(static_cast<float>(x))); break;
    case DType::kBfloat16: v.f = Bf16BitsToFloat(FloatToBf16Bits(static_cast<float>(x))); break;
    default: v.f = x; break;
  }
  return v;
}

inline uint64_t SeedMix(uint64_t seed) { return Mix(seed ^ 0x6a09e667f3bcc909ull) & ~((1ull << 44) - 1); }

template <typename T>
T WrapInt(int64_t v) {
  return static_cast<T>(static_cast<uint64_t>(v));
}

// The exact integer result in the dtype's width: sums and products wrap like two's complement, avg divides the
// wrapped sum with C's truncation (as NCCL and ccoll do).
template <typename T>
T IntReference(const InputSpec& spec, uint64_t seedMix, int nranks, size_t i) {
  using U = typename std::make_unsigned<T>::type;
  U acc = 0;
  T best = 0;
  for (int r = 0; r < nranks; ++r) {
    T x = WrapInt<T>(Input(spec, seedMix, r, i).i);
    if (r == 0) {
      acc = static_cast<U>(x);
      best = x;
      continue;
    }
    switch (spec.op) {
      case Op::kSum:
      case Op::kAvg: acc = static_cast<U>(acc + static_cast<U>(x)); break;
      case Op::kProd: acc = static_cast<U>(acc * static_cast<U>(x)); break;
      case Op::kMax: best = x > best ? x : best; break;
      case Op::kMin: best = x < best ? x : best; break;
    }
  }
  switch (spec.op) {
    case Op::kMax:
    case Op::kMin: return best;
    case Op::kAvg: {  // divided in 64 bits: nranks need not fit in T
      const T sum = static_cast<T>(acc);
      if (std::is_signed<T>::value) return static_cast<T>(static_cast<int64_t>(sum) / nranks);
      return static_cast<T>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(nranks));
    }
    default: return static_cast<T>(acc);
  }
}

// One rank's inputs in an integer type, wrapped into it (the 8-bit and unsigned types wrap the negative ones).
template <typename T>
void FillInts(const InputSpec& spec, uint64_t seedMix, int rank, void* buf, size_t count) {
  auto* p = static_cast<T*>(buf);
  for (size_t i = 0; i < count; ++i) p[i] = WrapInt<T>(Input(spec, seedMix, rank, i).i);
}

template <typename T>
CheckResult CheckInts(const InputSpec& spec, int nranks, const T* out, size_t begin, size_t end) {
  const uint64_t seedMix = SeedMix(spec.seed);
  CheckResult res;
  for (size_t i = begin; i < end; ++i) {
    const T ref = IntReference<T>(spec, seedMix, nranks, i);
    const double d = static_cast<double>(out[i]) - static_cast<double>(ref);
    res.sqErr += d * d;
    res.sqRef += static_cast<double>(ref) * static_cast<double>(ref);
    res.wrong += out[i] != ref;
  }
  return res;
}

CheckResult CheckFloats(const InputSpec& spec, int nranks, const void* out, size_t begin, size_t end, bool exact) {
  const uint64_t seedMix = SeedMix(spec.seed);
  const DTypeInfo& info = Info(spec.dtype);
  // Each of the n - 1 combines rounds once in the dtype (16-bit partial sums are stored between ring hops), and an
  // fp64 reference of fp64 data rounds too: 2n + 1 roundings of at most u * scale each bound the difference.
  const double relTol = (2.0 * nranks + 1.0) * info.unitRoundoff;
  const double absTol = nranks * info.denormMin;
  CheckResult res;
  for (size_t i = begin; i < end; ++i) {
    double acc = 0, absSum = 0;
    for (int r = 0; r < nranks; ++r) {
      const double x = Input(spec, seedMix, r, i).f;
      absSum += std::fabs(x);
      if (r == 0) {
        acc = x;
        continue;
      }
      switch (spec.op) {
        case Op::kSum:
        case Op::kAvg: acc += x; break;
        case Op::kProd: acc *= x; break;
        case Op::kMax: acc = x > acc ? x : acc; break;
        case Op::kMin: acc = x < acc ? x : acc; break;
      }
    }
    double scale = absSum;
    if (spec.op == Op::kAvg) {
      acc /= nranks;
      scale = absSum / nranks;
    } else if (spec.op == Op::kProd) {
      scale = std::fabs(acc);
    }
    const double o = LoadAsDouble(spec.dtype, out, i);
    const double d = o - acc;
    res.sqErr += d * d;
    res.sqRef += acc * acc;
    if (exact) {
      const bool selects = spec.op == Op::kMax || spec.op == Op::kMin;  // the result is one of the inputs
      const double tol = selects ? 0.0 : relTol * scale + absTol;
      res.wrong += !(std::fabs(d) <= tol);
    } else {
      res.wrong += !std::isfinite(o);
    }
  }
  return res;
}

}  // namespace

void FillInput(const InputSpec& spec, int rank, void* buf, size_t count) {
  const uint64_t seedMix = SeedMix(spec.seed);
  switch (spec.dtype) {
    case DType::kFloat32: {
      auto* p = static_cast<float*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = static_cast<float>(Input(spec, seedMix, rank, i).f);
      break;
    }
    case DType::kFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = FloatToHalfBits(static_cast<float>(Input(spec, seedMix, rank, i).f));
      break;
    }
    case DType::kBfloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = FloatToBf16Bits(static_cast<float>(Input(spec, seedMix, rank, i).f));
      break;
    }
    case DType::kFloat64: {
      auto* p = static_cast<double*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = Input(spec, seedMix, rank, i).f;
      break;
    }
    case DType::kInt32: FillInts<int32_t>(spec, seedMix, rank, buf, count); break;
    case DType::kInt64: FillInts<int64_t>(spec, seedMix, rank, buf, count); break;
    case DType::kInt8: FillInts<int8_t>(spec, seedMix, rank, buf, count); break;
    case DType::kUint8: FillInts<uint8_t>(spec, seedMix, rank, buf, count); break;
    case DType::kUint32: FillInts<uint32_t>(spec, seedMix, rank, buf, count); break;
    case DType::kUint64: FillInts<uint64_t>(spec, seedMix, rank, buf, count); break;
  }
}

void FillPoison(DType dtype, void* buf, size_t begin, size_t end) {
  const size_t es = Info(dtype).size;
  if (end <= begin) return;
  std::memset(static_cast<char*>(buf) + begin * es, Info(dtype).isFloat ? 0xff : 0xa5, (end - begin) * es);
}

size_t CountNotPoison(DType dtype, const void* buf, size_t begin, size_t end) {
  const size_t es = Info(dtype).size;
  const unsigned char poison = Info(dtype).isFloat ? 0xff : 0xa5;
  const auto* p = static_cast<const unsigned char*>(buf);
  size_t changed = 0;
  for (size_t i = begin; i < end; ++i) {
    for (size_t b = 0; b < es; ++b) {
      if (p[i * es + b] != poison) {
        ++changed;
        break;
      }
    }
  }
  return changed;
}

CheckResult CheckOutput(const InputSpec& spec, int nranks, const void* out, size_t begin, size_t end, bool exact) {
  switch (spec.dtype) {
    case DType::kInt32: return CheckInts(spec, nranks, static_cast<const int32_t*>(out), begin, end);
    case DType::kInt64: return CheckInts(spec, nranks, static_cast<const int64_t*>(out), begin, end);
    case DType::kInt8: return CheckInts(spec, nranks, static_cast<const int8_t*>(out), begin, end);
    case DType::kUint8: return CheckInts(spec, nranks, static_cast<const uint8_t*>(out), begin, end);
    case DType::kUint32: return CheckInts(spec, nranks, static_cast<const uint32_t*>(out), begin, end);
    case DType::kUint64: return CheckInts(spec, nranks, static_cast<const uint64_t*>(out), begin, end);
    default: return CheckFloats(spec, nranks, out, begin, end, exact);
  }
}

double Vnmse(double sqErr, double sqRef) {
  if (sqErr == 0) return 0;
  if (sqRef == 0) return std::numeric_limits<double>::infinity();
  return sqErr / sqRef;
}

uint64_t HashBytes(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x243f6a8885a308d3ull ^ bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h ^= w;
    h = (h << 29 | h >> 35) * 0x9e3779b97f4a7c15ull;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, bytes - i);
  h ^= tail;
  return Mix(h);
}

}  // namespace ccperf
