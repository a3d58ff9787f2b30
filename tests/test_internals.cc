// Internals reached through ccoll_static: 16-bit float conversions, the parameter registry, the double binary tree
// and the chains' slices, the bootstrap root under hostile connections, and the in-process transport.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "child_process.h"
#include "collectives/btree.h"
#include "collectives/reduce.h"
#include "collectives/ring.h"
#include "compress/float16.h"
#include "compress/widen.h"
#include "core/bootstrap.h"
#include "core/error.h"
#include "core/job_secret.h"
#include "core/params.h"
#include "core/socket.h"
#include "first_difference.h"
#include "rank_harness.h"
#include "transport/local.h"
#include "transport/wire.h"
#ifdef CCOLL_HAVE_UCX
#include "transport/ucx.h"
#endif

using ccoll::Bf16;
using ccoll::Half;

namespace {

// ------------------------------------------------------------------------------------------------------------
// 16-bit floats. References: GCC's _Float16 (IEEE binary16, round to nearest even) and, for bfloat16, a rounding
// written here with integer arithmetic only.
// ------------------------------------------------------------------------------------------------------------

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
uint16_t RefHalfBits(float f) {
  volatile float v = f;  // keep the conversion at run time (libgcc), not folded by the compiler
  _Float16 h = static_cast<_Float16>(v);
  uint16_t b;
  std::memcpy(&b, &h, sizeof(b));
  return b;
}
float RefHalfToFloat(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, sizeof(h));
  return static_cast<float>(h);
}
bool HalfIsNan(uint16_t b) { return (b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0; }
bool Bf16IsNan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// bfloat16 round-to-nearest-even: pick the nearer of the two neighbouring bfloat16 values by comparing the
// discarded low half with the half-way point; on a tie keep the even one. Rounding up across the largest finite
// value gives the infinity pattern, as IEEE rounding does.
uint16_t RefBf16Bits(float f) {
  uint32_t u = Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffff;  // NaN: callers check NaN-ness, not bits
  uint32_t upper = u >> 16;
  uint32_t lower = u & 0xffffu;
  bool up = lower > 0x8000u || (lower == 0x8000u && (upper & 1u) != 0);
  return static_cast<uint16_t>(up ? upper + 1 : upper);
}

void CheckHalfAgainstGcc(float f, int* failures) {
  uint16_t got = ccoll::FloatToHalf(f).bits;
  uint16_t want = RefHalfBits(f);
  bool ok = std::isnan(f) ? got == 0x7e00 : got == want;  // every NaN becomes the one quiet NaN (float16.h)
  if (!ok && ++*failures <= 10) {
    UNSCOPED_INFO("FloatToHalf(" << f << " = 0x" << std::hex << Bits(f) << ") = 0x" << got << ", want 0x" << want);
  }
}

void CheckBf16AgainstRef(float f, int* failures) {
  uint16_t got = ccoll::FloatToBf16(f).bits;
  uint16_t want = RefBf16Bits(f);
  bool ok = std::isnan(f) ? got == 0x7fc0 : got == want;  // every NaN becomes the one quiet NaN (float16.h)
  if (!ok && ++*failures <= 10) {
    UNSCOPED_INFO("FloatToBf16(" << f << " = 0x" << std::hex << Bits(f) << ") = 0x" << got << ", want 0x" << want);
  }
}

}  // namespace

TEST_CASE("HalfToFloat and FloatToHalf round-trip every binary16 pattern like _Float16", "[internals][float16]") {
  int failures = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = static_cast<uint16_t>(b);
    float got = ccoll::HalfToFloat(Half{h});
    float want = RefHalfToFloat(h);
    if (HalfIsNan(h)) {
      if (!std::isnan(got) && ++failures <= 10) UNSCOPED_INFO("HalfToFloat(0x" << std::hex << b << ") is not NaN");
      if (!HalfIsNan(ccoll::FloatToHalf(got).bits) && ++failures <= 10) {
        UNSCOPED_INFO("NaN 0x" << std::hex << b << " did not stay NaN through a round trip");
      }
      continue;
    }
    if (Bits(got) != Bits(want) && ++failures <= 10) {
      UNSCOPED_INFO("HalfToFloat(0x" << std::hex << b << ") = " << got << ", want " << want);
    }
    uint16_t back = ccoll::FloatToHalf(got).bits;
    if (back != h && ++failures <= 10) {
      UNSCOPED_INFO("FloatToHalf(HalfToFloat(0x" << std::hex << b << ")) = 0x" << back);
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("FloatToHalf rounds to nearest even like _Float16", "[internals][float16]") {
  int failures = 0;
  SECTION("specials") {
    CHECK(ccoll::FloatToHalf(0.0f).bits == 0x0000);
    CHECK(ccoll::FloatToHalf(-0.0f).bits == 0x8000);
    CHECK(ccoll::FloatToHalf(std::numeric_limits<float>::infinity()).bits == 0x7c00);
    CHECK(ccoll::FloatToHalf(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
    CHECK(ccoll::FloatToHalf(65504.0f).bits == 0x7bff);                       // largest finite
    CHECK(ccoll::FloatToHalf(65519.99f).bits == 0x7bff);                      // below the half-way point
    CHECK(ccoll::FloatToHalf(65520.0f).bits == 0x7c00);                       // tie rounds to even: overflow
    CHECK(ccoll::FloatToHalf(std::numeric_limits<float>::max()).bits == 0x7c00);
    CHECK(ccoll::FloatToHalf(-1e30f).bits == 0xfc00);
    CHECK(ccoll::FloatToHalf(std::ldexp(1.0f, -24)).bits == 0x0001);          // smallest subnormal
    CHECK(ccoll::FloatToHalf(std::ldexp(1.0f, -25)).bits == 0x0000);          // tie: to even (zero)
    CHECK(ccoll::FloatToHalf(std::ldexp(1.5f, -25)).bits == 0x0001);          // above the tie
    CHECK(ccoll::FloatToHalf(std::ldexp(3.0f, -25)).bits == 0x0002);          // tie between 1 and 2: even
    CHECK(ccoll::FloatToHalf(-std::ldexp(1.0f, -14)).bits == 0x8400);         // smallest normal
    CHECK(ccoll::FloatToHalf(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
    CHECK(ccoll::FloatToHalf(-std::numeric_limits<float>::denorm_min()).bits == 0x8000);
    CHECK(ccoll::FloatToHalf(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);   // tie: to even (1.0)
    CHECK(ccoll::FloatToHalf(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02);   // tie: to even (1 + 2^-9)
    for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0xff800001u, 0x7f802000u}) {
      uint16_t h = ccoll::FloatToHalf(FromBits(nan)).bits;
      INFO("NaN 0x" << std::hex << nan << " -> 0x" << h);
      CHECK(h == 0x7e00);  // the one quiet NaN, whatever the sign and payload (float16.h)
    }
    for (float f : {1.0f, -2.5f, 3.14159f, 1e-5f, 6e-8f, 5.96e-8f, 2.98e-8f, 1e-40f, 70000.0f, 65535.0f}) {
      CheckHalfAgainstGcc(f, &failures);
    }
  }
  SECTION("every half-way point between neighbouring binary16 values, and its float neighbours") {
    for (uint32_t b = 0; b < 0x7c00; ++b) {  // positive finite; the next pattern is the next value up
      double lo = RefHalfToFloat(static_cast<uint16_t>(b));
      double hi = b + 1 == 0x7c00 ? 65536.0 : RefHalfToFloat(static_cast<uint16_t>(b + 1));
      float mid = static_cast<float>((lo + hi) / 2);  // exact: 12 significant bits
      for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
        CheckHalfAgainstGcc(f, &failures);
        CheckHalfAgainstGcc(-f, &failures);
      }
    }
  }
  SECTION("millions of random floats") {
    std::mt19937_64 rng(12345);
    // Uniform bit patterns: every exponent, NaNs and infinities included.
    for (int i = 0; i < 3000000; ++i) CheckHalfAgainstGcc(FromBits(static_cast<uint32_t>(rng())), &failures);
    // Concentrated on the binary16 range, subnormals included.
    for (int i = 0; i < 3000000; ++i) {
      uint64_t r = rng();
      int exp = static_cast<int>(r % 46) - 28;  // 2^-28 .. 2^17
      float f = std::ldexp(1.0f + static_cast<float>((r >> 8) & 0x7fffff) / 8388608.0f, exp);
      CheckHalfAgainstGcc((r >> 40) & 1 ? -f : f, &failures);
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("bfloat16 conversions round to nearest even", "[internals][float16]") {
  int failures = 0;
  SECTION("every bfloat16 pattern: Bf16ToFloat is the upper half, and converts back unchanged") {
    for (uint32_t b = 0; b < 65536; ++b) {
      float f = ccoll::Bf16ToFloat(Bf16{static_cast<uint16_t>(b)});
      REQUIRE(Bits(f) == b << 16);
      uint16_t back = ccoll::FloatToBf16(f).bits;
      if (Bf16IsNan(static_cast<uint16_t>(b))) {
        if (back != 0x7fc0 && ++failures <= 10) UNSCOPED_INFO("NaN 0x" << std::hex << b << " -> 0x" << back);
      } else if (back != b && ++failures <= 10) {
        UNSCOPED_INFO("FloatToBf16(Bf16ToFloat(0x" << std::hex << b << ")) = 0x" << back);
      }
    }
  }
  SECTION("every tie and its neighbours") {
    for (uint32_t b = 0; b < 65536; ++b) {
      uint32_t mid = (b << 16) | 0x8000u;
      for (uint32_t u : {mid, mid - 1, mid + 1, b << 16 | 0xffffu, b << 16 | 1u}) {
        CheckBf16AgainstRef(FromBits(u), &failures);
      }
    }
  }
  SECTION("specials") {
    CHECK(ccoll::FloatToBf16(0.0f).bits == 0x0000);
    CHECK(ccoll::FloatToBf16(-0.0f).bits == 0x8000);
    CHECK(ccoll::FloatToBf16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
    CHECK(ccoll::FloatToBf16(-std::numeric_limits<float>::infinity()).bits == 0xff80);
    CHECK(ccoll::FloatToBf16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds up past the largest
    CHECK(ccoll::FloatToBf16(FromBits(0x7f7f7fffu)).bits == 0x7f7f);              // stays finite
    CHECK(ccoll::FloatToBf16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
    CHECK(ccoll::FloatToBf16(FromBits(0x00008000u)).bits == 0x0000);  // subnormal tie: to even
    CHECK(ccoll::FloatToBf16(FromBits(0x00018000u)).bits == 0x0002);  // subnormal tie: to even
    for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu}) {
      uint16_t h = ccoll::FloatToBf16(FromBits(nan)).bits;
      INFO("NaN 0x" << std::hex << nan << " -> 0x" << h);
      CHECK(h == 0x7fc0);  // the one quiet NaN, whatever the sign and payload (float16.h)
    }
  }
  SECTION("millions of random floats") {
    std::mt19937_64 rng(777);
    for (int i = 0; i < 4000000; ++i) CheckBf16AgainstRef(FromBits(static_cast<uint32_t>(rng())), &failures);
  }
  CHECK(failures == 0);
}

TEST_CASE("max and min of floats are IEEE maximum and minimum: commutative and associative to the bit",
          "[internals][reduce]") {
  // Per dtype: four NaNs (quiet, negative, signalling, with a payload), then seven values in increasing order:
  // -inf, -1.5, -0, +0, the smallest subnormal, 1, +inf. The expected NaN is the type's one quiet NaN.
  struct Type {
    ccDataType_t dtype;
    size_t size;
    std::vector<uint64_t> nans, ordered;
    uint64_t quietNan;
  };
  const Type types[] = {
      {ccFloat32, 4, {0x7fc00000, 0xffc00000, 0x7f800001, 0xffc00123},
       {0xff800000, 0xbfc00000, 0x80000000, 0, 1, 0x3f800000, 0x7f800000}, 0x7fc00000},
      {ccFloat64, 8, {0x7ff8000000000000, 0xfff8000000000000, 0x7ff0000000000001, 0xfff8000000000123},
       {0xfff0000000000000, 0xbff8000000000000, 0x8000000000000000, 0, 1, 0x3ff0000000000000, 0x7ff0000000000000},
       0x7ff8000000000000},
      {ccFloat16, 2, {0x7e00, 0xfe00, 0x7c01, 0xfe23}, {0xfc00, 0xbe00, 0x8000, 0, 1, 0x3c00, 0x7c00}, 0x7e00},
      {ccBfloat16, 2, {0x7fc0, 0xffc0, 0x7f81, 0xffc3}, {0xff80, 0xbfc0, 0x8000, 0, 1, 0x3f80, 0x7f80}, 0x7fc0},
  };
  for (const Type& t : types) {
    std::vector<uint64_t> all = t.nans;
    all.insert(all.end(), t.ordered.begin(), t.ordered.end());
    const size_t nanCount = t.nans.size();
    for (ccRedOp_t op : {ccMax, ccMin}) {
      INFO("dtype " << t.dtype << (op == ccMax ? " max" : " min"));
      auto apply = [&](uint64_t a, uint64_t b) {
        uint64_t out = 0;
        ccoll::ReduceHost(&out, &a, &b, 1, t.dtype, op);  // little-endian: the low bytes are the element
        return t.size == 8 ? out : out & ((uint64_t{1} << (8 * t.size)) - 1);
      };
      int failures = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        for (size_t j = 0; j < all.size(); ++j) {
          uint64_t want = t.quietNan;
          if (i >= nanCount && j >= nanCount) {
            const size_t lo = std::min(i, j), hi = std::max(i, j);
            want = all[op == ccMax ? hi : lo];
          }
          const uint64_t got = apply(all[i], all[j]);
          if (got != want && ++failures <= 10) {
            UNSCOPED_INFO(std::hex << "op(0x" << all[i] << ", 0x" << all[j] << ") = 0x" << got << ", want 0x" << want);
          }
          for (uint64_t c : all) {  // associative: (a op b) op c == a op (b op c)
            const uint64_t left = apply(got, c), right = apply(all[i], apply(all[j], c));
            if (left != right && ++failures <= 10) {
              UNSCOPED_INFO(std::hex << "(0x" << all[i] << " op 0x" << all[j] << ") op 0x" << c << " = 0x" << left
                                     << ", but 0x" << all[i] << " op (0x" << all[j] << " op 0x" << c << ") = 0x"
                                     << right);
            }
          }
        }
      }
      CHECK(failures == 0);
    }
  }
}

namespace {

// One element at a time, through references independent of float16.h: _Float16 (libgcc) for binary16, the integer
// rounding above for bfloat16; float arithmetic in between, each operation rounded to float as the library's is.
// Every NaN is the type's one quiet NaN.
struct Ref16 {
  ccDataType_t dtype;
  float Load(uint16_t b) const { return dtype == ccFloat16 ? RefHalfToFloat(b) : FromBits(uint32_t{b} << 16); }
  uint16_t Store(float f) const {
    if (std::isnan(f)) return dtype == ccFloat16 ? 0x7e00 : 0x7fc0;
    return dtype == ccFloat16 ? RefHalfBits(f) : RefBf16Bits(f);
  }
};

// Every 16-bit pattern in a (and again, shifted), against a permutation of them in b: count is not a multiple of
// any vector width, and the buffers start one element past an alignment.
struct Patterns16 {
  static constexpr size_t kCount = 65536 * 2 + 7;
  std::vector<uint16_t> aStore = std::vector<uint16_t>(kCount + 1), bStore = aStore, outStore = aStore;
  uint16_t* a = aStore.data() + 1;
  uint16_t* b = bStore.data() + 1;
  uint16_t* out = outStore.data() + 1;
  Patterns16() {
    for (size_t i = 0; i < kCount; ++i) {
      a[i] = static_cast<uint16_t>(i < 65536 ? i : i * 7 + 3);
      b[i] = static_cast<uint16_t>(i * 40503u + 12345u);
    }
  }
};

}  // namespace

TEST_CASE("the host loops of 16-bit floats (vectorized, and an AVX2 clone where the CPU has it) give the bytes of "
          "the element math one element at a time", "[internals][float16][reduce]") {
  for (ccDataType_t dtype : {ccFloat16, ccBfloat16}) {
    const Ref16 ref{dtype};
    Patterns16 p;
    const size_t n = Patterns16::kCount;
    int failures = 0;
    auto expect = [&](const char* what, size_t i, uint16_t got, uint16_t want) {
      if (got != want && ++failures <= 10) {
        UNSCOPED_INFO(ccoll::DataTypeName(dtype) << " " << what << " at " << i << " (a 0x" << std::hex << p.a[i]
                      << ", b 0x" << p.b[i] << "): 0x" << got << ", want 0x" << want);
      }
    };
    for (ccRedOp_t op : {ccSum, ccProd}) {
      for (int inPlace : {0, 1, 2}) {  // dst separate, dst == a, dst == b
        uint16_t* dst = p.out;
        if (inPlace > 0) {
          std::copy(inPlace == 1 ? p.a : p.b, (inPlace == 1 ? p.a : p.b) + n, p.out);
        }
        ccoll::ReduceHost(dst, inPlace == 1 ? dst : p.a, inPlace == 2 ? dst : p.b, n, dtype, op);
        for (size_t i = 0; i < n; ++i) {
          const float x = ref.Load(p.a[i]), y = ref.Load(p.b[i]);
          expect(op == ccSum ? "sum" : "prod", i, p.out[i], ref.Store(op == ccSum ? x + y : x * y));
        }
      }
    }
    for (int nranks : {3, 4, 7}) {
      const float factor = ref.Load(ref.Store(static_cast<float>(1.0 / nranks)));
      ccoll::PremultiplyHost(p.out, p.a, n, dtype, nranks);
      for (size_t i = 0; i < n; ++i) expect("premultiply", i, p.out[i], ref.Store(ref.Load(p.a[i]) * factor));
      ccoll::ReducePremultipliedHost(p.out, p.a, p.b, n, dtype, nranks);
      for (size_t i = 0; i < n; ++i) {
        volatile float scaled = ref.Load(p.a[i]) * factor;  // not contracted with the sum
        expect("premultiplied sum", i, p.out[i], ref.Store(scaled + ref.Load(p.b[i])));
      }
    }
    std::vector<float> wide(n + 1), lost(n + 1);
    ccoll::Widen(dtype, p.a, n, wide.data() + 1);
    for (size_t i = 0; i < n; ++i) {
      const float want = ref.Load(p.a[i]);
      const bool same = std::isnan(want) ? std::isnan(wide[i + 1]) : Bits(wide[i + 1]) == Bits(want);
      if (!same && ++failures <= 10) UNSCOPED_INFO("Widen at " << i << ": " << wide[i + 1] << ", want " << want);
    }
    // Floats to narrow: sums of neighbouring patterns (ties and near-ties of the 16-bit grid among them) and random
    // bit patterns (every exponent, NaNs and infinities).
    std::mt19937 rng(7);
    std::vector<float> local(n);
    for (size_t i = 0; i < n; ++i) {
      local[i] = i % 2 ? FromBits(static_cast<uint32_t>(rng())) : (ref.Load(p.a[i]) + ref.Load(p.b[i])) * 0.5f;
    }
    ccoll::Narrow(dtype, local.data(), n, p.out);
    for (size_t i = 0; i < n; ++i) expect("Narrow", i, p.out[i], ref.Store(local[i]));
    const void* in[2] = {p.a, p.b};
    for (int nin = 0; nin <= 2; ++nin) {
      for (bool record : {false, true}) {
        ccoll::NarrowSum(dtype, local.data(), in, nin, n, p.out, record ? lost.data() : nullptr);
        for (size_t i = 0; i < n; ++i) {
          float v = local[i];
          if (nin > 0) v += ref.Load(p.a[i]);
          if (nin > 1) v += ref.Load(p.b[i]);
          expect("NarrowSum", i, p.out[i], ref.Store(v));
          if (!record) continue;
          const float want = v - ref.Load(ref.Store(v));
          const bool same = std::isnan(want) ? std::isnan(lost[i]) : Bits(lost[i]) == Bits(want);
          if (!same && ++failures <= 10) UNSCOPED_INFO("NarrowSum's lost at " << i << ": " << lost[i] << ", want "
                                                       << want);
        }
      }
    }
    // NarrowingLoss: what narrowing rounds away, scaled or not, written or added to what is there.
    for (float share : {1.0f, 0.25f, 1.0f / 3.0f}) {
      for (bool add : {false, true}) {
        std::vector<float> acc(n);
        for (size_t i = 0; i < n; ++i) acc[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 1e-3f;
        const std::vector<float> before = acc;
        ccoll::NarrowingLoss(dtype, local.data(), n, share, add, acc.data());
        for (size_t i = 0; i < n; ++i) {
          float l = local[i] - ref.Load(ref.Store(local[i]));
          if (share != 1.0f) l *= share;
          if (!std::isfinite(l)) l = 0.0f;  // an overflow to infinity (or a non-finite value) keeps nothing
          const float want = add ? before[i] + l : l;
          const bool same = std::isnan(want) ? std::isnan(acc[i]) : Bits(acc[i]) == Bits(want);
          if (!same && ++failures <= 10) {
            UNSCOPED_INFO("NarrowingLoss (share " << share << ", add " << add << ") at " << i << ": " << acc[i]
                          << ", want " << want);
          }
        }
      }
      // NarrowKeeping: the narrowed values, and what that rounds away, scaled, added where finite, non-finite sums
      // dropped (a memory holding a huge value makes some overflow).
      std::vector<float> memory(n);
      for (size_t i = 0; i < n; ++i) {
        memory[i] = i % 11 == 5 ? 3e38f : static_cast<float>(static_cast<int>(i % 7) - 3) * 1e-3f;
      }
      std::vector<float> kept = memory;
      std::vector<uint16_t> narrowed(n);
      ccoll::NarrowKeeping(dtype, local.data(), n, share, kept.data(), narrowed.data());
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = ref.Store(local[i]);
        const float l = (local[i] - ref.Load(h)) * share;
        const float sum = memory[i] + (std::isfinite(l) ? l : 0.0f);
        const float want = std::isfinite(sum) ? sum : 0.0f;
        if ((narrowed[i] != h || Bits(kept[i]) != Bits(want)) && ++failures <= 10) {
          UNSCOPED_INFO("NarrowKeeping (share " << share << ") at " << i << ": " << narrowed[i] << " and " << kept[i]
                        << ", want " << h << " and " << want);
        }
      }
    }
    CHECK(failures == 0);
  }
}

// ------------------------------------------------------------------------------------------------------------
// Parameter registry.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("ParseSize", "[internals][params]") {
  int64_t v = -7;
  CHECK(ccoll::ParseSize("64K", &v));
  CHECK(v == 65536);
  CHECK(ccoll::ParseSize("1M", &v));
  CHECK(v == 1048576);
  CHECK(ccoll::ParseSize("2G", &v));
  CHECK(v == 2147483648LL);
  CHECK(ccoll::ParseSize("12", &v));
  CHECK(v == 12);
  CHECK(ccoll::ParseSize("0", &v));
  CHECK(v == 0);
  CHECK(ccoll::ParseSize("3k", &v));
  CHECK(v == 3072);
  v = 99;
  CHECK_FALSE(ccoll::ParseSize("", &v));
  CHECK_FALSE(ccoll::ParseSize(nullptr, &v));
  CHECK_FALSE(ccoll::ParseSize("x", &v));
  CHECK_FALSE(ccoll::ParseSize("-1", &v));
  CHECK_FALSE(ccoll::ParseSize("12Q", &v));
  CHECK_FALSE(ccoll::ParseSize("1KB", &v));
  CHECK_FALSE(ccoll::ParseSize("K", &v));
  CHECK_FALSE(ccoll::ParseSize("99999999999999999999", &v));  // does not fit in 64 bits
  CHECK_FALSE(ccoll::ParseSize("9000000000G", &v));           // overflows after the multiplier
  CHECK(v == 99);                                             // untouched on failure
}

TEST_CASE("the parameter registry lists every name once, and PrintParams prints them all", "[internals][params]") {
  std::set<std::string> names;
  int rows = 0;
  for (const ccoll::ParamDef* p = ccoll::ParamTable(); p->name != nullptr; ++p, ++rows) {
    INFO(p->name);
    CHECK(names.insert(p->name).second);
    CHECK(std::string(p->name).rfind("CC_", 0) == 0);
    REQUIRE(p->defaultValue != nullptr);
    REQUIRE(p->doc != nullptr);
    CHECK(std::strlen(p->doc) > 0);
    if (p->type == ccoll::ParamType::kInt && std::getenv(p->name) == nullptr) {
      // With the variable unset, ParamInt is the documented default ("64K" style sizes or plain integers).
      int64_t want = 0;
      if (!ccoll::ParseSize(p->defaultValue, &want)) {
        char* end = nullptr;
        want = std::strtoll(p->defaultValue, &end, 10);
        CHECK(*end == '\0');
      }
      INFO("default \"" << p->defaultValue << "\"");
      CHECK(ccoll::ParamInt(p->name) == want);
    }
  }
  CHECK(rows == static_cast<int>(names.size()));
  for (const char* expected : {"CC_DEBUG", "CC_DEBUG_SUBSYS", "CC_DEBUG_FILE", "CC_TRANSPORT", "CC_ALGO",
                               "CC_TIMEOUT_MS", "CC_BLOCKING", "CC_SLICE_BYTES", "CC_TREE_DEPTH", "CC_RING_DEPTH",
                               "CC_TREE_THRESHOLD", "CC_SOCKET_IFNAME"}) {
    INFO(expected);
    CHECK(names.count(expected) == 1);
  }

  FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  ccoll::PrintParams(f);
  std::rewind(f);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  for (const std::string& name : names) {
    INFO(name);
    CHECK(text.find(name) != std::string::npos);
  }
}

// ------------------------------------------------------------------------------------------------------------
// The chains' slices.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("ChainSliceElems: between processes 32 (n - 2) slices per call, between 64 KiB and CC_SLICE_BYTES",
          "[internals][slice]") {
  using ccoll::ChainSliceElems;
  const size_t kib = 1024, def = 256 * kib;
  // Four ranks, float32: the call's bytes / 64, from 64 KiB up to the configured slice.
  CHECK(ChainSliceElems(def, 4, true, 64 * kib, 4) == 16 * kib);         // 256 KiB: 4 slices of 64 KiB
  CHECK(ChainSliceElems(def, 4, true, 1024 * kib, 4) == 16 * kib);       // 4 MiB: 64 slices of 64 KiB
  CHECK(ChainSliceElems(def, 4, true, 2048 * kib, 4) == 32 * kib);       // 8 MiB: 64 slices of 128 KiB
  CHECK(ChainSliceElems(def, 4, true, 4096 * kib, 4) == 64 * kib);       // 16 MiB: 64 slices of 256 KiB
  CHECK(ChainSliceElems(def, 4, true, 64 * 1024 * kib, 4) == 64 * kib);  // never above the configured slice
  CHECK(ChainSliceElems(def, 3, true, 512 * kib, 8) == 16 * kib);        // 3 ranks, float64: 4 MiB / 32 = 128 KiB
  CHECK(ChainSliceElems(def, 3, true, 128 * kib, 8) == 8 * kib);         // 1 MiB / 32 is below 64 KiB
  CHECK(ChainSliceElems(def, 10, true, 8192 * kib, 2) == 32 * kib);      // 10 ranks, 16-bit: 16 MiB / 256 = 64 KiB
  // One hop (two ranks) has no pipeline to fill; a configured slice below 64 KiB is kept as it is.
  CHECK(ChainSliceElems(def, 2, true, 64 * kib, 4) == 64 * kib);
  CHECK(ChainSliceElems(64, 4, true, 1024 * kib, 4) == 16);
  CHECK(ChainSliceElems(8, 4, true, 1, 8) == 1);
  // Thread ranks of one process keep the configured slice.
  CHECK(ChainSliceElems(def, 4, false, 64 * kib, 4) == 64 * kib);
  CHECK(ChainSliceElems(def, 8, false, 1, 1) == def);
  // Every count and rank count gives a slice of at least one element and at most the configured one.
  for (int n : {1, 2, 3, 4, 7, 64}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{1} << 20, size_t{1} << 30}) {
      const size_t s = ChainSliceElems(def, n, true, count, 2);
      INFO("n " << n << " count " << count);
      CHECK(s >= 1);
      CHECK(s <= def / 2);
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// Double binary tree.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("DoubleBinaryTree gives two valid trees for 1..64 ranks", "[internals][btree]") {
  for (int n = 1; n <= 64; ++n) {
    std::vector<ccoll::TreeNode> nodes[2];
    for (int t = 0; t < 2; ++t) nodes[t].resize(n);
    for (int r = 0; r < n; ++r) {
      ccoll::TreeNode pair[2];
      ccoll::DoubleBinaryTree(n, r, pair);
      nodes[0][r] = pair[0];
      nodes[1][r] = pair[1];
    }
    for (int t = 0; t < 2; ++t) {
      INFO("nranks " << n << " tree " << t);
      const auto& tree = nodes[t];
      int root = -1, roots = 0;
      bool linksOk = true;
      std::string why;
      for (int r = 0; r < n; ++r) {
        const ccoll::TreeNode& node = tree[r];
        if (node.parent == -1) {
          ++roots;
          root = r;
        } else if (node.parent < 0 || node.parent >= n || node.parent == r) {
          linksOk = false;
          why = "rank " + std::to_string(r) + " has parent " + std::to_string(node.parent);
        } else {
          const ccoll::TreeNode& p = tree[node.parent];
          if (p.children[0] != r && p.children[1] != r) {
            linksOk = false;
            why = "rank " + std::to_string(r) + " is not a child of its parent " + std::to_string(node.parent);
          }
        }
        for (int c = 0; c < 2; ++c) {
          int child = node.children[c];
          if (child == -1) continue;
          if (child < 0 || child >= n || child == r || tree[child].parent != r) {
            linksOk = false;
            why = "rank " + std::to_string(r) + " has child " + std::to_string(child) + " whose parent is not it";
          }
        }
        if (node.children[0] != -1 && node.children[0] == node.children[1]) {
          linksOk = false;
          why = "rank " + std::to_string(r) + " lists one child twice";
        }
      }
      CHECK(roots == 1);
      INFO(why);
      CHECK(linksOk);
      if (roots != 1 || !linksOk) continue;
      CHECK(tree[root].depth == 0);
      // Every rank is reachable from the root, once, and depths grow by one per level.
      std::vector<int> seen(n, 0);
      std::queue<int> q;
      q.push(root);
      int visited = 0;
      bool depthsOk = true;
      while (!q.empty()) {
        int r = q.front();
        q.pop();
        if (seen[r]++) continue;
        ++visited;
        for (int child : tree[r].children) {
          if (child < 0) continue;
          if (tree[child].depth != tree[r].depth + 1) depthsOk = false;
          q.push(child);
        }
      }
      CHECK(visited == n);
      CHECK(depthsOk);
      // Balanced: the depth is within one of the minimum for a binary tree of n nodes.
      int maxDepth = 0;
      for (const auto& node : tree) maxDepth = std::max(maxDepth, node.depth);
      CHECK(maxDepth <= static_cast<int>(std::floor(std::log2(n))) + 1);
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// Bootstrap root under garbage connections.
// ------------------------------------------------------------------------------------------------------------

namespace {

// The rank -> root hello as the protocol lays it out (src/core/bootstrap.cc, HelloHeader).
struct WireHello {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[ccoll::kSecretBytes];
  int32_t rank;
  int32_t nranks;
  uint32_t infoLen;
  uint32_t reserved;
};

int ConnectTo(const ccoll::SocketAddress& addr) {
  int fd = -1;
  if (ccoll::Connect(addr, ccoll::DeadlineIn(5000), &fd) != ccSuccess) return -1;
  return fd;
}

void SendRaw(int fd, const void* p, size_t n) {
  // The root may close on us at any point: never raise SIGPIPE, ignore errors.
  (void)::send(fd, p, n, MSG_NOSIGNAL);
}

// Starts a bootstrap root in this process that waits `timeoutMs` for each round, and returns its id's content (the
// root's address and the secret), for ranks and hand-made connections to join it.
ccoll::UniqueIdContent StartRoot(int timeoutMs) {
  ccUniqueId id;
  REQUIRE(ccoll::BootstrapStartRoot(nullptr, nullptr, timeoutMs, &id) == ccSuccess);
  ccoll::UniqueIdContent content;
  REQUIRE(ccoll::BootstrapParseId(id, &content) == ccSuccess);
  return content;
}

}  // namespace

TEST_CASE("the bootstrap root ignores garbage connections while real ranks join", "[internals][bootstrap]") {
  const ccoll::UniqueIdContent content = StartRoot(30000);

  std::vector<int> garbage;
  std::mt19937_64 rng(99);
  {  // random bytes
    int fd = ConnectTo(content.root);
    REQUIRE(fd >= 0);
    std::vector<uint8_t> junk(8192);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    junk[0] = 0x00;  // not the magic
    SendRaw(fd, junk.data(), junk.size());
    garbage.push_back(fd);
  }
  auto hello = [&](bool rightSecret, int32_t rank, int32_t nranks, uint32_t infoLen) {
    WireHello h{};
    h.magic = ccoll::kBootstrapMagic;
    h.version = ccoll::kBootstrapVersion;
    std::memcpy(h.secret, content.secret, sizeof(h.secret));
    if (!rightSecret) h.secret[5] ^= 0x40;
    h.rank = rank;
    h.nranks = nranks;
    h.infoLen = infoLen;
    return h;
  };
  {  // a well-formed hello with a wrong secret, claiming rank 0 of a 3-rank group
    int fd = ConnectTo(content.root);
    REQUIRE(fd >= 0);
    WireHello h = hello(false, 0, 3, 4);
    SendRaw(fd, &h, sizeof(h));
    SendRaw(fd, "evil", 4);
    garbage.push_back(fd);
  }
  {  // the right magic but a wrong version
    int fd = ConnectTo(content.root);
    REQUIRE(fd >= 0);
    WireHello h = hello(true, 1, 3, 0);
    h.version = 999;
    SendRaw(fd, &h, sizeof(h));
    garbage.push_back(fd);
  }
  {  // connects and stays silent (half-open from the root's view)
    int fd = ConnectTo(content.root);
    REQUIRE(fd >= 0);
    garbage.push_back(fd);
  }
  {  // half a header, then silence
    int fd = ConnectTo(content.root);
    REQUIRE(fd >= 0);
    WireHello h = hello(true, 2, 3, 0);
    SendRaw(fd, &h, sizeof(h) / 2);
    garbage.push_back(fd);
  }
  {  // connects and closes at once
    int fd = ConnectTo(content.root);
    REQUIRE(fd >= 0);
    ccoll::CloseFd(fd);
  }
  {  // connects, shuts down its sending side, keeps reading
    int fd = ConnectTo(content.root);
    REQUIRE(fd >= 0);
    ::shutdown(fd, SHUT_WR);
    garbage.push_back(fd);
  }
  // Give the root time to accept them all before the real ranks arrive.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  constexpr int kRanks = 3;
  std::vector<std::string> blobs(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    blobs[r] = r == 2 ? std::string() : std::string(100 + 1000 * r, static_cast<char>('a' + r));
    if (!blobs[r].empty()) blobs[r][0] = static_cast<char>(r);
  }
  std::vector<std::vector<std::string>> got(kRanks);
  std::vector<cctest::RankResult> results(kRanks);
  auto start = std::chrono::steady_clock::now();
  cctest::RunRanks(kRanks, [&](int r) {
    ccResult_t rc = ccoll::BootstrapAllGather(content, r, kRanks, blobs[r], 20000, &got[r]);
    results[r].rc = rc;
    if (rc != ccSuccess) results[r].error = ccoll::LastError();
  });
  double seconds = cctest::SecondsSince(start);
  // Another connection during the exchange: too late to matter, must not crash anything.
  for (int fd : garbage) ccoll::CloseFd(fd);

  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ": " << results[r].error);
    REQUIRE(results[r].rc == ccSuccess);
    REQUIRE(got[r].size() == static_cast<size_t>(kRanks));
    for (int q = 0; q < kRanks; ++q) CHECK(got[r][q] == blobs[q]);
  }
  CHECK(seconds < 5.0);  // the silent connections must not hold the real ranks up
}

// A root on a host that drops connection requests (a firewall, a host that died): a listener that never accepts, its
// accept queue full, so the kernel drops further SYNs. A blocking connect() would sit out the kernel's SYN retries
// (about two minutes) whatever the deadline, and an abort of a non-blocking init would wait for it.
TEST_CASE("Connect to a host that drops connection requests gives up at the deadline, and at once on a cancel",
          "[internals][bootstrap]") {
  ccoll::SocketAddress addr{};
  addr.family = AF_INET;
  addr.addr[0] = 127;
  addr.addr[3] = 1;
  int listener = -1;
  REQUIRE(ccoll::Listen(&addr, &listener) == ccSuccess);
  REQUIRE(::listen(listener, 0) == 0);  // the smallest accept queue
  // Fill the queue: connections complete until it is full; the first that does not within 300 ms shows it is.
  std::vector<int> fillers;
  bool full = false;
  while (!full && fillers.size() < 64) {
    int fd = -1;
    const ccResult_t rc = ccoll::Connect(addr, ccoll::DeadlineIn(static_cast<int64_t>(300 * cctest::TimeScale())), &fd);
    if (rc == ccSuccess) {
      fillers.push_back(fd);
    } else {
      INFO(ccoll::LastError());
      REQUIRE(rc == ccTimeout);
      full = true;
    }
  }
  REQUIRE(full);
  {
    int fd = -1;
    const auto start = std::chrono::steady_clock::now();
    const ccResult_t rc = ccoll::Connect(addr, ccoll::DeadlineIn(700), &fd);
    const double seconds = cctest::SecondsSince(start);
    INFO(ccoll::LastError() << " after " << seconds << " s");
    CHECK(rc == ccTimeout);
    CHECK(seconds >= 0.6);
    CHECK(seconds < 0.7 + 2.0 * cctest::TimeScale());
    if (rc == ccSuccess) ccoll::CloseFd(fd);
  }
  {
    std::atomic<bool> cancel{false};
    int fd = -1;
    ccResult_t rc = ccSuccess;
    double seconds = 0.0;
    std::thread connecting([&] {
      const auto start = std::chrono::steady_clock::now();
      rc = ccoll::Connect(addr, ccoll::DeadlineIn(60000), &fd, &cancel);
      seconds = cctest::SecondsSince(start);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
    connecting.join();
    INFO("after " << seconds << " s");
    CHECK(rc == ccRemoteError);
    CHECK(seconds < 0.2 + 2.0 * cctest::TimeScale());
    if (rc == ccSuccess) ccoll::CloseFd(fd);
  }
  for (int fd : fillers) ccoll::CloseFd(fd);
  ccoll::CloseFd(listener);
}

// A rank turned away (another nranks, another secret) is told why at once; the ranks that wait for the group learn it
// from the root's verdict when the group does not form, instead of a bare "did not join".
TEST_CASE("the bootstrap root turns away a rank of another size or secret, and the waiting ranks hear of it",
          "[internals][bootstrap]") {
  const double scale = cctest::TimeScale();
  const ccoll::UniqueIdContent content = StartRoot(static_cast<int>(2000 * scale));
  ccoll::UniqueIdContent stranger = content;
  stranger.secret[3] ^= 1;
  std::vector<std::string> got;
  std::string zero, wrongSize, wrongSecret;
  // A stranger first, claiming a group of 3: turned away, it must not set the group's size.
  CHECK(ccoll::BootstrapAllGather(stranger, 1, 3, "one", 20000, &got) == ccInvalidUsage);
  wrongSecret = ccoll::LastError();
  ccResult_t rcZero = ccSuccess;
  std::thread rank0([&] {
    rcZero = ccoll::BootstrapAllGather(content, 0, 2, "zero", 20000, &got);
    zero = ccoll::LastError();
  });
  // The root takes the group's size from the first hello that knows the secret: rank 0's, which a thread sends at
  // once (this waits a tenth of the root's time for it; the rejected ranks are answered at once, within that time).
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(200 * scale)));
  CHECK(ccoll::BootstrapAllGather(content, 1, 3, "one", 20000, &got) == ccInvalidUsage);
  wrongSize = ccoll::LastError();
  rank0.join();
  INFO(wrongSize);
  INFO(wrongSecret);
  INFO(zero);
  CHECK(wrongSize.find("turned this rank away: it announced nranks 3, the group has 2 ranks") != std::string::npos);
  CHECK(wrongSecret.find("turned this rank away: its secret differs") != std::string::npos);
  CHECK(wrongSecret.find("this rank's secret: a hash of") == std::string::npos);  // a unique id's, not the job's
  CHECK(rcZero == ccTimeout);
  CHECK(zero.find("rank 1 of 2 did not join") != std::string::npos);
  CHECK(zero.find("turned away: a rank 1 (another secret), a rank 1 (nranks 3)") != std::string::npos);
}

namespace {

// The sockets among this process's open file descriptors.
int CountSockets() {
  int sockets = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    char link[64], target[64];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0 && std::strncmp(target, "socket:", 7) == 0) ++sockets;
  }
  return sockets;
}

}  // namespace

// Run by the case below in a child process, whose file descriptors it uses up.
TEST_CASE("emfile_child: the bootstrap root out of file descriptors", "[.][emfile_child]") {
  const int timeoutMs = static_cast<int>(3000 * cctest::TimeScale());
  const ccoll::UniqueIdContent content = StartRoot(timeoutMs);
  std::vector<std::string> got0, got1;
  std::string error0;
  ccResult_t rc0 = ccSuccess;
  std::thread rank0([&] {
    rc0 = ccoll::BootstrapAllGather(content, 0, 2, "zero", timeoutMs, &got0);
    error0 = ccoll::LastError();
  });
  // Rank 0 joins while descriptors are left: once the root has accepted it, the process holds three sockets (the
  // listener, rank 0's end, the root's end).
  const auto start = std::chrono::steady_clock::now();
  while (CountSockets() < 3 && cctest::SecondsSince(start) < 20 * cctest::TimeScale()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(CountSockets() == 3);
  // Rank 1's thread starts now and connects once the descriptors are used up: UBSan's check of a new thread's
  // object needs a pipe, and reports a false "invalid vptr" without one.
  std::atomic<bool> full{false};
  ccResult_t rc1 = ccSuccess;
  std::thread rank1([&] {
    while (!full.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    rc1 = ccoll::BootstrapAllGather(content, 1, 2, "one", timeoutMs, &got1);
  });
  rlimit lim{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &lim) == 0);
  lim.rlim_cur = std::min<rlim_t>(lim.rlim_cur, 1024);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &lim) == 0);
  std::vector<int> filler;
  for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(fd);
  REQUIRE(errno == EMFILE);
  close(filler.back());  // one for rank 1's socket: the root cannot accept its connection
  filler.pop_back();
  full = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  getrusage(RUSAGE_SELF, &after);
  auto ms = [](const rusage& u) {
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000.0 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1000.0;
  };
  rank0.join();
  rank1.join();
  for (int fd : filler) close(fd);
  std::printf("cpu %.0f ms in 1500 ms out of descriptors; rank 0: %d %s; rank 1: %d\n", ms(after) - ms(before),
              static_cast<int>(rc0), error0.c_str(), static_cast<int>(rc1));
}

// A connection the root cannot accept (no file descriptor left) stays queued and keeps the listener readable: the root
// rests the listener 100 ms at a time rather than fail to accept at full speed, a core busy until its timeout, and
// its verdict to the ranks that joined says why the others did not.
TEST_CASE("the bootstrap root out of file descriptors waits without spinning and says so", "[internals][bootstrap]") {
  bool died = true;
  const std::string out = cctest::RunHiddenCase("emfile_child: the bootstrap root out of file descriptors",
                                                "timeout 120", &died);
  INFO(out);
  CHECK(!died);
  const size_t at = out.find("cpu ");
  REQUIRE(at != std::string::npos);
  CHECK(std::atof(out.c_str() + at + 4) < 300);  // spinning took about a core: 1500 ms
  CHECK(out.find("rank 0: 8 ") != std::string::npos);  // ccTimeout
  CHECK(out.find("rank 1 of 2 did not join") != std::string::npos);
  CHECK(out.find("the root could not accept connections for a while: Too many open files") != std::string::npos);
}

// A rank of another ccoll version (another bootstrap protocol) is told so in the reply's first 16 bytes, which every
// version shares, rather than dropped unanswered ("no answer from the bootstrap root ... did every rank start?").
TEST_CASE("the bootstrap root answers a rank of another protocol version in the layout every version reads",
          "[internals][bootstrap]") {
  const ccoll::UniqueIdContent content = StartRoot(static_cast<int>(5000 * cctest::TimeScale()));
  const int fd = ConnectTo(content.root);
  REQUIRE(fd >= 0);
  WireHello h{};
  h.magic = ccoll::kBootstrapMagic;
  h.version = 1;
  std::memcpy(h.secret, content.secret, sizeof(h.secret));
  h.rank = 0;
  h.nranks = 1;
  h.infoLen = 3;
  SendRaw(fd, &h, sizeof(h));
  SendRaw(fd, "old", 3);
  uint32_t prefix[4] = {};  // magic, status, nranks, textLen
  REQUIRE(ccoll::RecvAll(fd, prefix, sizeof(prefix), ccoll::DeadlineIn(10000), "reply") == ccSuccess);
  CHECK(prefix[0] == ccoll::kBootstrapMagic);
  CHECK(prefix[1] == static_cast<uint32_t>(ccInvalidUsage));
  REQUIRE(prefix[3] <= 512);
  std::string text(prefix[3], '\0');
  REQUIRE(ccoll::RecvAll(fd, &text[0], text.size(), ccoll::DeadlineIn(10000), "reply") == ccSuccess);
  CHECK(text == "the ranks run different ccoll versions: bootstrap protocol 1 at this rank, " +
                    std::to_string(ccoll::kBootstrapVersion) + " at the root");
  ccoll::CloseFd(fd);
  // It did not join: a rank of this version is rank 0 of its own group of 1.
  std::vector<std::string> got;
  CHECK(ccoll::BootstrapAllGather(content, 0, 1, "new", 10000, &got) == ccSuccess);
  CHECK(got == std::vector<std::string>{"new"});
}

namespace {

// JobSecret with exactly these variables set; returns its source and fills *secret.
std::string SecretWith(std::initializer_list<std::pair<const char*, const char*>> set, std::string* secret) {
  const std::map<std::string, std::string> env(set.begin(), set.end());
  uint8_t bytes[ccoll::kSecretBytes];
  const std::string source = ccoll::JobSecret(bytes, [&](const char* name) {
    const auto it = env.find(name);
    return it != env.end() ? it->second : std::string();
  });
  secret->assign(reinterpret_cast<const char*>(bytes), sizeof(bytes));
  return source;
}

}  // namespace

TEST_CASE("JobSecret: CC_SECRET, then CC_JOB_ID, then the process launcher's job id, then the allocation's",
          "[internals][bootstrap]") {
  std::string a, b;
  CHECK(SecretWith({}, &a) == "");
  CHECK(a == std::string(ccoll::kSecretBytes, '\0'));
  // CC_SECRET whole: strings that share their first 16 bytes differ.
  CHECK(SecretWith({{"CC_SECRET", "0123456789abcdef-one"}}, &a) == "CC_SECRET");
  CHECK(SecretWith({{"CC_SECRET", "0123456789abcdef-two"}}, &b) == "CC_SECRET");
  CHECK(a != b);
  CHECK(a != std::string(ccoll::kSecretBytes, '\0'));
  CHECK(SecretWith({{"CC_SECRET", "s"}, {"CC_JOB_ID", "j"}, {"PMIX_NAMESPACE", "p"}}, &a) == "CC_SECRET");
  CHECK(SecretWith({{"CC_JOB_ID", "j"}, {"TORCHELASTIC_RUN_ID", "t"}}, &a) == "CC_JOB_ID");
  // One value under two sources is two secrets.
  CHECK(SecretWith({{"TORCHELASTIC_RUN_ID", "j"}}, &b) == "TORCHELASTIC_RUN_ID");
  CHECK(SecretWith({{"CC_JOB_ID", "j"}}, &a) == "CC_JOB_ID");
  CHECK(a != b);
  // torchrun's default run id names no job: every plain torchrun job has it.
  CHECK(SecretWith({{"TORCHELASTIC_RUN_ID", "none"}}, &a) == "");
  CHECK(SecretWith({{"TORCHELASTIC_RUN_ID", "none"}, {"PMIX_NAMESPACE", "p"}}, &a) == "PMIX_NAMESPACE");
  // mpirun inside a Slurm allocation: its ranks share PMIX_NAMESPACE, not the Slurm step, so PMIx comes first.
  CHECK(SecretWith({{"PMIX_NAMESPACE", "p"}, {"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}}, &a) == "PMIX_NAMESPACE");
  CHECK(SecretWith({{"PMIX_NAMESPACE", "p"}, {"SLURM_JOB_ID", "7"}}, &b) == "PMIX_NAMESPACE");
  CHECK(a == b);
  CHECK(SecretWith({{"OMPI_MCA_ess_base_jobid", "5"}, {"SLURM_JOB_ID", "7"}}, &a) == "OMPI_MCA_ess_base_jobid");
  // Slurm: the job (or heterogeneous job), not the step, so that the job's steps form one group.
  CHECK(SecretWith({{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}}, &a) == "SLURM_JOB_ID");
  CHECK(SecretWith({{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "1"}}, &b) == "SLURM_JOB_ID");
  CHECK(a == b);
  CHECK(SecretWith({{"SLURM_JOB_ID", "8"}}, &b) == "SLURM_JOB_ID");
  CHECK(a != b);
  CHECK(SecretWith({{"SLURM_HET_JOB_ID", "7"}, {"SLURM_JOB_ID", "9"}}, &a) == "SLURM_HET_JOB_ID");
  CHECK(SecretWith({{"SLURM_HET_JOB_ID", "7"}, {"SLURM_JOB_ID", "10"}}, &b) == "SLURM_HET_JOB_ID");
  CHECK(a == b);
  CHECK(SecretWith({{"SLURM_PACK_JOB_ID", "7"}, {"SLURM_JOB_ID", "9"}}, &a) == "SLURM_PACK_JOB_ID");
}

TEST_CASE("ParseSocketAddress takes a port of digits only", "[internals][bootstrap]") {
  ccoll::SocketAddress a{};
  CHECK(ccoll::ParseSocketAddress("127.0.0.1:29123", 1000, &a) == ccSuccess);
  CHECK(a.port == 29123);
  CHECK(ccoll::ParseSocketAddress("[::1]:29124", 1000, &a) == ccSuccess);
  CHECK((a.family == AF_INET6 && a.port == 29124 && a.addr[15] == 1));
  for (const char* bad : {"127.0.0.1: 29123", "127.0.0.1:+29123", "127.0.0.1:-1", "127.0.0.1:0x10", "127.0.0.1:",
                          "127.0.0.1:65536", "127.0.0.1:99999999999999999999", "127.0.0.1", ":29123", ""}) {
    INFO(bad);
    CHECK(ccoll::ParseSocketAddress(bad, 1000, &a) == ccInvalidArgument);
    CHECK_THAT(ccoll::LastError(), Catch::Contains("is not host:port"));
    std::string name;
    CHECK(ccoll::SplitSocketAddress(bad, &a, &name) == ccInvalidArgument);
    CHECK_THAT(ccoll::LastError(), Catch::Contains("is not host:port"));
  }
  // SplitSocketAddress: the same checks without the lookup, which it leaves to the caller.
  std::string name = "x";
  CHECK(ccoll::SplitSocketAddress("10.1.2.3:29500", &a, &name) == ccSuccess);
  CHECK((name.empty() && a.family == AF_INET && a.port == 29500 && a.addr[0] == 10 && a.addr[3] == 3));
  CHECK(ccoll::SplitSocketAddress("node-7.cluster:29501", &a, &name) == ccSuccess);
  CHECK((name == "node-7.cluster" && a.port == 29501));
  CHECK(ccoll::SplitSocketAddress("fd00::5", &a, &name) == ccInvalidArgument);
  CHECK(ccoll::ParseSocketAddress("[::zz]:1", 1000, &a) == ccInvalidArgument);
  CHECK_THAT(ccoll::LastError(), Catch::Contains("is not an IPv6 address"));
  // An IPv6 address without brackets is refused before any lookup ("fd00::5" would look up "fd00:" at port 5).
  for (const char* bare : {"::1:29500", "fd00::5", "fe80::1%eth0:29500"}) {
    INFO(bare);
    CHECK(ccoll::ParseSocketAddress(bare, 1000, &a) == ccInvalidArgument);
    CHECK_THAT(ccoll::LastError(), Catch::Contains("an IPv6 address goes in brackets, [address]:port"));
  }
}

TEST_CASE("a bootstrap session all-gathers several rounds over one connection", "[internals][bootstrap]") {
  const ccoll::UniqueIdContent content = StartRoot(30000);
  constexpr int kRanks = 4, kRounds = 3;
  auto blob = [](int round, int rank) { return std::string(static_cast<size_t>(round * 300 + rank), 'r') + "#" +
                                               std::to_string(round) + "/" + std::to_string(rank); };
  std::vector<std::vector<std::vector<std::string>>> got(kRounds, std::vector<std::vector<std::string>>(kRanks));
  std::vector<std::vector<cctest::RankResult>> results(kRounds, std::vector<cctest::RankResult>(kRanks));
  cctest::RunRanks(kRanks, [&](int r) {
    ccoll::BootstrapSession session(content, r, kRanks, 20000);
    for (int round = 0; round < kRounds; ++round) {
      ccResult_t rc = session.AllGather(blob(round, r), &got[round][r]);
      results[round][r].rc = rc;
      if (rc != ccSuccess) {
        results[round][r].error = ccoll::LastError();
        return;
      }
    }
  });
  for (int round = 0; round < kRounds; ++round) {
    for (int r = 0; r < kRanks; ++r) {
      INFO("round " << round << " rank " << r << ": " << results[round][r].error);
      REQUIRE(results[round][r].rc == ccSuccess);
      REQUIRE(got[round][r].size() == static_cast<size_t>(kRanks));
      for (int q = 0; q < kRanks; ++q) CHECK(got[round][r][q] == blob(round, q));
    }
  }
}

// A rank that gives up between rounds (its init failed: say, it could not reach a peer that died) tells the root why
// (BootstrapSession::Leave), and the ranks still in the bootstrap get that reason in the root's answer to their next
// round, not only that it left. A rank that just closes its connection is reported as before; a reason is cut at
// kMaxLeaveText bytes and shown without control characters.
TEST_CASE("a rank that leaves the bootstrap between rounds says why, and the others hear it",
          "[internals][bootstrap]") {
  constexpr int kRanks = 4;
  const std::string longWhy = "rank 1: cannot reach rank 0\n(it died)" + std::string(1000, 'x');
  struct Case {
    const char* name;
    std::vector<int> leaving;  // ranks that give up after round 1: with a reason (Leave), or silently (-rank - 1)
    std::vector<std::string> says;  // the answer's text begins with the first, and holds the others
  };
  const Case cases[] = {
      {"one rank with a reason", {1}, {"rank 1 of 4 left the bootstrap: rank 1: cannot reach rank 0?(it died)xxx"}},
      {"one rank silently", {-3 - 1}, {"rank 3 of 4 left the bootstrap while the others continued"}},
      {"one with a reason, one silently",
       {1, -3 - 1},
       {"rank 3 of 4 left the bootstrap while the others continued (died, stalled, or its connection was lost); rank 1 "
        "of 4 left the bootstrap: rank 1: cannot reach rank 0?(it died)xxx"}},
      {"two silently", {-1 - 1, -3 - 1}, {"ranks 1, 3 of 4 left the bootstrap while the others continued"}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const ccoll::UniqueIdContent content = StartRoot(20000);
    std::vector<cctest::RankResult> first(kRanks), second(kRanks);
    cctest::RunRanks(kRanks, [&](int r) {
      ccoll::BootstrapSession session(content, r, kRanks, 20000);
      std::vector<std::string> all;
      first[r].rc = session.AllGather("round 1 of rank " + std::to_string(r), &all);
      if (first[r].rc != ccSuccess) {
        first[r].error = ccoll::LastError();
        return;
      }
      for (int leaving : c.leaving) {
        if (leaving == r) {
          session.Leave(longWhy);
          return;
        }
        if (leaving == -r - 1) return;  // the session closes
      }
      second[r].rc = session.AllGather("round 2", &all);
      if (second[r].rc != ccSuccess) second[r].error = ccoll::LastError();
      // Leaving now, to a root that gave up (gone, or draining), neither blocks nor replaces this rank's error.
      session.Leave("leaving after the root gave up");
      if (ccoll::LastError() != second[r].error) second[r].error += " | changed by Leave: " + ccoll::LastError();
    });
    for (int r = 0; r < kRanks; ++r) {
      INFO("rank " << r << ": " << first[r].error);
      REQUIRE(first[r].rc == ccSuccess);
    }
    for (int r = 0; r < kRanks; ++r) {
      if (std::count(c.leaving.begin(), c.leaving.end(), r) + std::count(c.leaving.begin(), c.leaving.end(), -r - 1)) {
        continue;
      }
      INFO("rank " << r << ": " << second[r].error);
      CHECK(second[r].rc == ccRemoteError);
      CHECK(second[r].error.find("rank " + std::to_string(r) + " of 4: the bootstrap root gave up: " + c.says[0]) !=
            std::string::npos);
      for (const std::string& part : c.says) CHECK(second[r].error.find(part) != std::string::npos);
      if (std::count(c.leaving.begin(), c.leaving.end(), 1)) {
        // The reason as far as kMaxLeaveText: its first 240 bytes, and nothing after them.
        const std::string shown = "rank 1: cannot reach rank 0?(it died)" + std::string(ccoll::kMaxLeaveText - 37, 'x');
        CHECK(second[r].error.find(shown) != std::string::npos);
        CHECK(second[r].error.find(shown + "x") == std::string::npos);
      }
    }
  }
  // A root that gave up on a rank that never joined answers and closes the connections: a Leave then meets a closed
  // connection, and the rank's error stays the root's answer.
  {
    const ccoll::UniqueIdContent content = StartRoot(300);
    ccoll::BootstrapSession session(content, 0, 2, 20000);
    std::vector<std::string> all;
    CHECK(session.AllGather("alone", &all) == ccTimeout);
    const std::string error = ccoll::LastError();
    CHECK(error.find("rank 1 of 2 did not join within 300 ms") != std::string::npos);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the root has closed its end by now
    session.Leave("leaving after the root closed");
    CHECK(ccoll::LastError() == error);
  }
  // A session that never joined has nothing to say: Leave only closes it.
  ccoll::UniqueIdContent unused{};
  ccoll::BootstrapSession idle(unused, 0, 1, 1000);
  idle.Leave("never joined");
}

namespace {

// A rank speaking the protocol by hand: joins (a hello with no blob and the given timeout), then reads the root's
// answer to round 1 (its header and nranks records). Returns the connection, or -1.
int JoinByHand(const ccoll::UniqueIdContent& content, int rank, int nranks, uint32_t timeoutMs) {
  const int fd = ConnectTo(content.root);
  if (fd < 0) return -1;
  WireHello h{};
  h.magic = ccoll::kBootstrapMagic;
  h.version = ccoll::kBootstrapVersion;
  std::memcpy(h.secret, content.secret, sizeof(h.secret));
  h.rank = rank;
  h.nranks = nranks;
  h.infoLen = 0;
  h.reserved = timeoutMs;  // (HelloHeader::timeoutMs)
  SendRaw(fd, &h, sizeof(h));
  const ccoll::Deadline deadline = ccoll::DeadlineIn(20000);
  uint32_t reply[6];  // ReplyHeader: magic, status, nranks, textLen, reason, reserved
  bool ok = ccoll::RecvAll(fd, reply, sizeof(reply), deadline, "test reply") == ccSuccess && reply[1] == 0;
  for (int r = 0; ok && r < nranks; ++r) {
    uint32_t len = 0;
    ok = ccoll::RecvAll(fd, &len, sizeof(len), deadline, "test reply") == ccSuccess && len <= (1u << 16);
    std::string blob(len, '\0');
    ok = ok && (len == 0 || ccoll::RecvAll(fd, &blob[0], len, deadline, "test reply") == ccSuccess);
  }
  if (!ok) {
    ccoll::CloseFd(fd);
    return -1;
  }
  return fd;
}

}  // namespace

// What the root does with a rank that breaks off between rounds: half a round header and the end of its stream is a
// lost rank, never an empty round; and when the root gives up the round on a rank that stalls, the ranks that left
// with a reason before it in the round, and those whose Leave is already waiting after it, are reported with it.
TEST_CASE("the bootstrap root reports a rank that breaks off a round, with the reasons of those that left",
          "[internals][bootstrap]") {
  constexpr int kRanks = 3;
  struct Case {
    const char* name;
    int byHand;   // the rank that joins by hand: it breaks off (half a header) or stalls (sends nothing)
    bool stall;
    int leaver;   // -1, or a rank that leaves with a reason after round 1
    std::vector<std::string> says;
    bool silently = false;  // the leaver just closes its connection
  };
  const Case cases[] = {
      {"half a round header", 1, false, -1, {"rank 1 of 3 left the bootstrap while the others continued"}},
      {"a stall after a rank that left",
       1,
       true,
       0,
       {"rank 1 of 3 left the bootstrap while the others continued", "; rank 0 of 3 left the bootstrap: why 0"}},
      {"a stall before a rank that left",
       0,
       true,
       1,
       {"rank 0 of 3 left the bootstrap while the others continued", "; rank 1 of 3 left the bootstrap: why 1"}},
      {"a stall before a rank that closed", 0, true, 1, {"ranks 0, 1 of 3 left the bootstrap while the others"}, true},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const ccoll::UniqueIdContent content = StartRoot(20000);
    std::vector<cctest::RankResult> second(kRanks);
    std::vector<double> leaveSeconds(kRanks, 0.0);
    int handFd = -1;
    // The root's round timeout becomes the shortest a rank asks for: 3 s from the rank joined by hand (a stall
    // costs that; the other ranks must join, and then send their round or leave, within it).
    cctest::RunRanks(kRanks, [&](int r) {
      if (r == c.byHand) {
        handFd = JoinByHand(content, r, kRanks, 3000);
        if (handFd < 0) {
          second[r].rc = ccSystemError;
          return;
        }
        if (!c.stall) {
          const uint32_t magic = ccoll::kBootstrapMagic;
          SendRaw(handFd, &magic, sizeof(magic));
          ::shutdown(handFd, SHUT_WR);
        }
        return;  // (its connection stays open until the case ends)
      }
      ccoll::BootstrapSession session(content, r, kRanks, 20000);
      std::vector<std::string> all;
      if (session.AllGather("round 1", &all) != ccSuccess) {
        second[r].rc = ccSystemError;
        second[r].error = "round 1: " + ccoll::LastError();
        return;
      }
      if (r == c.leaver) {
        if (c.silently) return;
        const auto start = std::chrono::steady_clock::now();
        session.Leave("why " + std::to_string(r));
        leaveSeconds[r] = cctest::SecondsSince(start);
        return;
      }
      second[r].rc = session.AllGather("round 2", &all);
      if (second[r].rc != ccSuccess) second[r].error = ccoll::LastError();
    });
    if (handFd >= 0) ccoll::CloseFd(handFd);
    for (int r = 0; r < kRanks; ++r) {
      INFO("rank " << r << ": " << second[r].error);
      if (r == c.byHand) {
        CHECK(second[r].rc == ccSuccess);  // joined by hand
        continue;
      }
      if (r == c.leaver) {
        CHECK(leaveSeconds[r] < 0.6);
        continue;
      }
      CHECK(second[r].rc == ccRemoteError);
      CHECK(second[r].error.find("the bootstrap root gave up: " + c.says[0]) != std::string::npos);
      for (const std::string& part : c.says) CHECK(second[r].error.find(part) != std::string::npos);
    }
  }
}

TEST_CASE("BootstrapParseId rejects ids it did not make", "[internals][bootstrap]") {
  ccUniqueId id;
  std::memset(&id, 0, sizeof(id));
  ccoll::UniqueIdContent content;
  CHECK(ccoll::BootstrapParseId(id, &content) == ccInvalidArgument);
  std::memset(&id, 0x5a, sizeof(id));
  CHECK(ccoll::BootstrapParseId(id, &content) == ccInvalidArgument);
}

TEST_CASE("a rank whose root never answers fails with ccTimeout or a connection error, not a hang",
          "[internals][bootstrap]") {
  // A listening socket that accepts nothing: connect succeeds (backlog), the hello is sent, no reply comes.
  ccoll::SocketAddress addr{};
  addr.family = AF_INET;
  addr.port = 0;
  addr.addr[0] = 127;
  addr.addr[3] = 1;
  int lfd = -1;
  REQUIRE(ccoll::ChooseBootstrapAddress(&addr) == ccSuccess);
  addr.port = 0;
  REQUIRE(ccoll::Listen(&addr, &lfd) == ccSuccess);
  ccoll::UniqueIdContent content{};
  content.magic = ccoll::kUniqueIdMagic;
  content.version = ccoll::kBootstrapVersion;
  content.root = addr;
  std::vector<std::string> all;
  auto start = std::chrono::steady_clock::now();
  ccResult_t rc = ccoll::BootstrapAllGather(content, 0, 2, "x", 300, &all);
  double seconds = cctest::SecondsSince(start);
  ccoll::CloseFd(lfd);
  INFO(ccoll::LastError());
  CHECK(rc == ccTimeout);
  CHECK(seconds < 3.0);
}

// ------------------------------------------------------------------------------------------------------------
// In-process transport.
// ------------------------------------------------------------------------------------------------------------

namespace {

struct Pair {
  std::unique_ptr<ccoll::LocalTransport> t[2];
};

Pair MakePair(const std::string& key) {
  Pair p;
  REQUIRE(ccoll::LocalTransport::Create(key, 0, 2, &p.t[0]) == ccSuccess);
  REQUIRE(ccoll::LocalTransport::Create(key, 1, 2, &p.t[1]) == ccSuccess);
  return p;
}

}  // namespace

TEST_CASE("LocalTransport matches sends and receives by tag, in posting order", "[internals][transport]") {
  Pair p = MakePair("test-local-match");
  CHECK(p.t[0]->PeerPresent(1));
  CHECK(p.t[1]->PeerPresent(0));
  int a = 11, b = 22, c = 33, d = 44;
  int ra = 0, rb = 0, rc = 0, rd = 0;
  ccoll::Request *sa, *sb, *sc, *sd, *qa, *qb, *qc, *qd;
  // Sends first (unexpected-message queue): tags 1, 2, then two with tag 3.
  REQUIRE(p.t[0]->Isend(1, &a, sizeof(a), 1, ccoll::kWireData, &sa) == ccSuccess);
  REQUIRE(p.t[0]->Isend(1, &b, sizeof(b), 2, ccoll::kWireData, &sb) == ccSuccess);
  REQUIRE(p.t[0]->Isend(1, &c, sizeof(c), 3, ccoll::kWireData, &sc) == ccSuccess);
  REQUIRE(p.t[0]->Isend(1, &d, sizeof(d), 3, ccoll::kWireData, &sd) == ccSuccess);
  // Receives in another order: tag 2 first, then 3 twice, then 1.
  REQUIRE(p.t[1]->Irecv(0, &rb, sizeof(rb), 2, ccoll::kWireData, &qb) == ccSuccess);
  REQUIRE(p.t[1]->Irecv(0, &rc, sizeof(rc), 3, ccoll::kWireData, &qc) == ccSuccess);
  REQUIRE(p.t[1]->Irecv(0, &rd, sizeof(rd), 3, ccoll::kWireData, &qd) == ccSuccess);
  REQUIRE(p.t[1]->Irecv(0, &ra, sizeof(ra), 1, ccoll::kWireData, &qa) == ccSuccess);
  for (ccoll::Request* r : {qa, qb, qc, qd}) CHECK(p.t[1]->Wait(r, 1000) == ccSuccess);
  for (ccoll::Request* r : {sa, sb, sc, sd}) CHECK(p.t[0]->Wait(r, 1000) == ccSuccess);
  CHECK(ra == 11);
  CHECK(rb == 22);
  CHECK(rc == 33);  // same tag: first send to first receive
  CHECK(rd == 44);

  // Receives first (posted-receive queue), and a zero-byte message.
  int x = 5, rx = 0;
  ccoll::Request *s1, *q1, *s0, *q0;
  REQUIRE(p.t[0]->Irecv(1, &rx, sizeof(rx), 7, ccoll::kWireData, &q1) == ccSuccess);
  REQUIRE(p.t[0]->Irecv(1, nullptr, 0, 8, ccoll::kWireData, &q0) == ccSuccess);
  REQUIRE(p.t[1]->Isend(0, nullptr, 0, 8, ccoll::kWireData, &s0) == ccSuccess);
  REQUIRE(p.t[1]->Isend(0, &x, sizeof(x), 7, ccoll::kWireData, &s1) == ccSuccess);
  CHECK(p.t[0]->Wait(q1, 1000) == ccSuccess);
  CHECK(p.t[0]->Wait(q0, 1000) == ccSuccess);
  CHECK(p.t[1]->Wait(s0, 1000) == ccSuccess);
  CHECK(p.t[1]->Wait(s1, 1000) == ccSuccess);
  CHECK(rx == 5);
}

TEST_CASE("LocalTransport: a size mismatch fails both sides with ccInvalidUsage", "[internals][transport]") {
  Pair p = MakePair("test-local-size");
  uint64_t small = 1;
  uint64_t big[2] = {0xabababababababab, 0xabababababababab};
  ccoll::Request *s, *r;
  REQUIRE(p.t[0]->Isend(1, &small, sizeof(small), 4, ccoll::kWireData, &s) == ccSuccess);
  REQUIRE(p.t[1]->Irecv(0, big, sizeof(big), 4, ccoll::kWireData, &r) == ccSuccess);
  CHECK(p.t[1]->Wait(r, 1000) == ccInvalidUsage);
  std::string recvErr = ccoll::LastError();
  CHECK(p.t[0]->Wait(s, 1000) == ccInvalidUsage);
  INFO(recvErr);
  CHECK(recvErr.find("8 bytes") != std::string::npos);
  CHECK(recvErr.find("16 bytes") != std::string::npos);
  CHECK(big[0] == 0xabababababababab);  // nothing copied
}

TEST_CASE("LocalTransport: a receive of at most n bytes takes a message as long or shorter and says its length",
          "[internals][transport]") {
  Pair p = MakePair("test-local-atmost");
  std::mt19937 gen(5);
  uint64_t tag = 1;
  for (bool sendFirst : {false, true}) {
    for (size_t sent : {size_t{0}, size_t{1}, size_t{100}, size_t{256}}) {
      INFO(sent << " bytes sent to a receive of at most 256" << (sendFirst ? ", the send posted first" : ""));
      std::vector<unsigned char> data(sent), got(257, 0xee);
      for (auto& b : data) b = static_cast<unsigned char>(gen());
      size_t received = 12345;
      ccoll::Request *s, *r;
      if (sendFirst) REQUIRE(p.t[0]->Isend(1, data.data(), sent, tag, ccoll::kWireData, &s) == ccSuccess);
      REQUIRE(p.t[1]->IrecvAtMost(0, got.data(), 256, tag, ccoll::kWireData, &received, &r) == ccSuccess);
      if (!sendFirst) REQUIRE(p.t[0]->Isend(1, data.data(), sent, tag, ccoll::kWireData, &s) == ccSuccess);
      CHECK(p.t[1]->Wait(r, 1000) == ccSuccess);
      CHECK(p.t[0]->Wait(s, 1000) == ccSuccess);
      CHECK(received == sent);
      CHECK(std::equal(data.begin(), data.end(), got.begin()));
      CHECK(got[sent] == 0xee);  // nothing past the message
      ++tag;
    }
  }
  // Longer than the receive: both sides fail, nothing is copied.
  std::vector<unsigned char> data(300, 1), got(256, 0xee);
  size_t received = 12345;
  ccoll::Request *s, *r;
  REQUIRE(p.t[0]->Isend(1, data.data(), data.size(), tag, ccoll::kWireData, &s) == ccSuccess);
  REQUIRE(p.t[1]->IrecvAtMost(0, got.data(), 256, tag, ccoll::kWireData, &received, &r) == ccSuccess);
  CHECK(p.t[1]->Wait(r, 1000) == ccInvalidUsage);
  const std::string err = ccoll::LastError();
  INFO(err);
  CHECK(err.find("rank 0 sent 300 bytes but rank 1 expects at most 256 bytes") != std::string::npos);
  CHECK(p.t[0]->Wait(s, 1000) == ccInvalidUsage);
  CHECK(received == 12345);
  CHECK(got[0] == 0xee);
}

TEST_CASE("LocalTransport: Wait times out when nobody sends or receives", "[internals][transport]") {
  Pair p = MakePair("test-local-timeout");
  int buf = 0;
  ccoll::Request* r;
  REQUIRE(p.t[1]->Irecv(0, &buf, sizeof(buf), 1, ccoll::kWireData, &r) == ccSuccess);
  auto start = std::chrono::steady_clock::now();
  CHECK(p.t[1]->Wait(r, 150) == ccTimeout);
  double seconds = cctest::SecondsSince(start);
  std::string err = ccoll::LastError();
  INFO(err);
  CHECK(seconds >= 0.14);
  CHECK(seconds < 2.0);
  CHECK(err.find("rank 0") != std::string::npos);

  ccoll::Request* s;
  REQUIRE(p.t[0]->Isend(1, &buf, sizeof(buf), 2, ccoll::kWireData, &s) == ccSuccess);
  CHECK(p.t[0]->Wait(s, 100) == ccTimeout);
  CHECK(ccoll::LastError().find("rank 1") != std::string::npos);

  // The timed-out requests are gone: a later pair with the same tags matches each other only.
  int v = 9, got = 0;
  ccoll::Request *s2, *r2;
  REQUIRE(p.t[0]->Isend(1, &v, sizeof(v), 1, ccoll::kWireData, &s2) == ccSuccess);
  REQUIRE(p.t[1]->Irecv(0, &got, sizeof(got), 1, ccoll::kWireData, &r2) == ccSuccess);
  CHECK(p.t[1]->Wait(r2, 1000) == ccSuccess);
  CHECK(p.t[0]->Wait(s2, 1000) == ccSuccess);
  CHECK(got == 9);
}

TEST_CASE("LocalTransport: Abort wakes a waiting peer with ccRemoteError", "[internals][transport]") {
  Pair p = MakePair("test-local-abort");
  int buf = 0;
  ccoll::Request* r;
  REQUIRE(p.t[1]->Irecv(0, &buf, sizeof(buf), 1, ccoll::kWireData, &r) == ccSuccess);
  ccResult_t rc = ccSuccess;
  std::string err;
  double seconds = 0;
  std::thread waiter([&] {
    auto start = std::chrono::steady_clock::now();
    rc = p.t[1]->Wait(r, 30000);
    seconds = cctest::SecondsSince(start);
    err = ccoll::LastError();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  p.t[0]->Abort("the test aborted rank 0");
  waiter.join();
  INFO(err);
  CHECK(rc == ccRemoteError);
  CHECK(seconds < 5.0);
  CHECK(err.find("the test aborted rank 0") != std::string::npos);
  // Later operations on either side fail at once.
  ccoll::Request* s;
  CHECK(p.t[0]->Isend(1, &buf, sizeof(buf), 2, ccoll::kWireData, &s) == ccRemoteError);
  CHECK(p.t[1]->Irecv(0, &buf, sizeof(buf), 2, ccoll::kWireData, &s) == ccRemoteError);
}

TEST_CASE("LocalTransport::Create rejects a rank joining twice and a disagreeing nranks", "[internals][transport]") {
  std::unique_ptr<ccoll::LocalTransport> a, b, c;
  REQUIRE(ccoll::LocalTransport::Create("test-local-create", 0, 3, &a) == ccSuccess);
  CHECK(ccoll::LocalTransport::Create("test-local-create", 0, 3, &b) == ccInvalidUsage);
  CHECK(ccoll::LocalTransport::Create("test-local-create", 1, 4, &c) == ccInvalidUsage);
  CHECK_FALSE(a->PeerPresent(1));
  REQUIRE(ccoll::LocalTransport::Create("test-local-create", 1, 3, &c) == ccSuccess);
  CHECK(a->PeerPresent(1));
  c.reset();
  CHECK(a->PeerPresent(1));  // it joined: a peer's init may check after it has left (its calls find that out)
  CHECK(ccoll::LocalTransport::Create("test-local-create", 1, 3, &c) == ccSuccess);  // its mailbox is free again
}

// ------------------------------------------------------------------------------------------------------------
// Wire header and CRC32C.
// ------------------------------------------------------------------------------------------------------------

#ifdef CCOLL_HAVE_ISAL
namespace {

// The textbook bit-at-a-time CRC32C (reflected polynomial 0x82f63b78): the reference ISA-L must match.
uint32_t Crc32cBitwise(const unsigned char* p, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

}  // namespace

TEST_CASE("Crc32c is CRC32C: the check value and a bitwise reference on random buffers", "[internals][wire]") {
  REQUIRE(ccoll::HaveCrc32c());
  CHECK(ccoll::Crc32c("123456789", 9) == 0xe3069283u);
  CHECK(ccoll::Crc32c(nullptr, 0) == 0u);
  std::mt19937_64 rng(20261201);
  std::vector<unsigned char> buf(70000);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (int trial = 0; trial < 200; ++trial) {
    const size_t off = rng() % 64, len = rng() % (trial < 100 ? 300 : buf.size() - 64);
    INFO("offset " << off << " length " << len);
    CHECK(ccoll::Crc32c(buf.data() + off, len) == Crc32cBitwise(buf.data() + off, len));
  }
}
#endif

TEST_CASE("CheckWireHeader accepts its own headers and names what is wrong with others", "[internals][wire]") {
  const bool crc = ccoll::HaveCrc32c();
  std::vector<unsigned char> payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<unsigned char>(i * 7 + 3);
  const ccoll::WireKind kind = ccoll::kWireCodecBase + ccCompressQuant;
  const ccoll::WireHeader good = ccoll::MakeWireHeader(kind, payload.data(), payload.size(), crc);
  std::string why;
  auto check = [&](const ccoll::WireHeader& h, ccoll::WireKind expect, size_t bytes) {
    why.clear();
    return ccoll::CheckWireHeader(h, expect, payload.data(), bytes, crc, 3, 2, 77, &why);
  };
  CHECK(check(good, kind, payload.size()) == ccSuccess);
  CHECK(why.empty());

  ccoll::WireHeader h = good;
  h.magic ^= 1;
  CHECK(check(h, kind, payload.size()) == ccRemoteError);
  CHECK(why.find("malformed message from rank 2") != std::string::npos);
  h = good;
  h.version = ccoll::kWireVersion + 1;
  CHECK(check(h, kind, payload.size()) == ccRemoteError);
  h = good;
  h.flags |= 0x80;
  CHECK(check(h, kind, payload.size()) == ccRemoteError);
  h = good;
  h.reserved = 1;
  CHECK(check(h, kind, payload.size()) == ccRemoteError);
  h = good;
  h.flags ^= ccoll::kWireFlagCrc;
  CHECK(check(h, kind, payload.size()) == ccRemoteError);

  // Another kind: the ranks made different calls.
  CHECK(check(good, ccoll::kWireData, payload.size()) == ccInvalidUsage);
  INFO(why);
  CHECK(why.find("expected a data message from rank 2") != std::string::npos);
  CHECK(why.find("quant payload") != std::string::npos);

  // A header whose length disagrees with what arrived.
  CHECK(check(good, kind, payload.size() - 1) == ccRemoteError);
  CHECK(why.find("header says 1000 bytes but 999 arrived") != std::string::npos);

  if (crc) {
    // Every single-bit flip of the payload is caught.
    for (size_t bit = 0; bit < payload.size() * 8; bit += 13) {
      payload[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
      CHECK(check(good, kind, payload.size()) == ccRemoteError);
      payload[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    }
    CHECK(why.find("from rank 2 (tag 77) is corrupted") != std::string::npos);
    CHECK(check(good, kind, payload.size()) == ccSuccess);
    // A receiver that checks rejects a sender that did not sum.
    const ccoll::WireHeader plain = ccoll::MakeWireHeader(kind, payload.data(), payload.size(), false);
    CHECK(check(plain, kind, payload.size()) == ccRemoteError);
    CHECK(why.find("runs with CC_CHECKSUM=1 but the message from rank 2 (tag 77) has checksum flag 0") !=
          std::string::npos);
  }
}

TEST_CASE("LocalTransport: a message of another kind is ccInvalidUsage, nothing else is touched",
          "[internals][transport][wire]") {
  Pair p = MakePair("test-local-kind");
  uint64_t v = 42, got = 0;
  ccoll::Request *s, *r;
  REQUIRE(p.t[0]->Isend(1, &v, sizeof(v), 4, ccoll::kWireCallCheck, &s) == ccSuccess);
  REQUIRE(p.t[1]->Irecv(0, &got, sizeof(got), 4, ccoll::kWireData, &r) == ccSuccess);
  CHECK(p.t[1]->Wait(r, 1000) == ccInvalidUsage);
  std::string err = ccoll::LastError();
  INFO(err);
  CHECK(err.find("call-check record") != std::string::npos);
  CHECK(p.t[0]->Wait(s, 1000) == ccSuccess);
}

namespace {

// A DeviceCopier over ordinary memory: "device memory" is one vector; it counts its copies and can fail them.
struct TestCopier : ccoll::DeviceCopier {
  std::vector<char> device = std::vector<char>(1 << 16);
  std::atomic<int> copies{0};
  bool fail = false;
  bool IsDevice(const void* p) const override {
    const char* c = static_cast<const char*>(p);
    return c >= device.data() && c < device.data() + device.size();
  }
  ccResult_t CopyMessage(void* dst, const void* src, size_t bytes) override {
    ++copies;
    if (fail) return ccoll::Fail(ccUnhandledCudaError, "test copier: the copy failed");
    std::memcpy(dst, src, bytes);
    return ccSuccess;
  }
};

}  // namespace

TEST_CASE("LocalTransport: a DeviceCopier moves every message with a device side, and its failure fails both",
          "[internals][transport][wire]") {
  for (bool checksum : {false, true}) {
#ifndef CCOLL_HAVE_ISAL
    if (checksum) continue;
#endif
    INFO("checksum " << checksum);
    Pair p = MakePair(checksum ? "test-local-copier-crc" : "test-local-copier");
    CHECK(p.t[0]->CarriesDeviceMemory());
    TestCopier copier;
    p.t[0]->SetDeviceCopier(&copier);  // rank 0 has device memory; rank 1 has none
    for (auto& t : p.t) t->SetChecksum(checksum);
    float* dev = reinterpret_cast<float*>(copier.device.data());
    std::vector<float> host(256), mine(256);
    for (int i = 0; i < 256; ++i) dev[i] = static_cast<float>(i) + 0.5f;
    ccoll::Request *s, *r;
    // Device to host: rank 0's copier moves it (and no CRC is read off device memory).
    REQUIRE(p.t[0]->Isend(1, dev, 1024, 1, ccoll::kWireData, &s) == ccSuccess);
    REQUIRE(p.t[1]->Irecv(0, host.data(), 1024, 1, ccoll::kWireData, &r) == ccSuccess);
    CHECK(p.t[1]->Wait(r, 1000) == ccSuccess);
    CHECK(p.t[0]->Wait(s, 1000) == ccSuccess);
    CHECK(copier.copies == 1);
    CHECK(host[255] == 255.5f);
    // Host to device, the receive posted first: the receiver's copier again.
    for (auto& x : host) x = -x;
    REQUIRE(p.t[0]->Irecv(1, dev + 512, 1024, 2, ccoll::kWireData, &r) == ccSuccess);
    REQUIRE(p.t[1]->Isend(0, host.data(), 1024, 2, ccoll::kWireData, &s) == ccSuccess);
    CHECK(p.t[0]->Wait(r, 1000) == ccSuccess);
    CHECK(p.t[1]->Wait(s, 1000) == ccSuccess);
    CHECK(copier.copies == 2);
    CHECK(dev[512 + 7] == -7.5f);
    // Host to host on the rank that has a copier: a plain copy, and with CC_CHECKSUM a corrupted payload is caught.
    REQUIRE(p.t[0]->Isend(1, mine.data(), 1024, 3, ccoll::kWireData, &s) == ccSuccess);
    mine[3] = 1.0f;  // after the sender summed
    REQUIRE(p.t[1]->Irecv(0, host.data(), 1024, 3, ccoll::kWireData, &r) == ccSuccess);
    CHECK(p.t[1]->Wait(r, 1000) == (checksum ? ccRemoteError : ccSuccess));
    CHECK(p.t[0]->Wait(s, 1000) == ccSuccess);
    CHECK(copier.copies == 2);
    // A failed device copy fails the send and the receive, with the copier's sentence.
    copier.fail = true;
    REQUIRE(p.t[0]->Isend(1, dev, 1024, 4, ccoll::kWireData, &s) == ccSuccess);
    REQUIRE(p.t[1]->Irecv(0, host.data(), 1024, 4, ccoll::kWireData, &r) == ccSuccess);
    CHECK(p.t[1]->Wait(r, 1000) == ccUnhandledCudaError);
    CHECK(ccoll::LastError().find("the copy failed") != std::string::npos);
    CHECK(p.t[0]->Wait(s, 1000) == ccUnhandledCudaError);
    CHECK(copier.copies == 3);
  }
}

#ifdef CCOLL_HAVE_ISAL
TEST_CASE("LocalTransport with CC_CHECKSUM: a payload changed in flight is an error, not a wrong result",
          "[internals][transport][wire]") {
  // A send's buffer must stay untouched until the send completes; changing it after Isend and before the receive
  // matches is what corruption between the sender's memory and the receiver's looks like to the receiver.
  for (bool checksum : {true, false}) {
    Pair p = MakePair(checksum ? "test-local-crc-on" : "test-local-crc-off");
    p.t[0]->SetChecksum(checksum);
    p.t[1]->SetChecksum(checksum);
    std::vector<float> data(4096, 1.5f), got(4096, 0.0f);
    ccoll::Request *s, *r;
    REQUIRE(p.t[0]->Isend(1, data.data(), data.size() * 4, 9, ccoll::kWireData, &s) == ccSuccess);
    reinterpret_cast<unsigned char*>(data.data())[5000] ^= 0x10;  // one bit, after the sender summed
    REQUIRE(p.t[1]->Irecv(0, got.data(), got.size() * 4, 9, ccoll::kWireData, &r) == ccSuccess);
    ccResult_t rc = p.t[1]->Wait(r, 1000);
    std::string err = ccoll::LastError();
    CHECK(p.t[0]->Wait(s, 1000) == ccSuccess);
    INFO("checksum " << checksum << ": " << err);
    if (checksum) {
      CHECK(rc == ccRemoteError);
      CHECK(err.find("16384-byte data message from rank 0 (tag 9) is corrupted") != std::string::npos);
    } else {
      CHECK(rc == ccSuccess);  // without the checksum the flipped bit goes through unnoticed
      CHECK(got[1250] != 1.5f);
    }
  }
}
#endif

#ifdef CCOLL_HAVE_UCX
namespace {

// Two UCX transports of this process, ranks 0 and 1, connected to each other.
void ConnectUcxPair(std::unique_ptr<ccoll::UcxTransport> (&t)[2], bool peerErrors = false,
                    const ccoll::UcxOptions& options = ccoll::UcxOptions{}) {
  for (int i = 0; i < 2; ++i) REQUIRE(ccoll::UcxTransport::Create(i, 2, options, &t[i]) == ccSuccess);
  std::vector<std::string> addr = {t[0]->Address(), t[1]->Address()};
  REQUIRE(t[0]->Connect({1}, addr, {peerErrors}) == ccSuccess);
  REQUIRE(t[1]->Connect({0}, addr, {peerErrors}) == ccSuccess);
}

}  // namespace

#endif

#ifdef CCOLL_HAVE_UCX
// UCX parses a worker address without validating it and aborts the process on bytes it cannot read (a helper's
// audit: random bytes from a stray process at the bootstrap root gave SIGABRT in ucp_address_unpack). Each record a
// rank hands its peers carries a header of ccoll's own, checked before UCX sees the address.
TEST_CASE("UcxTransport: a peer's worker address that is not one is refused, and the process lives",
          "[internals][ucx]") {
  std::unique_ptr<ccoll::UcxTransport> good[2];
  ConnectUcxPair(good);  // well-formed records connect
  std::mt19937_64 gen(5);
  std::string random(200, '\0');
  for (char& c : random) c = static_cast<char>(gen());
  const std::string real = good[1]->Address();
  std::string corrupted = real;
  corrupted[corrupted.size() / 2] ^= 0x10;
  std::string longer = real + "x";
  struct Case {
    const char* name;
    std::string record;
    const char* says;
  };
  for (const Case& c : {Case{"random bytes", random, "not a ccoll record"},
                        Case{"the header cut short", real.substr(0, 10), "shorter than its header"},
                        Case{"the address cut short", real.substr(0, real.size() - 7), "corrupted"},
                        Case{"a byte more", longer, "corrupted"},
                        Case{"a flipped bit", corrupted, "corrupted"},
                        Case{"the bare UCX address", real.substr(24), "not a ccoll record"}}) {
    INFO(c.name);
    std::unique_ptr<ccoll::UcxTransport> t;
    REQUIRE(ccoll::UcxTransport::Create(0, 2, ccoll::UcxOptions{}, &t) == ccSuccess);
    CHECK(t->Connect({1}, {t->Address(), c.record}, {false}) == ccRemoteError);
    const std::string error = ccoll::LastError();
    INFO(error);
    CHECK(error.find("rank 1") != std::string::npos);
    CHECK(error.find(c.says) != std::string::npos);
  }
}
#endif

#ifdef CCOLL_HAVE_UCX
TEST_CASE("DataLanesOverSharedMemory reads the lanes of ucp_ep_print_info", "[internals][ucx]") {
  // As UCX 1.13 prints them: the default between two processes of one host, a peer-error-handling endpoint,
  // UCX_TLS=cma,tcp (cma moves rendezvous data only), and UCX_TLS=sysv,tcp,self (rendezvous data over tcp).
  const std::string sysv =
      "#\n# UCP endpoint \n#\n#               peer: <no debug data>\n"
      "#                 lane[0]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] am am_bw#0\n"
      "#                 lane[1]:  5:cma/memory.0 md[4]            -> md[4]/cma/sysdev[255] rma_bw#0\n#\n"
      "#                tag_send: 0..<egr/short>..93..<egr/bcopy>..8256..<rndv>..(inf)\n";
  const std::string peer =
      "#                 lane[0]:  2:tcp/lo.0 md[1]                -> md[1]/tcp/sysdev[255] am am_bw#0 keepalive "
      "wireup\n";
  const std::string cma =
      "#                 lane[0]:  1:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am am_bw#0 wireup\n"
      "#                 lane[1]:  2:cma/memory.0 md[1]            -> md[1]/cma/sysdev[255] rma_bw#0\n";
  const std::string sysvTcp =
      "#                 lane[0]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] am am_bw#0\n"
      "#                 lane[1]:  1:tcp/lo.0 md[1]                -> md[1]/tcp/sysdev[255] rma_bw#0\n"
      "#                 lane[2]:  0:tcp/eth0.0 md[1]              -> md[1]/tcp/sysdev[255] rma_bw#1\n";
  std::string posix = sysv;
  posix.replace(posix.find("3:sysv"), 6, "4:posix");
  CHECK(ccoll::DataLanesOverSharedMemory(sysv));
  CHECK(ccoll::DataLanesOverSharedMemory(posix));
  CHECK_FALSE(ccoll::DataLanesOverSharedMemory(peer));
  CHECK_FALSE(ccoll::DataLanesOverSharedMemory(cma));
  CHECK_FALSE(ccoll::DataLanesOverSharedMemory(sysvTcp));
  CHECK_FALSE(ccoll::DataLanesOverSharedMemory(""));
  // No lane of active messages: nothing says where eager messages go.
  CHECK_FALSE(ccoll::DataLanesOverSharedMemory("# UCP endpoint\n#  lane[0]:  3:sysv/memory.0 md[2] -> am_bw#0\n"));
}

namespace {
// Sets an environment variable for a scope, restoring it after (also when a REQUIRE throws).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) before_ = before;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, before_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string before_;
};
}  // namespace

TEST_CASE("UcxTransport: PeerOverSharedMemory says what UCX chose for each endpoint", "[internals][ucx]") {
  struct Case {
    const char* tls;
    bool peerErrors;  // UCP_ERR_HANDLING_MODE_PEER asked for (CC_UCX_ERR_MODE=peer)
    bool shared;
  };
  // Shared memory cannot detect a dead peer: asked for peer error handling, UCX takes tcp where it may, and the
  // endpoint falls back to no error handling over shared memory where it may not.
  const Case cases[] = {{"sysv,self", false, true},      {"posix,self", false, true},      {"tcp,self", false, false},
                        {"tcp,cma", false, false},       {"sysv,tcp,self", false, false}, {"sysv,tcp,self", true, false},
                        {"sysv,self", true, true}};
  for (const Case& c : cases) {
    INFO(c.tls << (c.peerErrors ? ", peer error handling" : ""));
    ScopedEnv env("UCX_TLS", c.tls);
    std::unique_ptr<ccoll::UcxTransport> t[2];
    ConnectUcxPair(t, c.peerErrors);
    const bool shared = c.shared;
    CHECK(t[0]->PeerOverSharedMemory(1) == shared);
    CHECK(t[1]->PeerOverSharedMemory(0) == shared);
    // One message each way, so that tcp's connections exist before teardown (else UCX logs refused connections).
    bool ok[2] = {false, false};
    auto exchange = [&](int i) {
      int out = i, in = -1;
      ccoll::Request *send = nullptr, *recv = nullptr;
      if (t[i]->Irecv(1 - i, &in, sizeof(in), 7, ccoll::kWireData, &recv) != ccSuccess) return;
      if (t[i]->Isend(1 - i, &out, sizeof(out), 7, ccoll::kWireData, &send) != ccSuccess) return;
      ok[i] = t[i]->Wait(send, 10000) == ccSuccess && t[i]->Wait(recv, 10000) == ccSuccess && in == 1 - i;
    };
    std::thread other(exchange, 1);
    exchange(0);
    other.join();
    CHECK(ok[0]);
    CHECK(ok[1]);
  }
}

TEST_CASE("CC_UCX_RNDV_THRESH: slice resolves to a slice and its header, at most 1 MiB, and UCX refuses a non-size",
          "[internals][ucx]") {
  CHECK(ccoll::RndvThreshFor("slice", 262144) == "266240");
  CHECK(ccoll::RndvThreshFor("slice", 8) == "4104");
  CHECK(ccoll::RndvThreshFor("slice", (size_t{1} << 20) - 4096) == "1048576");
  CHECK(ccoll::RndvThreshFor("slice", size_t{1} << 30) == "1048576");
  CHECK(ccoll::RndvThreshFor("64k", 262144) == "64k");
  CHECK(ccoll::RndvThreshFor("", 262144).empty());
  // Every message that goes by rendezvous at that threshold is split (its payload contiguous): an unsplit one, its
  // header included, is eager. A slice below 1 MiB stays one message.
  for (size_t slice : {size_t{8}, size_t{4096}, size_t{262144}, (size_t{1} << 20) - 4096, (size_t{1} << 20) - 24,
                       size_t{1} << 20, size_t{1} << 30}) {
    INFO("slice " << slice);
    const size_t split = ccoll::SplitBytesFor(slice);
    CHECK(split + sizeof(ccoll::WireHeader) <= std::stoull(ccoll::RndvThreshFor("slice", slice)));
    CHECK(split == std::min(slice, (size_t{1} << 20) - sizeof(ccoll::WireHeader)));
  }
  std::unique_ptr<ccoll::UcxTransport> t;
  ccoll::UcxOptions options;
  options.rndvThresh = "266240";
  CHECK(ccoll::UcxTransport::Create(0, 1, options, &t) == ccSuccess);
  t.reset();
  options.rndvThresh = "banana";
  CHECK(ccoll::UcxTransport::Create(0, 1, options, &t) == ccInvalidArgument);
  CHECK(std::string(ccoll::LastError()).find("CC_UCX_RNDV_THRESH=banana is not a UCX size") != std::string::npos);
}

#endif

#if defined(CCOLL_HAVE_UCX) && defined(CCOLL_HAVE_ISAL)
TEST_CASE("UcxTransport with CC_CHECKSUM: the header's CRC covers the payload, also one sent apart, and corruption "
          "is caught", "[internals][transport][wire][ucx]") {
  std::unique_ptr<ccoll::UcxTransport> t[2];
  ConnectUcxPair(t);
  for (auto& x : t) x->SetChecksum(true);
  // Small (eager, one message with its header) and large (4 MiB: after its header, as a message of its own, by
  // rendezvous: the receiver reads the sender's memory when it matches) messages, intact; then a large one changed
  // after Isend; then a kind mismatch.
  for (size_t elems : {size_t{16}, size_t{1} << 20}) {
    for (int corrupt = 0; corrupt < 2; ++corrupt) {
      std::vector<float> data(elems), got(elems, 0.0f);
      for (size_t i = 0; i < elems; ++i) data[i] = static_cast<float>(i % 1000) * 0.25f;
      ccoll::Request *s, *r;
      const uint64_t tag = elems * 2 + corrupt;
      REQUIRE(t[0]->Isend(1, data.data(), elems * 4, tag, ccoll::kWireData, &s) == ccSuccess);
      if (corrupt) data[elems / 2] = -1.0f;
      REQUIRE(t[1]->Irecv(0, got.data(), elems * 4, tag, ccoll::kWireData, &r) == ccSuccess);
      ccResult_t sendRc = ccSuccess;
      std::thread sender([&] { sendRc = t[0]->Wait(s, 10000); });
      ccResult_t rc = t[1]->Wait(r, 10000);
      std::string err = ccoll::LastError();
      sender.join();
      INFO(elems << " elements, corrupt " << corrupt << ": " << err);
      CHECK(sendRc == ccSuccess);
      if (!corrupt) {
        CHECK(rc == ccSuccess);
        CHECK(std::memcmp(data.data(), got.data(), elems * 4) == 0);
      } else if (got[elems / 2] == -1.0f) {
        // UCX read the buffer after the change (rendezvous): the receiver must notice.
        CHECK(rc == ccRemoteError);
        CHECK(err.find("is corrupted") != std::string::npos);
      } else {
        CHECK(rc == ccSuccess);  // UCX had copied the message at Isend (eager): it arrived as summed
      }
    }
  }
  float one = 1.0f, got = 0.0f;
  ccoll::Request *s, *r;
  REQUIRE(t[0]->Isend(1, &one, 4, 99, ccoll::kWireCodecBase + ccCompressCast16, &s) == ccSuccess);
  REQUIRE(t[1]->Irecv(0, &got, 4, 99, ccoll::kWireData, &r) == ccSuccess);
  CHECK(t[1]->Wait(r, 10000) == ccInvalidUsage);
  CHECK(ccoll::LastError().find("cast16 payload") != std::string::npos);
  CHECK(t[0]->Wait(s, 10000) == ccSuccess);
}
#endif

#ifdef CCOLL_HAVE_UCX
// A payload longer than UcxOptions::splitBytes follows its header as a contiguous message of its own (which UCX's
// rendezvous moves in one copy). Each end decides from its own length, so every pairing of split and unsplit
// messages and of lengths must end on both ranks: the data where the lengths agree; otherwise the receiver's error,
// with the length sent where the header told it, and the sender's success (its payload received, cut short, or
// drained; never its timeout). The next message between the two still pairs up. With payloads by rendezvous and
// eagerly (UCX's RNDV_THRESH 8 KiB and inf), and with the receive posted before the messages arrive and after (they
// wait in UCX's unexpected queue: the receiver first takes a marker sent after them).
TEST_CASE("UcxTransport: payloads longer than splitBytes travel apart from their header, and mismatches end on both "
          "ranks", "[internals][transport][ucx]") {
  struct Case {
    size_t sent, expected;
    const char* says;     // nullptr: delivered
    bool atMost = false;  // a receive of at most `expected` bytes (IrecvAtMost)
  };
  const Case cases[] = {
      {100000, 100000, nullptr},
      {4097, 4097, nullptr},
      {4096, 4096, nullptr},
      {0, 0, nullptr},
      {100000, 50000, "but 100000 bytes arrived"},  // both split: the payload cut short
      {50000, 100000, "but 50000 bytes arrived"},   // both split: a shorter payload
      {100000, 100, "but 100000 bytes arrived"},    // split against unsplit: the payload drained
      {100000, 0, "but 100000 bytes arrived"},
      {100, 100000, "but 100 bytes arrived"},  // unsplit against split: the payload receive cancelled
      {0, 100000, "but 0 bytes arrived"},
      {1000, 100, "but a larger message arrived"},  // neither split: UCX's truncation
      // At most: a message as long or shorter is delivered in each of the ways above, a longer one is not.
      {100000, 100000, nullptr, true},
      {50000, 100000, nullptr, true},
      {100, 100000, nullptr, true},
      {0, 100000, nullptr, true},
      {100, 4000, nullptr, true},
      {0, 0, nullptr, true},
      {100000, 50000, "but 100000 bytes arrived", true},
      {100000, 100, "but 100000 bytes arrived", true},
      {1000, 100, "but a larger message arrived", true},
  };
  std::mt19937 gen(11);
  for (const char* rndv : {"8192", "inf"}) {
    ccoll::UcxOptions options;
    options.splitBytes = 4096;
    options.rndvThresh = rndv;
    std::unique_ptr<ccoll::UcxTransport> t[2];
    ConnectUcxPair(t, false, options);
    uint64_t tag = 1;
    // One message from rank 0 to rank 1; `late`: the receive is posted once the message is in UCX's unexpected queue.
    // With `received`, the receive takes at most `expected` bytes.
    auto exchange = [&](size_t sent, size_t expected, ccoll::WireKind sendKind, bool late,
                        std::vector<unsigned char>* data, std::vector<unsigned char>* got, ccResult_t* sendRc,
                        size_t* received = nullptr) {
      data->resize(sent);
      for (auto& b : *data) b = static_cast<unsigned char>(gen());
      got->assign(expected + 1, 0xee);  // one guard byte
      const uint64_t markerTag = tag + 1;
      ccoll::Request *s = nullptr, *r = nullptr, *m = nullptr;
      auto post = [&] {
        return received != nullptr ? t[1]->IrecvAtMost(0, got->data(), expected, tag, ccoll::kWireData, received, &r)
                                   : t[1]->Irecv(0, got->data(), expected, tag, ccoll::kWireData, &r);
      };
      if (!late) REQUIRE(post() == ccSuccess);
      *sendRc = ccInternalError;
      ccResult_t markerRc = ccSuccess;
      std::thread sender([&] {
        uint64_t marker = 7;
        ccoll::Request* ms = nullptr;
        if (t[0]->Isend(1, data->data(), sent, tag, sendKind, &s) != ccSuccess) return;
        if (late) {
          markerRc = t[0]->Isend(1, &marker, sizeof(marker), markerTag, ccoll::kWireData, &ms);
          if (markerRc == ccSuccess) markerRc = t[0]->Wait(ms, 10000);
        }
        *sendRc = t[0]->Wait(s, 10000);
      });
      if (late) {
        uint64_t marker = 0;
        REQUIRE(t[1]->Irecv(0, &marker, sizeof(marker), markerTag, ccoll::kWireData, &m) == ccSuccess);
        CHECK(t[1]->Wait(m, 10000) == ccSuccess);
        REQUIRE(post() == ccSuccess);
      }
      const ccResult_t rc = t[1]->Wait(r, 10000);
      sender.join();
      CHECK(markerRc == ccSuccess);
      tag += 2;
      return rc;
    };
    for (bool late : {false, true}) {
      for (const Case& c : cases) {
        INFO("RNDV_THRESH " << rndv << (late ? ", receive posted late" : "") << ": " << c.sent << " bytes sent, "
                            << c.expected << " expected");
        INFO((c.atMost ? "at most" : "exactly"));
        std::vector<unsigned char> data, got;
        ccResult_t sendRc;
        size_t received = 12345;
        const ccResult_t rc =
            exchange(c.sent, c.expected, ccoll::kWireData, late, &data, &got, &sendRc, c.atMost ? &received : nullptr);
        const std::string err = rc == ccSuccess ? std::string() : ccoll::LastError();
        INFO(err);
        CHECK(sendRc == ccSuccess);
        if (c.says == nullptr) {
          CHECK(rc == ccSuccess);
          CHECK(std::equal(data.begin(), data.end(), got.begin()));
          CHECK(got[c.sent] == 0xee);  // nothing past the message
          CHECK(got.back() == 0xee);
          if (c.atMost) CHECK(received == c.sent);
        } else {
          CHECK(rc == ccInvalidUsage);
          CHECK(err.find(c.says) != std::string::npos);
          CHECK(err.find(std::string("rank 1 expected ") + (c.atMost ? "at most " : "") + std::to_string(c.expected) +
                         " bytes from rank 0") != std::string::npos);
          if (c.atMost) CHECK(received == 12345);
        }
        // The next message, split, still pairs up: nothing of the last one is left to match it.
        CHECK(exchange(60000, 60000, ccoll::kWireData, false, &data, &got, &sendRc) == ccSuccess);
        CHECK(sendRc == ccSuccess);
        CHECK(std::equal(data.begin(), data.end(), got.begin()));
      }
    }
    // A split payload of another kind: the header's kind is checked once the payload is in.
    std::vector<unsigned char> data, got;
    ccResult_t sendRc;
    CHECK(exchange(100000, 100000, ccoll::kWireCodecBase + ccCompressCast16, false, &data, &got, &sendRc) ==
          ccInvalidUsage);
    CHECK(ccoll::LastError().find("cast16 payload") != std::string::npos);
    CHECK(sendRc == ccSuccess);
  }
}
#endif

#ifdef CCOLL_HAVE_UCX
// A wait that gives up (its timeout) releases the UCX request, but over shared memory UCX cannot be made to drop a
// send: it may still read the message's header and iov, which live in ccoll's request. The transport keeps such a
// request until UCX is done with it (or its worker is gone). Here the receiver posts only after the sender's wait
// timed out; UCX then moves the message (an iov by rendezvous: its data goes after the receiver's reply, packed from
// the iov), and it arrives whole. Under AddressSanitizer a request freed at the timeout is a use after free. Once UCX
// has finished it, the transport lets it go (HeldRequests), so abandoned waits do not pile up.
TEST_CASE("UcxTransport: a send whose wait timed out stays readable by UCX until UCX is done with it",
          "[internals][transport][ucx]") {
  ccoll::UcxOptions options;
  options.splitBytes = size_t{1} << 20;  // 100000 bytes unsplit: one iov
  options.rndvThresh = "8192";           // by rendezvous
  std::unique_ptr<ccoll::UcxTransport> t[2];
  ConnectUcxPair(t, false, options);
  std::vector<unsigned char> data(100000), got(100000, 0);
  std::mt19937 gen(3);
  for (auto& b : data) b = static_cast<unsigned char>(gen());
  ccoll::Request *s = nullptr, *r = nullptr, *m = nullptr;
  REQUIRE(t[0]->Isend(1, data.data(), data.size(), 5, ccoll::kWireData, &s) == ccSuccess);
  CHECK(t[0]->Wait(s, 100) == ccTimeout);
  CHECK(t[0]->HeldRequests() == 1);
  CHECK(t[1]->HeldRequests() == 0);
  // Rank 0 progresses (waiting for a marker) while rank 1 receives the message, then sends the marker.
  uint64_t marker = 0, one = 1;
  REQUIRE(t[0]->Irecv(1, &marker, sizeof(marker), 6, ccoll::kWireData, &m) == ccSuccess);
  ccResult_t markerRc = ccInternalError;
  std::thread progress([&] { markerRc = t[0]->Wait(m, 10000); });
  REQUIRE(t[1]->Irecv(0, got.data(), got.size(), 5, ccoll::kWireData, &r) == ccSuccess);
  const ccResult_t rc = t[1]->Wait(r, 10000);
  ccoll::Request* ms = nullptr;
  const ccResult_t sent = t[1]->Isend(0, &one, sizeof(one), 6, ccoll::kWireData, &ms);
  const ccResult_t sentRc = sent == ccSuccess ? t[1]->Wait(ms, 10000) : sent;
  progress.join();
  CHECK(rc == ccSuccess);
  CHECK(cctest::FirstDifference(got, data) == "");
  CHECK(sentRc == ccSuccess);
  CHECK(markerRc == ccSuccess);
  CHECK(marker == 1);
  // The receiver has the message, so UCX completes the send once rank 0's worker hears of it.
  size_t held = 1;
  for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       held != 0 && std::chrono::steady_clock::now() < end;) {
    held = t[0]->HeldRequests();
  }
  CHECK(held == 0);
}
#endif

namespace {

// Idle work that counts its pieces: `pieces` of them (or without end when 0), each about `us` microseconds long.
class CountingWork : public ccoll::IdleWork {
 public:
  CountingWork(int pieces, int us) : pieces_(pieces), us_(us) {}
  bool RunPiece() override {
    ++ran;
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    return pieces_ == 0 || ran < pieces_;
  }
  int ran = 0;

 private:
  const int pieces_, us_;
};

}  // namespace

TEST_CASE("LocalTransport: Wait leaves idle work alone (its transfers are the CPU's own copies)",
          "[internals][transport]") {
  Pair p = MakePair("test-local-idle");
  std::vector<float> data(1000, 2.5f), got(1000, 0.0f);
  ccoll::Request *s, *r;
  REQUIRE(p.t[1]->Irecv(0, got.data(), 4000, 1, ccoll::kWireData, &r) == ccSuccess);
  CountingWork idle(3, 10);
  ccResult_t sendRc = ccInternalError;
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (p.t[0]->Isend(1, data.data(), 4000, 1, ccoll::kWireData, &s) == ccSuccess) sendRc = p.t[0]->Wait(s, 10000);
  });
  CHECK(p.t[1]->Wait(r, 10000, &idle) == ccSuccess);
  sender.join();
  CHECK(sendRc == ccSuccess);
  CHECK(idle.ran == 0);
  CHECK(cctest::FirstDifference(got, data) == "");
}

#ifdef CCOLL_HAVE_UCX
// The sparsifiers hand UCX's waits the passes over what they do not send (collectives/sparse.cc): Wait runs them
// while the network is busy, stops when they are done, and returns once the message is there even when they never are.
TEST_CASE("UcxTransport: Wait runs idle work while a transfer is pending, and returns when it completes",
          "[internals][transport][ucx]") {
  std::unique_ptr<ccoll::UcxTransport> t[2];
  ConnectUcxPair(t);
  for (int endless = 0; endless < 2; ++endless) {
    INFO((endless ? "idle work without end" : "five pieces of idle work"));
    std::vector<float> data(1 << 16), got(1 << 16, 0.0f);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 777) - 300.0f;
    ccoll::Request *s, *r;
    const uint64_t tag = 40 + static_cast<uint64_t>(endless);
    REQUIRE(t[1]->Irecv(0, got.data(), data.size() * 4, tag, ccoll::kWireData, &r) == ccSuccess);
    CountingWork idle(endless ? 0 : 5, 1000);
    ccResult_t sendRc = ccInternalError;
    std::thread sender([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (t[0]->Isend(1, data.data(), data.size() * 4, tag, ccoll::kWireData, &s) == ccSuccess) {
        sendRc = t[0]->Wait(s, 10000);
      }
    });
    const auto start = std::chrono::steady_clock::now();
    CHECK(t[1]->Wait(r, 10000, &idle) == ccSuccess);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    sender.join();
    CHECK(sendRc == ccSuccess);
    CHECK(cctest::FirstDifference(got, data) == "");
    if (endless) {
      CHECK(idle.ran >= 5);   // it ran while nothing arrived (100 ms, pieces of 1 ms)
      CHECK(ms < 5000.0);     // and Wait still returned with the message
    } else {
      CHECK(idle.ran == 5);  // every piece, none after the last
    }
  }
}
#endif
