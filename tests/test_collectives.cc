// Exact collectives against fp64 / int64 references, in the manner of gloo's allreduce_test: a sweep over
// nranks x count x datatype x op x algorithm x in-place, with inputs from a counter-based generator whose exact
// answer is known. Every case also checks that all ranks end bitwise identical, that a second run gives the same
// bits, that an out-of-place call leaves sendbuff alone, and that nothing is written past the end of recvbuff.
//
// Ranks are threads (tests/rank_harness.h); rank bodies only record, the main thread asserts.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ccoll.h"
#include "core/params.h"
#include "rank_harness.h"

using cctest::Group;
using cctest::RankResult;
using cctest::Record;
using cctest::RunRanks;

namespace {

// ------------------------------------------------------------------------------------------------------------
// Element types, written independently of the library (fp16 through GCC's _Float16, bf16 by bit shifting).
// ------------------------------------------------------------------------------------------------------------

struct F16 {
  uint16_t bits;
};
struct B16 {
  uint16_t bits;
};

double ToDouble(float v) { return v; }
double ToDouble(double v) { return v; }
double ToDouble(F16 v) {
  _Float16 h;
  std::memcpy(&h, &v.bits, sizeof(h));
  return static_cast<double>(h);
}
double ToDouble(B16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Encodes a value that is exactly representable in T (the generators only produce such values).
template <typename T>
T FromDouble(double d);
template <>
float FromDouble<float>(double d) { return static_cast<float>(d); }
template <>
double FromDouble<double>(double d) { return d; }
template <>
F16 FromDouble<F16>(double d) {
  _Float16 h = static_cast<_Float16>(d);
  F16 v;
  std::memcpy(&v.bits, &h, sizeof(h));
  return v;
}
template <>
B16 FromDouble<B16>(double d) {
  float f = static_cast<float>(d);
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return B16{static_cast<uint16_t>(u >> 16)};
}

template <typename T>
constexpr bool kIsInt = std::is_integral<T>::value;

// Unit roundoff of each floating-point type (half an ulp at 1, relative).
template <typename T>
constexpr double Eps();
template <>
constexpr double Eps<F16>() { return 0x1p-11; }
template <>
constexpr double Eps<B16>() { return 0x1p-8; }
template <>
constexpr double Eps<float>() { return 0x1p-24; }
template <>
constexpr double Eps<double>() { return 0x1p-53; }

// Sums of up to 16 inputs in [-4, 4] on a grid of 1/8 need at most 10 significant bits: exact in fp16, fp32 and fp64
// (every partial sum is representable, whatever the order), but not in bf16 (8 bits), where each hop may round.
template <typename T>
constexpr bool kExactSums = !std::is_same<T, B16>::value;

template <typename Fn>
void WithType(ccDataType_t dtype, Fn&& fn) {
  switch (dtype) {
    case ccInt8: fn(int8_t{}); break;
    case ccUint8: fn(uint8_t{}); break;
    case ccInt32: fn(int32_t{}); break;
    case ccUint32: fn(uint32_t{}); break;
    case ccInt64: fn(int64_t{}); break;
    case ccUint64: fn(uint64_t{}); break;
    case ccFloat16: fn(F16{}); break;
    case ccBfloat16: fn(B16{}); break;
    case ccFloat32: fn(float{}); break;
    case ccFloat64: fn(double{}); break;
  }
}

struct DtypeInfo {
  ccDataType_t dtype;
  const char* name;
  size_t size;
};
const DtypeInfo kDtypes[] = {{ccInt8, "int8", 1},       {ccUint8, "uint8", 1},     {ccInt32, "int32", 4},
                             {ccUint32, "uint32", 4},   {ccInt64, "int64", 8},     {ccUint64, "uint64", 8},
                             {ccFloat16, "float16", 2}, {ccBfloat16, "bfloat16", 2}, {ccFloat32, "float32", 4},
                             {ccFloat64, "float64", 8}};
constexpr size_t kNumDtypes = sizeof(kDtypes) / sizeof(kDtypes[0]);
const ccRedOp_t kOps[] = {ccSum, ccProd, ccMax, ccMin, ccAvg};
const int kNranks[] = {1, 2, 3, 4, 5, 8};
const size_t kSmallCounts[] = {0, 1, 7, 1023};
const size_t kLargeCount = (size_t{1} << 20) + 3;
const size_t kLargeRsCount = (size_t{1} << 18) + 1;

const char* OpName(ccRedOp_t op) {
  switch (op) {
    case ccSum: return "sum";
    case ccProd: return "prod";
    case ccMax: return "max";
    case ccMin: return "min";
    case ccAvg: return "avg";
  }
  return "?";
}
// The datatypes the sweeps run: every one, or those that CCTEST_DTYPES names (a comma-separated list of the names
// above; an unknown name stops the test). The sanitizer builds narrow the sweeps with it (scripts/sanitize.sh): the
// normal build runs every datatype's arithmetic, and what a sanitizer adds depends on element sizes and code paths,
// which fewer datatypes cover.
const std::vector<DtypeInfo>& SweepDtypes() {
  static const std::vector<DtypeInfo> chosen = [] {
    const char* env = std::getenv("CCTEST_DTYPES");
    if (env == nullptr || *env == '\0') return std::vector<DtypeInfo>(std::begin(kDtypes), std::end(kDtypes));
    std::vector<DtypeInfo> v;
    std::stringstream list(env);
    std::string name;
    while (std::getline(list, name, ',')) {
      const DtypeInfo* found = nullptr;
      for (const DtypeInfo& i : kDtypes) {
        if (name == i.name) found = &i;
      }
      if (found == nullptr) {
        std::fprintf(stderr, "CCTEST_DTYPES=%s: no datatype is called '%s'\n", env, name.c_str());
        std::abort();
      }
      v.push_back(*found);
    }
    if (v.empty()) {
      std::fprintf(stderr, "CCTEST_DTYPES=%s names no datatype\n", env);
      std::abort();
    }
    std::fprintf(stderr, "CCTEST_DTYPES: the sweeps run %s only\n", env);
    return v;
  }();
  return chosen;
}

const char* DtypeName(ccDataType_t d) {
  for (const auto& i : kDtypes) {
    if (i.dtype == d) return i.name;
  }
  return "?";
}
size_t DtypeSize(ccDataType_t d) {
  for (const auto& i : kDtypes) {
    if (i.dtype == d) return i.size;
  }
  return 0;
}

// ------------------------------------------------------------------------------------------------------------
// Inputs: a counter-based generator keyed by (seed, rank, index).
// ------------------------------------------------------------------------------------------------------------

uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}
uint64_t Hash(uint64_t seed, uint64_t rank, uint64_t index) {
  return Mix(Mix(seed * 0x9e3779b97f4a7c15ull + rank) ^ (index * 0xd6e8feb86659fd93ull + 0x632be59bd9b4e019ull));
}

// Random bits that decode to a finite value.
template <typename T>
T FiniteBits(uint64_t h) {
  T v;
  if (std::is_same<T, F16>::value || std::is_same<T, B16>::value) {
    uint16_t b = static_cast<uint16_t>(h);
    uint16_t expMask = std::is_same<T, F16>::value ? 0x7c00 : 0x7f80;
    if ((b & expMask) == expMask) b ^= 0x4000;
    std::memcpy(&v, &b, sizeof(b));
  } else if (std::is_same<T, float>::value) {
    uint32_t b = static_cast<uint32_t>(h);
    if ((b & 0x7f800000u) == 0x7f800000u) b ^= 0x40000000u;
    std::memcpy(&v, &b, sizeof(b));
  } else {
    uint64_t b = h;
    if ((b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) b ^= 1ull << 62;
    std::memcpy(&v, &b, sizeof(b));
  }
  return v;
}

// A value whose reductions over <= 8 ranks have a known, representable answer:
//   sum/avg: [-4, 4], integers for integer types, multiples of 1/8 for floating point;
//   prod:    0 (rarely), +-1, 2 (and 1/2 for floating point): products are powers of two of magnitude <= 256;
//   max/min: any finite value of the type.
template <typename T>
T GenValue(ccRedOp_t op, uint64_t h) {
  if (op == ccMax || op == ccMin) {
    if constexpr (kIsInt<T>) {
      return static_cast<T>(h);
    } else {
      return FiniteBits<T>(h);
    }
  }
  double v;
  if (op == ccSum || op == ccAvg) {
    v = kIsInt<T> ? static_cast<double>(static_cast<int>(h % 9) - 4) : (static_cast<int>(h % 65) - 32) / 8.0;
  } else {
    unsigned k = h % 32;
    if (k == 0) {
      v = 0;
    } else if (k <= 2) {
      v = 2;
    } else if (k <= 4) {
      v = kIsInt<T> ? 1 : 0.5;
    } else if (k <= 18) {
      v = 1;
    } else {
      v = -1;
    }
  }
  if constexpr (kIsInt<T>) {
    return static_cast<T>(static_cast<int64_t>(v));  // negative values wrap in the unsigned types
  } else {
    return FromDouble<T>(v);
  }
}

void FillInput(ccDataType_t dtype, ccRedOp_t op, uint64_t seed, int rank, size_t count, void* out) {
  WithType(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out);
    for (size_t i = 0; i < count; ++i) p[i] = GenValue<T>(op, Hash(seed, static_cast<uint64_t>(rank), i));
  });
}

// Arbitrary bytes (all-gather and broadcast move bytes; NaN patterns included on purpose).
void FillBytes(uint64_t seed, int rank, size_t bytes, void* out) {
  auto* p = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t h = Hash(seed, static_cast<uint64_t>(rank), i);
    std::memcpy(p + i, &h, bytes - i < 8 ? bytes - i : 8);
  }
}

// ------------------------------------------------------------------------------------------------------------
// References.
// ------------------------------------------------------------------------------------------------------------

template <typename T>
std::string Show(T v) {
  std::ostringstream s;
  s.precision(17);
  if constexpr (kIsInt<T> && std::is_signed<T>::value) {
    s << static_cast<long long>(v);
  } else if constexpr (kIsInt<T>) {
    s << static_cast<unsigned long long>(v);
  } else {
    s << ToDouble(v);
  }
  return s.str();
}

// out[i] must be op over q of in[q][i], within the type's rounding (see the file comment and kExactSums).
template <typename T>
std::string CheckReduceTyped(ccRedOp_t op, const std::vector<const void*>& in, const void* out, size_t count) {
  const int n = static_cast<int>(in.size());
  const T* o = static_cast<const T*>(out);
  for (size_t i = 0; i < count; ++i) {
    auto x = [&](int q) { return static_cast<const T*>(in[q])[i]; };
    if constexpr (kIsInt<T>) {
      // Sums and products modulo 2^64, which narrow to the type's wrap-around; max and min in the type's order.
      uint64_t wrapped = static_cast<uint64_t>(x(0));
      T ordered = x(0);
      for (int q = 1; q < n; ++q) {
        const T v = x(q);
        switch (op) {
          case ccSum:
          case ccAvg: wrapped += static_cast<uint64_t>(v); break;
          case ccProd: wrapped *= static_cast<uint64_t>(v); break;
          case ccMax: ordered = v > ordered ? v : ordered; break;
          case ccMin: ordered = v < ordered ? v : ordered; break;
        }
      }
      T want = op == ccMax || op == ccMin ? ordered : static_cast<T>(wrapped);
      if (op == ccAvg) want = static_cast<T>(want / static_cast<T>(n));  // truncates toward zero, as the API says
      if (o[i] != want) {
        return "element " + std::to_string(i) + ": got " + Show(o[i]) + ", want " + Show(want);
      }
    } else {
      double acc = ToDouble(x(0));
      double sumAbs = std::fabs(acc);
      for (int q = 1; q < n; ++q) {
        double v = ToDouble(x(q));
        sumAbs += std::fabs(v);
        switch (op) {
          case ccSum:
          case ccAvg: acc += v; break;  // exact in fp64: at most 8 terms on a 1/8 grid
          case ccProd: acc *= v; break;  // exact: powers of two
          case ccMax: acc = v > acc ? v : acc; break;
          case ccMin: acc = v < acc ? v : acc; break;
        }
      }
      double tol = 0;
      if (op == ccSum) {
        tol = kExactSums<T> ? 0 : n * Eps<T>() * sumAbs;
      } else if (op == ccAvg && std::is_same<T, F16>::value) {
        acc /= n;
        // float16: every rank's input times 1/n, the factor rounded to T (through float: at most 1.01 units of
        // roundoff) and then the product, summed with n - 1 more roundings: within (n + 1.01) units of sumAbs / n. A
        // sum divided at the end instead would overflow where the average does not (test "a float16 average ...").
        tol = (n + 2) * Eps<T>() * sumAbs / n;
      } else if (op == ccAvg) {
        acc /= n;
        // The sum's error divided by n, plus the final division, rounded through float then T (double rounding).
        tol = (kExactSums<T> ? 0 : Eps<T>() * sumAbs) + 2 * Eps<T>() * std::fabs(acc);
      }
      double got = ToDouble(o[i]);
      if (!(std::fabs(got - acc) <= tol)) {  // also catches NaN
        std::ostringstream s;
        s.precision(17);
        s << "element " << i << ": got " << got << ", want " << acc << " (tolerance " << tol << ")";
        return s.str();
      }
    }
  }
  return "";
}

std::string CheckReduce(ccDataType_t dtype, ccRedOp_t op, const std::vector<const void*>& in, const void* out,
                        size_t count) {
  std::string err;
  WithType(dtype, [&](auto tag) { err = CheckReduceTyped<decltype(tag)>(op, in, out, count); });
  return err;
}

// ------------------------------------------------------------------------------------------------------------
// Buffers with a guard zone after the end, to catch writes past recvbuff.
// ------------------------------------------------------------------------------------------------------------

constexpr size_t kGuard = 64;
constexpr uint8_t kSentinel = 0xa5;

struct Buf {
  std::vector<uint8_t> bytes;
  size_t used = 0;
  void Reset(size_t n) {
    used = n;
    bytes.assign(n + kGuard, kSentinel);
  }
  uint8_t* data() { return bytes.data(); }
  const uint8_t* data() const { return bytes.data(); }
  bool GuardIntact() const {
    for (size_t i = used; i < bytes.size(); ++i) {
      if (bytes[i] != kSentinel) return false;
    }
    return true;
  }
};

std::string RankErrors(const std::vector<RankResult>& results, const char* what) {
  std::string err;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].rc != ccSuccess) {
      err += std::string(what) + " rank " + std::to_string(r) + " returned " + std::to_string(results[r].rc) + " (" +
             ccGetErrorString(results[r].rc) + "): " + results[r].error + "\n";
    }
  }
  return err;
}

// ------------------------------------------------------------------------------------------------------------
// One case of each collective. Each returns "" on success, else what went wrong.
// ------------------------------------------------------------------------------------------------------------

struct Case {
  ccDataType_t dtype = ccFloat32;
  ccRedOp_t op = ccSum;
  size_t count = 0;
  bool inPlace = false;
  int root = 0;
  uint64_t seed = 1;
  int runs = 2;  // runs of the same case; every run after the first must give the first run's bits
};

std::string Describe(const char* coll, int nranks, const char* algo, const Case& c) {
  std::ostringstream s;
  s << coll << " nranks=" << nranks << " algo=" << algo << " dtype=" << DtypeName(c.dtype) << " op=" << OpName(c.op)
    << " count=" << c.count << " inPlace=" << c.inPlace << " root=" << c.root << " seed=" << c.seed;
  return s.str();
}

std::string RunAllReduce(const std::vector<ccComm_t>& comms, const Case& c) {
  const int n = static_cast<int>(comms.size());
  const size_t bytes = c.count * DtypeSize(c.dtype);
  std::vector<Buf> input(n), send(n);
  std::vector<std::vector<Buf>> out(c.runs, std::vector<Buf>(n));
  std::vector<std::vector<RankResult>> results(c.runs, std::vector<RankResult>(n));
  RunRanks(n, [&](int r) {
    input[r].Reset(bytes);
    FillInput(c.dtype, c.op, c.seed, r, c.count, input[r].data());
    for (int run = 0; run < c.runs; ++run) {
      Buf& recv = out[run][r];
      recv.Reset(bytes);
      const void* src;
      if (c.inPlace) {
        std::memcpy(recv.data(), input[r].data(), bytes);
        src = recv.data();
      } else {
        send[r] = input[r];
        src = send[r].data();
      }
      results[run][r] = Record(ccAllReduce(src, recv.data(), c.count, c.dtype, c.op, nullptr, comms[r], nullptr),
                               comms[r]);
    }
  });
  std::string err;
  for (int run = 0; run < c.runs; ++run) err += RankErrors(results[run], "ccAllReduce");
  if (!err.empty()) return err;
  for (int r = 0; r < n; ++r) {
    if (!c.inPlace && std::memcmp(send[r].data(), input[r].data(), bytes + kGuard) != 0) {
      return "rank " + std::to_string(r) + " changed its sendbuff";
    }
    for (int run = 0; run < c.runs; ++run) {
      if (!out[run][r].GuardIntact()) return "rank " + std::to_string(r) + " wrote past the end of recvbuff";
      if (std::memcmp(out[run][r].data(), out[0][0].data(), bytes) != 0) {
        return "rank " + std::to_string(r) + " run " + std::to_string(run) +
               " is not bitwise identical to rank 0 run 0";
      }
    }
  }
  std::vector<const void*> in(n);
  for (int r = 0; r < n; ++r) in[r] = input[r].data();
  return CheckReduce(c.dtype, c.op, in, out[0][0].data(), c.count);
}

std::string RunReduceScatter(const std::vector<ccComm_t>& comms, const Case& c) {
  const int n = static_cast<int>(comms.size());
  const size_t es = DtypeSize(c.dtype);
  const size_t block = c.count * es;
  std::vector<Buf> input(n);
  std::vector<std::vector<Buf>> send(c.runs, std::vector<Buf>(n)), recv(c.runs, std::vector<Buf>(n));
  std::vector<std::vector<RankResult>> results(c.runs, std::vector<RankResult>(n));
  RunRanks(n, [&](int r) {
    input[r].Reset(block * n);
    FillInput(c.dtype, c.op, c.seed, r, c.count * n, input[r].data());
    for (int run = 0; run < c.runs; ++run) {
      send[run][r] = input[r];
      void* dst = send[run][r].data() + r * block;
      if (!c.inPlace) {
        recv[run][r].Reset(block);
        dst = recv[run][r].data();
      }
      results[run][r] =
          Record(ccReduceScatter(send[run][r].data(), dst, c.count, c.dtype, c.op, comms[r], nullptr), comms[r]);
    }
  });
  std::string err;
  for (int run = 0; run < c.runs; ++run) err += RankErrors(results[run], "ccReduceScatter");
  if (!err.empty()) return err;
  for (int r = 0; r < n; ++r) {
    std::vector<const void*> in(n);
    for (int q = 0; q < n; ++q) in[q] = input[q].data() + r * block;
    for (int run = 0; run < c.runs; ++run) {
      const uint8_t* res = c.inPlace ? send[run][r].data() + r * block : recv[run][r].data();
      if (c.inPlace) {
        if (!send[run][r].GuardIntact()) return "rank " + std::to_string(r) + " wrote past the end of sendbuff";
      } else {
        if (std::memcmp(send[run][r].data(), input[r].data(), block * n + kGuard) != 0) {
          return "rank " + std::to_string(r) + " changed its sendbuff";
        }
        if (!recv[run][r].GuardIntact()) return "rank " + std::to_string(r) + " wrote past the end of recvbuff";
      }
      const uint8_t* first = c.inPlace ? send[0][r].data() + r * block : recv[0][r].data();
      if (std::memcmp(res, first, block) != 0) {
        return "rank " + std::to_string(r) + " run " + std::to_string(run) + " differs from run 0 (not deterministic)";
      }
    }
    std::string e = CheckReduce(c.dtype, c.op, in, c.inPlace ? send[0][r].data() + r * block : recv[0][r].data(),
                                c.count);
    if (!e.empty()) return "rank " + std::to_string(r) + ": " + e;
  }
  return "";
}

std::string RunAllGather(const std::vector<ccComm_t>& comms, const Case& c) {
  const int n = static_cast<int>(comms.size());
  const size_t block = c.count * DtypeSize(c.dtype);
  std::vector<Buf> input(n), send(n), recv(n);
  std::vector<RankResult> results(n);
  RunRanks(n, [&](int r) {
    input[r].Reset(block);
    FillBytes(c.seed, r, block, input[r].data());
    recv[r].Reset(block * n);
    const void* src;
    if (c.inPlace) {
      std::memcpy(recv[r].data() + r * block, input[r].data(), block);
      src = recv[r].data() + r * block;
    } else {
      send[r] = input[r];
      src = send[r].data();
    }
    results[r] = Record(ccAllGather(src, recv[r].data(), c.count, c.dtype, comms[r], nullptr), comms[r]);
  });
  std::string err = RankErrors(results, "ccAllGather");
  if (!err.empty()) return err;
  for (int r = 0; r < n; ++r) {
    if (!recv[r].GuardIntact()) return "rank " + std::to_string(r) + " wrote past the end of recvbuff";
    if (!c.inPlace && std::memcmp(send[r].data(), input[r].data(), block + kGuard) != 0) {
      return "rank " + std::to_string(r) + " changed its sendbuff";
    }
    for (int q = 0; q < n; ++q) {
      if (std::memcmp(recv[r].data() + q * block, input[q].data(), block) != 0) {
        return "rank " + std::to_string(r) + ": block " + std::to_string(q) + " is not rank " + std::to_string(q) +
               "'s input";
      }
    }
  }
  return "";
}

std::string RunBroadcast(const std::vector<ccComm_t>& comms, const Case& c) {
  const int n = static_cast<int>(comms.size());
  const size_t bytes = c.count * DtypeSize(c.dtype);
  Buf input;
  input.Reset(bytes);
  FillBytes(c.seed, c.root, bytes, input.data());
  std::vector<Buf> send(n), recv(n);
  std::vector<RankResult> results(n);
  RunRanks(n, [&](int r) {
    recv[r].Reset(bytes);
    const void* src = nullptr;  // non-root ranks may pass NULL
    if (c.inPlace) {
      if (r == c.root) std::memcpy(recv[r].data(), input.data(), bytes);
      src = recv[r].data();
    } else if (r == c.root) {
      send[r] = input;
      src = send[r].data();
    }
    results[r] = Record(ccBroadcast(src, recv[r].data(), c.count, c.dtype, c.root, comms[r], nullptr), comms[r]);
  });
  std::string err = RankErrors(results, "ccBroadcast");
  if (!err.empty()) return err;
  if (!c.inPlace && std::memcmp(send[c.root].data(), input.data(), bytes + kGuard) != 0) {
    return "the root changed its sendbuff";
  }
  for (int r = 0; r < n; ++r) {
    if (!recv[r].GuardIntact()) return "rank " + std::to_string(r) + " wrote past the end of recvbuff";
    if (std::memcmp(recv[r].data(), input.data(), bytes) != 0) {
      return "rank " + std::to_string(r) + " did not receive the root's bytes";
    }
  }
  return "";
}

// ccReduce into c.root. Non-root ranks pass a recvbuff on even seeds (it must stay untouched) and NULL on odd ones.
std::string RunReduce(const std::vector<ccComm_t>& comms, const Case& c) {
  const int n = static_cast<int>(comms.size());
  const size_t bytes = c.count * DtypeSize(c.dtype);
  std::vector<Buf> input(n), send(n);
  std::vector<std::vector<Buf>> out(c.runs, std::vector<Buf>(n));
  std::vector<std::vector<RankResult>> results(c.runs, std::vector<RankResult>(n));
  const bool nonRootNull = c.seed % 2 == 1;
  RunRanks(n, [&](int r) {
    input[r].Reset(bytes);
    FillInput(c.dtype, c.op, c.seed, r, c.count, input[r].data());
    for (int run = 0; run < c.runs; ++run) {
      Buf& recv = out[run][r];
      recv.Reset(bytes);
      const void* src;
      if (c.inPlace && r == c.root) {
        std::memcpy(recv.data(), input[r].data(), bytes);
        src = recv.data();
      } else {
        send[r] = input[r];
        src = send[r].data();
      }
      void* dst = r == c.root || !nonRootNull ? recv.data() : nullptr;
      results[run][r] = Record(ccReduce(src, dst, c.count, c.dtype, c.op, c.root, comms[r], nullptr), comms[r]);
    }
  });
  std::string err;
  for (int run = 0; run < c.runs; ++run) err += RankErrors(results[run], "ccReduce");
  if (!err.empty()) return err;
  Buf untouched;
  untouched.Reset(bytes);
  for (int r = 0; r < n; ++r) {
    if (!(c.inPlace && r == c.root) && std::memcmp(send[r].data(), input[r].data(), bytes + kGuard) != 0) {
      return "rank " + std::to_string(r) + " changed its sendbuff";
    }
    for (int run = 0; run < c.runs; ++run) {
      if (!out[run][r].GuardIntact()) return "rank " + std::to_string(r) + " wrote past the end of recvbuff";
      if (r != c.root && std::memcmp(out[run][r].data(), untouched.data(), bytes) != 0) {
        return "rank " + std::to_string(r) + " (not the root) had its recvbuff written";
      }
      if (r == c.root && std::memcmp(out[run][r].data(), out[0][r].data(), bytes) != 0) {
        return "run " + std::to_string(run) + " differs from run 0 on the root (not deterministic)";
      }
    }
  }
  std::vector<const void*> in(n);
  for (int r = 0; r < n; ++r) in[r] = input[r].data();
  return CheckReduce(c.dtype, c.op, in, out[0][c.root].data(), c.count);
}

// Communicators for one nranks: one group per all-reduce algorithm (selected by config, not by environment), and
// one from ccCommInitAll for the other collectives.
ccConfig_t AlgoConfig(ccAlgo_t algo) {
  // A hang becomes an error well inside ctest's timeout.
  return cctest::MakeConfig(algo, 60000);
}

// Stops a sweep after this many failing cases, so a systematic bug does not print thousands of them.
constexpr int kMaxFailures = 10;

}  // namespace

// ------------------------------------------------------------------------------------------------------------

// auto: with the call check, counts 1 and 7 ride in its messages on 2, 4 and 8 ranks (CC_CHECK_INLINE_BYTES).
TEST_CASE("ccAllReduce sweep: nranks x small counts x dtypes x ops x ring/tree/auto x in-place",
          "[collectives][allreduce]") {
  const int nranks = GENERATE(from_range(std::begin(kNranks), std::end(kNranks)));
  CAPTURE(nranks);
  const ccAlgo_t algos[] = {ccAlgoRing, ccAlgoTree, ccAlgoAuto};
  int failures = 0;
  for (ccAlgo_t algo : algos) {
    Group g = Group::InitConfig(nranks, AlgoConfig(algo));
    INFO(g.error);
    REQUIRE(g.status == ccSuccess);
    for (const DtypeInfo& dt : SweepDtypes()) {
      for (ccRedOp_t op : kOps) {
        for (size_t count : kSmallCounts) {
          for (bool inPlace : {false, true}) {
            Case c;
            c.dtype = dt.dtype;
            c.op = op;
            c.count = count;
            c.inPlace = inPlace;
            c.seed = 1000 + count * 7 + static_cast<uint64_t>(op);
            std::string what =
                Describe("ccAllReduce", nranks, algo == ccAlgoRing ? "ring" : (algo == ccAlgoTree ? "tree" : "auto"), c);
            std::string err = RunAllReduce(g.comms, c);
            INFO(what);
            CHECK(err == "");
            if (!err.empty()) {
              REQUIRE(++failures < kMaxFailures);
              // A failed collective leaves the communicators aborted: start a fresh group for the next cases.
              g = Group::InitConfig(nranks, AlgoConfig(algo));
              REQUIRE(g.status == ccSuccess);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ccAllReduce sweep: 2^20+3 elements, every dtype, sum, avg and max, ring and tree",
          "[collectives][allreduce][large]") {
  const int nranks = GENERATE(from_range(std::begin(kNranks), std::end(kNranks)));
  CAPTURE(nranks);
  const ccAlgo_t algos[] = {ccAlgoRing, ccAlgoTree};
  for (ccAlgo_t algo : algos) {
    Group g = Group::InitConfig(nranks, AlgoConfig(algo));
    INFO(g.error);
    REQUIRE(g.status == ccSuccess);
    int k = 0;
    for (const DtypeInfo& dt : SweepDtypes()) {
      // uint8 and uint32 move and slice as int8 and int32 do; the small sweep checks their arithmetic.
      if (dt.dtype == ccUint8 || dt.dtype == ccUint32) continue;
      for (ccRedOp_t op : {ccSum, ccAvg, ccMax}) {
        Case c;
        c.dtype = dt.dtype;
        c.op = op;
        c.count = kLargeCount;
        c.inPlace = (k++ + nranks) % 2 == 1;  // half of the cases in place
        c.seed = 77 + k;
        c.runs = 1 + (k % 3 == 0);  // determinism is also checked by the small sweep
        std::string what = Describe("ccAllReduce", nranks, algo == ccAlgoRing ? "ring" : "tree", c);
        std::string err = RunAllReduce(g.comms, c);
        INFO(what);
        REQUIRE(err == "");
      }
    }
  }
}

TEST_CASE("ccAllReduce with the default (auto) algorithm from ccCommInitAll", "[collectives][allreduce]") {
  const int nranks = GENERATE(1, 3, 4);
  Group g = Group::InitAll(nranks);
  INFO(g.error);
  REQUIRE(g.status == ccSuccess);
  // Around the tree/ring threshold of auto (64 KiB by default).
  for (size_t count : {size_t{5}, size_t{16384}, size_t{16385}, size_t{40000}}) {
    for (ccDataType_t dtype : {ccFloat32, ccInt64, ccBfloat16}) {
      Case c;
      c.dtype = dtype;
      c.op = ccSum;
      c.count = count;
      c.seed = count;
      std::string err = RunAllReduce(g.comms, c);
      INFO(Describe("ccAllReduce", nranks, "auto", c));
      CHECK(err == "");
    }
  }
}

TEST_CASE("ccReduceScatter sweep: nranks x recvcounts x dtypes x ops x in-place", "[collectives][reducescatter]") {
  const int nranks = GENERATE(from_range(std::begin(kNranks), std::end(kNranks)));
  CAPTURE(nranks);
  Group g = Group::InitAll(nranks);
  INFO(g.error);
  REQUIRE(g.status == ccSuccess);
  int failures = 0;
  for (const DtypeInfo& dt : SweepDtypes()) {
    for (ccRedOp_t op : kOps) {
      for (size_t count : kSmallCounts) {
        for (bool inPlace : {false, true}) {
          Case c;
          c.dtype = dt.dtype;
          c.op = op;
          c.count = count;
          c.inPlace = inPlace;
          c.seed = 3000 + count + static_cast<uint64_t>(op);
          std::string err = RunReduceScatter(g.comms, c);
          INFO(Describe("ccReduceScatter", nranks, "ring", c));
          CHECK(err == "");
          if (!err.empty()) {
            REQUIRE(++failures < kMaxFailures);
            g = Group::InitAll(nranks);
            REQUIRE(g.status == ccSuccess);
          }
        }
      }
    }
  }
}

TEST_CASE("ccReduceScatter with 2^18+1 elements per rank", "[collectives][reducescatter][large]") {
  const int nranks = GENERATE(2, 5, 8);
  Group g = Group::InitAll(nranks);
  INFO(g.error);
  REQUIRE(g.status == ccSuccess);
  int k = 0;
  for (const DtypeInfo& dt : SweepDtypes()) {
    // uint8 and uint32 move and slice as int8 and int32 do; the small sweep checks their arithmetic.
    if (dt.dtype == ccUint8 || dt.dtype == ccUint32) continue;
    for (ccRedOp_t op : kOps) {
      Case c;
      c.dtype = dt.dtype;
      c.op = op;
      c.count = kLargeRsCount;
      c.inPlace = (k++ + nranks) % 2 == 0;
      c.seed = 5 + k;
      c.runs = 1;
      std::string err = RunReduceScatter(g.comms, c);
      INFO(Describe("ccReduceScatter", nranks, "ring", c));
      REQUIRE(err == "");
    }
  }
}

TEST_CASE("ccAllGather sweep: nranks x sendcounts x dtypes x in-place", "[collectives][allgather]") {
  const int nranks = GENERATE(from_range(std::begin(kNranks), std::end(kNranks)));
  Group g = Group::InitAll(nranks);
  INFO(g.error);
  REQUIRE(g.status == ccSuccess);
  int k = 0;
  for (const DtypeInfo& dt : SweepDtypes()) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, kLargeRsCount}) {
      for (bool inPlace : {false, true}) {
        if (count == kLargeRsCount && (k++ % 2) == 0) continue;  // the large count for half of the cases
        Case c;
        c.dtype = dt.dtype;
        c.count = count;
        c.inPlace = inPlace;
        c.seed = 9000 + count;
        std::string err = RunAllGather(g.comms, c);
        INFO(Describe("ccAllGather", nranks, "ring", c));
        REQUIRE(err == "");
      }
    }
  }
}

TEST_CASE("ccBroadcast from every root, in place and not", "[collectives][broadcast]") {
  const int nranks = GENERATE(from_range(std::begin(kNranks), std::end(kNranks)));
  Group g = Group::InitAll(nranks);
  INFO(g.error);
  REQUIRE(g.status == ccSuccess);
  for (int root = 0; root < nranks; ++root) {
    for (const DtypeInfo& dt : SweepDtypes()) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, kLargeRsCount}) {
        // The large count for one dtype per root.
        if (count == kLargeRsCount && dt.dtype != SweepDtypes()[root % SweepDtypes().size()].dtype) continue;
        for (bool inPlace : {false, true}) {
          Case c;
          c.dtype = dt.dtype;
          c.count = count;
          c.inPlace = inPlace;
          c.root = root;
          c.seed = 11 + count;
          std::string err = RunBroadcast(g.comms, c);
          INFO(Describe("ccBroadcast", nranks, "ring", c));
          REQUIRE(err == "");
        }
      }
    }
  }
}

TEST_CASE("ccReduce sweep: nranks x counts x dtypes x ops x roots x in-place", "[collectives][reduce]") {
  const int nranks = GENERATE(from_range(std::begin(kNranks), std::end(kNranks)));
  CAPTURE(nranks);
  Group g = Group::InitAll(nranks);
  INFO(g.error);
  REQUIRE(g.status == ccSuccess);
  int failures = 0, k = 0;
  for (const DtypeInfo& dt : SweepDtypes()) {
    for (ccRedOp_t op : kOps) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{(1 << 16) + 3}}) {
        for (bool inPlace : {false, true}) {
          Case c;
          c.dtype = dt.dtype;
          c.op = op;
          c.count = count;
          c.inPlace = inPlace;
          c.root = k % nranks;
          c.seed = 4000 + static_cast<uint64_t>(k++);
          std::string err = RunReduce(g.comms, c);
          INFO(Describe("ccReduce", nranks, "ring", c));
          CHECK(err == "");
          if (!err.empty()) {
            REQUIRE(++failures < kMaxFailures);
            g = Group::InitAll(nranks);
            REQUIRE(g.status == ccSuccess);
          }
        }
      }
    }
  }
}

TEST_CASE("ccAllReduce with more ranks than cores (13 and 16 thread ranks)", "[collectives][allreduce]") {
  const int nranks = GENERATE(13, 16);
  CAPTURE(nranks);
  for (ccAlgo_t algo : {ccAlgoRing, ccAlgoTree}) {
    Group g = Group::InitConfig(nranks, AlgoConfig(algo));
    INFO(g.error);
    REQUIRE(g.status == ccSuccess);
    for (ccDataType_t dtype : {ccFloat32, ccBfloat16, ccInt64}) {
      for (ccRedOp_t op : {ccSum, ccMax}) {
        for (size_t count : {size_t{1}, size_t{1023}, size_t{65537}}) {
          Case c;
          c.dtype = dtype;
          c.op = op;
          c.count = count;
          c.inPlace = count == 1023;
          c.seed = 17 * count + static_cast<uint64_t>(op);
          c.runs = 1;
          std::string err = RunAllReduce(g.comms, c);
          INFO(Describe("ccAllReduce", nranks, algo == ccAlgoRing ? "ring" : "tree", c));
          REQUIRE(err == "");
        }
      }
    }
  }
}

namespace {

// Non-finite inputs at fixed positions (mod 8): 0 NaN on rank 0; 1 +inf on rank 1; 2 +inf on rank 0 and -inf on
// the last rank; 3 +inf on every rank; 4 a negative NaN on rank 1; 5 -0 on rank 0 and +0 elsewhere; 6 +0 on rank 0
// and -0 elsewhere; 7 small finite values.
double EdgeValue(int rank, int nranks, size_t i) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double v = static_cast<double>((rank + static_cast<int>(i)) % 5) - 2;
  switch (i % 8) {
    case 0: if (rank == 0) v = nan; break;
    case 1: if (rank == 1) v = inf; break;
    case 2: if (rank == 0) v = inf; else if (rank == nranks - 1) v = -inf; break;
    case 3: v = inf; break;
    case 4: if (rank == 1) v = -nan; break;
    case 5: v = rank == 0 ? -0.0 : 0.0; break;
    case 6: v = rank == 0 ? 0.0 : -0.0; break;
  }
  return v;
}
template <typename T>
T EdgeInput(int rank, int nranks, size_t i) {
  return FromDouble<T>(EdgeValue(rank, nranks, i));
}

// The value of T whose bits are the low sizeof(T) bytes of `bits`.
template <typename T>
T FromBits(uint64_t bits) {
  T v;
  if constexpr (sizeof(T) == 8) {
    std::memcpy(&v, &bits, 8);
  } else if constexpr (sizeof(T) == 4) {
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&v, &b, 4);
  } else {
    const uint16_t b = static_cast<uint16_t>(bits);
    std::memcpy(&v, &b, 2);
  }
  return v;
}

// The one quiet NaN a max or min writes (reduce_op.h), as T.
template <typename T>
T CanonicalNaN() {
  if constexpr (sizeof(T) == 8) return FromBits<T>(0x7ff8000000000000ull);
  if constexpr (sizeof(T) == 4) return FromBits<T>(0x7fc00000u);
  return FromBits<T>(std::is_same<T, F16>::value ? 0x7e00 : 0x7fc0);
}

// A NaN other than CanonicalNaN: negative, with a payload (and quiet, so that arithmetic keeps it a NaN), as T.
template <typename T>
T PayloadNaN() {
  if constexpr (sizeof(T) == 8) return FromBits<T>(0xfff8000000001234ull);
  if constexpr (sizeof(T) == 4) return FromBits<T>(0xffc01234u);
  return FromBits<T>(std::is_same<T, F16>::value ? 0xfe01 : 0xffc1);
}

// IEEE 754-2019 maximum (or minimum) of the ranks' values at i: NaN if any is NaN, +0 above -0.
template <typename T>
T WantMaxMin(bool max, int nranks, size_t i) {
  double acc = EdgeValue(0, nranks, i);
  for (int r = 0; r < nranks; ++r) {
    const double v = EdgeValue(r, nranks, i);
    if (std::isnan(v) || std::isnan(acc)) return CanonicalNaN<T>();
    if (v == acc) {
      acc = max == std::signbit(acc) ? v : acc;  // max keeps the +0 of a pair of zeros, min the -0
    } else if (max ? v > acc : v < acc) {
      acc = v;
    }
  }
  return FromDouble<T>(acc);
}

template <typename T>
std::string RunNonFinite(const std::vector<ccComm_t>& comms, ccRedOp_t op, size_t count) {
  const int n = static_cast<int>(comms.size());
  std::vector<std::vector<T>> out(n, std::vector<T>(count)), reduced(n, std::vector<T>(count));
  std::vector<RankResult> results(n), reduceResults(n);
  const ccDataType_t dtype = std::is_same<T, F16>::value    ? ccFloat16
                             : std::is_same<T, B16>::value  ? ccBfloat16
                             : std::is_same<T, float>::value ? ccFloat32
                                                             : ccFloat64;
  const bool maxMin = op == ccMax || op == ccMin;
  RunRanks(n, [&](int r) {
    std::vector<T> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = EdgeInput<T>(r, n, i);
    // Rank 0's NaN at position 0 carries a sign and a payload, which no result may keep where the type's rules
    // write the one quiet NaN (also with one rank, whose result used to be a copy of its input).
    if (r == 0) in[0] = PayloadNaN<T>();
    results[r] = Record(ccAllReduce(in.data(), out[r].data(), count, dtype, op, nullptr, comms[r], nullptr), comms[r]);
    // ccReduce runs a chain, not the ring or the tree: for max and min it must write the same bytes.
    if (maxMin) {
      reduceResults[r] = Record(ccReduce(in.data(), reduced[r].data(), count, dtype, op, n - 1, comms[r], nullptr),
                                comms[r]);
    }
  });
  std::string err = RankErrors(results, "ccAllReduce");
  if (maxMin) err += RankErrors(reduceResults, "ccReduce");
  if (!err.empty()) return err;
  for (int r = 1; r < n; ++r) {
    if (std::memcmp(out[r].data(), out[0].data(), count * sizeof(T)) != 0) {
      return "rank " + std::to_string(r) + " is not bitwise identical to rank 0";
    }
  }
  if (sizeof(T) == 2) {  // 16-bit floats: every NaN result is the one quiet NaN (ccoll.h), whatever the op
    const T canonical = CanonicalNaN<T>();
    for (size_t i = 0; i < count; ++i) {
      if (std::isnan(ToDouble(out[0][i])) && std::memcmp(&out[0][i], &canonical, sizeof(T)) != 0) {
        return "ccAllReduce element " + std::to_string(i) + " is a NaN other than the type's one quiet NaN";
      }
    }
  }
  if (maxMin) {  // IEEE maximum and minimum: the bytes are known whatever the order
    for (size_t i = 0; i < count; ++i) {
      const T want = WantMaxMin<T>(op == ccMax, n, i);
      if (std::memcmp(&out[0][i], &want, sizeof(T)) != 0) {
        return "ccAllReduce element " + std::to_string(i) + " (position " + std::to_string(i % 8) + ") is " +
               std::to_string(ToDouble(out[0][i])) + ", not " + std::to_string(ToDouble(want)) +
               " (or its bits differ)";
      }
    }
    if (std::memcmp(reduced[n - 1].data(), out[0].data(), count * sizeof(T)) != 0) {
      return "ccReduce's result differs from ccAllReduce's";
    }
    return "";
  }
  if (op != ccSum && op != ccAvg) return "";  // prod of NaN depends on the order; identical is what counts
  for (size_t i = 0; i < count; ++i) {
    double got = ToDouble(out[0][i]);
    bool ok = true;
    switch (i % 8) {
      case 0: ok = std::isnan(got); break;
      case 1: ok = n > 1 ? got == std::numeric_limits<double>::infinity() : std::isfinite(got); break;
      case 2: ok = n > 1 ? std::isnan(got) : got == std::numeric_limits<double>::infinity(); break;  // inf - inf
      case 3: ok = got == std::numeric_limits<double>::infinity(); break;
      case 4: ok = n > 1 ? std::isnan(got) : std::isfinite(got); break;
      default: ok = std::isfinite(got); break;
    }
    if (!ok) return "element " + std::to_string(i) + " (position " + std::to_string(i % 8) + ") is " + std::to_string(got);
  }
  return "";
}

}  // namespace

TEST_CASE("non-finite inputs give the same non-finite result on every rank", "[collectives][allreduce][nonfinite]") {
  const int nranks = GENERATE(1, 2, 3, 5);
  CAPTURE(nranks);
  for (ccAlgo_t algo : {ccAlgoRing, ccAlgoTree}) {
    Group g = Group::InitConfig(nranks, AlgoConfig(algo));
    INFO(g.error);
    REQUIRE(g.status == ccSuccess);
    for (ccRedOp_t op : kOps) {
      for (size_t count : {size_t{8}, size_t{1001}}) {
        INFO("algo " << (algo == ccAlgoRing ? "ring" : "tree") << " op " << OpName(op) << " count " << count);
        CHECK(RunNonFinite<float>(g.comms, op, count) == "");
        CHECK(RunNonFinite<double>(g.comms, op, count) == "");
        CHECK(RunNonFinite<F16>(g.comms, op, count) == "");
        CHECK(RunNonFinite<B16>(g.comms, op, count) == "");
      }
    }
  }
}

TEST_CASE("integer sums wrap around as two's complement, identically on every rank", "[collectives][allreduce]") {
  Group g = Group::InitAll(3);
  REQUIRE(g.status == ccSuccess);
  std::vector<int32_t> out32(3 * 4);
  std::vector<int64_t> out64(3 * 4);
  std::vector<RankResult> results(6);
  RunRanks(3, [&](int r) {
    const int32_t in32[4] = {INT32_MAX, INT32_MIN, INT32_MAX, r};
    const int64_t in64[4] = {INT64_MAX, INT64_MIN, INT64_MAX, r};
    results[r] = Record(ccAllReduce(in32, &out32[4 * r], 4, ccInt32, ccSum, nullptr, g[r], nullptr), g[r]);
    results[3 + r] = Record(ccAllReduce(in64, &out64[4 * r], 4, ccInt64, ccSum, nullptr, g[r], nullptr), g[r]);
  });
  REQUIRE(RankErrors(results, "ccAllReduce") == "");
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(out32[4 * r + 0] == static_cast<int32_t>(3u * 0x7fffffffu));
    CHECK(out32[4 * r + 1] == static_cast<int32_t>(3u * 0x80000000u));
    CHECK(out32[4 * r + 3] == 3);
    CHECK(out64[4 * r + 0] == static_cast<int64_t>(3ull * 0x7fffffffffffffffull));
    CHECK(out64[4 * r + 1] == static_cast<int64_t>(3ull * 0x8000000000000000ull));
    CHECK(out64[4 * r + 3] == 3);
  }
}

// ccAvg of float16 multiplies every rank's input by 1/nranks before the sum, as NCCL's ncclAvg does, so an average
// whose sum is beyond float16's range stays finite. Until 2026-12-05 the sum was divided at the end: two ranks'
// 40000 averaged to infinity (float16's largest value is 65504), where DDP over NCCL or gloo gives 40000.
TEST_CASE("a float16 average whose sum overflows float16 stays finite: inputs premultiplied by 1/nranks",
          "[collectives][avg]") {
  struct Range {
    ccDataType_t dtype;
    double lo, hi;  // every input in [lo, hi): any two sum beyond the type's largest value
  };
  const Range ranges[] = {{ccFloat16, 33000.0, 65000.0}};
  auto check = [&](auto tag, int n, const std::vector<std::vector<uint8_t>>& in,
                   const std::vector<std::vector<uint8_t>>& out, size_t outOffset, size_t outCount) -> std::string {
    using T = decltype(tag);
    for (int r = 0; r < static_cast<int>(out.size()); ++r) {
      if (out[r] != out[0]) return "rank " + std::to_string(r) + "'s output differs from rank 0's";
      const T* o = reinterpret_cast<const T*>(out[r].data());
      for (size_t i = 0; i < outCount; ++i) {
        double sum = 0;
        for (int q = 0; q < n; ++q) sum += ToDouble(reinterpret_cast<const T*>(in[q].data())[outOffset + i]);
        const double want = sum / n, got = ToDouble(o[i]);
        if (!(std::fabs(got - want) <= (n + 2) * Eps<T>() * sum / n)) {
          std::ostringstream s;
          s.precision(17);
          s << "element " << outOffset + i << ": got " << got << ", want " << want;
          return s.str();
        }
      }
    }
    return "";
  };
  for (int n : {2, 3, 4}) {
    // auto: 300 elements ride in the call check's messages on 2 and 4 ranks (CC_CHECK_INLINE_BYTES), premultiplied
    for (ccAlgo_t algo : {ccAlgoRing, ccAlgoTree, ccAlgoAuto}) {
      const size_t count = algo == ccAlgoAuto ? 300 : 999;
      Group g = Group::InitConfig(n, AlgoConfig(algo));
      REQUIRE(g.status == ccSuccess);
      for (const Range& range : ranges) {
        WithType(range.dtype, [&](auto tag) {
          using T = decltype(tag);
          if constexpr (!kIsInt<T>) {
            INFO(n << " ranks, algo " << algo << ", dtype " << range.dtype);
            std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(count * n * sizeof(T)));
            for (int r = 0; r < n; ++r) {
              T* p = reinterpret_cast<T*>(in[r].data());
              for (size_t i = 0; i < count * n; ++i) {
                const double u = static_cast<double>((i * 7919 + static_cast<size_t>(r) * 104729) % 1000) / 1000.0;
                p[i] = FromDouble<T>(range.lo + u * (range.hi - range.lo));
              }
            }
            std::vector<RankResult> results(n);
            std::vector<std::vector<uint8_t>> all(n, std::vector<uint8_t>(count * sizeof(T)));
            std::vector<std::vector<uint8_t>> scattered(n, std::vector<uint8_t>(count * sizeof(T)));
            std::vector<std::vector<uint8_t>> reduced(1, std::vector<uint8_t>(count * sizeof(T)));
            RunRanks(n, [&](int r) {
              ccResult_t rc = ccAllReduce(in[r].data(), all[r].data(), count, range.dtype, ccAvg, nullptr, g[r],
                                          nullptr);
              if (rc == ccSuccess) {
                rc = ccReduceScatter(in[r].data(), scattered[r].data(), count, range.dtype, ccAvg, g[r], nullptr);
              }
              if (rc == ccSuccess) {
                rc = ccReduce(in[r].data(), r == 1 ? reduced[0].data() : nullptr, count, range.dtype, ccAvg, 1, g[r],
                              nullptr);
              }
              results[r] = Record(rc, g[r]);
            });
            REQUIRE(RankErrors(results, "ccAllReduce, ccReduceScatter, ccReduce") == "");
            CHECK(check(tag, n, in, all, 0, count) == "");
            CHECK(check(tag, n, in, reduced, 0, count) == "");
            for (int r = 0; r < n; ++r) {
              INFO("reduce-scatter, rank " << r);
              CHECK(check(tag, n, in, {scattered[r]}, static_cast<size_t>(r) * count, count) == "");
            }
          }
        });
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// Many collectives in a row, many communicators at once.
// ------------------------------------------------------------------------------------------------------------

namespace {

enum class Coll { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

struct Step {
  Coll coll;
  Case c;
};

// A random but reproducible program of collectives; every rank runs the same one.
std::vector<Step> MakeProgram(uint64_t seed, int steps, int nranks) {
  std::vector<Step> prog;
  for (int i = 0; i < steps; ++i) {
    uint64_t h = Hash(seed, 999, static_cast<uint64_t>(i));
    Step s;
    s.coll = static_cast<Coll>(h % 4);
    s.c.dtype = kDtypes[(h >> 8) % kNumDtypes].dtype;
    s.c.op = kOps[(h >> 16) % 5];
    // Mostly small, sometimes above the auto tree/ring threshold.
    s.c.count = (h >> 24) % 8 == 0 ? 20000 + (h >> 32) % 5000 : (h >> 32) % 300;
    s.c.inPlace = ((h >> 40) & 1) != 0;
    s.c.root = static_cast<int>((h >> 44) % static_cast<uint64_t>(nranks));
    s.c.seed = seed * 1000 + static_cast<uint64_t>(i);
    prog.push_back(s);
  }
  return prog;
}

// Runs a whole program back to back on each rank (no join between steps), keeping every output, then checks it.
struct ProgramRun {
  std::vector<std::vector<Buf>> input, out;  // [step][rank]
  std::vector<std::vector<RankResult>> results;
};

void RunProgramOnRank(const std::vector<Step>& prog, ccComm_t comm, int r, int n, ProgramRun* run) {
  for (size_t i = 0; i < prog.size(); ++i) {
    const Case& c = prog[i].c;
    const size_t es = DtypeSize(c.dtype);
    Buf& in = run->input[i][r];
    Buf& out = run->out[i][r];
    ccResult_t rc = ccSuccess;
    switch (prog[i].coll) {
      case Coll::kAllReduce:
        in.Reset(c.count * es);
        FillInput(c.dtype, c.op, c.seed, r, c.count, in.data());
        out.Reset(c.count * es);
        std::memcpy(out.data(), in.data(), c.count * es);
        rc = ccAllReduce(c.inPlace ? out.data() : in.data(), out.data(), c.count, c.dtype, c.op, nullptr, comm,
                         nullptr);
        break;
      case Coll::kReduceScatter:
        in.Reset(c.count * es * n);
        FillInput(c.dtype, c.op, c.seed, r, c.count * n, in.data());
        if (c.inPlace) {
          Buf copy = in;
          rc = ccReduceScatter(copy.data(), copy.data() + r * c.count * es, c.count, c.dtype, c.op, comm, nullptr);
          out.Reset(c.count * es);
          std::memcpy(out.data(), copy.data() + r * c.count * es, c.count * es);
        } else {
          out.Reset(c.count * es);
          rc = ccReduceScatter(in.data(), out.data(), c.count, c.dtype, c.op, comm, nullptr);
        }
        break;
      case Coll::kAllGather:
        in.Reset(c.count * es);
        FillBytes(c.seed, r, c.count * es, in.data());
        out.Reset(c.count * es * n);
        if (c.inPlace) std::memcpy(out.data() + r * c.count * es, in.data(), c.count * es);
        rc = ccAllGather(c.inPlace ? out.data() + r * c.count * es : in.data(), out.data(), c.count, c.dtype, comm,
                         nullptr);
        break;
      case Coll::kBroadcast:
        in.Reset(c.count * es);
        FillBytes(c.seed, c.root, c.count * es, in.data());
        out.Reset(c.count * es);
        if (c.inPlace && r == c.root) std::memcpy(out.data(), in.data(), c.count * es);
        rc = ccBroadcast(c.inPlace ? out.data() : (r == c.root ? in.data() : nullptr), out.data(), c.count, c.dtype,
                         c.root, comm, nullptr);
        break;
    }
    run->results[i][r] = Record(rc, comm);
    if (rc != ccSuccess) return;  // the communicator is aborted after a failure
  }
}

std::string CheckProgram(const std::vector<Step>& prog, int n, const ProgramRun& run) {
  for (size_t i = 0; i < prog.size(); ++i) {
    const Case& c = prog[i].c;
    const size_t es = DtypeSize(c.dtype);
    std::string where = "step " + std::to_string(i) + " (" +
                        Describe(prog[i].coll == Coll::kAllReduce        ? "ccAllReduce"
                                 : prog[i].coll == Coll::kReduceScatter ? "ccReduceScatter"
                                 : prog[i].coll == Coll::kAllGather     ? "ccAllGather"
                                                                         : "ccBroadcast",
                                 n, "auto", c) +
                        "): ";
    std::string err = RankErrors(run.results[i], "");
    if (!err.empty()) return where + err;
    for (int r = 0; r < n; ++r) {
      if (!run.out[i][r].GuardIntact()) return where + "write past the end on rank " + std::to_string(r);
      std::vector<const void*> in(n);
      std::string e;
      switch (prog[i].coll) {
        case Coll::kAllReduce:
          for (int q = 0; q < n; ++q) in[q] = run.input[i][q].data();
          e = CheckReduce(c.dtype, c.op, in, run.out[i][r].data(), c.count);
          if (e.empty() && std::memcmp(run.out[i][r].data(), run.out[i][0].data(), c.count * es) != 0) {
            e = "not bitwise identical to rank 0";
          }
          break;
        case Coll::kReduceScatter:
          for (int q = 0; q < n; ++q) in[q] = run.input[i][q].data() + r * c.count * es;
          e = CheckReduce(c.dtype, c.op, in, run.out[i][r].data(), c.count);
          break;
        case Coll::kAllGather:
          for (int q = 0; q < n && e.empty(); ++q) {
            if (std::memcmp(run.out[i][r].data() + q * c.count * es, run.input[i][q].data(), c.count * es) != 0) {
              e = "block " + std::to_string(q) + " is wrong";
            }
          }
          break;
        case Coll::kBroadcast:
          if (std::memcmp(run.out[i][r].data(), run.input[i][r].data(), c.count * es) != 0) {
            e = "did not receive the root's bytes";
          }
          break;
      }
      if (!e.empty()) return where + "rank " + std::to_string(r) + ": " + e;
    }
  }
  return "";
}

ProgramRun NewProgramRun(size_t steps, int n) {
  ProgramRun run;
  run.input.assign(steps, std::vector<Buf>(n));
  run.out.assign(steps, std::vector<Buf>(n));
  run.results.assign(steps, std::vector<RankResult>(n));
  return run;
}

}  // namespace

TEST_CASE("50 mixed collectives back to back on one communicator", "[collectives][repeat]") {
  const int nranks = GENERATE(2, 4, 5);
  Group g = Group::InitAll(nranks);
  INFO(g.error);
  REQUIRE(g.status == ccSuccess);
  std::vector<Step> prog = MakeProgram(42 + nranks, 50, nranks);
  ProgramRun run = NewProgramRun(prog.size(), nranks);
  RunRanks(nranks, [&](int r) { RunProgramOnRank(prog, g[r], r, nranks, &run); });
  CHECK(CheckProgram(prog, nranks, run) == "");

  ccCommStats_t stats;
  stats.size = sizeof(stats);
  REQUIRE(ccCommGetStats(g[0], &stats) == ccSuccess);
  CHECK(stats.collectives == prog.size());
}

TEST_CASE("three groups of four ranks, created concurrently and used interleaved", "[collectives][groups]") {
  constexpr int kGroups = 3, kRanks = 4;
  ccUniqueId ids[kGroups];
  for (auto& id : ids) REQUIRE(ccGetUniqueId(&id) == ccSuccess);
  std::vector<ccComm_t> comms(kGroups * kRanks, nullptr);
  std::vector<RankResult> init(kGroups * kRanks);
  // 12 threads join 3 groups at once.
  RunRanks(kGroups * kRanks, [&](int t) {
    ccConfig_t config = cctest::MakeConfig(t / kRanks == 1 ? ccAlgoTree : ccAlgoRing, 60000);
    init[t] = Record(ccCommInitRankConfig(&comms[t], kRanks, ids[t / kRanks], t % kRanks, &config));
  });
  REQUIRE(RankErrors(init, "ccCommInitRankConfig") == "");
  struct Destroyer {
    std::vector<ccComm_t>* c;
    ~Destroyer() {
      for (ccComm_t x : *c) ccCommDestroy(x);
    }
  } destroyer{&comms};
  for (int t = 0; t < kGroups * kRanks; ++t) {
    int count = -1, rank = -1;
    REQUIRE(ccCommCount(comms[t], &count) == ccSuccess);
    REQUIRE(ccCommUserRank(comms[t], &rank) == ccSuccess);
    CHECK(count == kRanks);
    CHECK(rank == t % kRanks);
  }

  SECTION("the groups run their own programs at the same time") {
    std::vector<std::vector<Step>> progs;
    std::vector<ProgramRun> runs;
    for (int gi = 0; gi < kGroups; ++gi) {
      progs.push_back(MakeProgram(500 + gi, 20, kRanks));
      runs.push_back(NewProgramRun(20, kRanks));
    }
    RunRanks(kGroups * kRanks, [&](int t) {
      int gi = t / kRanks, r = t % kRanks;
      RunProgramOnRank(progs[gi], comms[t], r, kRanks, &runs[gi]);
    });
    for (int gi = 0; gi < kGroups; ++gi) {
      INFO("group " << gi);
      CHECK(CheckProgram(progs[gi], kRanks, runs[gi]) == "");
    }
  }

  SECTION("one thread per rank index drives that rank of every group, interleaving the groups") {
    constexpr int kRounds = 10;
    const size_t count = 777;
    // [round][group][rank]
    std::vector<std::vector<std::vector<Buf>>> input(kRounds, std::vector<std::vector<Buf>>(kGroups, std::vector<Buf>(kRanks)));
    auto out = input;
    std::vector<std::vector<std::vector<RankResult>>> results(
        kRounds, std::vector<std::vector<RankResult>>(kGroups, std::vector<RankResult>(kRanks)));
    RunRanks(kRanks, [&](int r) {
      for (int round = 0; round < kRounds; ++round) {
        for (int gi = 0; gi < kGroups; ++gi) {
          Buf& in = input[round][gi][r];
          in.Reset(count * 4);
          FillInput(ccInt32, ccSum, 100 * gi + round, r, count, in.data());
          out[round][gi][r].Reset(count * 4);
          ccComm_t comm = comms[gi * kRanks + r];
          results[round][gi][r] =
              Record(ccAllReduce(in.data(), out[round][gi][r].data(), count, ccInt32, ccSum, nullptr, comm, nullptr),
                     comm);
        }
      }
    });
    for (int round = 0; round < kRounds; ++round) {
      for (int gi = 0; gi < kGroups; ++gi) {
        INFO("round " << round << " group " << gi);
        REQUIRE(RankErrors(results[round][gi], "ccAllReduce") == "");
        std::vector<const void*> in(kRanks);
        for (int q = 0; q < kRanks; ++q) in[q] = input[round][gi][q].data();
        for (int r = 0; r < kRanks; ++r) CHECK(CheckReduce(ccInt32, ccSum, in, out[round][gi][r].data(), count) == "");
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// Multi-slice pipelining. CC_SLICE_BYTES is read once per process, so ctest runs this binary a second time with
// CC_SLICE_BYTES=64 and the tag [slice] (see tests/CMakeLists.txt); with the default slice these cases are small
// and single-slice, which is fine too.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("collectives pipelined over many slices", "[collectives][slice]") {
  if (const char* env = std::getenv("CC_SLICE_BYTES")) {
    INFO("CC_SLICE_BYTES=" << env);
    CHECK(ccoll::ParamInt("CC_SLICE_BYTES") == std::atoll(env));
  }
  const int nranks = GENERATE(2, 3, 5, 8);
  CAPTURE(nranks);
  int failures = 0;
  auto check = [&](const std::string& what, const std::string& err) {
    INFO(what);
    CHECK(err == "");
    if (!err.empty()) REQUIRE(++failures < kMaxFailures);
  };
  for (ccAlgo_t algo : {ccAlgoRing, ccAlgoTree}) {
    Group g = Group::InitConfig(nranks, AlgoConfig(algo));
    INFO(g.error);
    REQUIRE(g.status == ccSuccess);
    int k = 0;
    for (const DtypeInfo& dt : SweepDtypes()) {
      for (ccRedOp_t op : {ccSum, ccAvg, ccMax, ccProd}) {
        for (size_t count : {size_t{33}, size_t{1023}, size_t{4099}}) {
          Case c;
          c.dtype = dt.dtype;
          c.op = op;
          c.count = count;
          c.inPlace = (k++ % 2) == 1;
          c.seed = 123 + count;
          std::string err = RunAllReduce(g.comms, c);
          check(Describe("ccAllReduce", nranks, algo == ccAlgoRing ? "ring" : "tree", c), err);
          if (!err.empty()) g = Group::InitConfig(nranks, AlgoConfig(algo));
        }
      }
    }
  }
  Group g = Group::InitAll(nranks);
  REQUIRE(g.status == ccSuccess);
  int k = 0;
  for (const DtypeInfo& dt : SweepDtypes()) {
    for (size_t count : {size_t{33}, size_t{1023}}) {
      Case c;
      c.dtype = dt.dtype;
      c.op = dt.dtype == ccInt32 ? ccMin : ccSum;
      c.count = count;
      c.inPlace = (k++ % 2) == 0;
      c.root = k % nranks;
      c.seed = 321 + count;
      check(Describe("ccReduceScatter", nranks, "ring", c), RunReduceScatter(g.comms, c));
      check(Describe("ccAllGather", nranks, "ring", c), RunAllGather(g.comms, c));
      check(Describe("ccBroadcast", nranks, "ring", c), RunBroadcast(g.comms, c));
      check(Describe("ccReduce", nranks, "ring", c), RunReduce(g.comms, c));
    }
  }
}
