// Soak: many mixed all-reduces, through the public API only, the way a long training job uses ccoll: on thread ranks
// (-t), or one rank per process under a launcher (CC_RANK, CC_NRANKS and CC_ROOT set, no -t; UCX between them).
//
// Every call draws (from a seed all ranks share, so they agree without talking) an element count, log-uniform in
// 1..max, a communicator (ring, tree or auto: three communicators per rank) and a kind:
//   exact: datatype float32/float16/bfloat16/float64/int32/int64, op sum/prod/max/min/avg, in place or not; the
//          inputs are small integers (sums, products of +-1/+-2, and averages, exact in every type since the number
//          of ranks must be 2, 4 or 8), so the result must equal the reference exactly, element by element;
//   compressed: float32 sum/avg through cast16, quant 4-bit requant, quant 8-bit homomorphic, topk, randk or
//          powersgd:rank=2, with a fresh compressor or one of a few persistent per-bucket compressors (error
//          feedback and warm starts carried across calls); the result must be finite and byte-identical on every
//          rank.
// Every `every` calls, with all ranks idle, each process samples its resident memory (VmRSS) and open file
// descriptors, and rank 0 prints its row. At the end: RSS and fd count must be flat after warm-up in every process: no
// sample from call `warmup` on exceeds the one at `warmup` by more than 5% + 16 MiB (RSS), or at all (fds).
// Processes: the three communicators are split from the launcher's (ccCommSplit), which stays the side channel
// (perf/env_group.h) for the barriers and the comparison of the compressed results' hashes across ranks.
//
// glibc's malloc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), after which
// blocks of that size come from per-thread arenas that are only trimmed at the top: resident memory then creeps up
// for thousands of calls without anything being leaked (measured: +37 MiB between calls 1000 and 4500, flat after).
// The soak fixes the threshold at 1 MiB (mallopt) so that RSS follows what the library holds; -G keeps glibc's
// default. Under ASan the quarantine keeps freed memory by design: RSS is printed but not judged.
//
//   soak [-n calls] [-t ranks] [-m max_count] [-s every] [-w warmup] [-S seed] [-G]
//   UCX_TLS=tcp,self perf/launch_local.sh -n 4 build/perf/soak -P [-n calls] [-m max_count] ...
// -t always means thread ranks; without it a set CC_RANK makes this process one rank; -P fails unless it does.
#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ccoll.h"
#include "env_group.h"
#include "thread_group.h"
#include "verify.h"

#if defined(__SANITIZE_ADDRESS__)
#define SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_ASAN 1
#endif
#endif
#ifndef SOAK_ASAN
#define SOAK_ASAN 0
#endif

namespace {

struct Options {
  long calls = 10000;
  int ranks = 4;
  size_t maxCount = size_t{4} << 20;
  long every = 500;
  long warmup = 1000;
  uint64_t seed = 1;
  bool glibcThreshold = false;  // -G: keep glibc's dynamic mmap threshold
};

// splitmix64: the shared stream of call parameters.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint64_t>(n)); }
};

// ---- element values ------------------------------------------------------------------------------------------

uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Rank r's input at element i of call c: an integer in -8..8 (sum, max, min, avg) or one of -2,-1,1,2 (prod).
int Value(int r, size_t i, long c, bool prod) {
  uint32_t h = Hash((static_cast<uint64_t>(c) << 40) ^ (static_cast<uint64_t>(r) << 32) ^ i);
  if (prod) {
    static const int kProd[4] = {-2, -1, 1, 2};
    return kProd[h & 3];
  }
  return static_cast<int>(h % 17) - 8;
}

// Compressed calls: a smooth float in about [-1, 1] with some structure (a few large chunks for topk).
float Smooth(int r, size_t i, long c) {
  uint32_t h = Hash((static_cast<uint64_t>(c) << 40) ^ (static_cast<uint64_t>(r) << 32) ^ i);
  float base = std::sin(static_cast<float>(i % 4096) * 0.01f + static_cast<float>(c));
  return base * ((i / 1024) % 7 == 0 ? 4.0f : 1.0f) + (static_cast<float>(h % 2001) - 1000.0f) * 1e-4f;
}

uint16_t ToHalf(float f) {  // exact for the small integers and quarters used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) == 0) return sign;
  int exp = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
  return static_cast<uint16_t>(sign | (exp << 10) | ((u >> 13) & 0x3ffu));
}
float FromHalf(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  uint32_t u = sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112u) << 23) | (man << 13));
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void Store(void* buf, size_t i, ccDataType_t t, int v) {
  switch (t) {
    case ccFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case ccFloat64: static_cast<double*>(buf)[i] = v; break;
    case ccInt32: static_cast<int32_t*>(buf)[i] = v; break;
    case ccInt64: static_cast<int64_t*>(buf)[i] = v; break;
    case ccFloat16: static_cast<uint16_t*>(buf)[i] = ToHalf(static_cast<float>(v)); break;
    case ccBfloat16: static_cast<uint16_t*>(buf)[i] = ToBf16(static_cast<float>(v)); break;
    default: break;  // the soak draws only kTypes
  }
}

double Load(const void* buf, size_t i, ccDataType_t t) {
  switch (t) {
    case ccFloat32: return static_cast<const float*>(buf)[i];
    case ccFloat64: return static_cast<const double*>(buf)[i];
    case ccInt32: return static_cast<const int32_t*>(buf)[i];
    case ccInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case ccFloat16: return FromHalf(static_cast<const uint16_t*>(buf)[i]);
    case ccBfloat16: return FromBf16(static_cast<const uint16_t*>(buf)[i]);
    default: break;  // the soak draws only kTypes
  }
  return 0;
}

double Expected(int nranks, size_t i, long c, ccRedOp_t op, ccDataType_t t) {
  const bool prod = op == ccProd;
  int64_t acc = Value(0, i, c, prod);
  for (int r = 1; r < nranks; ++r) {
    int64_t v = Value(r, i, c, prod);
    switch (op) {
      case ccSum:
      case ccAvg: acc += v; break;
      case ccProd: acc *= v; break;
      case ccMax: acc = std::max(acc, v); break;
      case ccMin: acc = std::min(acc, v); break;
    }
  }
  if (op != ccAvg) return static_cast<double>(acc);
  if (t == ccInt32 || t == ccInt64) return static_cast<double>(acc / nranks);  // integer division, as documented
  return static_cast<double>(acc) / nranks;
}

// ---- process numbers -----------------------------------------------------------------------------------------

long RssKiB() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::strtol(line + 6, nullptr, 10);
  }
  std::fclose(f);
  return kib;
}

int OpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

// ---- the calls -----------------------------------------------------------------------------------------------

const char* const kSpecs[] = {"cast16", "quant:bits=4,mode=requant", "quant:bits=8,mode=homomorphic",
                              "topk", "randk", "powersgd:rank=2"};
constexpr int kNumSpecs = 6;
constexpr int kBucketsPerSpec = 3;
const char* const kAlgoNames[] = {"ring", "tree", "auto"};
const ccDataType_t kTypes[] = {ccFloat32, ccFloat16, ccBfloat16, ccFloat64, ccInt32, ccInt64};
const ccRedOp_t kOps[] = {ccSum, ccProd, ccMax, ccMin, ccAvg};

struct Plan {
  size_t count = 0;
  int comm = 0;    // 0 ring, 1 tree, 2 auto
  int spec = -1;   // -1: exact
  int bucket = -1; // compressed: -1 fresh compressor, else a persistent one
  ccDataType_t type = ccFloat32;
  ccRedOp_t op = ccSum;
  bool inPlace = false;
};

size_t LogUniform(Rng& rng, size_t max) {
  double x = std::exp(rng.Unit() * std::log(static_cast<double>(max)));
  return std::min(max, std::max<size_t>(1, static_cast<size_t>(x)));
}

// What the ranks of one process share: the options, the thread ranks' unique ids, and rank 0's counters and samples
// (with ranks as processes, each process samples its own memory and descriptors).
struct Shared {
  Options opt;
  std::vector<ccUniqueId> ids;       // thread ranks: one per communicator kind
  std::vector<size_t> bucketCount;   // [spec * kBucketsPerSpec + b]
  long compressedCalls = 0, exactCalls = 0;  // rank 0's
  unsigned long long elements = 0;           // rank 0's
  std::vector<long> sampleCall, sampleRss, sampleFds;
  std::vector<double> sampleSeconds;
  explicit Shared(const Options& o) : opt(o) {}
};

Plan Draw(Rng& rng, const Shared& sh) {
  Plan p;
  p.comm = rng.Below(3);
  int kind = rng.Below(9);  // 3 of 9 exact, 1 of 9 each compressed spec
  if (kind < 3) {
    p.count = LogUniform(rng, sh.opt.maxCount);
    p.type = kTypes[rng.Below(6)];
    p.op = kOps[rng.Below(5)];
    p.inPlace = rng.Below(2) == 0;
    return p;
  }
  p.spec = kind - 3;
  p.op = rng.Below(2) ? ccSum : ccAvg;
  p.inPlace = rng.Below(2) == 0;
  if (rng.Below(2)) {
    p.bucket = rng.Below(kBucketsPerSpec);
    p.count = sh.bucketCount[static_cast<size_t>(p.spec * kBucketsPerSpec + p.bucket)];
  } else {
    p.count = LogUniform(rng, sh.opt.maxCount);
  }
  return p;
}

// With ranks as processes, this process's communicators: aborted before a failed call exits, so that the peers'
// waiting calls fail at once where their transport hears of it, instead of at their timeout.
std::vector<ccComm_t> gAbortOnExit;

[[noreturn]] void FailExit() {
  for (ccComm_t comm : gAbortOnExit) ccCommAbort(comm);
  std::_Exit(1);  // the other ranks would wait for this one until their timeout
}

#define SOAK_CHECK(call, what)                                                                                 \
  do {                                                                                                         \
    ccResult_t r_ = (call);                                                                                    \
    if (r_ != ccSuccess) {                                                                                     \
      std::fprintf(stderr, "soak: rank %d call %ld: %s failed: %s: %s\n", rank, c, what, ccGetErrorString(r_), \
                   ccGetLastError(comm));                                                                      \
      std::fflush(stderr);                                                                                     \
      FailExit();                                                                                              \
    }                                                                                                          \
  } while (0)

void Sample(Shared& sh, long calls, std::chrono::steady_clock::time_point start, bool print) {
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  long rss = RssKiB();
  int fds = OpenFds();
  sh.sampleCall.push_back(calls);
  sh.sampleRss.push_back(rss);
  sh.sampleFds.push_back(fds);
  sh.sampleSeconds.push_back(s);
  double rate = 0;
  if (sh.sampleCall.size() > 1) {
    size_t k = sh.sampleCall.size() - 1;
    rate = static_cast<double>(calls - sh.sampleCall[k - 1]) / std::max(1e-9, s - sh.sampleSeconds[k - 1]);
  }
  if (!print) return;
  std::printf("%8ld %9.1f %10.1f %6d %10.1f\n", calls, s, static_cast<double>(rss) / 1024.0, fds, rate);
  std::fflush(stdout);
}

// Whether this process's RSS or descriptors grew after the warm-up (see the top); rank 0 prints its numbers.
struct Growth {
  bool rss = false, fds = false;
  std::string what;  // the numbers, for a process other than rank 0's to tell
};

Growth Grew(const Shared& sh, bool print) {
  const Options& opt = sh.opt;
  size_t w = 0;
  while (w < sh.sampleCall.size() && sh.sampleCall[w] < opt.warmup) ++w;
  long rssMax = 0;
  int fdsMax = 0;
  for (size_t k = w; k < sh.sampleCall.size(); ++k) {
    rssMax = std::max(rssMax, sh.sampleRss[k]);
    fdsMax = std::max(fdsMax, static_cast<int>(sh.sampleFds[k]));
  }
  const long rssW = sh.sampleRss[w], rssLimit = rssW + rssW / 20 + 16 * 1024;
  const int fdsW = static_cast<int>(sh.sampleFds[w]);
  char rssLine[160], fdsLine[96];
  std::snprintf(rssLine, sizeof(rssLine),
                "rss: %.1f MiB at call %ld, max %.1f MiB after (limit %.1f MiB), final %.1f MiB",
                static_cast<double>(rssW) / 1024, sh.sampleCall[w], static_cast<double>(rssMax) / 1024,
                static_cast<double>(rssLimit) / 1024, static_cast<double>(sh.sampleRss.back()) / 1024);
  std::snprintf(fdsLine, sizeof(fdsLine), "fds: %d at call %ld, max %d after, final %ld", fdsW, sh.sampleCall[w],
                fdsMax, sh.sampleFds.back());
  if (print) {
    const double seconds = sh.sampleSeconds.back();
    std::printf("# calls: %ld exact, %ld compressed, %.3g elements per rank, %.1f s, %.1f calls/s\n", sh.exactCalls,
                sh.compressedCalls, static_cast<double>(sh.elements), seconds,
                static_cast<double>(opt.calls) / seconds);
    std::printf("# %s\n# %s\n", rssLine, fdsLine);
  }
  Growth g;
  g.rss = rssMax > rssLimit && !SOAK_ASAN;
  g.fds = fdsMax > fdsW;
  g.what = std::string(rssLine) + "; " + fdsLine;
  return g;
}

// One rank's soak. base: with ranks as processes, the launcher's communicator (the side channel's; the three
// communicators are split from it); NULL for thread ranks. Returns the exit code, the same on every rank.
int RankMain(Shared& sh, ccperf::Group& g, ccComm_t base) {
  const Options& opt = sh.opt;
  const int rank = g.rank(), nranks = g.nranks();
  const bool processes = base != nullptr;
  const bool samples = processes || rank == 0;  // thread ranks share one process: rank 0 samples it
  long c = -1;
  ccComm_t comm = base;
  ccComm_t comms[3];
  if (processes) gAbortOnExit.push_back(base);
  for (int k = 0; k < 3; ++k) {
    ccConfig_t config = CC_CONFIG_INITIALIZER;
    config.algorithm = k == 0 ? ccAlgoRing : k == 1 ? ccAlgoTree : ccAlgoAuto;
    if (processes) {
      SOAK_CHECK(ccCommSplit(base, 0, rank, &comms[k], &config), "ccCommSplit");
      gAbortOnExit.push_back(comms[k]);
    } else {
      config.transport = ccTransportLocal;
      SOAK_CHECK(ccCommInitRankConfig(&comms[k], nranks, sh.ids[static_cast<size_t>(k)], rank, &config),
                 "ccCommInitRankConfig");
    }
  }
  std::vector<ccCompressor_t> buckets(kNumSpecs * kBucketsPerSpec, nullptr);
  // Buffers of the largest call, touched once, so that RSS measures the library, not this program's first touches.
  std::vector<char> send(opt.maxCount * 8, 1), recv(opt.maxCount * 8, 1);
  Rng rng{opt.seed};
  uint64_t failures = 0;  // this rank's; rank 0 counts the compressed results that differ across ranks
  const auto start = std::chrono::steady_clock::now();
  g.Barrier();
  if (rank == 0) std::printf("%8s %9s %10s %6s %10s\n", "calls", "seconds", "rss_MiB", "fds", "calls/s");
  if (samples) Sample(sh, 0, start, rank == 0);
  for (c = 0; c < opt.calls; ++c) {
    const Plan p = Draw(rng, sh);
    comm = comms[p.comm];
    void* out = recv.data();
    void* in = p.inPlace ? out : send.data();
    if (p.spec < 0) {
      const bool prod = p.op == ccProd;
      for (size_t i = 0; i < p.count; ++i) Store(in, i, p.type, Value(rank, i, c, prod));
      SOAK_CHECK(ccAllReduce(in, out, p.count, p.type, p.op, nullptr, comm, nullptr), "exact ccAllReduce");
      for (size_t i = 0; i < p.count; ++i) {
        double want = Expected(nranks, i, c, p.op, p.type), got = Load(out, i, p.type);
        if (got != want) {
          std::fprintf(stderr, "soak: rank %d call %ld (%s, count %zu, type %d, op %d): element %zu is %g, not %g\n",
                       rank, c, kAlgoNames[p.comm], p.count, static_cast<int>(p.type), static_cast<int>(p.op), i, got,
                       want);
          failures++;
          break;
        }
      }
      if (rank == 0) sh.exactCalls++;
    } else {
      float* fin = static_cast<float*>(in);
      for (size_t i = 0; i < p.count; ++i) fin[i] = Smooth(rank, i, c);
      ccCompressor_t comp = nullptr;
      if (p.bucket >= 0) {
        ccCompressor_t& slot = buckets[static_cast<size_t>(p.spec * kBucketsPerSpec + p.bucket)];
        if (!slot) SOAK_CHECK(ccCompressorCreateFromString(&slot, kSpecs[p.spec]), kSpecs[p.spec]);
        comp = slot;
      } else {
        SOAK_CHECK(ccCompressorCreateFromString(&comp, kSpecs[p.spec]), kSpecs[p.spec]);
      }
      SOAK_CHECK(ccAllReduce(in, out, p.count, ccFloat32, p.op, comp, comm, nullptr), kSpecs[p.spec]);
      if (p.bucket < 0) SOAK_CHECK(ccCompressorDestroy(comp), "ccCompressorDestroy");
      const float* res = static_cast<const float*>(out);
      for (size_t i = 0; i < p.count; ++i) {
        if (!std::isfinite(res[i])) {
          std::fprintf(stderr, "soak: rank %d call %ld (%s, %s, count %zu): element %zu is %g\n", rank, c,
                       kSpecs[p.spec], kAlgoNames[p.comm], p.count, i, static_cast<double>(res[i]));
          failures++;
          break;
        }
      }
      const std::vector<uint64_t> hashes = g.GatherU64(ccperf::HashBytes(out, p.count * sizeof(float)));
      if (rank == 0) {
        for (int r = 1; r < nranks; ++r) {
          if (hashes[static_cast<size_t>(r)] != hashes[0]) {
            std::fprintf(stderr, "soak: call %ld (%s, %s, count %zu): rank %d's result differs from rank 0's\n", c,
                         kSpecs[p.spec], kAlgoNames[p.comm], p.count, r);
            failures++;
          }
        }
        sh.compressedCalls++;
      }
    }
    if (rank == 0) sh.elements += p.count;
    if ((c + 1) % opt.every == 0 || c + 1 == opt.calls) {
      g.Barrier();
      if (samples) Sample(sh, c + 1, start, rank == 0);
      g.Barrier();
    }
  }
  for (ccCompressor_t b : buckets) {
    if (b) ccCompressorDestroy(b);
  }
  gAbortOnExit.resize(processes ? 1 : 0);  // base alone from here: the others are destroyed next
  for (ccComm_t& k : comms) {
    comm = k;
    SOAK_CHECK(ccCommDestroy(k), "ccCommDestroy");
  }
  // The verdict, the same on every rank: wrong results over all ranks, and whether RSS or descriptors grew in any
  // sampling process (a process other than rank 0's says so on stderr, with its numbers).
  Growth grew;
  if (samples) grew = Grew(sh, rank == 0);
  if (rank != 0 && (grew.rss || grew.fds)) std::fprintf(stderr, "soak: rank %d: %s\n", rank, grew.what.c_str());
  uint64_t totals[3] = {failures, grew.rss ? 1u : 0u, grew.fds ? 1u : 0u};
  g.SumU64(totals, 3);
  const bool ok = totals[0] == 0 && totals[1] == 0 && totals[2] == 0;
  if (rank == 0) {
    auto state = [&](uint64_t grewIn, const char* otherwise) {
      if (grewIn == 0) return std::string(otherwise);
      return processes ? "GREW in " + std::to_string(grewIn) + " of " + std::to_string(nranks) + " processes"
                       : std::string("GREW");
    };
    std::printf("# %s: %llu wrong results, rss %s, fds %s\n", ok ? "PASS" : "FAIL",
                static_cast<unsigned long long>(totals[0]),
                state(totals[1], SOAK_ASAN ? "not judged (ASan quarantine)" : "flat").c_str(),
                state(totals[2], "flat").c_str());
    std::fflush(stdout);
  }
  return ok ? 0 : 1;
}
// Ranks as processes: every process must have been given the same options (the calls drawn, the barriers and the
// sampling follow from them; a launcher other than launch_local.sh may pass each its own). One all-gather of their
// hash through the side channel; every rank fails alike on a difference.
bool SameOptionsEverywhere(ccperf::Group& g, const Options& opt) {
  const uint64_t words[] = {static_cast<uint64_t>(opt.calls),  opt.maxCount, static_cast<uint64_t>(opt.every),
                            static_cast<uint64_t>(opt.warmup), opt.seed,     opt.glibcThreshold ? 1u : 0u};
  const std::vector<uint64_t> all = g.GatherU64(ccperf::HashBytes(words, sizeof(words)));
  for (int k = 0; k < g.nranks(); ++k) {
    if (all[static_cast<size_t>(k)] != all[0]) {
      if (g.rank() == 0) std::fprintf(stderr, "soak: rank %d was given other options than rank 0\n", k);
      return false;
    }
  }
  return true;
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [-n calls] [-t ranks | -P] [-m max_count] [-s every] [-w warmup] [-S seed] [-G]\n"
               "  -t N: N thread ranks (2, 4 or 8; the default is 4, unless CC_RANK is set: then this process is one\n"
               "        rank of those a launcher started). -P: insist on the latter.\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  bool threads = false;        // -t given: thread ranks, whatever the environment
  bool needProcesses = false;  // -P: fail unless the launcher's environment is there
  int ch;
  while ((ch = getopt(argc, argv, "n:t:m:s:w:S:GPh")) != -1) {
    switch (ch) {
      case 'n': opt.calls = std::atol(optarg); break;
      case 't':
        opt.ranks = std::atoi(optarg);
        threads = true;
        break;
      case 'm': opt.maxCount = std::strtoull(optarg, nullptr, 0); break;
      case 's': opt.every = std::atol(optarg); break;
      case 'w': opt.warmup = std::atol(optarg); break;
      case 'S': opt.seed = std::strtoull(optarg, nullptr, 0); break;
      case 'G': opt.glibcThreshold = true; break;
      case 'P':
        needProcesses = true;
        break;
      default: return Usage(argv[0]);
    }
  }
  const bool processes = !threads && std::getenv("CC_RANK") != nullptr;
  if (needProcesses && !processes) {
    std::fprintf(stderr, "soak: -P: ranks as processes wanted, but %s\n",
                 threads ? "-t asks for thread ranks" : "CC_RANK is not set (no launcher)");
    return 2;
  }
  if (opt.calls < 1 || opt.maxCount < 1 || opt.every < 1 || opt.warmup < 0 || opt.warmup > opt.calls ||
      opt.warmup % opt.every != 0) {
    std::fprintf(stderr,
                 "soak: need calls >= 1, max_count >= 1, every >= 1, and warmup a multiple of every, at most "
                 "calls\n");
    return Usage(argv[0]);
  }
  if (!opt.glibcThreshold && !SOAK_ASAN) mallopt(M_MMAP_THRESHOLD, 1 << 20);
  ccComm_t base = nullptr;
  std::unique_ptr<ccperf::EnvGroup> side;  // processes: the side channel, on base
  if (processes) {
    const ccResult_t r = ccCommInitFromEnv(&base, nullptr);
    if (r != ccSuccess) {
      std::fprintf(stderr, "soak: ccCommInitFromEnv failed: %s: %s\n", ccGetErrorString(r), ccGetLastError(nullptr));
      return 1;
    }
    side = std::make_unique<ccperf::EnvGroup>(base, "soak");
    opt.ranks = side->nranks();
  }
  // The exact results are exact in every type: averages of the small integers with a power-of-two rank count, and
  // products of up to 8 factors of +-1 or +-2 within float16's range (16 may reach 2^16, above its 65504).
  if ((opt.ranks & (opt.ranks - 1)) != 0 || opt.ranks < 2 || opt.ranks > 8) {
    std::fprintf(stderr, "soak: the number of ranks (%d) must be 2, 4 or 8\n", opt.ranks);
    side.reset();
    ccCommDestroy(base);
    return 2;
  }
  if (processes && !SameOptionsEverywhere(*side, opt)) {
    side.reset();
    ccCommDestroy(base);
    return 2;
  }
  Shared sh(opt);
  if (!processes) {
    sh.ids.resize(3);
    for (ccUniqueId& id : sh.ids) {
      if (ccGetUniqueId(&id) != ccSuccess) {
        std::fprintf(stderr, "soak: ccGetUniqueId failed: %s\n", ccGetLastError(nullptr));
        return 1;
      }
    }
  }
  Rng bucketRng{opt.seed ^ 0xb0c4e75ull};
  for (int b = 0; b < kNumSpecs * kBucketsPerSpec; ++b) sh.bucketCount.push_back(LogUniform(bucketRng, opt.maxCount));
  if (!processes || side->rank() == 0) {
    std::printf("# soak: %ld all-reduces on %d %s, counts log-uniform in 1..%zu, seed %" PRIu64
                ", communicators ring/tree/auto; exact (6 types x 5 ops) and %s, %s, %s, %s, %s, %s; malloc mmap "
                "threshold %s\n",
                opt.calls, opt.ranks,
                processes ? (std::string("processes (one rank each, ccCommInitFromEnv; UCX_TLS=") +
                             (std::getenv("UCX_TLS") != nullptr ? std::getenv("UCX_TLS") : "unset") + ")")
                                .c_str()
                          : "thread ranks",
                opt.maxCount, opt.seed, kSpecs[0], kSpecs[1], kSpecs[2], kSpecs[3], kSpecs[4], kSpecs[5],
                SOAK_ASAN            ? "ASan's allocator"
                : opt.glibcThreshold ? "glibc's dynamic one"
                                     : "1 MiB");
  }
  if (!processes) {
    return ccperf::RunThreadRanks(opt.ranks, [&](ccperf::Group& g) { return RankMain(sh, g, nullptr); });
  }
  int code = RankMain(sh, *side, base);
  side.reset();
  if (ccCommDestroy(base) != ccSuccess) code = 1;
  return code;
}
