#include "bench.h"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "verify.h"

namespace ccperf {
namespace {

// Elements after the end of every output that are poisoned and checked: a write past count is a bug.
constexpr size_t kGuardBytes = 4096;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, FreeDeleter>;

Buffer Allocate(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0) return Buffer(nullptr);
  return Buffer(p);
}

size_t PartBegin(size_t n, int parts, int i) {
  size_t base = n / parts, rem = n % parts;
  return base * i + (static_cast<size_t>(i) < rem ? i : rem);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class RankRun {
 public:
  RankRun(const BenchSetup& setup, Group& group, AllReducer& reducer, Report* report)
      : s_(setup), o_(setup.opts), group_(group), reducer_(reducer), report_(report) {
    spec_.dtype = o_.dtype;
    spec_.op = o_.op;
    spec_.seed = o_.seed;
    spec_.dist = o_.dist == "corr" ? Dist::kCorr : o_.dist == "heavy" ? Dist::kHeavy : Dist::kIid;
    es_ = Info(o_.dtype).size;
    guard_ = kGuardBytes / es_;
  }

  int Run() {
    const size_t maxCount = o_.maxBytes / es_;
    const size_t bufBytes = (maxCount + guard_) * es_;
    send_ = Allocate(bufBytes);
    if (!o_.inplace) recv_ = Allocate(bufBytes);
    bool ok = send_ && (o_.inplace || recv_);
    if (!ok) Complain("cannot allocate 2 x %zu bytes", bufBytes);
    if (!group_.AllOk(ok)) return 1;
    // Touch every page once, before anything is timed.
    FillInput(spec_, group_.rank(), send_.get(), maxCount);
    FillPoison(o_.dtype, send_.get(), maxCount, maxCount + guard_);
    if (recv_) FillPoison(o_.dtype, recv_.get(), 0, maxCount + guard_);
    ok = reducer_.Upload(send_.get(), bufBytes) && (!recv_ || reducer_.Upload(recv_.get(), bufBytes));
    if (!ok) Complain("copying the buffers to their device twins failed: %s", reducer_.LastError().c_str());
    if (!group_.AllOk(ok)) return 1;

    bool failed = false;
    size_t lastCount = SIZE_MAX;
    for (size_t bytes = o_.minBytes; bytes <= o_.maxBytes;) {
      // A size that rounds to the element count of the one before (below an element, or below n blocks of the
      // patterns in blocks) is that row again: skipped.
      if (CountOf(bytes) != lastCount && !OneSize(bytes)) {
        failed = true;
        break;
      }
      lastCount = CountOf(bytes);
      if (bytes == 0 && o_.maxBytes > 0) {  // (a factor would never leave 0)
        bytes = 1;
        continue;
      }
      if (o_.stepFactor < 2 || bytes == 0 || bytes > o_.maxBytes / o_.stepFactor) break;
      bytes *= o_.stepFactor;
    }
    // Gather everyone's high-water mark while the buffers are still held.
    std::vector<uint64_t> rss = group_.GatherU64(PeakRssBytes());
    int code = failed ? 1 : 0;
    if (report_ != nullptr) {
      if (!report_->Footer()) code = 1;
      if (s_.ranksShareProcess) {
        report_->Line("peak RSS: %.1f MiB (VmHWM)", rss[0] / 1048576.0);
      } else {
        uint64_t sum = 0, max = 0;
        for (uint64_t v : rss) {
          sum += v;
          max = v > max ? v : max;
        }
        report_->Line("peak RSS: %.1f MiB max per process, %.1f MiB all %d processes (VmHWM)", max / 1048576.0,
                      sum / 1048576.0, group_.nranks());
      }
      if (!o_.jsonPath.empty()) {
        std::string error;
        if (!report_->WriteJson(o_.jsonPath, &error)) {
          std::fprintf(stderr, "%s: %s\n", s_.program, error.c_str());
          code = 1;
        }
      }
    }
    // Every rank returns the same code.
    uint64_t c = static_cast<uint64_t>(code);
    group_.Broadcast(&c, sizeof(c), 0);
    return static_cast<int>(c);
  }

 private:
  void Complain(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "%s: rank %d: %s\n", s_.program, group_.rank(), buf);
  }

  // `times` calls of the collective; false (after saying why) at the first failure.
  bool Repeat(int times, size_t count, size_t bytes, const char* phase) {
    void* out = o_.inplace ? send_.get() : recv_.get();
    for (int i = 0; i < times; ++i) {
      if (!reducer_.Run(send_.get(), out, count)) {
        Complain("the call on %zu bytes failed (%s): %s", bytes, phase, reducer_.LastError().c_str());
        return false;
      }
    }
    if (!reducer_.Finish()) {
      Complain("the call on %zu bytes failed (%s, after it returned): %s", bytes, phase,
               reducer_.LastError().c_str());
      return false;
    }
    return true;
  }

  // busbw / algbw, as nccl-tests computes it.
  double BusFactor(int n) const {
    switch (s_.pattern) {
      case Pattern::kAllReduce:
        return 2.0 * (n - 1) / n;
      case Pattern::kReduce:
      case Pattern::kBroadcast:
      case Pattern::kSendRecv:
        return 1.0;
      case Pattern::kReduceScatter:
      case Pattern::kAllGather:
      case Pattern::kAllToAll:
        return static_cast<double>(n - 1) / n;
    }
    return 1.0;
  }

  // The elements each rank sends, on average, per element of the size (1 with one rank): 2(n-1)/n for a ring
  // all-reduce, 1 for a send to the next rank, (n-1)/n for the others (a chain into or from a root, n-1 blocks of n).
  double Traffic(int n) const {
    if (s_.pattern == Pattern::kSendRecv || n == 1) return 1.0;
    return (s_.pattern == Pattern::kAllReduce ? 2.0 : 1.0) * (n - 1) / n;
  }

  // The elements a requested size runs: whole elements, and for the patterns in blocks a multiple of n.
  size_t CountOf(size_t requested) const {
    const size_t blocks = Blocked(s_.pattern) ? static_cast<size_t>(group_.nranks()) : 1;
    return requested / es_ / blocks * blocks;
  }

  bool OneSize(size_t requested) {
    const int n = group_.nranks(), rank = group_.rank();
    const size_t count = CountOf(requested);
    const size_t bytes = count * es_;
    void* out = o_.inplace ? send_.get() : recv_.get();
    if (o_.inplace) {
      FillInput(spec_, rank, send_.get(), count);  // earlier sizes overwrote it
      if (!reducer_.Upload(send_.get(), bytes)) {
        Complain("copying the inputs to the device failed: %s", reducer_.LastError().c_str());
        return false;
      }
    }

    if (!group_.AllOk(Repeat(o_.warmup, count, bytes, "warmup"))) return false;
    uint64_t sent0 = 0, sent1 = 0, nominal0 = 0, nominal1 = 0;
    bool counted = reducer_.BytesSent(&sent0, &nominal0);
    group_.Barrier();
    // Each rank times its own -n calls (the last one has completed when Repeat returns); the row's time is the
    // slowest rank's. The harness's closing exchange is not timed.
    const double t0 = Now();
    bool ok = Repeat(o_.iters, count, bytes, "timed");
    const double mine = Now() - t0;
    counted = reducer_.BytesSent(&sent1, &nominal1) && counted;
    if (!group_.AllOk(ok)) return false;
    std::vector<double> elapsed(static_cast<size_t>(n));
    group_.AllGather(&mine, sizeof(mine), elapsed.data());
    const double slowest = *std::max_element(elapsed.begin(), elapsed.end());
    uint64_t wire[3] = {counted ? sent1 - sent0 : 0, counted ? 1u : 0u, counted ? nominal1 - nominal0 : 0};
    group_.SumU64(wire, 3);

    Row row;
    row.bytes = bytes;
    row.count = count;
    row.type = Info(o_.dtype).name;
    row.redop = Reduces(s_.pattern) ? OpName(o_.op) : "none";
    row.algo = s_.algoLabel;
    row.codec = s_.codecLabel;
    row.nranks = n;
    row.inplace = o_.inplace;
    const double seconds = slowest / o_.iters;
    row.timeUs = seconds * 1e6;
    row.algbw = seconds > 0 ? bytes / seconds / 1e9 : 0;
    row.busbw = row.algbw * BusFactor(n);
    // Bits on the wire per element and per transmission: a rank's bytes sent, divided by the elements the pattern
    // sends per element of the size (Traffic: 2(n-1)/n for a ring all-reduce). The exact ring gives the datatype's
    // width (32 for float), a codec its compressed width (metadata included).
    const double eltBits = 8.0 * es_;
    const double traffic = Traffic(n);
    if (wire[1] == static_cast<uint64_t>(n)) {
      row.wirebits = count ? 8.0 * (static_cast<double>(wire[0]) / n) /
                                 (static_cast<double>(o_.iters) * static_cast<double>(count) * traffic)
                           : 0;
      // Some of the bytes computed by the library instead of counted (what it hands to NCCL: the exact calls, and a
      // codec's exact exchanges of scales or norms), as a ring's 2(n-1)/n of their buffers.
      row.wirebitsMeasured = wire[2] == 0;
    } else {
      row.wirebitsMeasured = false;  // nominal: the datatype's width
      row.wirebits = eltBits;
    }

    if (o_.check && !Check(count, bytes, out, &row)) return false;
    if (report_ != nullptr) report_->AddRow(row);
    return true;
  }

  // One more call from fresh inputs into a poisoned output, checked as the pattern says (Pattern): an all-reduce's
  // rank r checks the r-th part of its own output against the reference and the hashes of all outputs must agree, so
  // every element of every rank is covered; the others check what each rank's output must hold, whole.
  bool Check(size_t count, size_t bytes, void* out, Row* row) {
    const int n = group_.nranks(), rank = group_.rank();
    FillInput(spec_, rank, send_.get(), count);
    if (!o_.inplace) FillPoison(o_.dtype, out, 0, count);
    FillPoison(o_.dtype, out, count, count + guard_);
    const uint64_t sendHash = HashBytes(send_.get(), bytes);
    const size_t outBytes = (count + guard_) * es_;
    bool moved = reducer_.Upload(send_.get(), o_.inplace ? outBytes : bytes) &&
                 (o_.inplace || reducer_.Upload(out, outBytes));
    if (!moved) Complain("copying the inputs to the device failed: %s", reducer_.LastError().c_str());
    if (!group_.AllOk(moved)) return false;
    const bool reset = reducer_.Reset();
    if (!reset) Complain("a fresh state for the check failed: %s", reducer_.LastError().c_str());
    if (!group_.AllOk(reset)) return false;
    if (!group_.AllOk(Repeat(1, count, bytes, "check"))) return false;
    moved = reducer_.Download(out, outBytes) && (o_.inplace || reducer_.Download(send_.get(), bytes));
    if (!moved) Complain("copying the outputs from the device failed: %s", reducer_.LastError().c_str());
    if (!group_.AllOk(moved)) return false;
    const bool intact = o_.inplace || HashBytes(send_.get(), bytes) == sendHash;
    const std::vector<uint64_t> hashes = group_.GatherU64(HashBytes(out, bytes));
    CheckResult cr;
    const size_t block = Blocked(s_.pattern) ? count / n : 0, mine = block * rank;
    switch (s_.pattern) {
      case Pattern::kAllReduce:
        cr = CheckOutput(spec_, n, out, PartBegin(count, n, rank), PartBegin(count, n, rank + 1), s_.exactCheck);
        break;
      case Pattern::kReduce:
        if (rank == o_.root) {
          cr = CheckOutput(spec_, n, out, 0, count, s_.exactCheck);
        } else if (!o_.inplace) {
          cr.wrong = CountNotPoison(o_.dtype, out, 0, count);  // a non-root's recvbuff is not written
        } else {
          cr.wrong = HashBytes(out, bytes) == sendHash ? 0 : count;  // in place, a non-root's buffer is only read
        }
        break;
      case Pattern::kBroadcast:
        cr.wrong = CountDifferent(out, 0, o_.root, 0, count);
        break;
      case Pattern::kReduceScatter:
        cr = CheckOutput(spec_, n, out, mine, mine + block, s_.exactCheck);
        // The other blocks: out of place never written, in place the input, only read.
        if (!o_.inplace) {
          cr.wrong += CountNotPoison(o_.dtype, out, 0, mine) + CountNotPoison(o_.dtype, out, mine + block, count);
        } else {
          cr.wrong += CountDifferent(out, 0, rank, 0, mine) +
                      CountDifferent(out, mine + block, rank, mine + block, count - mine - block);
        }
        break;
      case Pattern::kAllGather:
        for (int p = 0; p < n; ++p) cr.wrong += CountDifferent(out, block * p, p, block * p, block);
        break;
      case Pattern::kSendRecv:
        cr.wrong = CountDifferent(out, 0, (rank + n - 1) % n, 0, count);
        break;
      case Pattern::kAllToAll:
        for (int p = 0; p < n; ++p) cr.wrong += CountDifferent(out, block * p, p, block * rank, block);
        break;
    }
    double sq[2] = {cr.sqErr, cr.sqRef};
    uint64_t counts[2] = {cr.wrong + CountNotPoison(o_.dtype, out, count, count + guard_), intact ? 0u : 1u};
    group_.SumDoubles(sq, 2);
    group_.SumU64(counts, 2);
    row->checked = true;
    row->error = Vnmse(sq[0], sq[1]);
    row->errorMeasured = Reduces(s_.pattern);
    row->lossy = !s_.exactCheck;
    row->vnmseBound = o_.maxVnmse;
    row->wrong = counts[0];
    row->sendIntact = counts[1] == 0;
    row->identical = true;
    row->resultHash = hashes[0];
    // The patterns whose outputs are the same on every rank: every rank's bytes must be.
    const bool same =
        s_.pattern == Pattern::kAllReduce || s_.pattern == Pattern::kBroadcast || s_.pattern == Pattern::kAllGather;
    for (uint64_t h : hashes) row->identical = row->identical && (!same || h == hashes[0]);
    // Restore the inputs for the next size (out of place they were never changed unless the check failed).
    if (!o_.inplace && !row->sendIntact) {
      FillInput(spec_, rank, send_.get(), o_.maxBytes / es_);
      reducer_.Upload(send_.get(), o_.maxBytes / es_ * es_);
    }
    return true;
  }

  // Elements of out[at, at + count) that differ from those of rank `from`'s input at [fromAt, fromAt + count), bit for
  // bit.
  uint64_t CountDifferent(const void* out, size_t at, int from, size_t fromAt, size_t count) {
    Buffer expect = Allocate((fromAt + count) * es_);
    if (!expect) return count;
    FillInput(spec_, from, expect.get(), fromAt + count);
    uint64_t wrong = 0;
    const char* a = static_cast<const char*>(out) + at * es_;
    const char* b = static_cast<const char*>(expect.get()) + fromAt * es_;
    for (size_t i = 0; i < count; ++i) wrong += std::memcmp(a + i * es_, b + i * es_, es_) != 0 ? 1 : 0;
    return wrong;
  }

  const BenchSetup& s_;
  const Options& o_;
  Group& group_;
  AllReducer& reducer_;
  Report* report_;
  InputSpec spec_;
  size_t es_ = 4;
  size_t guard_ = 0;
  Buffer send_, recv_;
};

}  // namespace

bool Blocked(Pattern p) { return p == Pattern::kReduceScatter || p == Pattern::kAllGather || p == Pattern::kAllToAll; }

const char* BusbwRule(Pattern p) {
  switch (p) {
    case Pattern::kAllReduce:
      return "algbw * 2(n-1)/n";
    case Pattern::kReduce:
      return "algbw (a reduce)";
    case Pattern::kBroadcast:
      return "algbw (a broadcast)";
    case Pattern::kSendRecv:
      return "algbw (one link per element)";
    case Pattern::kReduceScatter:
    case Pattern::kAllGather:
      return "algbw * (n-1)/n (n-1 blocks cross each rank's link)";
    case Pattern::kAllToAll:
      return "algbw * (n-1)/n (every block but the rank's own)";
  }
  return "";
}

const char* WrongRule(Pattern p) {
  switch (p) {
    case Pattern::kReduce:
      return "elements of the root's output outside the dtype's rounding tolerance, and of another rank's recvbuff "
             "written";
    case Pattern::kBroadcast:
      return "elements not bitwise equal to the root's input";
    case Pattern::kReduceScatter:
      return "elements of block `rank` outside the dtype's rounding tolerance, and of the other blocks changed";
    case Pattern::kAllGather:
      return "elements of block p not bitwise equal to block p of rank p's input";
    case Pattern::kSendRecv:
      return "elements not bitwise equal to the previous rank's input";
    case Pattern::kAllToAll:
      return "elements of block p not bitwise equal to block `rank` of rank p's input";
    case Pattern::kAllReduce:
      return "elements outside the dtype's rounding tolerance";
  }
  return "";
}

bool Reduces(Pattern p) { return p == Pattern::kAllReduce || p == Pattern::kReduce || p == Pattern::kReduceScatter; }

int RunAllReduceBench(const BenchSetup& setup, Group& group, AllReducer& reducer, Report* report) {
  RankRun run(setup, group, reducer, report);
  return run.Run();
}

}  // namespace ccperf
