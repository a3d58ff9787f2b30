// PowerSGD (low-rank compression) behind ccAllReduce: a rank-r average is recovered almost exactly with rank >= r
// and not with less; warm start converges to the best rank-r approximation; error feedback keeps the running sum of
// outputs on the running sum of true averages (the identity sum(out) = sum(avg) - mean(E) holds, and the residual
// stays bounded while without feedback it grows); vectors in a bucket travel exactly; the first `start` calls are
// the exact all-reduce; sum is n times avg; the bf16 wire halves the bytes; bad shapes are refused before anything is
// sent, writing nothing; zeros stay zeros and a NaN does not poison later calls. Every result is compared across
// ranks byte for byte.
//
// Rank bodies run on threads and only record; the main thread asserts after the join.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ccoll.h"
#include "compress/compressor.h"
#include "compress/widen.h"
#include "first_difference.h"
#include "rank_harness.h"

using cctest::Compressors;
using cctest::CallCheckOn;
using cctest::Contains;
using cctest::Group;
using cctest::RankResult;
using cctest::Record;
using cctest::RunRanks;
using cctest::Vnmse;

namespace {

using Buffers = std::vector<std::vector<float>>;

Group MakeGroup(int nranks, int algo = ccAlgoRing) { return Group::InitConfig(nranks, cctest::MakeConfig(algo)); }


struct CallResult {
  Buffers out;
  std::vector<RankResult> rc;
  uint64_t bytesSent = 0;  // rank 0's, during the call
  std::string Failure() const {
    for (size_t r = 0; r < rc.size(); ++r) {
      if (rc[r].rc != ccSuccess) return "rank " + std::to_string(r) + ": " + rc[r].error;
    }
    return "";
  }
};

// One ccAllReduce on every rank; `comp` may be null (the exact all-reduce).
CallResult AllReduce(const Group& g, const Compressors* comps, const Buffers& in, ccRedOp_t op = ccAvg,
                     bool inPlace = false) {
  const int n = g.size();
  const size_t count = in[0].size();
  CallResult res;
  res.out.assign(static_cast<size_t>(n), std::vector<float>());
  res.rc.assign(static_cast<size_t>(n), RankResult());
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
    res.rc[r] = Record(ccAllReduce(send, out.data(), count, ccFloat32, op, comps ? (*comps)[r] : nullptr, g[r],
                                   nullptr), g[r]);
    ccCommGetStats(g[r], &after);
    if (r == 0) res.bytesSent = after.bytesSent - before.bytesSent;
  });
  return res;
}

int FirstDifferentRank(const Buffers& out) {
  for (size_t r = 1; r < out.size(); ++r) {
    if (std::memcmp(out[r].data(), out[0].data(), out[0].size() * sizeof(float)) != 0) return static_cast<int>(r);
  }
  return -1;
}

std::vector<double> Mean(const Buffers& in) {
  std::vector<double> m(in[0].size(), 0.0);
  for (const auto& x : in) {
    for (size_t i = 0; i < m.size(); ++i) m[i] += x[i];
  }
  for (auto& v : m) v /= static_cast<double>(in.size());
  return m;
}

double SqNorm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return s;
}

// `k` orthonormal vectors of length `len` (Gram-Schmidt of Gaussian ones), column j at v[i * k + j].
std::vector<double> Orthonormal(int64_t len, int k, std::mt19937_64& gen) {
  std::normal_distribution<double> normal;
  std::vector<double> v(static_cast<size_t>(len) * k);
  for (auto& x : v) x = normal(gen);
  for (int j = 0; j < k; ++j) {
    for (int p = 0; p < j; ++p) {
      double dot = 0;
      for (int64_t i = 0; i < len; ++i) dot += v[i * k + j] * v[i * k + p];
      for (int64_t i = 0; i < len; ++i) v[i * k + j] -= dot * v[i * k + p];
    }
    double norm = 0;
    for (int64_t i = 0; i < len; ++i) norm += v[i * k + j] * v[i * k + j];
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < len; ++i) v[i * k + j] /= norm;
  }
  return v;
}

// Writes sum_j sigma[j] u_j v_j^T (a rows x cols matrix of rank sigma.size()) into out, row-major.
void LowRankMatrix(const std::vector<double>& u, const std::vector<double>& v, const std::vector<double>& sigma,
                   int64_t rows, int64_t cols, float* out) {
  const int k = static_cast<int>(sigma.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double x = 0;
      for (int p = 0; p < k; ++p) x += sigma[p] * u[i * k + p] * v[j * k + p];
      out[i * cols + j] = static_cast<float>(x);
    }
  }
}

// The mean over the ranks of the compressors' error-feedback memories (each of `count` floats).
std::vector<double> MeanMemory(const Compressors& comps, size_t count) {
  std::vector<double> memory(count, 0.0);
  for (ccCompressor_t c : comps.c) {
    REQUIRE(c->errorFeedback.size() == count);
    for (size_t i = 0; i < count; ++i) memory[i] += c->errorFeedback[i] / static_cast<double>(comps.c.size());
  }
  return memory;
}

// Per-rank rows x cols matrices whose average has rank k: a shared column space U, each rank its own row factors.
Buffers RankKInputs(int nranks, int64_t rows, int64_t cols, int k, uint64_t seed) {
  std::mt19937_64 gen(seed);
  const std::vector<double> u = Orthonormal(rows, k, gen);
  std::vector<double> sigma(static_cast<size_t>(k));
  for (int p = 0; p < k; ++p) sigma[p] = 10.0 / (p + 1);
  Buffers in(static_cast<size_t>(nranks), std::vector<float>(static_cast<size_t>(rows * cols)));
  for (int r = 0; r < nranks; ++r) {
    const std::vector<double> v = Orthonormal(cols, k, gen);
    LowRankMatrix(u, v, sigma, rows, cols, in[r].data());
  }
  return in;
}

}  // namespace

TEST_CASE("a rank-k average is recovered almost exactly with rank >= k, and not with rank < k", "[lowrank]") {
  const int64_t rows = 96, cols = 64;
  const int k = 3;
  for (int nranks : {2, 3, 4}) {
    for (int algo : {ccAlgoRing, ccAlgoTree}) {
      Group g = MakeGroup(nranks, algo);
      REQUIRE(g.status == ccSuccess);
      const Buffers in = RankKInputs(nranks, rows, cols, k, 100 + nranks);
      const std::vector<double> m = Mean(in);
      for (int rank : {2, 3, 4, 8}) {
        for (const char* extra : {"", ",warm=0", ",dtype=bf16"}) {
          const std::string spec = "powersgd:rows=96,cols=64,rank=" + std::to_string(rank) + extra;
          INFO(spec << " nranks " << nranks << (algo == ccAlgoTree ? " tree" : " ring"));
          Compressors comps(spec, nranks);
          REQUIRE(comps.status == ccSuccess);
          CallResult res = AllReduce(g, &comps, in);
          REQUIRE(res.Failure() == "");
          CHECK(FirstDifferentRank(res.out) == -1);
          const double e = Vnmse(res.out[0], m);
          INFO("vNMSE " << e);
          if (rank < k) {
            CHECK(e > 1e-3);  // the third direction (sigma 3.3 of 10, 5, 3.3) cannot fit
          } else if (Contains(spec, "bf16")) {
            CHECK(e < 1e-4);  // P and Q rounded to bf16 (8 bits of mantissa) on the wire
          } else {
            CHECK(e < 1e-9);
          }
        }
      }
    }
  }
}

TEST_CASE("rank-deficient averages (equal rows, few distinct rows, one nonzero row) are recovered, not multiplied",
          "[lowrank]") {
  // P = M Q then has dependent columns, exactly: Gram-Schmidt's rest of them is rounding, which normalized used to
  // point along an earlier column, so that P held one direction twice and the output was 2x (rank 4), 4x or 5x the
  // average (rank 8) of a constant matrix.
  const int64_t rows = 100, cols = 120;
  const int nranks = 3;
  Group g = MakeGroup(nranks);
  REQUIRE(g.status == ccSuccess);
  std::mt19937_64 gen(77);
  std::normal_distribution<float> normal;
  std::vector<float> patterns(3 * cols);
  for (float& x : patterns) x = normal(gen);
  for (const char* kind : {"equal rows", "three distinct rows", "one nonzero row", "constant"}) {
    Buffers in(nranks, std::vector<float>(static_cast<size_t>(rows * cols), 0.0f));
    for (int r = 0; r < nranks; ++r) {
      const float scale = 0.75f * static_cast<float>(r + 1);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          float v = 0.0f;
          if (std::string(kind) == "equal rows") v = patterns[j];
          if (std::string(kind) == "three distinct rows") v = patterns[(i % 3) * cols + j];
          if (std::string(kind) == "one nonzero row") v = i == 17 ? patterns[j] : 0.0f;
          if (std::string(kind) == "constant") v = 1.0f;
          in[r][i * cols + j] = scale * v;
        }
      }
    }
    const std::vector<double> m = Mean(in);
    // eps > 0 too: each column then has less than unit length, and only its full projection removes its direction
    // from the later columns (with eps=1e-8 the output was 2x the average of a constant matrix).
    for (const char* spec :
         {"powersgd:rows=100,cols=120,rank=4", "powersgd:rows=100,cols=120,rank=8,ef=0",
          "powersgd:rows=100,cols=120,rank=4,warm=0", "powersgd:rows=100,cols=120,rank=3",
          "powersgd:rows=100,cols=120,rank=4,eps=1e-8", "powersgd:rows=100,cols=120,rank=8,eps=1e-6"}) {
      INFO(kind << ", " << spec);
      Compressors comps(spec, nranks);
      REQUIRE(comps.status == ccSuccess);
      for (int call = 0; call < 3; ++call) {  // warm start and error feedback carry the dependence to the next calls
        CallResult res = AllReduce(g, &comps, in);
        REQUIRE(res.Failure() == "");
        CHECK(FirstDifferentRank(res.out) == -1);
        const double e = Vnmse(res.out[0], m);
        INFO("call " << call << ": vNMSE " << e << ", out[0] " << res.out[0][0] << ", average " << m[0]);
        CHECK(e < 1e-9);
      }
    }
  }
}

TEST_CASE("warm start converges to the best rank-r approximation, and a cold start each call does not", "[lowrank]") {
  // A fixed matrix with singular values 0.7^j: the best rank-2 approximation misses sum_{j>=2} 0.49^j / sum 0.49^j.
  const int nranks = 2;
  const int64_t rows = 80, cols = 60;
  const int k = 12;
  std::mt19937_64 gen(7);
  const std::vector<double> u = Orthonormal(rows, k, gen), v = Orthonormal(cols, k, gen);
  std::vector<double> sigma(k);
  double all = 0, tail = 0;
  for (int j = 0; j < k; ++j) {
    sigma[j] = std::pow(0.7, j);
    all += sigma[j] * sigma[j];
    if (j >= 2) tail += sigma[j] * sigma[j];
  }
  const double best = tail / all;
  Buffers in(nranks, std::vector<float>(static_cast<size_t>(rows * cols)));
  for (auto& x : in) LowRankMatrix(u, v, sigma, rows, cols, x.data());
  const std::vector<double> m = Mean(in);
  Group g = MakeGroup(nranks);
  REQUIRE(g.status == ccSuccess);
  double warmErr = 0, coldErr = 0;
  for (bool warm : {true, false}) {
    Compressors comps(std::string("powersgd:rank=2,ef=0,rows=80,cols=60,warm=") + (warm ? "1" : "0"), nranks);
    REQUIRE(comps.status == ccSuccess);
    double e = 0;
    for (int call = 0; call < 12; ++call) {
      CallResult res = AllReduce(g, &comps, in);
      REQUIRE(res.Failure() == "");
      CHECK(FirstDifferentRank(res.out) == -1);
      e = Vnmse(res.out[0], m);
      CHECK(e >= best * (1 - 1e-4));  // nothing beats the truncated SVD
    }
    (warm ? warmErr : coldErr) = e;
  }
  WARN("best rank-2 vNMSE " << best << "; after 12 calls: warm start " << warmErr << ", cold start " << coldErr);
  CHECK(warmErr < best * 1.01);
  CHECK(coldErr > best * 1.05);
}

TEST_CASE("error feedback: sum(out) = sum(avg) - mean(E), and the residual stays bounded (without: it grows)",
          "[lowrank][ef]") {
  // Gradients with a fixed part g (full rank, so rank 2 misses most of it each call) and fresh noise per call.
  const int nranks = 3;
  const int64_t rows = 24, cols = 16;
  const size_t count = static_cast<size_t>(rows * cols);
  const int calls = 120;
  Group g = MakeGroup(nranks);
  REQUIRE(g.status == ccSuccess);
  std::mt19937_64 gen(11);
  std::normal_distribution<double> normal;
  std::vector<double> fixed(count);
  for (auto& x : fixed) x = normal(gen);
  std::vector<Buffers> inputs(calls, Buffers(nranks, std::vector<float>(count)));
  for (auto& call : inputs) {
    for (auto& x : call) {
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(fixed[i] + 0.3 * normal(gen));
    }
  }
  const double oneCall = std::sqrt(SqNorm(Mean(inputs[0])));
  double residualAt[2][2] = {};  // [ef][half, end]
  for (int ef : {1, 0}) {
    Compressors comps("powersgd:rank=2,rows=24,cols=16,ef=" + std::to_string(ef), nranks);
    REQUIRE(comps.status == ccSuccess);
    std::vector<double> sumOut(count, 0.0), sumAvg(count, 0.0);
    for (int t = 0; t < calls; ++t) {
      CallResult res = AllReduce(g, &comps, inputs[t]);
      REQUIRE(res.Failure() == "");
      CHECK(FirstDifferentRank(res.out) == -1);
      const std::vector<double> m = Mean(inputs[t]);
      for (size_t i = 0; i < count; ++i) {
        sumOut[i] += res.out[0][i];
        sumAvg[i] += m[i];
      }
      std::vector<double> diff(count);
      for (size_t i = 0; i < count; ++i) diff[i] = sumOut[i] - sumAvg[i];
      const double residual = std::sqrt(SqNorm(diff)) / oneCall;
      if (t + 1 == calls / 2) residualAt[ef][0] = residual;
      if (t + 1 == calls) residualAt[ef][1] = residual;
      if (ef == 1) {
        // The identity of error feedback: what the outputs lack is exactly the ranks' mean memory.
        const std::vector<double> memory = MeanMemory(comps, count);
        double gap = 0;
        for (size_t i = 0; i < count; ++i) gap += std::pow(diff[i] + memory[i], 2);
        INFO("call " << t);
        CHECK(std::sqrt(gap) <= 1e-4 * std::sqrt(SqNorm(sumAvg)));
      }
    }
  }
  WARN("residual |sum(out) - sum(avg)| / |avg| after " << calls / 2 << " and " << calls
                                                         << " calls: with error feedback " << residualAt[1][0] << ", "
                                                         << residualAt[1][1] << "; without " << residualAt[0][0]
                                                         << ", " << residualAt[0][1]);
  // Without feedback the missed part of g piles up call after call; with it, the residual (the memory) levels off.
  CHECK(residualAt[0][1] > 1.8 * residualAt[0][0]);
  CHECK(residualAt[1][1] < 1.3 * residualAt[1][0]);
  CHECK(residualAt[1][1] < 0.25 * residualAt[0][1]);
}

TEST_CASE("16-bit data: error feedback's identity holds for the narrowed results, whose rounding the memory keeps",
          "[lowrank][ef][half]") {
  // As above, with bfloat16 and float16 gradients and a vector beside the matrix: the 16-bit results are the float32
  // result rounded, and each memory keeps its share of that rounding, so sum(out) = s (sum(avg) - mean(E)) still holds
  // (s: 1 for avg, n for sum), to float32 rounding. Without the rounding in the memory the gap is a call's rounding.
  const int nranks = 3;
  const int64_t rows = 24, cols = 16;
  const size_t count = static_cast<size_t>(rows * cols) + 10;
  const int calls = 30;
  Group g = MakeGroup(nranks);
  REQUIRE(g.status == ccSuccess);
  for (ccDataType_t dtype : {ccBfloat16, ccFloat16}) {
    std::mt19937_64 gen(dtype == ccBfloat16 ? 12 : 13);
    std::normal_distribution<double> normal;
    std::vector<double> fixed(count);
    for (auto& x : fixed) x = normal(gen);
    for (ccRedOp_t op : {ccAvg, ccSum}) {
      const double s = op == ccSum ? nranks : 1.0;
      INFO((dtype == ccBfloat16 ? "bf16" : "fp16") << ", " << (op == ccSum ? "sum" : "avg"));
      Compressors comps("powersgd:rank=2,shapes=24x16+10", nranks);
      REQUIRE(comps.status == ccSuccess);
      std::vector<double> sumOut(count, 0.0), sumAvg(count, 0.0);
      double worst = 0;  // the largest gap over the calls, relative to |s sum(avg)|
      for (int t = 0; t < calls; ++t) {
        Buffers in(static_cast<size_t>(nranks), std::vector<float>(count));
        std::vector<std::vector<uint16_t>> in16(static_cast<size_t>(nranks), std::vector<uint16_t>(count));
        std::vector<std::vector<uint16_t>> out16(static_cast<size_t>(nranks), std::vector<uint16_t>(count));
        for (int r = 0; r < nranks; ++r) {
          for (size_t i = 0; i < count; ++i) in[r][i] = static_cast<float>(fixed[i] + 0.3 * normal(gen));
          ccoll::Narrow(dtype, in[r].data(), count, in16[r].data());
          ccoll::Widen(dtype, in16[r].data(), count, in[r].data());  // the values the ranks hold
        }
        std::vector<RankResult> rc(static_cast<size_t>(nranks));
        RunRanks(nranks, [&](int r) {
          rc[r] = Record(ccAllReduce(in16[r].data(), out16[r].data(), count, dtype, op, comps[r], g[r], nullptr), g[r]);
        });
        for (int r = 0; r < nranks; ++r) REQUIRE(rc[r].rc == ccSuccess);
        for (int r = 1; r < nranks; ++r) CHECK(cctest::FirstDifference(out16[r], out16[0]) == "");
        std::vector<float> out(count);
        ccoll::Widen(dtype, out16[0].data(), count, out.data());
        const std::vector<double> m = Mean(in);
        const std::vector<double> memory = MeanMemory(comps, count);
        double gap = 0;
        for (size_t i = 0; i < count; ++i) {
          sumOut[i] += out[i];
          sumAvg[i] += m[i];
          gap += std::pow(sumOut[i] - s * (sumAvg[i] - memory[i]), 2);
        }
        worst = std::max(worst, std::sqrt(gap) / (s * std::sqrt(SqNorm(sumAvg))));
      }
      WARN((dtype == ccBfloat16 ? "bf16" : "fp16")
           << ", " << (op == ccSum ? "sum" : "avg")
           << ": the largest gap |sum(out) - s (sum(avg) - mean(E))| / |s sum(avg)| " << worst);
      CHECK(worst <= 1e-5);
    }
  }
}

TEST_CASE("a bucket of several tensors: vectors and small matrices exact, large matrices low rank", "[lowrank]") {
  // 96x64 (rank 3 average: compressed) + 64 (vector) + 4x4 (too small to gain: exact) + 7 (vector).
  const int nranks = 4;
  const int64_t rows = 96, cols = 64;
  const size_t big = static_cast<size_t>(rows * cols), count = big + 64 + 16 + 7;
  Buffers in = RankKInputs(nranks, rows, cols, 3, 5);
  std::mt19937_64 gen(6);
  std::normal_distribution<float> normal;
  for (auto& x : in) {
    x.resize(count);
    for (size_t i = big; i < count; ++i) x[i] = normal(gen);
  }
  const std::vector<double> m = Mean(in);
  Group g = MakeGroup(nranks);
  REQUIRE(g.status == ccSuccess);
  for (const char* spec : {"powersgd:rank=4,shapes=96x64+64+4x4+7", "powersgd:rank=4,shapes=96x64+64x1+4x4+7x1",
                           "powersgd:rank=4,shapes=96x64+64+4x4+7,dtype=bf16"}) {
    INFO(spec);
    const bool bf16 = Contains(spec, "bf16");  // P and Q in bf16; the exact parts still in float32
    Compressors comps(spec, nranks);
    REQUIRE(comps.status == ccSuccess);
    for (ccRedOp_t op : {ccAvg, ccSum}) {
      CallResult res = AllReduce(g, &comps, in, op);
      REQUIRE(res.Failure() == "");
      CHECK(FirstDifferentRank(res.out) == -1);
      const double scale = op == ccSum ? nranks : 1.0;
      std::vector<double> ref = m;
      for (auto& x : ref) x *= scale;
      CHECK(Vnmse(res.out[0], ref, 0, big) < (bf16 ? 1e-4 : 1e-9));
      for (size_t i = big; i < count; ++i) {
        // Exact: the float sum of 4 values (divided by 4 for avg) is within a few ulps of the fp64 mean.
        INFO("element " << i);
        CHECK(std::fabs(res.out[0][i] - scale * m[i]) <= 1e-6 * (1.0 + std::fabs(scale * m[i])));
      }
    }
  }
  // The same through ccCompressorSetShapes.
  Compressors comps("powersgd:rank=4", nranks);
  REQUIRE(comps.status == ccSuccess);
  const int64_t r[] = {96, 64, 4, 7}, c[] = {64, 1, 4, 1};
  for (int k = 0; k < nranks; ++k) REQUIRE(ccCompressorSetShapes(comps[k], 4, r, c) == ccSuccess);
  char spec[256];
  REQUIRE(ccCompressorGetSpec(comps[0], spec, sizeof(spec)) == ccSuccess);
  CHECK(Contains(spec, "shapes=96x64+64+4x4+7"));
  CallResult res = AllReduce(g, &comps, in);
  REQUIRE(res.Failure() == "");
  CHECK(Vnmse(res.out[0], m) < 1e-9);
}

TEST_CASE("sum is n times avg, in place (input = M = output) equals out of place, the automatic shape works on any "
          "count",
          "[lowrank]") {
  for (int nranks : {2, 3, 5}) {
    Group g = MakeGroup(nranks);
    REQUIRE(g.status == ccSuccess);
    for (size_t count : {size_t{1}, size_t{2}, size_t{5}, size_t{1001}, size_t{4099}, size_t{40000}}) {
      std::mt19937_64 gen(count);
      std::normal_distribution<float> normal;
      Buffers in(nranks, std::vector<float>(count));
      for (auto& x : in) {
        for (auto& v : x) v = normal(gen);
      }
      INFO("nranks " << nranks << " count " << count);
      Buffers outs[3];
      int i = 0;
      for (auto [op, inPlace] : {std::pair{ccAvg, false}, std::pair{ccAvg, true}, std::pair{ccSum, false}}) {
        // ef=0: in place, the input itself is M (with feedback M is the memory), so this is the aliasing case.
        Compressors comps("powersgd:rank=4,ef=0", nranks);
        REQUIRE(comps.status == ccSuccess);
        CallResult res = AllReduce(g, &comps, in, op, inPlace);
        REQUIRE(res.Failure() == "");
        CHECK(FirstDifferentRank(res.out) == -1);
        outs[i++] = res.out;
      }
      CHECK(std::memcmp(outs[0][0].data(), outs[1][0].data(), count * sizeof(float)) == 0);
      for (size_t k = 0; k < count; ++k) {
        INFO("element " << k);
        CHECK(std::fabs(outs[2][0][k] - nranks * outs[0][0][k]) <= 1e-5 * (1.0 + std::fabs(outs[2][0][k])));
      }
    }
  }
}

TEST_CASE("the first `start` calls are the exact all-reduce, bit for bit, and compression starts after", "[lowrank]") {
  const int nranks = 3;
  const size_t count = 64 * 64;
  Group g = MakeGroup(nranks);
  REQUIRE(g.status == ccSuccess);
  Compressors comps("powersgd:rank=2,start=2", nranks);
  REQUIRE(comps.status == ccSuccess);
  for (int call = 0; call < 3; ++call) {
    std::mt19937_64 gen(call);
    std::normal_distribution<float> normal;
    Buffers in(nranks, std::vector<float>(count));
    for (auto& x : in) {
      for (auto& v : x) v = normal(gen);
    }
    CallResult exact = AllReduce(g, nullptr, in);
    CallResult res = AllReduce(g, &comps, in);
    REQUIRE(res.Failure() == "");
    CHECK(FirstDifferentRank(res.out) == -1);
    INFO("call " << call);
    const bool same = std::memcmp(exact.out[0].data(), res.out[0].data(), count * sizeof(float)) == 0;
    CHECK(same == (call < 2));
    CHECK(comps[0]->errorFeedback.empty() == (call < 2));  // no feedback before compression starts
  }
}

TEST_CASE("wire bytes: P and Q only (ring traffic), and half of that with the bf16 wire", "[lowrank]") {
  const int nranks = 4;
  const int64_t rows = 512, cols = 256;
  const size_t count = static_cast<size_t>(rows * cols);
  Group g = MakeGroup(nranks, ccAlgoRing);
  REQUIRE(g.status == ccSuccess);
  const Buffers in = RankKInputs(nranks, rows, cols, 8, 3);
  uint64_t bytes[2] = {};
  for (int bf16 : {0, 1}) {
    Compressors comps(std::string("powersgd:rank=8,rows=512,cols=256,dtype=") + (bf16 ? "bf16" : "f32"), nranks);
    REQUIRE(comps.status == ccSuccess);
    CallResult res = AllReduce(g, &comps, in);
    REQUIRE(res.Failure() == "");
    bytes[bf16] = res.bytesSent;
  }
  // A ring all-reduce sends 2 (n-1)/n of its buffer per rank: (512 + 256) x 8 floats in two rounds.
  const double factors = (rows + cols) * 8.0;
  const double f32 = 2.0 * (nranks - 1) / nranks * factors * 4;
  INFO("bytes sent by rank 0: f32 " << bytes[0] << ", bf16 " << bytes[1] << "; P+Q in f32 over a ring " << f32
                                    << "; the gradient itself " << count * 4);
  CHECK(bytes[0] >= f32);
  CHECK(bytes[0] <= f32 * 1.05 + 1024);  // message headers only
  CHECK(bytes[1] <= bytes[0] * 0.55);
}

TEST_CASE("bad shapes are refused with ccInvalidUsage on every rank before anything is sent, writing nothing",
          "[lowrank][params]") {
  const int nranks = 2;
  const size_t count = 1000;
  Group g = MakeGroup(nranks);
  REQUIRE(g.status == ccSuccess);
  Buffers in(nranks, std::vector<float>(count, 1.0f));
  struct Bad {
    const char* spec;
    const char* mention;
  };
  for (const Bad& b : {Bad{"powersgd:rows=30,cols=30", "900"}, Bad{"powersgd:rows=30", "multiple of rows 30"},
                       Bad{"powersgd:cols=7", "multiple of cols 7"}, Bad{"powersgd:shapes=10x10+10", "110"},
                       Bad{"powersgd:shapes=10x100+1", "more than count 1000"},
                       Bad{"powersgd:shapes=1073741824x1073741824+1073741824x1073741824+1000", "more than count"}}) {
    INFO(b.spec);
    Compressors comps(b.spec, nranks);
    REQUIRE(comps.status == ccSuccess);
    Buffers out(nranks, std::vector<float>(count, -7.0f));
    std::vector<RankResult> rc(nranks);
    RunRanks(nranks, [&](int r) {
      rc[r] = Record(ccAllReduce(in[r].data(), out[r].data(), count, ccFloat32, ccAvg, comps[r], g[r], nullptr), g[r]);
    });
    for (int r = 0; r < nranks; ++r) {
      INFO("rank " << r << ": " << rc[r].error);
      CHECK(rc[r].rc == ccInvalidUsage);
      CHECK(Contains(rc[r].error, "powersgd"));
      CHECK(Contains(rc[r].error, b.mention));
      for (float x : out[r]) CHECK(x == -7.0f);
    }
  }
  // The communicator still works.
  Compressors good("powersgd:rows=10,cols=100", nranks);
  CallResult res = AllReduce(g, &good, in);
  CHECK(res.Failure() == "");
  CHECK(FirstDifferentRank(res.out) == -1);

  // ccCompressorSetShapes validates its arguments.
  ccCompressor_t c = nullptr, q = nullptr;
  REQUIRE(ccCompressorCreate(&c, ccCompressPowerSGD) == ccSuccess);
  REQUIRE(ccCompressorCreate(&q, ccCompressQuant) == ccSuccess);
  const int64_t rows[] = {10, 0}, cols[] = {100, 5};
  CHECK(ccCompressorSetShapes(c, 1, nullptr, cols) == ccInvalidArgument);
  CHECK(ccCompressorSetShapes(c, -1, rows, cols) == ccInvalidArgument);
  CHECK(ccCompressorSetShapes(c, 2, rows, cols) == ccInvalidArgument);
  CHECK(Contains(ccGetLastError(nullptr), "tensor 1"));
  CHECK(ccCompressorSetShapes(q, 1, rows, cols) == ccInvalidArgument);
  CHECK(Contains(ccGetLastError(nullptr), "powersgd only"));
  CHECK(ccCompressorSetShapes(nullptr, 1, rows, cols) == ccInvalidArgument);
  CHECK(ccCompressorSetShapes(c, 1, rows, cols) == ccSuccess);
  CHECK(ccCompressorSetShapes(c, 0, nullptr, nullptr) == ccSuccess);  // back to rows/cols
  char spec[128];
  REQUIRE(ccCompressorGetSpec(c, spec, sizeof(spec)) == ccSuccess);
  CHECK_FALSE(Contains(spec, "shapes"));
  ccCompressorDestroy(c);
  ccCompressorDestroy(q);
}

TEST_CASE("zeros give exact zeros, and a NaN poisons one call on every rank alike and not the next ones", "[lowrank]") {
  const int nranks = 3;
  const size_t count = 50 * 40;
  Group g = MakeGroup(nranks);
  REQUIRE(g.status == ccSuccess);
  Compressors comps("powersgd:rank=4,rows=50,cols=40", nranks);
  REQUIRE(comps.status == ccSuccess);
  const Buffers zeros(nranks, std::vector<float>(count, 0.0f));
  const Buffers normal = RankKInputs(nranks, 50, 40, 2, 9);
  Buffers nan = normal;
  nan[1][777] = std::numeric_limits<float>::quiet_NaN();
  // zeros (Q stays usable?), NaN, then ordinary inputs: the warm-start Q and the memory must recover.
  int step = 0;
  for (const Buffers* in : std::vector<const Buffers*>{&zeros, &normal, &nan, &normal, &normal}) {
    CallResult res = AllReduce(g, &comps, *in);
    INFO("step " << step);
    REQUIRE(res.Failure() == "");
    CHECK(FirstDifferentRank(res.out) == -1);
    size_t finite = 0, nonzero = 0;
    for (float x : res.out[0]) {
      finite += std::isfinite(x) ? 1 : 0;
      nonzero += x != 0.0f ? 1 : 0;
    }
    if (in == &zeros) CHECK(nonzero == 0);
    if (in == &nan) CHECK_FALSE(std::isfinite(res.out[0][777]));
    if (in == &normal) {
      CHECK(finite == count);
      if (step == 4) CHECK(Vnmse(res.out[0], Mean(normal)) < 1e-6);  // rank-2 input, rank 4: recovered again
    }
    ++step;
  }
}
