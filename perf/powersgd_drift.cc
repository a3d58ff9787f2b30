// How far PowerSGD's error feedback lets the running sum of outputs stray from the running sum of true averages when
// every rank sends the same gradient call after call: each rank a fixed low-rank matrix of its own (the persistent
// differences between ranks of non-iid data), or all ranks one matrix (-S). Thread ranks of one process
// (ccCommInitAll), ccAvg, one row per compressor spec, |sum_t out_t - t * avg| / |avg| after each checkpoint's calls.
//
//   powersgd_drift [-t ranks] [-R rows] [-C cols] [-k input rank] [-n calls] [-S] [-z spec]...
//
// (-t and -n as in the other perf binaries: thread ranks, iterations.) Defaults: 2 ranks, 64 x 64, inputs of rank 2,
// 12800 calls, specs powersgd:rank=2 with f32 and with bf16 factors
// (rows and cols are added to each spec). With bf16 factors each rank's share of P and Q is rounded on the wire, and
// the ranks' memories drift apart by the sum of their differences: the shares grow and cancel in the sum, their
// rounding does not (include/ccoll.h, ccParamValueType).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ccoll.h"

namespace {

struct Options {
  int ranks = 2;
  long rows = 64, cols = 64;
  int inputRank = 2;
  long calls = 12800;
  bool same = false;
  std::vector<std::string> specs;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "powersgd_drift: %s\nusage: powersgd_drift [-t ranks] [-R rows] [-C cols] [-k input rank] [-n calls] "
               "[-S (every rank the same input)] [-z spec]...\n",
               why);
  std::exit(2);
}

long Positive(const char* text, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v <= 0 || v > (1L << 24)) Usage(what);
  return v;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-S") {
      o.same = true;
      continue;
    }
    if (i + 1 >= argc) Usage("an option without its value");
    const char* v = argv[++i];
    if (a == "-t") {
      o.ranks = static_cast<int>(Positive(v, "-t takes a positive rank count"));
    } else if (a == "-R") {
      o.rows = Positive(v, "-R takes a positive row count");
    } else if (a == "-C") {
      o.cols = Positive(v, "-C takes a positive column count");
    } else if (a == "-k") {
      o.inputRank = static_cast<int>(Positive(v, "-k takes a positive rank"));
    } else if (a == "-n") {
      o.calls = Positive(v, "-n takes a positive call count");
    } else if (a == "-z") {
      o.specs.push_back(v);
    } else {
      Usage(("unknown option " + a).c_str());
    }
  }
  if (o.inputRank > std::min(o.rows, o.cols)) Usage("-k is larger than the matrix allows");
  if (o.rows * o.cols > (1L << 26)) Usage("-R times -C is over 2^26 elements");
  if (o.specs.empty()) o.specs = {"powersgd:rank=2,dtype=f32", "powersgd:rank=2,dtype=bf16"};
  return o;
}

// Columns of a (n x k, row-major) made orthonormal (Gram-Schmidt, twice for accuracy).
void Orthonormalize(std::vector<double>* a, long n, int k) {
  for (int pass = 0; pass < 2; ++pass) {
    for (int j = 0; j < k; ++j) {
      for (int p = 0; p < j; ++p) {
        double dot = 0.0;
        for (long i = 0; i < n; ++i) dot += (*a)[i * k + j] * (*a)[i * k + p];
        for (long i = 0; i < n; ++i) (*a)[i * k + j] -= dot * (*a)[i * k + p];
      }
      double norm = 0.0;
      for (long i = 0; i < n; ++i) norm += (*a)[i * k + j] * (*a)[i * k + j];
      norm = std::sqrt(norm);
      for (long i = 0; i < n; ++i) (*a)[i * k + j] /= norm;
    }
  }
}

// A gradient-like matrix: U diag(1, 1/2, ..., 1/k) V^T with random orthonormal U and V, scaled to RMS 1.
std::vector<float> LowRankMatrix(long rows, long cols, int k, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> u(static_cast<size_t>(rows * k)), v(static_cast<size_t>(cols * k));
  for (double& x : u) x = normal(gen);
  for (double& x : v) x = normal(gen);
  Orthonormalize(&u, rows, k);
  Orthonormalize(&v, cols, k);
  std::vector<double> m(static_cast<size_t>(rows * cols), 0.0);
  double squares = 0.0;
  for (long i = 0; i < rows; ++i) {
    for (long j = 0; j < cols; ++j) {
      double s = 0.0;
      for (int p = 0; p < k; ++p) s += u[i * k + p] * v[j * k + p] / (p + 1);
      m[i * cols + j] = s;
      squares += s * s;
    }
  }
  const double scale = 1.0 / std::sqrt(squares / static_cast<double>(m.size()));
  std::vector<float> out(m.size());
  for (size_t i = 0; i < m.size(); ++i) out[i] = static_cast<float>(m[i] * scale);
  return out;
}

double Norm(const std::vector<double>& x) {
  double s = 0.0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  const size_t count = static_cast<size_t>(o.rows * o.cols);
  std::vector<std::vector<float>> in;
  for (int r = 0; r < o.ranks; ++r) in.push_back(LowRankMatrix(o.rows, o.cols, o.inputRank, o.same ? 10 : 10 + r));
  std::vector<double> avg(count, 0.0);
  for (const auto& x : in) {
    for (size_t i = 0; i < count; ++i) avg[i] += x[i];
  }
  for (double& v : avg) v /= o.ranks;
  const double avgNorm = Norm(avg);
  std::vector<long> marks;
  for (long m : {1L, 100L, 400L, 1600L, 3200L, 6400L, 12800L, 25600L, 51200L}) {
    if (m < o.calls) marks.push_back(m);
  }
  marks.push_back(o.calls);

  std::printf("# PowerSGD drift: %d ranks, %ld x %ld, %s inputs of rank %d, the same every call, ccAvg\n", o.ranks,
              o.rows, o.cols, o.same ? "every rank the same" : "each rank its own", o.inputRank);
  std::printf("# |sum of outputs - calls * average| / |average| after each number of calls (|average| %.4g)\n\n",
              avgNorm);
  std::printf("| spec |");
  for (long m : marks) std::printf(" %ld |", m);
  std::printf(" ranks identical |\n|---|");
  for (size_t i = 0; i < marks.size(); ++i) std::printf("---:|");
  std::printf("---|\n");

  std::vector<ccComm_t> comms(static_cast<size_t>(o.ranks), nullptr);
  if (ccCommInitAll(comms.data(), o.ranks, nullptr) != ccSuccess) {
    std::fprintf(stderr, "powersgd_drift: ccCommInitAll: %s\n", ccGetLastError(nullptr));
    return 1;
  }
  int status = 0;
  for (const std::string& base : o.specs) {
    const std::string spec = base + ",rows=" + std::to_string(o.rows) + ",cols=" + std::to_string(o.cols);
    // Each rank keeps its own running drift; identical outputs on every rank give identical drifts.
    std::vector<std::vector<double>> drift(static_cast<size_t>(o.ranks), std::vector<double>(count, 0.0));
    std::vector<std::vector<double>> atMarks(static_cast<size_t>(o.ranks));
    std::vector<std::string> failure(static_cast<size_t>(o.ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < o.ranks; ++r) {
      threads.emplace_back([&, r] {
        ccCompressor_t comp = nullptr;
        if (ccCompressorCreateFromString(&comp, spec.c_str()) != ccSuccess) {
          failure[r] = ccGetLastError(nullptr);
          return;
        }
        std::vector<float> out(count);
        size_t next = 0;
        for (long t = 1; t <= o.calls; ++t) {
          if (ccAllReduce(in[r].data(), out.data(), count, ccFloat32, ccAvg, comp, comms[r], nullptr) != ccSuccess) {
            failure[r] = ccGetLastError(comms[r]);
            break;
          }
          for (size_t i = 0; i < count; ++i) drift[r][i] += static_cast<double>(out[i]) - avg[i];
          if (next < marks.size() && marks[next] == t) {
            atMarks[r].push_back(Norm(drift[r]) / avgNorm);
            ++next;
          }
        }
        ccCompressorDestroy(comp);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < o.ranks; ++r) {
      if (!failure[r].empty()) {
        std::fprintf(stderr, "powersgd_drift: %s: rank %d: %s\n", spec.c_str(), r, failure[r].c_str());
        return 1;
      }
    }
    bool identical = true;
    for (int r = 1; r < o.ranks; ++r) {
      identical = identical && std::memcmp(drift[r].data(), drift[0].data(), count * sizeof(double)) == 0;
    }
    if (!identical) status = 1;
    std::printf("| `%s` |", base.c_str());
    for (double v : atMarks[0]) std::printf(" %.3g |", v);
    std::printf(" %s |\n", identical ? "yes" : "NO");
  }
  for (ccComm_t c : comms) ccCommDestroy(c);
  return status;
}
