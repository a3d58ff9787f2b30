// The datatypes and reduction ops the perf tools know, independent of any library: ccoll's benchmark and the MPI peer
// share them, and the 16-bit conversions here are written apart from ccoll's own so that the check does not trust the
// code it checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ccperf {

enum class DType { kFloat32, kFloat16, kBfloat16, kFloat64, kInt32, kInt64, kInt8, kUint8, kUint32, kUint64 };
enum class Op { kSum, kProd, kMax, kMin, kAvg };

struct DTypeInfo {
  DType type;
  const char* name;   // as the perf tools print it (nccl-tests' names)
  size_t size;        // bytes per element
  bool isFloat;
  double unitRoundoff;  // half an ulp of 1.0: the largest relative rounding error of one operation
  double denormMin;     // the smallest positive subnormal: the absolute rounding error near zero
};

const DTypeInfo& Info(DType t);
const char* OpName(Op op);
// Parses nccl-tests' names and a few aliases ("float", "fp32", "half", "bf16", "int", ...). False if unknown.
bool ParseDType(const std::string& text, DType* out);
bool ParseOp(const std::string& text, Op* out);

// IEEE binary16 and bfloat16 from binary32, round to nearest even; NaN stays NaN (quiet), overflow goes to inf.
inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16BitsToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t FloatToHalfBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absu < 0x38800000u) {
    // Subnormal or zero in half: scale so that the half's last bit is the float's unit in the last place of 2^-24,
    // then round to nearest even on the shifted-out bits.
    if (absu < 0x33000000u) return static_cast<uint16_t>(sign);  // below half of the smallest subnormal
    const uint32_t exp = absu >> 23;
    const uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // value = mant * 2^(exp - 150) = half * 2^-24
    uint32_t half = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t v = absu - 0x38000000u;  // rebias 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24, exact in float.
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Element i of a buffer of type t as a double (64-bit integers rounded beyond 2^53; the checks compare integers in
// their own type).
inline double LoadAsDouble(DType t, const void* buf, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(buf)[i];
    case DType::kFloat16: return HalfBitsToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::kBfloat16: return Bf16BitsToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::kFloat64: return static_cast<const double*>(buf)[i];
    case DType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DType::kInt8: return static_cast<const int8_t*>(buf)[i];
    case DType::kUint8: return static_cast<const uint8_t*>(buf)[i];
    case DType::kUint32: return static_cast<const uint32_t*>(buf)[i];
    case DType::kUint64: return static_cast<double>(static_cast<const uint64_t*>(buf)[i]);
  }
  return 0;
}

}  // namespace ccperf
