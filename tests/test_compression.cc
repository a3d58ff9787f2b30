// Compressed all-reduce: every codec and mode over rank counts, odd/prime/tiny/large counts, ring and tree, in place
// or not (identical bits on every rank, finite output, a loose vNMSE sanity bound); the per-codec bounds table at
// 2^20 elements (vNMSE and bits on the wire per element); the tail of a count that is not a multiple of the rotation
// block; unbiasedness of stochastic and correlated rounding (the trial-averaged error shrinks like 1/sqrt(T), and
// nearest rounding without rotation visibly does not); error feedback of the sparsifiers; state isolation between
// compressors and the bucket binding; reproducibility; parameter and spec validation; non-finite, zero, denormal and
// outlier inputs.
//
// Rank bodies run on threads and only record what happened; the main thread asserts after the join (Catch2 v2
// assertions are not thread-safe). Every rank has its own compressor, made from the same spec.
#include <catch2/catch.hpp>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ccoll.h"
#include "collectives/call_check.h"
#include "collectives/compressed.h"
#include "compress/hadamard.h"
#include "compress/bitpack.h"
#include "compress/codecs.h"
#include "compress/compressor.h"
#include "compress/float16.h"
#include "compress/quant_cpu.h"
#include "compress/rng.h"
#include "compress/sparse.h"
#include "compress/sparse_math.h"
#include "compress/widen.h"
#include "drift.h"
#include "fake_cuda/tile_emulator.h"
#include "inputs.h"
#include "rank_harness.h"

using cctest::Compressors;
using cctest::CallCheckOn;
using cctest::Contains;
using cctest::Drift;
using cctest::Vnmse;
using cctest::Group;
using cctest::RankResult;
using cctest::Record;
using cctest::RunRanks;

namespace {

using Buffers = std::vector<std::vector<float>>;

const char* AlgoName(int algo) { return algo == ccAlgoTree ? "tree" : "ring"; }

// The specs of the issue: every codec and aggregation mode.
const std::vector<std::string>& AllSpecs() {
  static const std::vector<std::string> specs = {
      "cast16",
      "cast16:dtype=fp16",
      "quant:bits=8,mode=homomorphic",
      "quant:bits=4,mode=homomorphic,rounding=correlated",
      "quant:bits=4,mode=homomorphic,gather=requant",
      "quant:bits=4,mode=requant,group=32",
      "quant:bits=2,mode=requant",
      "quant:bits=6,mode=requant,rotation=none,clip=0.001",
      "topk:density=0.1",
      "topk:density=0.25,dtype=bf16",
      "randk:density=0.1",
      "randk:density=0.1,unbiased=1,ef=0",
#ifdef CCOLL_HAVE_BLAS  // PowerSGD needs a BLAS; a build without one refuses it (checked below)
      "powersgd:rank=4",
      "powersgd:rank=2,warm=0,dtype=bf16",
#endif
  };
  return specs;
}

// A loose sanity bound of the sweep's vNMSE per spec; infinity means "only check it is finite". Requant error
// compounds with the number of hops (each re-encodes a partial sum), so 2 bits gets the loosest bound; the measured
// worst case at 8 ranks is ~0.65. Sending nothing would score 1.0.
double SweepBound(const std::string& spec) {
  if (spec.rfind("cast16", 0) == 0) return 1e-4;
  if (Contains(spec, "bits=8")) return 1e-3;
  if (Contains(spec, "bits=6")) return 1e-2;
  if (Contains(spec, "bits=4")) return 0.1;
  if (Contains(spec, "bits=2")) return 1.0;
  if (Contains(spec, "unbiased=1")) return std::numeric_limits<double>::infinity();
  // One call from a fresh compressor (no error feedback yet): the result is the average projected on span(P), so
  // it never exceeds 1 in exact arithmetic; the bf16 wire of P and Q adds a little.
  if (Contains(spec, "powersgd")) return 1.02;
  return 1.0;  // biased topk / randk: what is not sent is missing, what is sent is (nearly) exact
}


// `corr` input: rank r holds g + noiseScale * noise_r with g, noise_r ~ N(0,1) and g shared by all ranks.
Buffers CorrInput(int nranks, size_t count, uint64_t seed, double noiseScale = 0.5) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> g(count);
  for (auto& v : g) v = normal(gen);
  Buffers in(static_cast<size_t>(nranks), std::vector<float>(count));
  for (int r = 0; r < nranks; ++r) {
    for (size_t i = 0; i < count; ++i) in[r][i] = static_cast<float>(g[i] + noiseScale * normal(gen));
  }
  return in;
}

// The exact result in fp64: the sum over ranks, divided by nranks for ccAvg.
std::vector<double> ExactReduce(const Buffers& in, ccRedOp_t op) {
  const size_t count = in[0].size();
  std::vector<double> m(count, 0.0);
  for (const auto& x : in) {
    for (size_t i = 0; i < count; ++i) m[i] += static_cast<double>(x[i]);
  }
  if (op == ccAvg) {
    for (auto& v : m) v /= static_cast<double>(in.size());
  }
  return m;
}

// ||out - m||^2 / ||m||^2.
bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// Index of the first rank whose output differs bitwise from rank 0's, or -1.
int FirstDifferentRank(const Buffers& out) {
  for (size_t r = 1; r < out.size(); ++r) {
    if (out[r].size() != out[0].size() ||
        std::memcmp(out[r].data(), out[0].data(), out[0].size() * sizeof(float)) != 0) {
      return static_cast<int>(r);
    }
  }
  return -1;
}

// What one compressed all-reduce gave on every rank.
struct CallResult {
  Buffers out;
  std::vector<RankResult> rc;
  uint64_t bytesSent = 0;  // summed over ranks, during the call

  // "" when every rank returned ccSuccess, else the first failure.
  std::string Failure() const { return cctest::FirstFailure(rc); }
};

// One ccAllReduce on every rank of g with compressor comps[r] on rank r. In place: the input is copied into the
// output buffer and sendbuff == recvbuff.
CallResult AllReduce(const Group& g, const Compressors& comps, const Buffers& in, ccRedOp_t op = ccAvg,
                     bool inPlace = false) {
  const int n = g.size();
  const size_t count = in[0].size();
  CallResult res;
  res.out.assign(static_cast<size_t>(n), std::vector<float>());
  res.rc.assign(static_cast<size_t>(n), RankResult());
  std::vector<uint64_t> sent(static_cast<size_t>(n), 0);
  RunRanks(n, [&](int r) {
    std::vector<float>& out = res.out[r];
    ccCommStats_t before{}, after{};
    before.size = after.size = sizeof(ccCommStats_t);
    ccCommGetStats(g[r], &before);
    const float* send = in[r].data();
    if (inPlace) {
      out = in[r];
      send = out.data();
    } else {
      out.assign(count, std::numeric_limits<float>::quiet_NaN());
    }
    res.rc[r] = Record(ccAllReduce(send, out.data(), count, ccFloat32, op, comps[r], g[r], nullptr), g[r]);
    ccCommGetStats(g[r], &after);
    sent[r] = after.bytesSent - before.bytesSent;
  });
  for (uint64_t b : sent) res.bytesSent += b;
  return res;
}

Group MakeGroup(int nranks, int algo) { return Group::InitConfig(nranks, cctest::MakeConfig(algo)); }

// A buffer full of a bit pattern that no all-reduce produces by accident.
constexpr uint32_t kSentinelBits = 0x7fa5a5a5u;  // a NaN with a payload
float Sentinel() {
  float f;
  std::memcpy(&f, &kSentinelBits, sizeof(f));
  return f;
}
bool AllSentinel(const std::vector<float>& v) {
  for (float x : v) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof(b));
    if (b != kSentinelBits) return false;
  }
  return true;
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------
// The sweep: every spec x nranks x count x algorithm x in place.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("every codec and mode: identical bits on every rank, finite, vNMSE within a sanity bound", "[sweep]") {
  const size_t kLarge = (size_t{1} << 18) + 5;
  const std::vector<size_t> counts = {1, 3, 1001, 7919, kLarge};
  const auto start = std::chrono::steady_clock::now();
  for (int nranks : {2, 3, 4, 8}) {
    for (int algo : {ccAlgoRing, ccAlgoTree}) {
      Group g = MakeGroup(nranks, algo);
      INFO("nranks " << nranks << " " << AlgoName(algo));
      REQUIRE(g.status == ccSuccess);
      for (size_t count : counts) {
        const Buffers in = CorrInput(nranks, count, 1000 + count * 16 + static_cast<uint64_t>(nranks));
        const std::vector<double> exact = ExactReduce(in, ccAvg);
        for (const std::string& spec : AllSpecs()) {
          std::vector<float> outOfPlace;
          for (bool inPlace : {false, true}) {
            INFO(spec << ", count " << count << (inPlace ? ", in place" : ", out of place"));
            Compressors comps(spec, nranks);
            REQUIRE(comps.status == ccSuccess);
            CallResult res = AllReduce(g, comps, in, ccAvg, inPlace);
            REQUIRE(res.Failure() == "");
            CHECK(FirstDifferentRank(res.out) == -1);
            // In place or not, the same inputs and seed give the same bits.
            if (!inPlace) outOfPlace = res.out[0];
            if (inPlace) CHECK(std::memcmp(res.out[0].data(), outOfPlace.data(), count * sizeof(float)) == 0);
            CHECK(AllFinite(res.out[0]));
            const double e = Vnmse(res.out[0], exact);
            INFO("vNMSE " << e);
            CHECK(std::isfinite(e));
            // Below 1000 elements the vNMSE of one draw is too noisy (a mean near zero makes it anything) for a
            // bound to mean something; those counts check identity and finiteness.
            if (count >= 1000) CHECK(e <= SweepBound(spec));
          }
        }
      }
    }
  }
  WARN("sweep took " << cctest::SecondsSince(start) << " s");
}

// ------------------------------------------------------------------------------------------------------------
// The bounds table: 4 ranks, 2^20 float32, corr input, op avg, mean over 5 seeds.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("bounds table: vNMSE and wire bits per element of each codec at 4 ranks, 2^20 elements", "[bounds]") {
  struct Row {
    const char* spec;
    double maxVnmse;
    double maxWireBits;
  };
  const Row rows[] = {
      {"cast16", 2e-5, 16.0},
      {"quant:bits=8,mode=homomorphic", 1e-4, 10.1},
      {"quant:bits=4,mode=homomorphic,rounding=correlated", 0.012, 6.1},
      {"quant:bits=4,mode=requant,group=32", 0.05, 4.6},
      {"quant:bits=6,mode=requant,group=32", 0.003, 6.6},
  };
  const int nranks = 4, kSeeds = 5;
  const size_t count = size_t{1} << 20;
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  // Bits per element per transmission: the exact float32 ring sends 2 (n - 1) / n elements per element per rank.
  const double transmissions = static_cast<double>(count) * 2.0 * (nranks - 1) / nranks;

  // Calibration: the exact ring is 32 bits by this measure.
  {
    const Buffers in = CorrInput(nranks, count, 7);
    std::vector<uint64_t> sent(nranks);
    std::vector<std::vector<float>> out(nranks, std::vector<float>(count));
    RunRanks(nranks, [&](int r) {
      ccCommStats_t a{}, b{};
      a.size = b.size = sizeof(ccCommStats_t);
      ccCommGetStats(g[r], &a);
      ccAllReduce(in[r].data(), out[r].data(), count, ccFloat32, ccAvg, nullptr, g[r], nullptr);
      ccCommGetStats(g[r], &b);
      sent[r] = b.bytesSent - a.bytesSent;
    });
    double bytes = 0;
    for (uint64_t s : sent) bytes += static_cast<double>(s);
    CHECK(8.0 * bytes / nranks / transmissions == Approx(32.0).epsilon(1e-3));
  }

  std::vector<Buffers> inputs;
  std::vector<std::vector<double>> exacts;
  for (int s = 0; s < kSeeds; ++s) {
    inputs.push_back(CorrInput(nranks, count, 20200 + static_cast<uint64_t>(s)));
    exacts.push_back(ExactReduce(inputs.back(), ccAvg));
  }
  std::string table = "spec | vNMSE (bound) | wire bits/elt (bound)\n";
  for (const Row& row : rows) {
    INFO(row.spec);
    double vnmse = 0.0, wireBits = 0.0;
    for (int s = 0; s < kSeeds; ++s) {
      Compressors comps(row.spec, nranks, /*seed=*/1 + s);
      REQUIRE(comps.status == ccSuccess);
      CallResult res = AllReduce(g, comps, inputs[s]);
      REQUIRE(res.Failure() == "");
      CHECK(FirstDifferentRank(res.out) == -1);
      vnmse += Vnmse(res.out[0], exacts[s]) / kSeeds;
      // The codec's bits: without the call check's messages (ceil(log2 n) records per rank and call).
      const double check = CallCheckOn() ? ccoll::kCallCheckRecordBytes * std::ceil(std::log2(nranks)) * nranks : 0.0;
      const double payload = static_cast<double>(res.bytesSent) - check;
      wireBits += 8.0 * payload / nranks / transmissions / kSeeds;
    }
    char line[256];
    std::snprintf(line, sizeof(line), "%s | %.3g (%g) | %.4g (%g)\n", row.spec, vnmse, row.maxVnmse, wireBits,
                  row.maxWireBits);
    table += line;
    CAPTURE(vnmse, wireBits);
    CHECK(vnmse <= row.maxVnmse);
    CHECK(wireBits <= row.maxWireBits);
  }
  WARN(table);
}

// ------------------------------------------------------------------------------------------------------------
// Counts that are not a multiple of the rotation block: the tail is as accurate as the full blocks.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("the tail of a count that is not a multiple of the rotation block is quantized as well as full blocks",
          "[tail]") {
  // 7919 = 7 blocks of 1024 + a tail of 751 elements, which the rotation cuts into blocks of 512, 128, 64, 32, 8, 4,
  // 2 and 1. The rotation is norm-preserving up to one factor per block length, so every rotated element should be
  // quantized with about the same relative error: the tail's vNMSE should be about the full blocks'.
  const int nranks = 2, kSeeds = 8;
  const size_t count = 7919, full = 7 * 1024;
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  std::string report;
  for (const char* spec : {"quant:bits=4,mode=homomorphic", "quant:bits=8,mode=homomorphic",
                           "quant:bits=4,mode=requant,group=1024"}) {
    INFO(spec);
    double numFull = 0, denFull = 0, numTail = 0, denTail = 0;
    for (int s = 0; s < kSeeds; ++s) {
      const Buffers in = CorrInput(nranks, count, 300 + static_cast<uint64_t>(s));
      const std::vector<double> m = ExactReduce(in, ccAvg);
      Compressors comps(spec, nranks, 1 + s);
      REQUIRE(comps.status == ccSuccess);
      CallResult res = AllReduce(g, comps, in);
      REQUIRE(res.Failure() == "");
      for (size_t i = 0; i < count; ++i) {
        const double d = static_cast<double>(res.out[0][i]) - m[i];
        (i < full ? numFull : numTail) += d * d;
        (i < full ? denFull : denTail) += m[i] * m[i];
      }
    }
    const double vFull = numFull / denFull, vTail = numTail / denTail;
    CAPTURE(vFull, vTail);
    report += std::string(spec) + ": full blocks " + std::to_string(vFull) + ", tail " + std::to_string(vTail) + "\n";
    CHECK(vTail <= 2.0 * vFull);
  }
  WARN(report);
}

// ------------------------------------------------------------------------------------------------------------
// Unbiasedness: the trial-averaged error of an unbiased codec shrinks like 1/sqrt(T).
// ------------------------------------------------------------------------------------------------------------

namespace {

// RMS over elements of the error averaged over the first 16 and over all 256 trials (seeds 1..256, same input,
// fresh compressors), and their ratio (theory for an unbiased codec: 1/4; a biased one stays near 1).
struct BiasProbe {
  double rms16 = 0, rms256 = 0;
  double Ratio() const { return rms256 / rms16; }
};

BiasProbe ProbeBias(const Group& g, const std::string& spec, const Buffers& in, std::string* failure) {
  const size_t count = in[0].size();
  const std::vector<double> exact = ExactReduce(in, ccAvg);
  std::vector<double> errSum(count, 0.0);
  BiasProbe p;
  auto rms = [&](int trials) {
    double s = 0.0;
    for (double e : errSum) s += (e / trials) * (e / trials);
    return std::sqrt(s / static_cast<double>(count));
  };
  for (int t = 1; t <= 256; ++t) {
    Compressors comps(spec, g.size(), t);
    if (comps.status != ccSuccess) {
      *failure = comps.error;
      return p;
    }
    CallResult res = AllReduce(g, comps, in);
    if (!res.Failure().empty()) {
      *failure = res.Failure();
      return p;
    }
    if (FirstDifferentRank(res.out) != -1) {
      *failure = "ranks differ";
      return p;
    }
    for (size_t i = 0; i < count; ++i) errSum[i] += static_cast<double>(res.out[0][i]) - exact[i];
    if (t == 16) p.rms16 = rms(16);
  }
  p.rms256 = rms(256);
  return p;
}

// Every element a constant off the grid except one per 32-group that sets the group's scale: 1.0 at i % 32 == 0,
// 0.3 elsewhere (4 bits: 0.3 sits at 9.75 steps of 2/15 above -1, so nearest rounding always adds +0.033).
Buffers OffGridInput(int nranks, size_t count) {
  Buffers in(static_cast<size_t>(nranks), std::vector<float>(count));
  for (auto& x : in) {
    for (size_t i = 0; i < count; ++i) x[i] = i % 32 == 0 ? 1.0f : 0.3f;
  }
  return in;
}

}  // namespace

TEST_CASE("stochastic and correlated rounding are unbiased: the mean error shrinks like 1/sqrt(trials)",
          "[unbiased]") {
  const int nranks = 2;
  const size_t count = 4096;
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  const Buffers corr = CorrInput(nranks, count, 4242);
  const Buffers offGrid = OffGridInput(nranks, count);
  std::string report;

  // Unbiased: stochastic and correlated rounding, no clipping, homomorphic and requant, with and without rotation.
  // Without rotation nothing else randomizes the error, so a biased rounding rule shows; the corr input gives the
  // two ranks different values at every element, the off-grid input the same values.
  for (const char* spec : {"quant:bits=4,mode=homomorphic,rounding=stochastic",
                           "quant:bits=4,mode=homomorphic,rounding=stochastic,rotation=none",
                           "quant:bits=4,mode=homomorphic,rounding=correlated",
                           "quant:bits=4,mode=homomorphic,rounding=correlated,rotation=none",
                           "quant:bits=2,mode=homomorphic,rounding=correlated,rotation=none",
                           "quant:bits=4,mode=homomorphic,gather=requant",
                           "quant:bits=4,mode=requant,rounding=stochastic",
                           "quant:bits=2,mode=requant,rotation=none",
                           "quant:bits=8,mode=requant"}) {
    for (const Buffers* in : {&corr, &offGrid}) {
      INFO(spec << (in == &corr ? ", corr input" : ", off-grid input"));
      std::string failure;
      BiasProbe p = ProbeBias(g, spec, *in, &failure);
      REQUIRE(failure == "");
      CAPTURE(p.rms16, p.rms256, p.Ratio());
      report += std::string(spec) + (in == &corr ? " corr" : " off-grid") + ": ratio " + std::to_string(p.Ratio()) +
                "\n";
      CHECK(p.rms16 > 0.0);
      CHECK(p.Ratio() < 1.0 / 2.5);
    }
  }

  // Biased: nearest rounding must fail the same test, or the test proves nothing. Without rotation it is
  // deterministic, so the mean error does not shrink at all. With the seeded rotation it is NOT biased over seeds:
  // the rotation's signs D and -D are equally likely and nearest rounding on the symmetric grid is odd
  // (Q(-y) = -Q(y)), so the rotated-back errors cancel in expectation; the rotation acts as a dither. Measured ratios
  // are ~0.25 on both inputs, so the rotated cases are reported, not asserted.
  for (const char* spec : {"quant:bits=4,mode=requant,rounding=nearest,rotation=none",
                           "quant:bits=4,mode=homomorphic,rounding=nearest,rotation=none",
                           "quant:bits=4,mode=requant,rounding=nearest",
                           "quant:bits=4,mode=homomorphic,rounding=nearest"}) {
    for (const Buffers* in : {&corr, &offGrid}) {
      INFO(spec << (in == &corr ? ", corr input" : ", off-grid input"));
      std::string failure;
      BiasProbe p = ProbeBias(g, spec, *in, &failure);
      REQUIRE(failure == "");
      report += std::string(spec) + (in == &corr ? " corr" : " off-grid") + ": ratio " + std::to_string(p.Ratio()) +
                "\n";
      if (!Contains(spec, "rotation=none")) continue;
      CAPTURE(p.rms16, p.rms256, p.Ratio());
      CHECK(p.rms16 > 0.0);
      CHECK_FALSE(p.Ratio() < 1.0 / 2.5);
    }
  }
  WARN(report);
}

// ------------------------------------------------------------------------------------------------------------
// Error feedback.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("error feedback: the running sum of outputs tracks the running sum of exact means", "[ef]") {
  const int nranks = 4, kCalls = 200;
  const size_t count = 1 << 14;  // 64 chunks of 256; density 0.1 keeps 6 per call
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  // A fixed "true" gradient; every call adds fresh noise per rank.
  std::vector<double> truth(count);
  {
    std::mt19937_64 gen(99);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (auto& v : truth) v = normal(gen);
  }
  std::string report;
  for (const char* base : {"topk:density=0.1,chunk=256", "randk:density=0.1,chunk=256"}) {
    double resid[2][2] = {};  // [ef][call 50, call 200]
    for (int ef : {1, 0}) {
      const std::string spec = std::string(base) + ",ef=" + std::to_string(ef);
      INFO(spec);
      Compressors comps(spec, nranks);
      REQUIRE(comps.status == ccSuccess);
      Drift drift(count);  // sum_t out_t - sum_t mean_t
      std::mt19937_64 gen(7);
      std::normal_distribution<double> normal(0.0, 1.0);
      Buffers in(static_cast<size_t>(nranks), std::vector<float>(count));
      bool identical = true, finite = true;
      for (int t = 1; t <= kCalls; ++t) {
        for (auto& x : in) {
          for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(truth[i] + normal(gen));
        }
        const std::vector<double> mean = ExactReduce(in, ccAvg);
        CallResult res = AllReduce(g, comps, in);
        REQUIRE(res.Failure() == "");
        identical = identical && FirstDifferentRank(res.out) == -1;
        finite = finite && AllFinite(res.out[0]);
        drift.Add(res.out[0].data(), mean);
        if (t == 50 || t == kCalls) resid[ef][t == 50 ? 0 : 1] = drift.Norm();
      }
      CHECK(identical);
      CHECK(finite);
      report += spec + ": residual at call 50 " + std::to_string(resid[ef][0]) + ", at call 200 " +
                std::to_string(resid[ef][1]) + "\n";
    }
    INFO(base << ": ef=1 residual " << resid[1][0] << " -> " << resid[1][1] << ", ef=0 residual " << resid[0][0]
              << " -> " << resid[0][1]);
    CHECK(resid[1][1] < 2.0 * resid[1][0]);  // bounded with error feedback
    CHECK(resid[0][1] > 2.5 * resid[0][0]);  // grows without it
    CHECK(resid[1][1] < resid[0][1]);
  }
  WARN(report);
}

// With 16-bit values, a sparsifier's sums are rounded at every hop; error feedback keeps that rounding too (each rank
// its share), so the running sum of outputs stays on the running sum of means. The same input every call makes the
// rounding systematic: without the rounding kept, every call gives the same output and the drift grows with the calls.
// Tagged [numerics] too, so that ctest runs it again with 256-byte slices and 3 lanes (many slices per chunk).
TEST_CASE("error feedback keeps what the bf16 sums of the sent values round away", "[ef][numerics]") {
  const int nranks = 4;
  const size_t count = 4096 + 100;  // a short last chunk
  std::string report;
  for (int algo : {ccAlgoRing, ccAlgoTree}) {
    Group g = MakeGroup(nranks, algo);
    REQUIRE(g.status == ccSuccess);
    Buffers in(static_cast<size_t>(nranks), std::vector<float>(count));
    std::mt19937_64 gen(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& x : in) {
      for (float& v : x) v = 3.0f * normal(gen);
    }
    const std::vector<double> mean = ExactReduce(in, ccAvg);
    for (const char* base : {"topk:density=1,chunk=256", "randk:density=1,chunk=256", "topk:density=0.5,chunk=256"}) {
      const bool everyChunk = Contains(base, "density=1,");
      for (const char* values : {"bf16", "f32"}) {
        const bool bf16 = std::string(values) == "bf16";
        double rms[2][2] = {};  // [ef][after 10 calls, after 40]
        for (int ef : {1, 0}) {
          const std::string spec = std::string(base) + ",dtype=" + values + ",ef=" + std::to_string(ef);
          INFO("algorithm " << algo << ", " << spec);
          Compressors comps(spec, nranks);
          REQUIRE(comps.status == ccSuccess);
          Drift drift(count);
          bool identical = true;
          for (int t = 1; t <= 40; ++t) {
            CallResult res = AllReduce(g, comps, in);
            REQUIRE(res.Failure() == "");
            identical = identical && FirstDifferentRank(res.out) == -1;
            drift.Add(res.out[0].data(), mean);
            if (t == 10 || t == 40) rms[ef][t == 10 ? 0 : 1] = drift.Rms();
          }
          CHECK(identical);
        }
        std::ostringstream line;
        line << "algorithm " << algo << ", " << base << ",dtype=" << values << ": drift rms after 10 and 40 calls "
             << rms[1][0] << " -> " << rms[1][1] << " (ef=0: " << rms[0][0] << " -> " << rms[0][1] << ")";
        INFO(line.str());
        report += line.str() + "\n";
        if (!everyChunk) {
          CHECK(rms[1][1] < 1.5 * rms[1][0]);  // what was not sent is held back, the same amount every call or so
        } else if (bf16) {
          // Every chunk sent: the drift stays within about one call's rounding (2^-9 of the values' sums, near 6
          // here) ...
          CHECK(rms[1][1] < 1.5 * rms[1][0] + 1e-4);
          CHECK(rms[1][1] < 0.01);
          // ... while without error feedback every call rounds the same way: 4x the drift in 4x the calls.
          CHECK(rms[0][1] > 3.5 * rms[0][0]);
          CHECK(rms[0][1] > 10.0 * rms[1][1]);
        } else {
          CHECK(rms[1][1] < 1e-4);  // float32 values: float32's own rounding of the sum and the average
        }
      }
    }
  }
  WARN(report);
}

// With 16-bit data the result itself is rounded to 16 bits; error feedback keeps each rank's share of that rounding
// too (with float32 and with bf16 values), so the running sum of the 16-bit outputs stays on the running sum of the
// exact results. The same input every call makes the rounding systematic: without error feedback every call rounds
// the same way, and the drift grows with the calls. 3 ranks: the average's division rounds as well.
TEST_CASE("error feedback keeps what the 16-bit result's rounding takes", "[ef][numerics][half]") {
  const int nranks = 3;
  const size_t count = 4096 + 100;  // a short last chunk
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  std::string report;
  for (ccDataType_t dtype : {ccBfloat16, ccFloat16}) {
    Buffers in(static_cast<size_t>(nranks), std::vector<float>(count));
    std::vector<std::vector<uint16_t>> in16(static_cast<size_t>(nranks), std::vector<uint16_t>(count));
    const uint64_t seed = std::random_device()();
    INFO("input seed " << seed);
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int r = 0; r < nranks; ++r) {
      for (float& v : in[r]) v = 3.0f * normal(gen);
      ccoll::Narrow(dtype, in[r].data(), count, in16[r].data());
      ccoll::Widen(dtype, in16[r].data(), count, in[r].data());  // the exact values of the 16-bit inputs
    }
    for (ccRedOp_t op : {ccAvg, ccSum}) {
      const std::vector<double> exact = ExactReduce(in, op);
      for (const char* base : {"topk:density=1,chunk=256", "randk:density=1,chunk=256",
                               "topk:density=1,chunk=256,dtype=bf16"}) {
        double rms[2][2] = {};  // [ef][after 10 calls, after 40]
        for (int ef : {1, 0}) {
          const std::string spec = std::string(base) + ",ef=" + std::to_string(ef);
          INFO((dtype == ccBfloat16 ? "bf16" : "fp16") << " data, " << (op == ccAvg ? "avg" : "sum") << ", "
                                                        << spec);
          Compressors comps(spec, nranks);
          REQUIRE(comps.status == ccSuccess);
          Drift drift(count);
          std::vector<std::vector<uint16_t>> out(static_cast<size_t>(nranks), std::vector<uint16_t>(count));
          std::vector<float> wide(count);
          bool identical = true;
          for (int t = 1; t <= 40; ++t) {
            std::vector<RankResult> rc(static_cast<size_t>(nranks));
            RunRanks(nranks, [&](int r) {
              rc[r] = Record(ccAllReduce(in16[r].data(), out[r].data(), count, dtype, op, comps[r], g[r], nullptr),
                             g[r]);
            });
            for (int r = 0; r < nranks; ++r) REQUIRE(rc[r].rc == ccSuccess);
            for (int r = 1; r < nranks; ++r) identical = identical && out[r] == out[0];
            ccoll::Widen(dtype, out[0].data(), count, wide.data());
            drift.Add(wide.data(), exact);
            if (t == 10 || t == 40) rms[ef][t == 10 ? 0 : 1] = drift.Rms();
          }
          CHECK(identical);
        }
        std::ostringstream line;
        line << (dtype == ccBfloat16 ? "bf16" : "fp16") << " data, " << (op == ccAvg ? "avg" : "sum") << ", " << base
             << ": drift rms after 10 and 40 calls " << rms[1][0] << " -> " << rms[1][1] << " (ef=0: " << rms[0][0]
             << " -> " << rms[0][1] << ")";
        INFO(line.str());
        report += line.str() + "\n";
        // With error feedback the drift stays within about one call's rounding (2^-9 of the values for bf16) ...
        CHECK(rms[1][1] < 1.5 * rms[1][0] + 1e-4);
        // ... while without it every call rounds the same way: 4x the drift in 4x the calls.
        CHECK(rms[0][1] > 3.5 * rms[0][0]);
        CHECK(rms[0][1] > 10.0 * rms[1][1]);
      }
    }
  }
  WARN(report);
}

// ------------------------------------------------------------------------------------------------------------
// State: two compressors do not share state; a compressor is bound to its bucket's count.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("two compressors keep separate state: interleaved buckets give the bits of separate runs", "[state]") {
  const int nranks = 3, kCalls = 4;
  const size_t countA = 5000, countB = 3001;
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  std::vector<Buffers> inA, inB;
  for (int t = 0; t < kCalls; ++t) {
    inA.push_back(CorrInput(nranks, countA, 500 + static_cast<uint64_t>(t)));
    inB.push_back(CorrInput(nranks, countB, 600 + static_cast<uint64_t>(t)));
  }
  for (const char* spec : {"topk:density=0.1,chunk=64", "randk:density=0.1,chunk=64", "quant:bits=4",
                           "quant:bits=4,mode=homomorphic,rounding=correlated", "cast16"}) {
    INFO(spec);
    std::vector<Buffers> aloneA, aloneB, mixedA, mixedB;
    {
      Compressors a(spec, nranks);
      REQUIRE(a.status == ccSuccess);
      for (int t = 0; t < kCalls; ++t) {
        CallResult res = AllReduce(g, a, inA[t]);
        REQUIRE(res.Failure() == "");
        aloneA.push_back(res.out);
      }
      Compressors b(spec, nranks);
      REQUIRE(b.status == ccSuccess);
      for (int t = 0; t < kCalls; ++t) {
        CallResult res = AllReduce(g, b, inB[t]);
        REQUIRE(res.Failure() == "");
        aloneB.push_back(res.out);
      }
    }
    {
      Compressors a(spec, nranks), b(spec, nranks);
      REQUIRE(a.status == ccSuccess);
      REQUIRE(b.status == ccSuccess);
      for (int t = 0; t < kCalls; ++t) {
        CallResult ra = AllReduce(g, a, inA[t]);
        REQUIRE(ra.Failure() == "");
        mixedA.push_back(ra.out);
        CallResult rb = AllReduce(g, b, inB[t]);
        REQUIRE(rb.Failure() == "");
        mixedB.push_back(rb.out);
      }
    }
    for (int t = 0; t < kCalls; ++t) {
      INFO("call " << t);
      for (int r = 0; r < nranks; ++r) {
        CHECK(std::memcmp(mixedA[t][r].data(), aloneA[t][r].data(), countA * sizeof(float)) == 0);
        CHECK(std::memcmp(mixedB[t][r].data(), aloneB[t][r].data(), countB * sizeof(float)) == 0);
      }
    }
    // The state matters (else the test would prove nothing): call 1's input through a fresh compressor gives other
    // bits than through the compressor that already ran call 0 (error feedback, call counter). cast16 is stateless.
    if (std::string(spec) != "cast16") {
      Compressors fresh(spec, nranks);
      CallResult res = AllReduce(g, fresh, inA[1]);
      REQUIRE(res.Failure() == "");
      CHECK(std::memcmp(res.out[0].data(), aloneA[1][0].data(), countA * sizeof(float)) != 0);
    }
  }
}

TEST_CASE("a compressor is bound to the count of its first call and refuses another count with ccInvalidUsage", "[state]") {
  const int nranks = 2;
  for (const std::string& spec : AllSpecs()) {
    INFO(spec);
    // A group per spec: the refusal currently breaks the communicator (see the next test case), which must not
    // hide whether the next spec refuses too.
    Group g = MakeGroup(nranks, ccAlgoRing);
    REQUIRE(g.status == ccSuccess);
    Compressors comps(spec, nranks);
    REQUIRE(comps.status == ccSuccess);
    CallResult first = AllReduce(g, comps, CorrInput(nranks, 1000, 1));
    REQUIRE(first.Failure() == "");
    // The other count on every rank: each rank refuses before anything moves and leaves recvbuff alone.
    const Buffers other = CorrInput(nranks, 999, 2);
    std::vector<RankResult> rc(nranks);
    Buffers out(nranks, std::vector<float>(999, Sentinel()));
    RunRanks(nranks, [&](int r) {
      rc[r] = Record(ccAllReduce(other[r].data(), out[r].data(), 999, ccFloat32, ccAvg, comps[r], g[r], nullptr),
                     g[r]);
    });
    for (int r = 0; r < nranks; ++r) {
      INFO("rank " << r << ": " << rc[r].error);
      CHECK(rc[r].rc == ccInvalidUsage);
      CHECK(Contains(rc[r].error, "1000"));
      CHECK(Contains(rc[r].error, "999"));
      CHECK(AllSentinel(out[r]));
    }
    if (rc[0].rc != ccInvalidUsage) break;
  }
}

TEST_CASE("a compressor bound to another count is refused without breaking the communicator", "[state]") {
  // ccInvalidUsage is found before communication (like the argument checks), so the communicator must stay usable,
  // as it does after every other argument error.
  const int nranks = 2;
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  Compressors comps("quant:bits=4", nranks);
  REQUIRE(comps.status == ccSuccess);
  REQUIRE(AllReduce(g, comps, CorrInput(nranks, 1000, 1)).Failure() == "");
  std::vector<RankResult> rc(nranks);
  const Buffers other = CorrInput(nranks, 999, 2);
  Buffers out(nranks, std::vector<float>(999));
  RunRanks(nranks, [&](int r) {
    rc[r] = Record(ccAllReduce(other[r].data(), out[r].data(), 999, ccFloat32, ccAvg, comps[r], g[r], nullptr), g[r]);
  });
  for (int r = 0; r < nranks; ++r) CHECK(rc[r].rc == ccInvalidUsage);
  // The bucket of 1000 keeps working on the same communicator.
  CallResult again = AllReduce(g, comps, CorrInput(nranks, 1000, 3));
  CHECK(again.Failure() == "");
  std::vector<ccResult_t> async(nranks, ccSuccess);
  for (int r = 0; r < nranks; ++r) {
    ccCommGetAsyncError(g[r], &async[r]);
    INFO("rank " << r);
    CHECK(async[r] == ccSuccess);
  }
}

// ------------------------------------------------------------------------------------------------------------
// Reproducibility.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("the same seed and inputs give the same bits on a second run with fresh compressors", "[repro]") {
  const int nranks = 3, kCalls = 3;
  const size_t count = 10007;
  std::vector<Buffers> inputs;
  for (int t = 0; t < kCalls; ++t) inputs.push_back(CorrInput(nranks, count, 77 + static_cast<uint64_t>(t)));
  for (int algo : {ccAlgoRing, ccAlgoTree}) {
    Group g = MakeGroup(nranks, algo);
    REQUIRE(g.status == ccSuccess);
    for (const std::string& spec : AllSpecs()) {
      INFO(spec << " " << AlgoName(algo));
      std::vector<Buffers> runs[2];
      for (int run = 0; run < 2; ++run) {
        Compressors comps(spec, nranks, 12345);
        REQUIRE(comps.status == ccSuccess);
        for (int t = 0; t < kCalls; ++t) {
          CallResult res = AllReduce(g, comps, inputs[t]);
          REQUIRE(res.Failure() == "");
          runs[run].push_back(res.out);
        }
      }
      for (int t = 0; t < kCalls; ++t) {
        INFO("call " << t);
        for (int r = 0; r < nranks; ++r) {
          CHECK(std::memcmp(runs[0][t][r].data(), runs[1][t][r].data(), count * sizeof(float)) == 0);
        }
      }
      // The seed is used: another seed changes the bits of every randomized codec.
      const bool randomized = spec.rfind("quant", 0) == 0 || spec.rfind("randk", 0) == 0;
      if (randomized) {
        Compressors other(spec, nranks, 54321);
        REQUIRE(other.status == ccSuccess);
        CallResult res = AllReduce(g, other, inputs[0]);
        REQUIRE(res.Failure() == "");
        CHECK(std::memcmp(res.out[0].data(), runs[0][0][0].data(), count * sizeof(float)) != 0);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// Parameters, spec strings and misuse.
// ------------------------------------------------------------------------------------------------------------

TEST_CASE("compressor parameters and spec strings are validated with sentences that name the problem", "[params]") {
  int dummy = 0;
  ccCompressor_t fake = reinterpret_cast<ccCompressor_t>(&dummy);

  SECTION("out-of-range and foreign parameters") {
    ccCompressor_t q = nullptr;
    REQUIRE(ccCompressorCreate(&q, ccCompressQuant) == ccSuccess);
    for (int64_t bits : {int64_t{0}, int64_t{9}}) {
      INFO("bits " << bits);
      CHECK(ccCompressorSetParam(q, ccParamBits, bits) == ccInvalidArgument);  // include/ccoll.h: out of range
      std::string err = ccGetLastError(nullptr);
      INFO(err);
      CHECK(Contains(err, "bits"));
      CHECK(Contains(err, std::to_string(bits)));
    }
    int64_t v = 0;
    CHECK(ccCompressorGetParam(q, ccParamBits, &v) == ccSuccess);
    CHECK(v == 4);
    CHECK(ccCompressorSetParam(q, ccParamDensityPpm, 100000) == ccInvalidArgument);  // a topk/randk parameter
    CHECK(Contains(ccGetLastError(nullptr), "density"));
    CHECK(ccCompressorSetParam(q, ccParamUnbiased, 1) == ccInvalidArgument);  // randk only
    CHECK(Contains(ccGetLastError(nullptr), "unbiased"));
    ccCompressor_t c16 = nullptr;
    REQUIRE(ccCompressorCreate(&c16, ccCompressCast16) == ccSuccess);
    CHECK(ccCompressorSetParam(c16, ccParamBits, 4) == ccInvalidArgument);
    CHECK(Contains(ccGetLastError(nullptr), "bits"));
    CHECK(ccCompressorSetParam(c16, ccParamValueType, ccFloat32) == ccInvalidArgument);  // cast16: bf16 or fp16
    CHECK(Contains(ccGetLastError(nullptr), "dtype"));
    CHECK(ccCompressorDestroy(c16) == ccSuccess);
    CHECK(ccCompressorDestroy(q) == ccSuccess);
  }

  SECTION("malformed specs, unknown kinds, the reserved kind") {
    struct Bad {
      const char* spec;
      ccResult_t rc;
      const char* mention;
    };
    const Bad bad[] = {
        {"quant:bits", ccInvalidArgument, "bits"},
        {"quant:", ccInvalidArgument, "quant:"},
        {"quant:bits=4,", ccInvalidArgument, "quant:bits=4,"},
        {"quant:foo=1", ccInvalidArgument, "foo"},
        {"quant:bits=0", ccInvalidArgument, "bits"},
        {"quant:bits=9", ccInvalidArgument, "bits"},
        {"quant:density=0.1", ccInvalidArgument, "density"},
        {"topk:density=2", ccInvalidArgument, "density"},
        {"cast16:dtype=f32", ccInvalidArgument, "dtype"},
        {"zip:level=3", ccInvalidArgument, "zip"},
        {"Quant:bits=4", ccInvalidArgument, "Quant"},
#ifdef CCOLL_HAVE_LOWRANK
        {"powersgd:bits=4", ccInvalidArgument, "bits"},
        {"powersgd:rank=0", ccInvalidArgument, "rank"},
        {"powersgd:rank=65", ccInvalidArgument, "rank"},
        {"powersgd:eps=2", ccInvalidArgument, "eps"},
        {"powersgd:shapes=", ccInvalidArgument, "shapes"},
        {"powersgd:shapes=4x", ccInvalidArgument, "4x"},
        {"powersgd:shapes=4x4+", ccInvalidArgument, "4x4+"},
        {"powersgd:shapes=0x4", ccInvalidArgument, "0x4"},
        {"powersgd:shapes=4y4", ccInvalidArgument, "4y4"},
        {"powersgd:shapes=2199023255553x1", ccInvalidArgument, "2199023255553"},  // a side over 2^40
#else
        {"powersgd", ccInvalidUsage, "needs a BLAS"},
        {"powersgd:rank=4", ccInvalidUsage, "needs a BLAS"},
#endif
        {"quant:shapes=4x4", ccInvalidArgument, "shapes"},
    };
    for (const Bad& b : bad) {
      ccCompressor_t c = fake;
      ccResult_t rc = ccCompressorCreateFromString(&c, b.spec);
      std::string err = ccGetLastError(nullptr);
      INFO("\"" << b.spec << "\" -> " << rc << ": " << err);
      CHECK(rc == b.rc);
      CHECK(c == nullptr);
      CHECK(Contains(err, b.mention));
    }
  }

  SECTION("every parameter's bounds hold its default, for every kind it applies to") {
    const ccCompressorParam_t params[] = {ccParamBits,         ccParamMode,         ccParamRotation,
                                          ccParamRotationBlock, ccParamGroupSize,   ccParamScaleFormat,
                                          ccParamClipPpm,       ccParamRounding,    ccParamGatherPayload,
                                          ccParamDensityPpm,    ccParamChunkSize,   ccParamErrorFeedback,
                                          ccParamValueType,     ccParamUnbiased,    ccParamRank,
                                          ccParamRows,          ccParamCols,        ccParamWarmStart,
                                          ccParamStartIter,     ccParamOrthoEpsilon, ccParamSeed};
    int applied[sizeof(params) / sizeof(params[0])] = {};
    for (ccCompressorKind_t kind : {ccCompressCast16, ccCompressQuant, ccCompressTopkChunk, ccCompressRandk,
#ifdef CCOLL_HAVE_LOWRANK
                                    ccCompressPowerSGD
#endif
                                   }) {
      ccCompressor_t c = nullptr;
      REQUIRE(ccCompressorCreate(&c, kind) == ccSuccess);
      for (size_t k = 0; k < sizeof(params) / sizeof(params[0]); ++k) {
        INFO("kind " << kind << " param " << params[k]);
        int64_t lo = 0, hi = 0, def = 0;
        REQUIRE(ccCompressorGetParamBounds(params[k], &lo, &hi) == ccSuccess);
        if (ccCompressorGetParam(c, params[k], &def) != ccSuccess) continue;  // does not apply to this kind
        ++applied[k];
        CHECK(lo <= def);
        CHECK(def <= hi);
        // The bounds themselves are accepted, one past them is not (dtype and block have gaps inside).
        if (params[k] != ccParamValueType && params[k] != ccParamRotationBlock) {
          CHECK(ccCompressorSetParam(c, params[k], lo) == ccSuccess);
          CHECK(ccCompressorSetParam(c, params[k], hi) == ccSuccess);
        }
        if (lo > INT64_MIN) CHECK(ccCompressorSetParam(c, params[k], lo - 1) == ccInvalidArgument);
        if (hi < INT64_MAX) CHECK(ccCompressorSetParam(c, params[k], hi + 1) == ccInvalidArgument);
        CHECK(ccCompressorSetParam(c, params[k], def) == ccSuccess);
      }
      CHECK(ccCompressorDestroy(c) == ccSuccess);
    }
    for (size_t k = 0; k < sizeof(params) / sizeof(params[0]); ++k) {
      INFO("param " << params[k] << " applies to no kind");
#ifndef CCOLL_HAVE_LOWRANK
      if (params[k] >= ccParamRank && params[k] <= ccParamOrthoEpsilon) continue;  // PowerSGD's own
#endif
      CHECK(applied[k] > 0);
    }
  }

  SECTION("GetSpec round-trips: a compressor made from its own spec has the same spec and parameters") {
    std::vector<std::string> specs = AllSpecs();
    for (const char* s : {"cast16", "quant", "topk", "randk", "quant:clip=0.000001,seed=9223372036854775807",
                          "topk:density=0.123457,chunk=1,ef=0", "randk:density=1,unbiased=on,ef=off,dtype=bf16",
                          "quant:bits=1,block=64,group=1048576,scale=fp16,rounding=nearest",
#ifdef CCOLL_HAVE_LOWRANK
                          "powersgd", "powersgd:rank=64,rows=4096,cols=2048,warm=off,start=10,eps=1e-08,dtype=bf16,ef=0",
                          "powersgd:shapes=1024x512+512+10x512+10"
#endif
                         }) {
      specs.push_back(s);
    }
    for (const std::string& spec : specs) {
      INFO(spec);
      ccCompressor_t a = nullptr, b = nullptr;
      REQUIRE(ccCompressorCreateFromString(&a, spec.c_str()) == ccSuccess);
      char bufA[1024] = {}, bufB[1024] = {};
      REQUIRE(ccCompressorGetSpec(a, bufA, sizeof(bufA)) == ccSuccess);
      INFO("canonical: " << bufA);
      REQUIRE(ccCompressorCreateFromString(&b, bufA) == ccSuccess);
      REQUIRE(ccCompressorGetSpec(b, bufB, sizeof(bufB)) == ccSuccess);
      CHECK(std::string(bufA) == bufB);
      for (ccCompressorParam_t p : {ccParamBits, ccParamMode, ccParamRotation, ccParamRotationBlock, ccParamGroupSize,
                                    ccParamScaleFormat, ccParamClipPpm, ccParamRounding, ccParamGatherPayload,
                                    ccParamDensityPpm, ccParamChunkSize, ccParamErrorFeedback, ccParamValueType,
                                    ccParamUnbiased, ccParamRank, ccParamRows, ccParamCols, ccParamWarmStart,
                                    ccParamStartIter, ccParamOrthoEpsilon, ccParamSeed}) {
        int64_t va = -1, vb = -2;
        ccResult_t ra = ccCompressorGetParam(a, p, &va), rb = ccCompressorGetParam(b, p, &vb);
        INFO("param " << p);
        CHECK(ra == rb);
        if (ra == ccSuccess) CHECK(va == vb);
      }
      CHECK(ccCompressorDestroy(a) == ccSuccess);
      CHECK(ccCompressorDestroy(b) == ccSuccess);
    }
  }
}

TEST_CASE("Widen and Narrow equal the element conversions for every kind of value", "[half]") {
  std::mt19937_64 gen(3);
  std::vector<float> f;
  for (uint32_t u : {0u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 1u, 0x00800000u,
                     0x477ff000u, 0x477fefffu, 0x38800000u, 0x387fffffu, 0x33000000u, 0x3f808000u, 0x3f818000u}) {
    f.push_back(ccoll::BitsFloat(u));
  }
  while (f.size() < (1u << 20) + 3) f.push_back(ccoll::BitsFloat(static_cast<uint32_t>(gen())));
  for (ccDataType_t dtype : {ccBfloat16, ccFloat16}) {
    INFO((dtype == ccBfloat16 ? "bf16" : "fp16"));
    std::vector<uint16_t> narrow(f.size());
    ccoll::Narrow(dtype, f.data(), f.size(), narrow.data());
    std::vector<float> wide(f.size());
    ccoll::Widen(dtype, narrow.data(), narrow.size(), wide.data());
    size_t bad = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t n = dtype == ccBfloat16 ? ccoll::FloatToBf16(f[i]).bits : ccoll::FloatToHalf(f[i]).bits;
      const float w = dtype == ccBfloat16 ? ccoll::Bf16ToFloat(ccoll::Bf16{n}) : ccoll::HalfToFloat(ccoll::Half{n});
      if (narrow[i] != n || ccoll::FloatBits(wide[i]) != ccoll::FloatBits(w)) ++bad;
    }
    CHECK(bad == 0);
  }
}

// 16-bit gradients: every codec takes bfloat16 and float16 data as the float32 call on the widened values, narrowed
// with round-to-nearest-even. So the result is exactly that (and identical on every rank), call after call (error
// feedback and warm starts carry over in float32), in place or not, and non-finite values behave as in float32. A
// sparsifier's error feedback also keeps what that narrowing rounds away (the case above): the float32 call starts
// each call from the 16-bit call's memory, and ends with it less the narrowing's share on the sent chunks.
TEST_CASE("every codec on bfloat16 and float16 data is the float32 call on the widened values, narrowed",
          "[numerics][half]") {
  for (int nranks : {1, 2, 4}) {
    Group g = MakeGroup(nranks, ccAlgoAuto);
    REQUIRE(g.status == ccSuccess);
    // The sparsifiers read and write 16-bit data themselves, with and without error feedback.
    std::vector<std::string> specs = AllSpecs();
    specs.push_back("topk:density=0.2,ef=0,chunk=100");
    specs.push_back("randk:density=0.1,ef=0,chunk=7");
#ifdef CCOLL_HAVE_BLAS
    // PowerSGD reads and writes 16-bit data itself too; without error feedback, and with it: both exact at their
    // first call.
    specs.push_back("powersgd:rank=2,ef=0,start=1");
    specs.push_back("powersgd:rank=2,start=1");
#endif
    for (ccDataType_t dtype : {ccBfloat16, ccFloat16}) {
      for (const std::string& spec : specs) {
        for (size_t count : {size_t{1}, size_t{1000}, size_t{70001}}) {
          Compressors half(spec, nranks, 9), wide(spec, nranks, 9);
          REQUIRE(half.status == ccSuccess);
          REQUIRE(wide.status == ccSuccess);
          // With error feedback, the sparsifiers and PowerSGD keep what narrowing the result rounds away.
          const bool lowRank = spec.rfind("powersgd", 0) == 0;
          const bool keepsResultRounding =
              (spec.rfind("topk", 0) == 0 || spec.rfind("randk", 0) == 0 || lowRank) &&
              spec.find("ef=0") == std::string::npos;
          // Only the sparsifiers' 16-bit sums round what the memory keeps too (PowerSGD's factors are not kept).
          const bool float32Values = lowRank || spec.find("dtype=bf16") == std::string::npos;
          // Two finite calls first, so that the second one's result depends on what the first left in the error
          // feedback memory (a non-finite value poisons the whole result of some codecs).
          for (int call = 0; call < 4; ++call) {
            INFO(spec << ", " << (dtype == ccBfloat16 ? "bf16" : "fp16") << ", " << nranks << " ranks, count " << count
                      << ", call " << call);
            const ccRedOp_t op = call == 1 ? ccSum : ccAvg;
            const bool inPlace = call == 2;
            // 16-bit inputs (float16 has the range for these), and their exact float32 values.
            Buffers in = CorrInput(nranks, count, 40 + call + count);
            // The sum's call: float16 values whose sum overflows float16 (the float32 result does not; no memory
            // keeps what its rounding to infinity takes).
            if (call == 1 && dtype == ccFloat16 && count > 10) {
              for (int r = 0; r < nranks; ++r) in[r][count / 4] = 60000.0f;
            }
            if (call == 2 && count > 10) in[nranks - 1][count / 3] = std::numeric_limits<float>::quiet_NaN();
            if (call == 3 && count > 10) in[0][count / 2] = std::numeric_limits<float>::infinity();
            std::vector<std::vector<uint16_t>> in16(static_cast<size_t>(nranks), std::vector<uint16_t>(count));
            for (int r = 0; r < nranks; ++r) {
              ccoll::Narrow(dtype, in[r].data(), count, in16[r].data());
              ccoll::Widen(dtype, in16[r].data(), count, in[r].data());
            }
            if (keepsResultRounding) {
              for (int r = 0; r < nranks; ++r) wide[r]->errorFeedback = half[r]->errorFeedback;
            }
            const CallResult ref = AllReduce(g, wide, in, op);
            REQUIRE(ref.Failure() == "");
            std::vector<std::vector<uint16_t>> out(static_cast<size_t>(nranks), std::vector<uint16_t>(count, 0x7fa5));
            std::vector<RankResult> rc(static_cast<size_t>(nranks));
            RunRanks(nranks, [&](int r) {
              if (inPlace) out[r] = in16[r];
              const void* send = inPlace ? out[r].data() : in16[r].data();
              rc[r] = Record(ccAllReduce(send, out[r].data(), count, dtype, op, half[r], g[r], nullptr), g[r]);
            });
            for (int r = 0; r < nranks; ++r) {
              INFO("rank " << r);
              REQUIRE(rc[r].rc == ccSuccess);
              std::vector<uint16_t> expect(count);
              ccoll::Narrow(dtype, ref.out[r].data(), count, expect.data());
              CHECK(cctest::FirstDifference(out[r], expect) == "");
              CHECK(cctest::FirstDifference(out[r], out[0]) == "");
              const bool started = spec.find("start=1") == std::string::npos || call >= 1;
              if (!keepsResultRounding || !float32Values || nranks == 1 || !started) continue;
              // The memories: the same but where the narrowing rounded (float32 sums round nothing), there by this
              // rank's share of what it rounded (all of it for an average, 1 / nranks of it for a sum): added to
              // PowerSGD's residual, in place of the sparsifiers' zero over the sent chunks.
              const std::vector<float>& kept = half[r]->errorFeedback;
              const std::vector<float>& plain = wide[r]->errorFeedback;
              REQUIRE(kept.size() == count);
              REQUIRE(plain.size() == count);
              std::vector<float> back(count);
              ccoll::Widen(dtype, expect.data(), count, back.data());
              size_t wrong = 0, rounded = 0, finite = 0, overflowed = 0;
              for (size_t i = 0; i < count; ++i) {
                if (!std::isfinite(ref.out[r][i])) continue;  // (a non-finite leftover is dropped on both)
                ++finite;
                overflowed += std::isfinite(back[i]) ? 0 : 1;
                float l = ref.out[r][i] - back[i];
                if (op == ccSum) l *= 1.0f / static_cast<float>(nranks);
                if (!std::isfinite(l)) l = 0.0f;  // the 16-bit result overflowed: nothing to keep
                // (The sparsifiers' sent chunks end at 0 in the float32 memory.)
                const float want = lowRank ? plain[i] + l : plain[i] == 0.0f ? l : plain[i];
                rounded += l != 0.0f ? 1 : 0;
                if (ccoll::FloatBits(kept[i]) != ccoll::FloatBits(std::isfinite(want) ? want : 0.0f)) ++wrong;
              }
              CHECK(wrong == 0);
              if (call == 1 && dtype == ccFloat16 && count > 10 && (lowRank || spec.rfind("topk", 0) == 0)) {
                CHECK(overflowed > 0);  // the spike's sum is in the result (topk sends its chunk)
              }
              if (finite > 10) CHECK(rounded > 0);  // (randk poisons a call with a non-finite input whole)
            }
          }
        }
      }
    }
  }
}

TEST_CASE("compressed all-reduce refuses integer data, other ops and destroyed compressors, writing nothing",
          "[params]") {
  const int nranks = 2;
  const size_t count = 1000;
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  Compressors comps("quant:bits=4", nranks);
  REQUIRE(comps.status == ccSuccess);

  // Runs one call per rank with recvbuff full of the sentinel; returns what each rank got.
  auto attempt = [&](ccDataType_t dtype, ccRedOp_t op, const std::vector<ccCompressor_t>& cs,
                     std::vector<RankResult>* rc, bool* untouched) {
    const size_t bytes = count * 8;
    std::vector<std::vector<char>> send(nranks, std::vector<char>(bytes, 1)), recv(nranks, std::vector<char>(bytes));
    for (auto& r : recv) {
      for (size_t i = 0; i + 4 <= bytes; i += 4) std::memcpy(&r[i], &kSentinelBits, 4);
    }
    rc->assign(nranks, RankResult());
    RunRanks(nranks, [&](int r) {
      (*rc)[r] = Record(ccAllReduce(send[r].data(), recv[r].data(), count, dtype, op, cs[r], g[r], nullptr), g[r]);
    });
    *untouched = true;
    for (auto& r : recv) {
      for (size_t i = 0; i + 4 <= bytes; i += 4) {
        if (std::memcmp(&r[i], &kSentinelBits, 4) != 0) *untouched = false;
      }
    }
  };

  struct Case {
    ccDataType_t dtype;
    ccRedOp_t op;
    const char* mention;
  };
  for (const Case& c : {Case{ccInt32, ccSum, "int32"}, Case{ccInt64, ccAvg, "int64"}, Case{ccFloat64, ccSum, "float64"},
                        Case{ccFloat32, ccMax, "max"}, Case{ccFloat32, ccMin, "min"}, Case{ccFloat32, ccProd, "prod"},
                        Case{ccBfloat16, ccMax, "max"}}) {
    std::vector<RankResult> rc;
    bool untouched = false;
    attempt(c.dtype, c.op, comps.c, &rc, &untouched);
    for (int r = 0; r < nranks; ++r) {
      INFO("dtype " << c.dtype << " op " << c.op << " rank " << r << ": " << rc[r].error);
      CHECK(rc[r].rc == ccInvalidUsage);
      CHECK(Contains(rc[r].error, c.mention));
    }
    CHECK(untouched);
  }
  // The communicator and the compressors still work after those refusals.
  CHECK(AllReduce(g, comps, CorrInput(nranks, count, 5)).Failure() == "");

  // A destroyed compressor.
  std::vector<ccCompressor_t> dead(nranks, nullptr);
  for (auto& d : dead) {
    REQUIRE(ccCompressorCreateFromString(&d, "cast16") == ccSuccess);
    REQUIRE(ccCompressorDestroy(d) == ccSuccess);
  }
  std::vector<RankResult> rc;
  bool untouched = false;
  attempt(ccFloat32, ccAvg, dead, &rc, &untouched);
  for (int r = 0; r < nranks; ++r) {
    INFO("rank " << r << ": " << rc[r].error);
    CHECK(rc[r].rc == ccInvalidArgument);
    CHECK(Contains(rc[r].error, "compressor"));
  }
  CHECK(untouched);
  int64_t v = 0;
  CHECK(ccCompressorSetParam(dead[0], ccParamSeed, 1) == ccInvalidArgument);
  CHECK(ccCompressorGetParam(dead[0], ccParamSeed, &v) == ccInvalidArgument);
  char buf[256];
  CHECK(ccCompressorGetSpec(dead[0], buf, sizeof(buf)) == ccInvalidArgument);
  CHECK(ccCompressorDestroy(dead[0]) == ccInvalidArgument);
}

// ------------------------------------------------------------------------------------------------------------
// Numerics: non-finite, zero, denormal, outlier inputs; fewer elements than ranks.
// ------------------------------------------------------------------------------------------------------------

namespace {

// Runs `spec` on every rank of g once with `in`; fails the test case on an error return.
CallResult RunOnce(const Group& g, const std::string& spec, const Buffers& in, bool inPlace = false) {
  Compressors comps(spec, g.size());
  REQUIRE(comps.status == ccSuccess);
  CallResult res = AllReduce(g, comps, in, ccAvg, inPlace);
  REQUIRE(res.Failure() == "");
  return res;
}

// `large` is the call on `small`'s inputs scaled by the power of two `up`, which commutes with every rounding of the
// codec, the sums and the scales: its outputs must be the same on every rank, finite, and exactly `up` times
// `small`'s, bit for bit.
void CheckScaledExactly(const CallResult& small, const CallResult& large, float up) {
  CHECK(FirstDifferentRank(large.out) == -1);
  CHECK(AllFinite(large.out[0]));
  const size_t count = small.out[0].size();
  size_t differ = 0, first = count;
  for (size_t i = 0; i < count; ++i) {
    if (ccoll::FloatBits(large.out[0][i]) != ccoll::FloatBits(small.out[0][i] * up)) {
      ++differ;
      first = std::min(first, i);
    }
  }
  INFO(differ << " outputs differ from " << up << " times the unscaled ones, the first at " << first);
  CHECK(differ == 0);
}

}  // namespace

// PowerSGD's random start of Q draws 4 words per element of Q (cols x rank), more than 2^32 for a Q of more than 2^30
// elements: RandomWord64 keeps RandomWord's words below 2^32 and does not repeat them above.
TEST_CASE("RandomWord64 is RandomWord below 2^32 and does not repeat it above", "[rng]") {
  for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, (uint64_t{1} << 32) - 1}) {
    CHECK(ccoll::RandomWord64(77, i) == ccoll::RandomWord(77, static_cast<uint32_t>(i)));
  }
  int same = 0;
  for (uint64_t i = 0; i < 4096; ++i) {
    same += ccoll::RandomWord64(77, (uint64_t{1} << 32) + i) == ccoll::RandomWord(77, static_cast<uint32_t>(i));
    same += ccoll::RandomWord64(77, (uint64_t{3} << 32) + i) == ccoll::RandomWord64(77, (uint64_t{2} << 32) + i);
  }
  CHECK(same <= 2);  // chance agreements of 32-bit words: expected 2^-19 of them
}

// topk and randk number their chunks in 32 bits, and the device's chunk choice counts them in an int (CUB): a bucket
// of more than 2^31 - 1 chunks is refused on every rank, before its buffers are touched (here 8 GiB of address space
// that any access would fault on). Wider buckets need a larger chunk.
TEST_CASE("the sparsifiers refuse a bucket of more than 2^31 - 1 chunks before touching it", "[params][sparse]") {
  const size_t count = size_t{1} << 31;
  const size_t bytes = count * sizeof(float);
  void* buf = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (buf == MAP_FAILED) {
    WARN("not run: no 8 GiB of address space to map (ulimit -v?)");
    return;
  }
  const int nranks = 2;
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  for (const char* spec : {"topk:density=0.1,chunk=1", "randk:density=0.1,chunk=1"}) {
    Compressors comps(spec, nranks);
    REQUIRE(comps.status == ccSuccess);
    std::vector<RankResult> rc(nranks);
    RunRanks(nranks, [&](int r) {
      rc[r] = Record(ccAllReduce(buf, buf, count, ccFloat32, ccAvg, comps[r], g[r], nullptr), g[r]);
    });
    for (int r = 0; r < nranks; ++r) {
      INFO(spec << ", rank " << r << ": " << rc[r].error);
      CHECK(rc[r].rc == ccInvalidUsage);
      CHECK(Contains(rc[r].error, "2147483648 chunks of 1, more than the 2^31 - 1 a sparsifier numbers: use a chunk "
                                  "of at least 2"));
    }
  }
  std::string why;
  CHECK(ccoll::ChunksFit(count, 2, &why));
  CHECK(ccoll::ChunksFit(count - 1, 1, &why));
  CHECK_FALSE(ccoll::ChunksFit(size_t{1} << 40, 64, &why));
  CHECK(Contains(why, "use a chunk of at least 513"));
  munmap(buf, bytes);
}

TEST_CASE("a NaN or an Inf on one rank gives the same non-finite result on every rank, for every codec",
          "[numerics]") {
  const int nranks = 3;
  const size_t count = 4099;
  for (int algo : {ccAlgoRing, ccAlgoTree}) {
    Group g = MakeGroup(nranks, algo);
    REQUIRE(g.status == ccSuccess);
    for (const std::string& spec : AllSpecs()) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
        // Positions in different chunks of the sparsifiers (1024 elements; 4099 elements keep 1 of 5 chunks at
        // density 0.1), on a different rank each time: a chunk holding a non-finite value must be sent anyway.
        for (size_t at : {size_t{0}, size_t{1500}, size_t{2600}, count - 1}) {
          Buffers in = CorrInput(nranks, count, 31 + at);
          const int who = static_cast<int>(at % nranks);
          in[who][at] = bad;
          INFO(spec << " " << AlgoName(algo) << ": " << bad << " at " << at << " on rank " << who);
          CallResult res = RunOnce(g, spec, in);
          CHECK(FirstDifferentRank(res.out) == -1);
          CHECK_FALSE(std::isfinite(res.out[0][at]));
        }
      }
    }
  }
}

// The error-feedback memory keeps only finite values: what a NaN input left, or a sum that overflowed (3e38 + 3e38 in
// float32), is dropped, so later calls with ordinary inputs are finite again. The sparsifiers drop them in a pass
// that only runs when the memory's add saw a non-finite sum.
TEST_CASE("error feedback drops non-finite leftovers: a NaN input or an overflowing memory does not stay",
          "[numerics][ef]") {
  const int nranks = 2;
  const size_t count = 4099;
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  std::vector<std::string> specs = {"topk:density=0.2", "randk:density=0.4", "topk:density=0.2,dtype=bf16"};
#ifdef CCOLL_HAVE_BLAS
  specs.push_back("powersgd:rank=2");
#endif
  for (const std::string& spec : specs) {
    Compressors comps(spec, nranks, 3);
    REQUIRE(comps.status == ccSuccess);
    Buffers huge(static_cast<size_t>(nranks), std::vector<float>(count, 3e38f));
    for (int call = 0; call < 8; ++call) {
      INFO(spec << ", call " << call);
      // 0: a NaN on rank 1; 2, 3: every value 3e38 on every rank (the second one overflows the memory); the others
      // ordinary values, whose results must be finite again.
      Buffers in = CorrInput(nranks, count, 70 + static_cast<uint64_t>(call));
      if (call == 0) in[1][count / 2] = std::numeric_limits<float>::quiet_NaN();
      if (call == 2 || call == 3) in = huge;
      const CallResult res = AllReduce(g, comps, in, ccAvg);
      REQUIRE(res.Failure() == "");
      CHECK(FirstDifferentRank(res.out) == -1);
      if (call == 1 || call >= 4) CHECK(AllFinite(res.out[0]));
    }
  }
}

#ifdef CCOLL_HAVE_UCX
// Over UCX, randk adds the input into its memory for the chunks it does not send while the ring waits for the network
// (collectives/sparse.cc, transport.h's IdleWork); the local transport does it after the ring. The bytes must not
// depend on which: results and memory, call after call, with a NaN on one call and bfloat16 data.
TEST_CASE("the sparsifiers give the same bytes over UCX as over the local transport, call after call",
          "[numerics][ef][ucx]") {
  const int nranks = 3;
  const size_t count = (size_t{1} << 18) + 123;
  ccConfig_t ucx = cctest::MakeConfig(ccAlgoRing);
  ucx.transport = ccTransportUcx;
  Group viaUcx = Group::InitConfig(nranks, ucx), local = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(viaUcx.status == ccSuccess);
  REQUIRE(local.status == ccSuccess);
  for (const std::string& spec : {std::string("randk:density=0.1"), std::string("randk:density=0.2,ef=0"),
                                  std::string("topk:density=0.1")}) {
    for (ccDataType_t dtype : {ccFloat32, ccBfloat16}) {
      Compressors a(spec, nranks, 5), b(spec, nranks, 5);
      REQUIRE(a.status == ccSuccess);
      REQUIRE(b.status == ccSuccess);
      for (int call = 0; call < 4; ++call) {
        INFO(spec << (dtype == ccBfloat16 ? ", bf16" : ", float32") << ", call " << call);
        Buffers in = CorrInput(nranks, count, 300 + static_cast<uint64_t>(call));
        if (call == 2) in[1][count / 3] = std::numeric_limits<float>::quiet_NaN();
        const size_t es = dtype == ccFloat32 ? 4 : 2;
        std::vector<std::vector<char>> send(nranks, std::vector<char>(count * es));
        for (int r = 0; r < nranks; ++r) {
          if (dtype == ccFloat32) {
            std::memcpy(send[r].data(), in[r].data(), count * 4);
          } else {
            ccoll::Narrow(dtype, in[r].data(), count, send[r].data());
          }
        }
        std::vector<std::vector<char>> outU(nranks, std::vector<char>(count * es)), outL = outU;
        std::vector<ccResult_t> rcU(nranks), rcL(nranks);
        RunRanks(nranks, [&](int r) {
          rcU[r] = ccAllReduce(send[r].data(), outU[r].data(), count, dtype, ccAvg, a[r], viaUcx[r], nullptr);
        });
        RunRanks(nranks, [&](int r) {
          rcL[r] = ccAllReduce(send[r].data(), outL[r].data(), count, dtype, ccAvg, b[r], local[r], nullptr);
        });
        for (int r = 0; r < nranks; ++r) {
          INFO("rank " << r);
          REQUIRE(rcU[r] == ccSuccess);
          REQUIRE(rcL[r] == ccSuccess);
          CHECK(cctest::FirstDifference(outU[r], outL[r]) == "");
          CHECK(cctest::FirstDifference(outU[r], outU[0]) == "");
        }
      }
    }
  }
}
#endif

TEST_CASE("all-zero input gives exact zeros for every codec", "[numerics]") {
  for (int algo : {ccAlgoRing, ccAlgoTree}) {
    for (int nranks : {2, 5}) {
      Group g = MakeGroup(nranks, algo);
      REQUIRE(g.status == ccSuccess);
      for (size_t count : {size_t{1}, size_t{3}, size_t{4099}}) {
        const Buffers in(nranks, std::vector<float>(count, 0.0f));
        for (const std::string& spec : AllSpecs()) {
          for (bool inPlace : {false, true}) {
            INFO(spec << " " << AlgoName(algo) << " nranks " << nranks << " count " << count
                      << (inPlace ? " in place" : ""));
            CallResult res = RunOnce(g, spec, in, inPlace);
            CHECK(FirstDifferentRank(res.out) == -1);
            size_t nonzero = 0;
            for (float x : res.out[0]) nonzero += x == 0.0f ? 0 : 1;
            CHECK(nonzero == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("denormal inputs and a huge outlier give finite results, identical on every rank", "[numerics]") {
  const int nranks = 4;
  const size_t count = 5003;
  std::string report;
  for (int algo : {ccAlgoRing, ccAlgoTree}) {
    Group g = MakeGroup(nranks, algo);
    REQUIRE(g.status == ccSuccess);
    // Denormals: every value +-1e-40 (below FLT_MIN = 1.2e-38), the sign from the corr input.
    Buffers denormal = CorrInput(nranks, count, 8);
    for (auto& x : denormal) {
      for (auto& v : x) v = v < 0 ? -1e-40f : 1e-40f;
    }
    // One huge outlier: 1e30 at one index of one rank, ordinary values elsewhere.
    Buffers outlier = CorrInput(nranks, count, 9);
    const size_t at = 2222;
    outlier[1][at] = 1e30f;
    const std::vector<double> mDen = ExactReduce(denormal, ccAvg), mOut = ExactReduce(outlier, ccAvg);
    for (const std::string& spec : AllSpecs()) {
      INFO(spec << " " << AlgoName(algo));
      {
        CallResult res = RunOnce(g, spec, denormal);
        INFO("denormal input");
        CHECK(FirstDifferentRank(res.out) == -1);
        CHECK(AllFinite(res.out[0]));
        if (algo == ccAlgoRing) {
          char line[200];
          std::snprintf(line, sizeof(line), "denormal %-52s vNMSE %.3g\n", spec.c_str(), Vnmse(res.out[0], mDen));
          report += line;
        }
      }
      {
        CallResult res = RunOnce(g, spec, outlier);
        INFO("outlier input");
        CHECK(FirstDifferentRank(res.out) == -1);
        if (spec == "cast16:dtype=fp16") {
          // Documented by the wire type: fp16 tops out at 65504, so 1e30 becomes +inf on the wire; the result is
          // +inf exactly there, on every rank, and nowhere else.
          CHECK(std::isinf(res.out[0][at]));
          size_t nonFinite = 0;
          for (float x : res.out[0]) nonFinite += std::isfinite(x) ? 0 : 1;
          CHECK(nonFinite == 1);
        } else {
          CHECK(AllFinite(res.out[0]));
        }
        if (algo == ccAlgoRing) {
          char line[200];
          std::snprintf(line, sizeof(line), "outlier  %-52s out[at] %.4g (exact %.4g), vNMSE %.3g\n", spec.c_str(),
                        res.out[0][at], mOut[at], Vnmse(res.out[0], mOut));
          report += line;
        }
      }
    }
  }
  WARN(report);
}

// fp16 scales have fp16's range (ccoll.h, ccParamScaleFormat): every input below 65504, but the requant ring's partial
// sums above it at some elements. Their groups decode to non-finite values, the same on every rank; bf16 scales
// (the default) carry the same inputs.
TEST_CASE("quant with fp16 scales: partial sums beyond fp16's range are non-finite on every rank, bf16 carries them",
          "[numerics]") {
  const int nranks = 4;
  const size_t count = 4099;
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  Buffers in = CorrInput(nranks, count, 31);
  for (auto& x : in) {
    for (size_t i = 0; i < count; i += 97) x[i] = 5e4f;  // 4 ranks: sums of 2e5
  }
  const std::vector<double> exact = ExactReduce(in, ccAvg);
  CallResult fp16 = RunOnce(g, "quant:bits=4,mode=requant,scale=fp16,rotation=none", in);
  CHECK(FirstDifferentRank(fp16.out) == -1);
  CHECK_FALSE(AllFinite(fp16.out[0]));
  // The same elements rotated: spread over their 1024-element blocks, the scales stay within fp16's range here.
  // bf16 scales have float's range.
  // A sanity bound on the error (zeros score 1): without rotation, a 2e5 in every third group of 32 sets its scale
  // (0.14 measured; rotated with fp16 scales 0.014).
  for (const char* spec :
       {"quant:bits=4,mode=requant,scale=fp16", "quant:bits=4,mode=requant,scale=bf16,rotation=none"}) {
    INFO(spec);
    CallResult res = RunOnce(g, spec, in);
    CHECK(FirstDifferentRank(res.out) == -1);
    CHECK(AllFinite(res.out[0]));
    CHECK(Vnmse(res.out[0], exact) < 0.5);
  }
}

// cast16 with fp16 on the wire (ccoll.h, ccParamValueType): an average divides each rank's input by nranks before the
// ring, as NCCL's fp16 average does, so an average that fits in fp16 comes back finite where the ranks' sum would
// not; a sum past 65504 is +inf there, as an fp16 sum is, and the same on every rank. Before, the average also summed
// first and every such element came back +inf.
TEST_CASE("cast16 with fp16 on the wire: an average that fits stays finite where the sum overflows", "[numerics]") {
  const int nranks = 4;
  const size_t count = 4099;
  const float big = 4e4f;  // 4 ranks: sums of 1.6e5, averages of 4e4
  Buffers in = CorrInput(nranks, count, 37);
  for (auto& x : in) {
    for (size_t i = 0; i < count; i += 97) x[i] = big;
  }
  const std::vector<double> exact = ExactReduce(in, ccAvg);
  for (ccAlgo_t algo : {ccAlgoRing, ccAlgoTree}) {
    INFO(AlgoName(algo));
    Group g = MakeGroup(nranks, algo);
    REQUIRE(g.status == ccSuccess);
    for (bool inPlace : {false, true}) {
      INFO("in place " << inPlace);
      CallResult avg = RunOnce(g, "cast16:dtype=fp16", in, inPlace);
      CHECK(FirstDifferentRank(avg.out) == -1);
      CHECK(AllFinite(avg.out[0]));
      for (size_t i = 0; i < count; i += 97) {
        INFO("element " << i);
        CHECK(std::fabs(avg.out[0][i] - big) <= big * std::ldexp(1.0f, -10));
      }
      CHECK(Vnmse(avg.out[0], exact) < 1e-5);
    }
    Compressors comps("cast16:dtype=fp16", nranks);
    REQUIRE(comps.status == ccSuccess);
    CallResult sum = AllReduce(g, comps, in, ccSum, false);
    REQUIRE(sum.Failure() == "");
    CHECK(FirstDifferentRank(sum.out) == -1);
    size_t infinite = 0;
    for (size_t i = 0; i < count; ++i) infinite += std::isinf(sum.out[0][i]) ? 1 : 0;
    CHECK(infinite == (count + 96) / 97);
  }
}

// The rotation's range (ccoll.h, ccParamRotation): the inverse transform takes out an exact power of two before its
// sums, so a rank sum that float holds comes back finite. Scaling every input by 2^121 (so that the ranks' sums
// reach 4e37, above FLT_MAX / sqrt(block), where the unnormalized transform used to overflow) must scale every
// output by exactly 2^121: a power of two commutes with every rounding of the codec, the sums and the scales.
TEST_CASE("quant with rotation: inputs scaled by 2^121 give outputs scaled by exactly 2^121, finite",
          "[numerics][rotation]") {
  const int nranks = 4;
  const size_t count = 40000;  // two blocks of 16384 and a tail of smaller blocks; 39 of 1024 and a tail
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  const Buffers in = CorrInput(nranks, count, 47);
  const float up = std::ldexp(1.0f, 121);
  Buffers big = in;
  for (auto& x : big) {
    for (float& v : x) v *= up;
  }
  const std::vector<double> exact = ExactReduce(in, ccAvg);
  for (const char* spec : {"quant:bits=4,mode=requant", "quant:bits=4,mode=requant,block=16384,scale=fp32",
                           "quant:bits=8,mode=homomorphic", "quant:bits=4,mode=homomorphic,block=16384"}) {
    INFO(spec);
    CallResult small = RunOnce(g, spec, in);
    CallResult large = RunOnce(g, spec, big);
    CheckScaledExactly(small, large, up);
    double sumMax = 0.0;
    for (double v : exact) sumMax = std::max(sumMax, std::fabs(v) * nranks * static_cast<double>(up));
    CHECK(sumMax > std::numeric_limits<float>::max() / 128.0);  // the inputs reach the range this is about
    CHECK(Vnmse(small.out[0], exact) < 0.1);
  }
}

// The grid computed in halves (quant_math.h) has the bits of the plain forms, step = 2s/L, c * step - s,
// c * step - n * s and invStep = L/(2s), wherever those stay finite: halving and doubling are exact in float's
// normal range. Log-uniform scales from kMinScale up to where 2s (or 2ns) overflows, and bf16-rounded ones.
TEST_CASE("quant grid in halves: the bits of c * 2s/L - s wherever that is finite", "[numerics]") {
  std::mt19937_64 gen(59);
  std::uniform_real_distribution<double> logScale(std::log(1e-30), std::log(3.4e38));
  size_t checked = 0, mismatched = 0;
  for (int t = 0; t < 400000; ++t) {
    const int bits = 1 + static_cast<int>(gen() % 8);
    const uint32_t levels = ccoll::Levels(bits);
    float s = static_cast<float>(std::exp(logScale(gen)));
    if (t % 2) s = ccoll::RoundScaleUp(s, ccoll::ScaleFormat::kBf16);  // +inf above bf16's largest
    if (!std::isfinite(s)) continue;
    const float n = static_cast<float>(1 + gen() % 64);
    const uint32_t code = static_cast<uint32_t>(gen() % (levels + 1));
    const uint32_t sum = static_cast<uint32_t>(gen() % (static_cast<uint64_t>(n) * levels + 1));
    float half, inv;
    ccoll::GridOf(s, levels, &half, &inv);
    volatile float twoS = 2.0f * s;  // volatile: each operation rounded on its own, as the library's build does
    if (!std::isfinite(twoS)) {
      CHECK(std::isfinite(ccoll::DequantizeCode(code, half, s)));
      CHECK(inv > 0.0f);
      continue;
    }
    volatile float step = twoS / static_cast<float>(levels);
    volatile float value = static_cast<float>(code) * step;
    volatile float sumValue = static_cast<float>(sum) * step;
    volatile float ns = n * s;
    const float plainInv = static_cast<float>(levels) / twoS;
    const float plain = value - s;
    const float plainSum = sumValue - ns;
    ++checked;
    if (ccoll::FloatBits(ccoll::DequantizeCode(code, half, s)) != ccoll::FloatBits(plain) ||
        ccoll::FloatBits(inv) != ccoll::FloatBits(plainInv) ||
        (std::isfinite(sumValue) && std::isfinite(ns) &&
         ccoll::FloatBits(ccoll::DequantizeSum(sum, half, s, n)) != ccoll::FloatBits(plainSum))) {
      if (mismatched++ < 5) {
        WARN("bits " << bits << " s " << s << " code " << code << " sum " << sum << " n " << n);
      }
    }
  }
  CHECK(checked > 300000);
  CHECK(mismatched == 0);
}

// The grid's range (ccoll.h, ccParamRotation): a group's grid spans [-s, s], and its codes decode in halves, so a
// scale above FLT_MAX / 2 (where 2s, the grid's width, overflows) still decodes to finite values. Every rank plants
// 22.5 at some elements; scaled by 2^121 their partial sums reach 1.8e38 and their sum 2.4e38, which set their groups'
// scales without rotation (the homomorphic lanes' sums too: 4 ranks' codes on a grid of 6e37). As in the test above,
// the outputs must be exactly 2^121 times the unscaled call's, on the ring and the trees.
TEST_CASE("quant: group scales above FLT_MAX / 2 decode to finite values, exactly scaled", "[numerics]") {
  const int nranks = 4;
  const size_t count = 4099;
  const float up = std::ldexp(1.0f, 121);
  Buffers in = CorrInput(nranks, count, 53);
  for (auto& x : in) {
    for (size_t i = 0; i < count; i += 97) x[i] = 22.5f;
  }
  Buffers big = in;
  for (auto& x : big) {
    for (float& v : x) v *= up;
  }
  REQUIRE(22.5 * nranks * static_cast<double>(up) > std::numeric_limits<float>::max() / 2.0);
  REQUIRE(22.5 * nranks * static_cast<double>(up) < ccoll::Bf16ToFloat(ccoll::Bf16{0x7f7f}));  // bf16's largest
  const std::vector<double> exact = ExactReduce(in, ccAvg);
  for (ccAlgo_t algo : {ccAlgoRing, ccAlgoTree}) {
    Group g = MakeGroup(nranks, algo);
    REQUIRE(g.status == ccSuccess);
    for (const char* spec :
         {"quant:bits=4,mode=requant,rotation=none", "quant:bits=8,mode=requant,rotation=none,scale=fp32",
          "quant:bits=1,mode=requant,rotation=none", "quant:bits=4,mode=homomorphic,rotation=none",
          "quant:bits=2,mode=homomorphic,rotation=none,group=32"}) {
      INFO(spec << (algo == ccAlgoRing ? " on the ring" : " on the trees"));
      CallResult small = RunOnce(g, spec, in);
      CallResult large = RunOnce(g, spec, big);
      CheckScaledExactly(small, large, up);
      CHECK(std::fabs(large.out[0][97] / up - exact[97]) < 0.25 * exact[97]);  // a planted element: 22.5 on average
    }
  }
}

// topk's chunk norms (compress/sparse_math.h): the documented order exactly (the GPU kernel's eight partial sums and
// butterfly give the same bytes, and test_gpu holds it to them), accurate against a long double sum, and +inf for a
// chunk that is not finite.
TEST_CASE("chunk norms: eight partial sums added pairwise, accurate, +inf when not finite", "[sparse]") {
  std::mt19937_64 gen(77);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{15}, size_t{1024}, size_t{4099}}) {
    for (double scale : {1.0, 1e-20, 1e18}) {
      INFO("n " << n << ", scale " << scale);
      std::vector<float> x(n);
      for (float& v : x) v = static_cast<float>(scale * normal(gen));
      // The order as documented, written out plainly.
      double part[8] = {};
      for (size_t i = 0; i < n; ++i) part[i % 8] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
      const double documented =
          ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
      const double got = ccoll::ChunkSquaredNorm(x.data(), n);
      CHECK(ccoll::FloatBits(static_cast<float>(got)) == ccoll::FloatBits(static_cast<float>(documented)));
      CHECK(std::memcmp(&got, &documented, sizeof(double)) == 0);
      // The GPU kernel's order: eight partial sums, one per thread, then a butterfly over lanes j ^ 1, j ^ 2, j ^ 4
      // (lane j adds lane j ^ m's sum to its own); every lane ends with the same bytes.
      double lanes[8];
      for (unsigned j = 0; j < 8; ++j) lanes[j] = ccoll::ChunkPartialSquares(x.data(), n, j);
      for (unsigned m = 1; m < 8; m <<= 1) {
        double next[8];
        for (unsigned j = 0; j < 8; ++j) next[j] = lanes[j] + lanes[j ^ m];
        std::copy(next, next + 8, lanes);
      }
      for (const double& lane : lanes) CHECK(std::memcmp(&lane, &got, sizeof(double)) == 0);
      // With the error feedback's add fused in: the sums stored, and the partial sums of their squares.
      std::vector<float> acc(n), add(n), sum(n);
      for (size_t i = 0; i < n; ++i) {
        acc[i] = static_cast<float>(normal(gen));
        add[i] = x[i] - acc[i];
        sum[i] = acc[i] + add[i];
      }
      for (unsigned j = 0; j < 8; ++j) {
        const double want = ccoll::ChunkPartialSquares(sum.data(), n, j);
        const double fused = ccoll::ChunkPartialSquaresAdding(acc.data(), add.data(), n, j);
        CHECK(std::memcmp(&want, &fused, sizeof(double)) == 0);
      }
      CHECK(acc == sum);
      long double exact = 0.0L;
      for (float v : x) exact += static_cast<long double>(v) * v;
      CHECK(std::fabs(static_cast<double>(got - exact)) <= 1e-13 * static_cast<double>(exact));
      std::vector<float> norms;
      ccoll::ChunkNorms(x.data(), n, n == 0 ? 1 : n, &norms);
      if (n > 0) {
        REQUIRE(norms.size() == 1);
        CHECK(norms[0] == static_cast<float>(got));
      }
    }
  }
  // A non-finite value anywhere in a chunk makes its norm +inf; the other chunks keep theirs.
  std::vector<float> x(3000, 0.5f);
  for (size_t at : {size_t{0}, size_t{1003}, size_t{2999}}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      std::vector<float> y = x;
      y[at] = bad;
      std::vector<float> norms;
      ccoll::ChunkNorms(y.data(), y.size(), 1000, &norms);
      REQUIRE(norms.size() == 3);
      for (size_t c = 0; c < 3; ++c) {
        INFO("non-finite at " << at << ", chunk " << c);
        CHECK(norms[c] == (c == at / 1000 ? std::numeric_limits<float>::infinity() : 250.0f));
      }
    }
  }
}

TEST_CASE("the CPU rotation equals the host/device reference rotation byte for byte", "[rotation]") {
  for (size_t count : {size_t{1}, size_t{33}, size_t{1000}, size_t{4096}, size_t{7919}}) {
    for (size_t block : {size_t{64}, size_t{1024}}) {
      std::vector<float> x(count), ref(count), got(count);
      for (size_t i = 0; i < count; ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f + 0.01f * i;
      const uint32_t key = ccoll::StreamKey(7, 3, ~0u, ccoll::kPurposeRotation);
      ref = x;
      ccoll::ForEachRotationBlock(count, block,
                                  [&](size_t off, size_t len) { ccoll::RotateBlock(ref.data() + off, len, off, key); });
      ccoll::RotateForward(x.data(), got.data(), count, block, key);
      CAPTURE(count, block);
      CHECK(std::memcmp(ref.data(), got.data(), count * sizeof(float)) == 0);
      ccoll::ForEachRotationBlock(count, block, [&](size_t off, size_t len) {
        ccoll::UnrotateBlock(ref.data() + off, len, off, key, 0.25f);
      });
      ccoll::RotateInverse(got.data(), count, block, key, 0.25f);
      CHECK(std::memcmp(ref.data(), got.data(), count * sizeof(float)) == 0);
    }
  }
}

// The inverse rotation's sums stay within its result on every block length, odd powers of two included: a block
// holding one value near FLT_MAX (and small ones) comes back finite and close, through the driver and the reference.
TEST_CASE("the inverse rotation does not overflow where its result fits in float, on every block length",
          "[rotation][numerics]") {
  std::mt19937_64 gen(5);
  std::normal_distribution<float> normal;
  for (size_t len = 1; len <= 16384; len *= 2) {
    for (float spike : {2.5e38f, -3.3e38f}) {
      CAPTURE(len, spike);
      std::vector<float> x(len), y(len), ref(len);
      for (float& v : x) v = normal(gen);
      const size_t at = gen() % len;
      x[at] = spike;
      ccoll::RotateForward(x.data(), y.data(), len, len, 0x5eedu);
      CHECK(AllFinite(y));
      ref = y;
      ccoll::UnrotateBlock(ref.data(), len, 0, 0x5eedu, 1.0f);
      ccoll::RotateInverse(y.data(), len, len, 0x5eedu, 1.0f);
      CHECK(std::memcmp(ref.data(), y.data(), len * sizeof(float)) == 0);
      REQUIRE(AllFinite(y));
      CHECK(std::fabs(y[at] - spike) <= 1e-5f * std::fabs(spike));
    }
  }
}

// With PipelinePrepareAndFinish the requant codec rotates each block when a hop first touches it and rotates it
// back when the all-gather has decoded all of it. Two ranks' codecs run a ring by hand over slices that do not line
// up with the rotation blocks, in a shuffled order (blocks straddle slices handled far apart), in place and not:
// the result must be the bytes of the eager pre-pass and Finish.
TEST_CASE("requant's pipelined rotation gives the bytes of the eager passes", "[rotation][pipeline]") {
  for (bool inPlace : {false, true}) {
    for (size_t count : {size_t{5000}, size_t{4096}, size_t{77}}) {
      for (bool average : {false, true}) {
        CAPTURE(inPlace, count, average);
        ccCompressor_t comp = nullptr;
        REQUIRE(ccCompressorCreateFromString(&comp, "quant:bits=4,mode=requant,block=1024") == ccSuccess);
        std::vector<float> input[2];
        for (int r = 0; r < 2; ++r) {
          input[r].resize(count);
          for (size_t i = 0; i < count; ++i) input[r][i] = std::sin(0.1f * static_cast<float>(i) + r) + 0.001f * i;
        }
        std::vector<float> result[2][2];  // [pipelined][rank]
        for (int pipelined = 0; pipelined < 2; ++pipelined) {
          std::unique_ptr<ccoll::Codec> codec[2];
          std::vector<float> in[2], work[2];
          for (int r = 0; r < 2; ++r) {
            ccoll::CodecCall call;
            call.rank = r;
            call.nranks = 2;
            call.seed = 11;
            call.call = 3;
            codec[r] = ccoll::MakeQuantCodec(*comp, call);
            in[r] = input[r];
            work[r].assign(count, -1.0f);
            if (pipelined) codec[r]->PipelinePrepareAndFinish(average);
            std::vector<float> meta;
            float* w = inPlace ? in[r].data() : work[r].data();
            codec[r]->Prepare(in[r].data(), w, count, &meta);
            CHECK(meta.empty());
          }
          // Slices of 300 elements, in a shuffled order; each one: rank s%2 encodes, the other reduces, both decode.
          std::vector<size_t> starts;
          for (size_t off = 0; off < count; off += 300) starts.push_back(off);
          std::mt19937 rng(5);
          std::shuffle(starts.begin(), starts.end(), rng);
          const size_t slot = codec[0]->MaxWireBytes(300);
          std::vector<char> msg(slot), payload(slot);
          for (size_t k = 0; k < starts.size(); ++k) {
            const size_t off = starts[k], len = std::min<size_t>(300, count - off);
            const int a = static_cast<int>(k % 2), b = 1 - a;
            float* wa = inPlace ? in[a].data() : work[a].data();
            float* wb = inPlace ? in[b].data() : work[b].data();
            codec[a]->Hop(nullptr, 0, wa + off, off, len, msg.data());
            const void* arrived = msg.data();
            codec[b]->ReduceFinal(&arrived, 1, wb + off, off, len, payload.data());
            codec[a]->DecodeGather(payload.data(), off, len, wa + off);
            codec[b]->DecodeGather(payload.data(), off, len, wb + off);
          }
          for (int r = 0; r < 2; ++r) {
            float* w = inPlace ? in[r].data() : work[r].data();
            codec[r]->Finish(w, count, average);
            result[pipelined][r].assign(w, w + count);
          }
        }
        for (int r = 0; r < 2; ++r) {
          CHECK(std::memcmp(result[0][r].data(), result[1][r].data(), count * sizeof(float)) == 0);
          CHECK(std::count_if(result[1][r].begin(), result[1][r].end(), [](float x) { return !std::isfinite(x); }) ==
                0);
        }
        CHECK(std::memcmp(result[1][0].data(), result[1][1].data(), count * sizeof(float)) == 0);
        ccCompressorDestroy(comp);
      }
    }
  }
}

TEST_CASE("homomorphic calls run in segments (pre-pass overlapped with the ring) give the bytes of one ring",
          "[rotation][pipeline][segments]") {
  // Over a network a long homomorphic call runs segment by segment, the next segment's rotation and scales in the
  // waits of the current one; here the segments are forced on thread ranks, and the bytes must not change.
  const char* specs[] = {"quant:bits=4,mode=homomorphic", "quant:bits=2,mode=homomorphic,rotation=none,group=100",
                         "quant:bits=8,mode=homomorphic,block=256,group=64",
                         "quant:bits=4,mode=homomorphic,rounding=correlated,block=4096,clip=0.001"};
  struct Reset {
    ~Reset() { ccoll::SetCodecSegmentsForTesting(0); }
  } reset;
  for (int n : {2, 3}) {
    Group g = MakeGroup(n, ccAlgoRing);
    REQUIRE(g.status == ccSuccess);
    for (const char* spec : specs) {
      for (size_t count : {size_t{5000}, size_t{3 * 4096 + 77}, size_t{65536}}) {
        const Buffers in = CorrInput(n, count, 900 + count);
        for (ccRedOp_t op : {ccSum, ccAvg}) {
          for (bool inPlace : {false, true}) {
            CAPTURE(n, spec, count, op, inPlace);
            Buffers want;
            for (int segments : {1, 3, 7}) {
              CAPTURE(segments);
              ccoll::SetCodecSegmentsForTesting(segments);
              Compressors comps(spec, n, 5);
              REQUIRE(comps.status == ccSuccess);
              CallResult res = AllReduce(g, comps, in, op, inPlace);
              REQUIRE(res.Failure() == "");
              CHECK(FirstDifferentRank(res.out) == -1);
              CHECK(std::all_of(res.out[0].begin(), res.out[0].end(), [](float x) { return std::isfinite(x); }));
              if (segments == 1) {
                want = res.out;
                continue;
              }
              for (int r = 0; r < n; ++r) {
                CHECK(std::memcmp(res.out[r].data(), want[r].data(), count * sizeof(float)) == 0);
              }
            }
          }
        }
      }
    }
  }
}

// The requant encoder's dithers are Dither(key, global index mod 2^32) (rng.h, the definition the CUDA kernels use
// too), also for a slice that crosses a multiple of 2^32 elements and for odd and even starts: the encoder's bytes
// equal a message built element by element from the reference definitions.
TEST_CASE("requant codes use Dither's definition of the dither of every element, across 2^32 too", "[dither]") {
  const size_t len = 1000, group = 32;
  const int bits = 4;
  const auto format = ccoll::ScaleFormat::kBf16;
  std::mt19937_64 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> v(len);
  for (auto& x : v) x = normal(gen);
  for (uint64_t index0 : {uint64_t{0}, uint64_t{7}, (uint64_t{1} << 32) - 100, (uint64_t{1} << 32) - 101,
                          (uint64_t{3} << 32) + 5}) {
    INFO("index0 " << index0);
    ccoll::DitherRule rule;
    rule.rounding = 1;
    rule.key = 0xabcdef;
    const size_t groups = (len + group - 1) / group;
    std::vector<uint16_t> codes(len), want(len);
    std::vector<uint8_t> msg(groups * 2 + ccoll::PackedBytes(len, bits)), ref(msg.size());
    REQUIRE(ccoll::EncodeRequantSlice(v.data(), len, index0, group, bits, format, 0.0f, rule, codes.data(),
                                      msg.data()) == msg.size());
    for (size_t g = 0; g < groups; ++g) {
      const size_t begin = g * group, n = std::min(group, len - begin);
      float s = ccoll::RoundScaleUp(ccoll::GroupScaleOf(v.data() + begin, n, 0.0f), format);
      ccoll::StoreScale(ref.data() + 2 * g, s, format);
      s = ccoll::LoadScale(ref.data() + 2 * g, format);
      const float inv = ccoll::InvStepOf(s, ccoll::Levels(bits));
      for (size_t j = begin; j < begin + n; ++j) {
        const float u = ccoll::Dither(rule.key, static_cast<uint32_t>(index0 + j));
        want[j] = static_cast<uint16_t>(ccoll::QuantizeCode(v[j], inv, s * inv, ccoll::Levels(bits), u));
      }
    }
    ccoll::PackCodes(want.data(), len, bits, ref.data() + 2 * groups);
    CHECK(std::memcmp(msg.data(), ref.data(), msg.size()) == 0);
  }
}

namespace {

// A requant message built element by element from the definitions: per group the scale (GroupScaleOf, rounded up
// to the format), per element QuantizeCode with its dither (Dither of the global index mod 2^32, 0.5 for nearest,
// or the shared stream stratified by rank for correlated), the codes written one by one.
std::vector<uint8_t> ReferenceRequant(const std::vector<float>& v, uint64_t index0, size_t group, int bits,
                                      ccoll::ScaleFormat format, const ccoll::DitherRule& rule) {
  const size_t len = v.size(), groups = (len + group - 1) / group;
  const size_t sb = static_cast<size_t>(ccoll::ScaleBytes(format));
  std::vector<uint8_t> msg(groups * sb + ccoll::PackedBytes(len, bits));
  ccoll::BitWriter writer(msg.data() + groups * sb);
  for (size_t g = 0; g < groups; ++g) {
    const size_t begin = g * group, n = std::min(group, len - begin);
    float s = ccoll::RoundScaleUp(ccoll::GroupScaleOf(v.data() + begin, n, 0.0f), format);
    ccoll::StoreScale(msg.data() + g * sb, s, format);
    s = ccoll::LoadScale(msg.data() + g * sb, format);
    const float inv = ccoll::InvStepOf(s, ccoll::Levels(bits));
    for (size_t j = begin; j < begin + n; ++j) {
      const uint32_t i = static_cast<uint32_t>(index0 + j);
      float u = 0.5f;
      if (rule.rounding == 1) u = ccoll::Dither(rule.key, i);
      if (rule.rounding == 2) {
        u = ccoll::StratifiedDither(ccoll::Dither(rule.sharedKey, i), ccoll::StratumShift(rule.rank, rule.nranks));
      }
      writer.Put(ccoll::QuantizeCode(v[j], inv, s * inv, ccoll::Levels(bits), u), bits);
    }
  }
  writer.Flush();
  return msg;
}

}  // namespace

// The requant encoder and decoder (vector kernels plus scalar tails) against the definitions element by element,
// and the requant hop (decode and add in parts of kHopPart elements, each encoded while in cache) against the
// reference message of local + the decoded messages: every bit width, groups that are and are not multiples of 8
// and 32, every scale format, slices shorter and longer than a part, odd starts, one and two incoming messages,
// every rounding mode, and groups with an infinite scale.
TEST_CASE("requant encode, decode and hop equal the element-by-element reference, byte for byte", "[requant][hop]") {
  std::mt19937_64 gen(11);
  std::normal_distribution<float> normal;
  const ccoll::ScaleFormat formats[] = {ccoll::ScaleFormat::kFp32, ccoll::ScaleFormat::kBf16,
                                        ccoll::ScaleFormat::kFp16};
  int configs = 0;
  for (int bits : {1, 2, 3, 4, 5, 8}) {
    for (size_t group : {size_t{7}, size_t{8}, size_t{24}, size_t{32}, size_t{64}, size_t{96}, size_t{2048}}) {
      for (size_t len : {size_t{1}, size_t{37}, size_t{1000}, ccoll::kHopPart + 40, 3 * ccoll::kHopPart + 7}) {
        const auto format = formats[configs % 3];
        const int rounding = (configs / 3) % 3;
        const int nin = 1 + configs % 2;
        const uint64_t index0 = (configs % 5 == 0) ? 7 : 6 * static_cast<uint64_t>(configs);
        ++configs;
        INFO("bits " << bits << " group " << group << " len " << len << " format " << static_cast<int>(format)
                     << " rounding " << rounding << " nin " << nin << " index0 " << index0);
        ccoll::DitherRule rule;
        rule.rounding = rounding;
        rule.key = 0x1234u + static_cast<uint32_t>(configs);
        rule.sharedKey = 0x777u;
        rule.rank = 1;
        rule.nranks = 3;
        const size_t groups = (len + group - 1) / group, sb = static_cast<size_t>(ccoll::ScaleBytes(format));
        const size_t bytes = groups * sb + ccoll::PackedBytes(len, bits);
        std::vector<float> local(len), sum(len), dec(len), vals(len);
        std::vector<uint16_t> codes(len);
        for (auto& x : local) x = normal(gen);
        // The incoming messages, from other random values; in the second one, the first group is infinite.
        std::vector<std::vector<uint8_t>> in(nin, std::vector<uint8_t>(bytes));
        for (int k = 0; k < nin; ++k) {
          std::vector<float> other(len);
          for (auto& x : other) x = 3.0f * normal(gen);
          if (k == 1) other[0] = std::numeric_limits<float>::infinity();
          REQUIRE(ccoll::EncodeRequantSlice(other.data(), len, index0, group, bits, format, 0.0f, rule, codes.data(),
                                            in[k].data()) == bytes);
          CHECK(in[k] == ReferenceRequant(other, index0, group, bits, format, rule));
        }
        // The reference decode: codes read one by one, DequantizeCode with the group's scale.
        sum = local;
        for (int k = 0; k < nin; ++k) {
          ccoll::BitReader reader(in[k].data() + groups * sb);
          std::vector<float> want(len);
          for (size_t j = 0; j < len; ++j) {
            const float s = ccoll::LoadScale(in[k].data() + j / group * sb, format);
            float half, inv;
            ccoll::GridOf(s, ccoll::Levels(bits), &half, &inv);
            want[j] = ccoll::DequantizeCode(reader.Get(bits), half, s);
            sum[j] = sum[j] + want[j];
          }
          ccoll::DecodeRequantSlice(in[k].data(), len, group, bits, format, codes.data(), dec.data());
          CHECK(std::memcmp(dec.data(), want.data(), len * sizeof(float)) == 0);
        }
        const std::vector<uint8_t> want = ReferenceRequant(sum, index0, group, bits, format, rule);
        std::vector<uint8_t> got(bytes, 0xee);
        const void* wires[2] = {in[0].data(), nin > 1 ? in[1].data() : nullptr};
        REQUIRE(ccoll::HopRequantSlice(wires, nin, local.data(), len, index0, group, bits, format, 0.0f, rule,
                                       vals.data(), codes.data(), got.data()) == bytes);
        CHECK(std::memcmp(got.data(), want.data(), bytes) == 0);
      }
    }
  }
}

// What a hop of [off, off + len) reads in an in-place call with the rotation fused: the blocks at the slice's ends
// that reach past it rotated in the buffer first (from `rotated`), the slice's own inner blocks unrotated (`input`),
// and the rest of the buffer garbage (other slices' decodes may have overwritten it).
std::vector<float> InPlaceHopBuffer(const std::vector<float>& input, const std::vector<float>& rotated, size_t block,
                                    size_t off, size_t len) {
  const size_t count = input.size();
  std::vector<float> buf(count, std::numeric_limits<float>::quiet_NaN());
  std::copy(input.begin() + off, input.begin() + off + len, buf.begin() + off);
  for (size_t i : {off, off + len - 1}) {
    size_t bs, bl;
    ccoll::tile::RotationBlockOf(count, block, i, &bs, &bl);
    if (bs >= off && bs + bl <= off + len) continue;
    std::copy(rotated.begin() + bs, rotated.begin() + bs + bl, buf.begin() + bs);
  }
  return buf;
}

// The tile kernels' bit-stream reads against PackCodes' streams, for every width the codecs use (codes 1..8 bits,
// lanes up to 16): ReadBits at every position, and eight lanes through Bits128 (put, got, loaded, stored, added).
TEST_CASE("ReadBits and Bits128 read and write PackCodes' little-endian streams, 1 to 16 bits", "[tile][bits]") {
  std::mt19937_64 gen(37);
  for (int bits = 1; bits <= 16; ++bits) {
    INFO("bits " << bits);
    const size_t n = 1 + gen() % 200;
    const uint32_t mask = (1u << bits) - 1u;
    std::vector<uint16_t> codes(n), other(n);
    for (size_t i = 0; i < n; ++i) {
      codes[i] = static_cast<uint16_t>(gen() & mask);
      other[i] = static_cast<uint16_t>(gen() % (mask - codes[i] + 1u));  // the sum of the two fits the width
    }
    const size_t bytes = ccoll::PackedBytes(n, bits);
    std::vector<uint8_t> stream(bytes), others(bytes), got(bytes, 0xee);
    ccoll::PackCodes(codes.data(), n, bits, stream.data());
    ccoll::PackCodes(other.data(), n, bits, others.data());
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(ccoll::ReadBits(stream.data(), bytes, i * static_cast<size_t>(bits), bits) == codes[i]);
    }
    // Units of 8 codes (bits bytes each, the last maybe short), as the lane kernels handle them.
    std::vector<uint8_t> sum = stream;
    ccoll::AddPackedStreams(sum.data(), stream.data(), others.data(), bytes);
    for (size_t u = 0; 8 * u < n; ++u) {
      const size_t m = std::min<size_t>(8, n - 8 * u), at = u * static_cast<size_t>(bits);
      const size_t unitBytes = ccoll::PackedBytes(m, bits);
      ccoll::Bits128 w;
      for (size_t j = 0; j < m; ++j) ccoll::PutBits(&w, codes[8 * u + j], static_cast<int>(j) * bits);
      const ccoll::Bits128 loaded = ccoll::LoadBits(stream.data() + at, unitBytes);
      CHECK(loaded.lo == w.lo);
      CHECK(loaded.hi == w.hi);
      for (size_t j = 0; j < m; ++j) {
        CHECK(ccoll::GetBits(w, static_cast<int>(j) * bits, bits) == codes[8 * u + j]);
      }
      ccoll::StoreBits(ccoll::AddBits(w, ccoll::LoadBits(others.data() + at, unitBytes)), got.data() + at, unitBytes);
    }
    CHECK(got == sum);
  }
}

TEST_CASE("requant tile kernels, run on the CPU thread by thread, give the CPU codec's bytes", "[requant][tile]") {
  std::mt19937_64 gen(29);
  std::normal_distribution<float> normal;
  cctest::TileEmulator gpu(5);
  const ccoll::ScaleFormat formats[] = {ccoll::ScaleFormat::kFp32, ccoll::ScaleFormat::kBf16,
                                        ccoll::ScaleFormat::kFp16};
  const size_t groups[] = {1, 3, 8, 24, 32, 33, 64, 100, 256, 1024};
  const int bitsOf[] = {1, 2, 3, 4, 5, 6, 7, 8};  // the bits parameter's range
  const size_t blocks[] = {1, 2, 32, 256, 1024};
  int checked = 0;
  for (int config = 0; config < 160; ++config) {
    // Group and bits cover every pair of residues; the rest is drawn on its own, so no choice follows another.
    const size_t group = groups[config % 10];
    const int bits = bitsOf[(config / 10) % 8];
    const auto format = formats[gen() % 3];
    const size_t block = blocks[gen() % 5];
    const bool rotate = gen() % 4 != 3;
    const int nin = config % 3;
    const float clipK = config % 7 == 0 ? 2.5f : 0.0f;
    // A buffer with a tail of smaller rotation blocks most of the time, and a slice of it that starts and ends
    // anywhere (some slices span many tiles).
    const size_t count = 1 + gen() % (config % 8 == 0 ? 70000 : 9000);
    const size_t off = gen() % count;
    const size_t len = 1 + gen() % (count - off);
    ccoll::DitherRule rule;
    rule.rounding = static_cast<int>(gen() % 3);
    rule.key = 0x51u + static_cast<uint32_t>(config);
    rule.sharedKey = 0x99u;
    rule.rank = config % 4;
    rule.nranks = 4;
    const uint32_t signKey = 0xabcu + static_cast<uint32_t>(config);
    INFO("config " << config << ": group " << group << " bits " << bits << " format " << static_cast<int>(format)
                   << " block " << block << " rotate " << rotate << " nin " << nin << " clip " << clipK << " count "
                   << count << " off " << off << " len " << len);
    // Now and then near the ends of float's range: values up to 2e37 (the inverse rotation's prescale) or 1e-28.
    const int exponent = config % 13 == 4 ? 112 : config % 13 == 9 ? -95 : 0;
    CAPTURE(exponent);
    std::vector<float> input(count);
    for (auto& x : input) x = std::ldexp(normal(gen), exponent);
    if (config % 11 == 0) input[off + len / 2] = std::numeric_limits<float>::infinity();
    const size_t bytes = (len + group - 1) / group * static_cast<size_t>(ccoll::ScaleBytes(format)) +
                         ccoll::PackedBytes(len, bits);
    std::vector<uint16_t> codes(std::max(count, len));
    std::vector<float> vals(count);
    std::vector<std::vector<uint8_t>> in(2, std::vector<uint8_t>(bytes));
    for (int k = 0; k < nin; ++k) {
      std::vector<float> other(len);
      for (auto& x : other) x = std::ldexp(2.0f * normal(gen), exponent);
      ccoll::EncodeRequantSlice(other.data(), len, off, group, bits, format, 0.0f, rule, codes.data(), in[k].data());
    }
    const void* wires[2] = {in[0].data(), in[1].data()};
    // The CPU: the whole buffer rotated, then the slice's hop.
    std::vector<float> local = input;
    if (rotate) ccoll::RotateForward(input.data(), local.data(), count, block, signKey);
    std::vector<uint8_t> want(bytes), got(bytes, 0xee);
    if (nin == 0) {
      ccoll::EncodeRequantSlice(local.data() + off, len, off, group, bits, format, clipK, rule, codes.data(),
                                want.data());
    } else {
      ccoll::HopRequantSlice(wires, nin, local.data() + off, len, off, group, bits, format, clipK, rule, vals.data(),
                             codes.data(), want.data());
    }
    ccoll::tile::HopArgs a = ccoll::tile::HopArgsOf(local.data() + off, wires, nin, off, len, group, bits, format,
                                                    clipK, rule, got.data());
    if (rotate) a = ccoll::tile::RotatedFrom(a, input.data(), count, block, signKey, false);
    gpu.Hop(a);
    CHECK(cctest::FirstDifference(want, got) ==
          "");
    if (rotate) {
      const std::vector<float> inPlace = InPlaceHopBuffer(input, local, block, off, len);
      a.values = inPlace.data();
      a.edgesRotated = true;
      std::fill(got.begin(), got.end(), 0xee);
      gpu.Hop(a);
      CHECK(got == want);
    }
    // The decode of that message: without rotation, the values; with it, the slice's inner blocks rotated back and
    // marked, the rest as decoded, so that the finish gives the CPU's inverse rotation of the whole buffer.
    std::vector<float> dec(count);
    for (auto& x : dec) x = normal(gen);
    std::vector<float> wantOut = dec;
    ccoll::DecodeRequantSlice(want.data(), len, group, bits, format, codes.data(), wantOut.data() + off);
    std::vector<float> gotOut = dec;
    std::vector<uint8_t> done(count / block + 1, 0);
    ccoll::tile::DecodeArgs d =
        ccoll::tile::DecodeArgsOf(want.data(), off, len, group, bits, format, gotOut.data() + off);
    if (rotate) d = ccoll::tile::RotatedBack(d, count, block, signKey, 0.25f, done.data());
    gpu.Decode(d);
    if (rotate) {
      ccoll::RotateInverse(wantOut.data(), count, block, signKey, 0.25f);
      cctest::RotateInverseUnmarked(gotOut.data(), count, block, signKey, 0.25f, done.data());
      // Something was fused whenever the slice holds a whole block (and the finish did not redo it).
      size_t inner = 0;
      for (size_t b = 0; b + block <= count / block * block; b += block) inner += b >= off && b + block <= off + len;
      CHECK(static_cast<size_t>(std::count(done.begin(), done.end(), 1)) == inner);
    }
    CHECK(std::memcmp(gotOut.data(), wantOut.data(), count * sizeof(float)) == 0);
    ++checked;
  }
  CHECK(checked == 160);
}

TEST_CASE("homomorphic lane tile kernels, run on the CPU thread by thread, give the CPU codec's bytes",
          "[homomorphic][tile]") {
  std::mt19937_64 gen(31);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> widen(1.0f, 1.5f);
  cctest::TileEmulator gpu(7);
  const ccoll::ScaleFormat formats[] = {ccoll::ScaleFormat::kFp32, ccoll::ScaleFormat::kBf16,
                                        ccoll::ScaleFormat::kFp16};
  const size_t groups[] = {1, 3, 8, 24, 32, 33, 64, 100, 256, 1024};
  const size_t blocks[] = {1, 2, 32, 256, 1024};
  const int ranksOf[] = {2, 3, 4, 5, 8, 13, 256};
  int checked = 0;
  for (int config = 0; config < 120; ++config) {
    // Group and bits cover every pair of residues; the rest is drawn on its own, so no choice follows another.
    const size_t group = groups[config % 10];
    const int bits = 1 + (config / 10) % 8;
    const int nranks = ranksOf[gen() % 7];
    int laneBits = bits;  // room for the sum of nranks codes, as the codec's plan makes it
    while ((1 << (laneBits - bits)) < nranks) ++laneBits;
    const auto format = formats[gen() % 3];
    const size_t block = blocks[gen() % 5];
    const bool rotate = gen() % 4 != 3;
    const int nin = std::min(static_cast<int>(gen() % 3), nranks - 1);
    const float clipK = gen() % 5 == 0 ? 2.5f : 0.0f;
    const size_t count = 1 + gen() % (config % 8 == 0 ? 70000 : 9000);
    const size_t off = gen() % count;
    const size_t len = 1 + gen() % (count - off);
    ccoll::DitherRule rule;
    rule.rounding = static_cast<int>(gen() % 3);
    rule.key = 0x61u + static_cast<uint32_t>(config);
    rule.sharedKey = 0x98u;
    rule.rank = config % nranks;
    rule.nranks = nranks;
    const uint32_t signKey = 0xbcdu + static_cast<uint32_t>(config);
    INFO("config " << config << ": group " << group << " bits " << bits << " laneBits " << laneBits << " format "
                   << static_cast<int>(format) << " block " << block << " rotate " << rotate << " nin " << nin
                   << " clip " << clipK << " count " << count << " off " << off << " len " << len);
    // Now and then near the ends of float's range: values up to 2e37 (the inverse rotation's prescale) or 1e-28.
    const int exponent = config % 13 == 4 ? 112 : config % 13 == 9 ? -95 : 0;
    CAPTURE(exponent);
    std::vector<float> input(count);
    for (auto& x : input) x = std::ldexp(normal(gen), exponent);
    if (config % 11 == 0) input[off + len / 2] = std::numeric_limits<float>::infinity();
    std::vector<float> local = input;
    if (rotate) ccoll::RotateForward(input.data(), local.data(), count, block, signKey);
    const size_t ngroups = (count + group - 1) / group;

    // The group scales, from the unrotated input when rotating.
    std::vector<float> scales(ngroups), gotScales(ngroups, -1.0f);
    for (size_t g = 0; g < ngroups; ++g) {
      scales[g] = ccoll::GroupScaleOf(local.data() + g * group, std::min(group, count - g * group), clipK);
    }
    ccoll::tile::LanesArgs sa = ccoll::tile::ScalesArgsOf(local.data(), count, group, clipK, gotScales.data());
    if (rotate) sa.hop = ccoll::tile::RotatedFrom(sa.hop, input.data(), count, block, signKey, false);
    gpu.Lanes(sa);
    CHECK(std::memcmp(scales.data(), gotScales.data(), ngroups * sizeof(float)) == 0);

    // The agreed scales: the max over ranks, so at least this rank's.
    std::vector<float> agreed = scales;
    for (auto& s : agreed) s = (gen() % 3 == 0) ? s : s * widen(gen);
    const size_t bytes = ccoll::PackedBytes(len, laneBits);
    std::vector<uint16_t> codes(std::max(count, len));
    std::vector<std::vector<uint8_t>> in(2, std::vector<uint8_t>(bytes));
    for (int k = 0; k < nin; ++k) {
      std::vector<float> other(len);
      for (auto& x : other) x = std::ldexp(normal(gen), exponent);
      ccoll::EncodeLanesSlice(other.data(), len, off, group, agreed.data(), bits, laneBits, rule, codes.data(),
                              in[k].data());
    }
    const void* wires[2] = {in[0].data(), in[1].data()};

    // The hop: this rank's lanes plus the arriving streams.
    std::vector<uint8_t> want(bytes), got(bytes, 0xee);
    ccoll::EncodeLanesSlice(local.data() + off, len, off, group, agreed.data(), bits, laneBits, rule, codes.data(),
                            want.data());
    for (int k = 0; k < nin; ++k) ccoll::AddPackedStreams(want.data(), want.data(), in[k].data(), bytes);
    ccoll::tile::HopArgs hop = ccoll::tile::HopArgsOf(local.data() + off, wires, nin, off, len, group, bits, format,
                                                      clipK, rule, got.data());
    if (rotate) hop = ccoll::tile::RotatedFrom(hop, input.data(), count, block, signKey, false);
    gpu.Lanes(ccoll::tile::LanesArgsOf(hop, agreed.data(), laneBits, nranks, false));
    CHECK(cctest::FirstDifference(want, got) ==
          "");
    if (rotate) {
      const std::vector<float> inPlace = InPlaceHopBuffer(input, local, block, off, len);
      ccoll::tile::HopArgs edges = hop;
      edges.values = inPlace.data();
      edges.edgesRotated = true;
      std::fill(got.begin(), got.end(), 0xee);
      gpu.Lanes(ccoll::tile::LanesArgsOf(edges, agreed.data(), laneBits, nranks, false));
      CHECK(got == want);
    }

    // The last reduce hop of a requantized all-gather: the sums decoded and encoded as a requant message.
    std::vector<float> sums(len);
    ccoll::DecodeLanesSlice(want.data(), len, off, group, agreed.data(), bits, laneBits, nranks, codes.data(),
                            sums.data());
    const size_t reqBytes = (len + group - 1) / group * static_cast<size_t>(ccoll::ScaleBytes(format)) +
                            ccoll::PackedBytes(len, bits);
    std::vector<uint8_t> wantReq(reqBytes), gotReq(reqBytes, 0xee);
    ccoll::EncodeRequantSlice(sums.data(), len, off, group, bits, format, clipK, rule, codes.data(), wantReq.data());
    ccoll::tile::HopArgs req = hop;
    req.out = gotReq.data();
    gpu.Lanes(ccoll::tile::LanesArgsOf(req, agreed.data(), laneBits, nranks, true));
    CHECK(cctest::FirstDifference(wantReq, gotReq) == "");

    // The decode of the lane sums, with the inverse rotation fused for the blocks inside the slice.
    std::vector<float> dec(count);
    for (auto& x : dec) x = normal(gen);
    std::vector<float> wantOut = dec, gotOut = dec;
    std::copy(sums.begin(), sums.end(), wantOut.begin() + off);
    std::vector<uint8_t> done(count / block + 1, 0);
    ccoll::tile::DecodeArgs d =
        ccoll::tile::DecodeArgsOf(want.data(), off, len, group, bits, format, gotOut.data() + off);
    if (rotate) d = ccoll::tile::RotatedBack(d, count, block, signKey, 0.25f, done.data());
    gpu.Decode(ccoll::tile::LanesFrom(d, agreed.data(), laneBits, nranks));
    if (rotate) {
      ccoll::RotateInverse(wantOut.data(), count, block, signKey, 0.25f);
      cctest::RotateInverseUnmarked(gotOut.data(), count, block, signKey, 0.25f, done.data());
    }
    CHECK(std::memcmp(gotOut.data(), wantOut.data(), count * sizeof(float)) == 0);
    ++checked;
  }
  CHECK(checked == 120);
}
