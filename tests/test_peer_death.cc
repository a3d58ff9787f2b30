// A rank that dies in the middle of a collective must not hang the others: each survivor's call returns an error
// (ccRemoteError or ccTimeout) within the configured timeout, names a peer rank, and the process exits cleanly.
//
// The program starts its own ranks: per trial the parent makes a unique id, then fork+execs itself once per rank.
// The ranks run all-reduces back to back (random sizes, exact and compressed, ring and tree); one rank (the last in
// trial 0, a random one after) SIGKILLs itself at a random moment. Every survivor prints how long after the kill its
// call failed (CLOCK_MONOTONIC is shared by the processes of one machine). A rank still running 15 s after the
// timeout is a hang: the parent kills it and counts the trial as failed.
//
//   test_peer_death [nranks] [timeout_ms] [trials] [seed]
//     UCX_TLS picks the transport: tcp detects the death at once (UCX peer error handling), shared memory only
//     through the timeout. ctest runs one trial; perf/fault_trials.sh runs 50 and prints the distribution.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
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

std::string ToHex(const ccUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char c : id.internal) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

ccUniqueId FromHex(const char* hex) {
  ccUniqueId id;
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    id.internal[i] = static_cast<char>(v);
  }
  return id;
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Exit codes of a rank process.
enum : int { kOk = 0, kNoError = 12, kTooSlow = 13, kNoPeerNamed = 14, kWrongCode = 15, kSetupFailed = 16 };

struct RankArgs {
  int rank = 0, nranks = 0, timeoutMs = 0, victim = 0;
  int64_t killAtNs = 0;  // CLOCK_MONOTONIC time at which the victim kills itself
  uint64_t seed = 0;
  std::string idHex;
};

// True when `error` says "rank N", or "ranks N, M, ...", for some N other than `self` (every sentence names the rank
// it comes from; it must also name a peer: the dead one, or one that aborted or left because of it).
bool NamesAnotherRank(const std::string& error, int self) {
  for (size_t at = error.find("rank"); at != std::string::npos; at = error.find("rank", at + 1)) {
    const char* p = error.c_str() + at + 4;
    if (*p == 's') ++p;
    if (*p++ != ' ') continue;
    while (*p >= '0' && *p <= '9') {
      if (std::atoi(p) != self) return true;
      while (*p >= '0' && *p <= '9') ++p;
      if (p[0] != ',' || p[1] != ' ') break;
      p += 2;
    }
  }
  return false;
}

int RankMain(const RankArgs& a) {
  if (a.rank == a.victim) {
    const int64_t at = a.killAtNs;
    std::thread([at] {
      while (NowNs() < at) usleep(200);
      raise(SIGKILL);
    }).detach();
  }
  // The same sequence of calls on every rank (the seed is shared): exact and compressed, small and large.
  const char* specs[] = {nullptr, "quant:bits=4,mode=requant", "cast16", "topk:density=0.1"};
  ccCompressor_t comps[4] = {nullptr, nullptr, nullptr, nullptr};
  for (int k = 1; k < 4; ++k) {
    if (ccCompressorCreateFromString(&comps[k], specs[k]) != ccSuccess) return kSetupFailed;
  }
  const size_t maxCount = 8u << 20;  // 32 MiB of float32
  std::vector<float> data(maxCount, 1.0f);
  ccConfig_t config = CC_CONFIG_INITIALIZER;
  config.timeoutMs = a.timeoutMs;
  ccComm_t comm = nullptr;
  // An early kill lands during init: then init itself must fail within the timeout.
  int64_t callStart = NowNs();
  ccResult_t rc = ccCommInitRankConfig(&comm, a.nranks, FromHex(a.idHex.c_str()), a.rank, &config);
  const char* what = "init";
  std::mt19937_64 gen(a.seed);
  int calls = 0;
  std::vector<size_t> bound(4, 0);  // a compressor keeps the count of its first call
  while (rc == ccSuccess) {
    const int k = static_cast<int>(gen() % 4);
    size_t count = bound[k] != 0 ? bound[k] : 1 + static_cast<size_t>(gen() % maxCount);
    if (k != 0) bound[k] = count;
    callStart = NowNs();
    what = "all-reduce";
    rc = ccAllReduce(data.data(), data.data(), count, ccFloat32, ccSum, comps[k], comm, nullptr);
    ++calls;
    if (rc == ccSuccess) std::fill(data.begin(), data.begin() + static_cast<long>(count), 1.0f);
  }
  const int64_t failedAt = NowNs();
  if (a.rank == a.victim) pause();  // nothing finishes without the others; wait for the kill
  std::string error = ccGetLastError(comm);
  const double afterKill = static_cast<double>(failedAt - a.killAtNs) / 1e9;
  std::printf("rank %d: %s %d failed with %s %.3f s after the kill (the call took %.3f s): %s\n", a.rank, what,
              calls, ccGetErrorString(rc), afterKill, static_cast<double>(failedAt - callStart) / 1e9, error.c_str());
  std::printf("detect %s %d %.6f\n", what, static_cast<int>(rc), afterKill);
  std::fflush(stdout);
  ccCommDestroy(comm);
  for (ccCompressor_t c : comps) ccCompressorDestroy(c);
  if (afterKill < 0) return kNoError;  // failed before anyone died: a bug, not a detection
  if (rc != ccRemoteError && rc != ccTimeout) return kWrongCode;
  // Allow the timeout plus scheduling slack on a loaded 2-core machine (a sanitized run, 2-10x slower, scales it by
  // CCTEST_TIME_SCALE: a survivor may be inside a large compressed call's codec work when the victim dies).
  const char* scale = std::getenv("CCTEST_TIME_SCALE");
  const double slack = 3.0 * (scale != nullptr && std::atof(scale) > 1.0 ? std::atof(scale) : 1.0);
  if (afterKill > a.timeoutMs / 1000.0 + slack) return kTooSlow;
  if (!NamesAnotherRank(error, a.rank)) return kNoPeerNamed;
  return kOk;
}

// Runs one trial: forks the ranks, waits (killing a hung rank), returns the number of ranks that misbehaved.
int RunTrial(const char* self, int nranks, int timeoutMs, int victim, int killAfterMs, uint64_t seed) {
  ccUniqueId id;
  if (ccGetUniqueId(&id) != ccSuccess) {
    std::fprintf(stderr, "ccGetUniqueId failed: %s\n", ccGetLastError(nullptr));
    return nranks;
  }
  const std::string hex = ToHex(id);
  // The kill is timed from now, so it lands during init for small delays and mid-collective for larger ones; the
  // ranks' init takes ~0.1 s here.
  const int64_t killAt = NowNs() + static_cast<int64_t>(killAfterMs) * 1000000;
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      std::string args[] = {std::to_string(r), std::to_string(nranks), std::to_string(timeoutMs),
                            std::to_string(victim), std::to_string(killAt), std::to_string(seed)};
      execl("/proc/self/exe", self, "--rank", args[0].c_str(), args[1].c_str(), args[2].c_str(), args[3].c_str(),
            args[4].c_str(), args[5].c_str(), hex.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  const int64_t deadline = killAt + (static_cast<int64_t>(timeoutMs) + 15000) * 1000000;
  std::vector<int> status(static_cast<size_t>(nranks), -1);
  int left = nranks;
  while (left > 0) {
    for (int r = 0; r < nranks; ++r) {
      if (status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        --left;
      }
    }
    if (left > 0 && NowNs() > deadline) {
      for (int r = 0; r < nranks; ++r) {
        if (status[r] == -1) {
          std::fprintf(stderr, "rank %d: HANG, still running %d ms after the kill; killing it\n", r,
                       timeoutMs + 15000);
          kill(pids[r], SIGKILL);
        }
      }
    }
    usleep(2000);
  }
  int failures = 0;
  for (int r = 0; r < nranks; ++r) {
    const bool isVictim = r == victim;
    const int st = status[r];
    const bool ok = isVictim ? (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
                             : (WIFEXITED(st) && WEXITSTATUS(st) == kOk);
    if (!ok) {
      ++failures;
      std::fprintf(stderr, "rank %d%s: %s %d\n", r, isVictim ? " (victim)" : "",
                   WIFEXITED(st) ? "exit code" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 9 && std::strcmp(argv[1], "--rank") == 0) {
    RankArgs a;
    a.rank = std::atoi(argv[2]);
    a.nranks = std::atoi(argv[3]);
    a.timeoutMs = std::atoi(argv[4]);
    a.victim = std::atoi(argv[5]);
    a.killAtNs = std::atoll(argv[6]);
    a.seed = std::strtoull(argv[7], nullptr, 10);
    a.idHex = argv[8];
    return RankMain(a);
  }
  const int nranks = argc > 1 ? std::atoi(argv[1]) : 4;
  const int timeoutMs = argc > 2 ? std::atoi(argv[2]) : 5000;
  const int trials = argc > 3 ? std::atoi(argv[3]) : 1;
  const uint64_t seed = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1;
  if (nranks < 2 || timeoutMs < 1 || trials < 1) {
    std::fprintf(stderr, "usage: %s [nranks >= 2] [timeout_ms >= 1] [trials >= 1] [seed]\n", argv[0]);
    return 2;
  }
  std::mt19937_64 gen(seed);
  int failedTrials = 0;
  for (int t = 0; t < trials; ++t) {
    // Trial 0: the last rank, 300 ms in (mid-collective). Later: any rank, 0..1500 ms after the fork (init takes
    // ~0.1 s, so some kills land in init). The bootstrap root lives in this parent process.
    const int victim = t == 0 ? nranks - 1 : static_cast<int>(gen() % static_cast<uint64_t>(nranks));
    const int killAfterMs = t == 0 ? 300 : static_cast<int>(gen() % 1500);
    std::printf("trial %d: victim rank %d, kill after %d ms\n", t, victim, killAfterMs);
    std::fflush(stdout);
    const int failures = RunTrial(argv[0], nranks, timeoutMs, victim, killAfterMs, gen());
    if (failures != 0) ++failedTrials;
    std::printf("trial %d: %s\n", t, failures == 0 ? "ok" : "FAILED");
    std::fflush(stdout);
  }
  std::printf("%d of %d trials passed\n", trials - failedTrials, trials);
  return failedTrials == 0 ? 0 : 1;
}
