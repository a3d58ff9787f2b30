// Inputs of the device tests, as raw bytes of any datatype (and, from first_difference.h, where two results differ).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ccoll.h"
#include "first_difference.h"

namespace cctest {

using Bytes = std::vector<char>;

inline size_t SizeOf(ccDataType_t t) {
  if (t == ccInt8 || t == ccUint8) return 1;
  return t == ccFloat64 || t == ccInt64 || t == ccUint64 ? 8 : t == ccBfloat16 || t == ccFloat16 ? 2 : 4;
}

// The value of one element of type t at p.
inline double ToDouble(const char* p, ccDataType_t t) {
  switch (t) {
    case ccFloat32: { float v; std::memcpy(&v, p, 4); return v; }
    case ccFloat64: { double v; std::memcpy(&v, p, 8); return v; }
    case ccInt32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case ccInt64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case ccInt8: { int8_t v; std::memcpy(&v, p, 1); return v; }
    case ccUint8: { uint8_t v; std::memcpy(&v, p, 1); return v; }
    case ccUint32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case ccUint64: { uint64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case ccBfloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    default: {  // float16
      uint16_t h;
      std::memcpy(&h, p, 2);
      const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
      double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
      if (e == 31) v = m == 0 ? HUGE_VAL : std::nan("");
      return (h & 0x8000) ? -v : v;
    }
  }
}

// Every element of b, of type t.
inline std::vector<double> Values(const Bytes& b, ccDataType_t t) {
  const size_t es = SizeOf(t), n = b.size() / es;
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = ToDouble(b.data() + i * es, t);
  return v;
}

// Random inputs: floats of both signs for float types, small integers for int32 and int64, any bits for the 8-bit
// and unsigned integers (their sums and products wrap, as documented), as raw bytes.
inline std::vector<Bytes> Inputs(int n, size_t count, ccDataType_t dtype, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<Bytes> in(static_cast<size_t>(n));
  for (auto& b : in) {
    switch (dtype) {
      case ccFloat32: {
        std::vector<float> v(count);
        for (auto& x : v) x = normal(gen);
        b.assign(reinterpret_cast<char*>(v.data()), reinterpret_cast<char*>(v.data() + count));
        break;
      }
      case ccFloat64: {
        std::vector<double> v(count);
        for (auto& x : v) x = normal(gen);
        b.assign(reinterpret_cast<char*>(v.data()), reinterpret_cast<char*>(v.data() + count));
        break;
      }
      case ccInt32: {
        std::vector<int32_t> v(count);
        for (auto& x : v) x = static_cast<int32_t>(gen() % 2001) - 1000;
        b.assign(reinterpret_cast<char*>(v.data()), reinterpret_cast<char*>(v.data() + count));
        break;
      }
      case ccInt64: {  // small, so that products stay far from wrapping
        std::vector<int64_t> v(count);
        for (auto& x : v) x = static_cast<int64_t>(gen() % 7) - 3;
        b.assign(reinterpret_cast<char*>(v.data()), reinterpret_cast<char*>(v.data() + count));
        break;
      }
      case ccInt8:
      case ccUint8:
      case ccUint32:
      case ccUint64: {
        b.resize(count * SizeOf(dtype));
        for (auto& x : b) x = static_cast<char>(gen());
        break;
      }
      case ccFloat16: {  // finite normal halves of both signs, |x| in [2^-5, 2^6)
        std::vector<uint16_t> v(count);
        for (auto& x : v) {
          const uint64_t bits = gen();
          x = static_cast<uint16_t>((bits & 0x8000u) | ((10 + bits % 11) << 10) | ((bits >> 20) & 0x3ffu));
        }
        b.assign(reinterpret_cast<char*>(v.data()), reinterpret_cast<char*>(v.data() + count));
        break;
      }
      default: {  // bfloat16: the top half of a float
        std::vector<uint16_t> v(count);
        for (auto& x : v) {
          float f = normal(gen);
          uint32_t u;
          std::memcpy(&u, &f, 4);
          x = static_cast<uint16_t>(u >> 16);
        }
        b.assign(reinterpret_cast<char*>(v.data()), reinterpret_cast<char*>(v.data() + count));
        break;
      }
    }
  }
  return in;
}


}  // namespace cctest
