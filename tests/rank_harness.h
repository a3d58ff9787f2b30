// Ranks as threads of the test process. Catch2 v2 assertions are not thread-safe, so rank bodies only record what
// happened (return codes, error sentences, output buffers) and the main thread asserts after the join.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ccoll.h"

namespace cctest {

// Runs body(rank) for rank in [0, nranks), each on its own std::thread, and joins them all.
template <typename Body>
void RunRanks(int nranks, Body&& body) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) threads.emplace_back([&body, r] { body(r); });
  for (auto& t : threads) t.join();
}

// What one rank's call returned, with the sentence ccGetLastError gave right after it (on that rank's thread).
struct RankResult {
  ccResult_t rc = ccSuccess;
  std::string error;
};

inline RankResult Record(ccResult_t rc, ccComm_t comm = nullptr) {
  RankResult r;
  r.rc = rc;
  if (rc != ccSuccess) r.error = ccGetLastError(comm);
  return r;
}

// "" when every rank succeeded, else the first failure as "rank r: result name: sentence". R: anything with an rc
// and an error sentence (RankResult, or a test's own record of a rank's call).
template <typename R>
std::string FirstFailure(const std::vector<R>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].rc != ccSuccess) {
      return "rank " + std::to_string(r) + ": " + ccGetErrorString(results[r].rc) + ": " + results[r].error;
    }
  }
  return "";
}

// A config with the fields tests usually set; the rest stay "not set".
inline ccConfig_t MakeConfig(int algorithm = CC_CONFIG_UNDEF_INT, int timeoutMs = CC_CONFIG_UNDEF_INT) {
  ccConfig_t config = CC_CONFIG_INITIALIZER;
  config.algorithm = algorithm;
  config.timeoutMs = timeoutMs;
  return config;
}

// The communicators of one group of thread ranks; destroys them when it goes out of scope.
class Group {
 public:
  Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  Group(Group&& other) noexcept { *this = std::move(other); }
  Group& operator=(Group&& other) noexcept {
    Destroy();
    comms = std::move(other.comms);
    status = other.status;
    error = std::move(other.error);
    other.comms.clear();
    return *this;
  }
  ~Group() { Destroy(); }

  // ccCommInitAll(nranks).
  static Group InitAll(int nranks) {
    Group g;
    g.comms.assign(static_cast<size_t>(nranks), nullptr);
    g.status = ccCommInitAll(g.comms.data(), nranks, nullptr);
    if (g.status != ccSuccess) {
      g.error = ccGetLastError(nullptr);
      g.comms.clear();
    }
    return g;
  }

  // ccGetUniqueId, then one thread per rank calling ccCommInitRankConfig with `config` (blocking init).
  static Group InitConfig(int nranks, const ccConfig_t& config) {
    Group g;
    ccUniqueId id;
    g.status = ccGetUniqueId(&id);
    if (g.status != ccSuccess) {
      g.error = ccGetLastError(nullptr);
      return g;
    }
    g.comms.assign(static_cast<size_t>(nranks), nullptr);
    std::vector<RankResult> results(static_cast<size_t>(nranks));
    RunRanks(nranks, [&](int r) {
      ccConfig_t mine = config;
      results[r] = Record(ccCommInitRankConfig(&g.comms[r], nranks, id, r, &mine));
    });
    for (int r = 0; r < nranks; ++r) {
      if (results[r].rc != ccSuccess && g.status == ccSuccess) {
        g.status = results[r].rc;
        g.error = "rank " + std::to_string(r) + ": " + results[r].error;
      }
    }
    if (g.status != ccSuccess) g.Destroy();
    return g;
  }

  int size() const { return static_cast<int>(comms.size()); }
  ccComm_t operator[](int r) const { return comms[static_cast<size_t>(r)]; }

  // Destroys every communicator still held (ccCommDestroy; a NULL entry is skipped by the library).
  void Destroy() {
    for (ccComm_t& c : comms) {
      ccCommDestroy(c);
      c = nullptr;
    }
    comms.clear();
  }

  std::vector<ccComm_t> comms;
  ccResult_t status = ccSuccess;
  std::string error;
};

// One compressor per rank from the same spec (and seed, when >= 0); destroyed with the object.
struct Compressors {
  std::vector<ccCompressor_t> c;
  ccResult_t status = ccSuccess;
  std::string error;

  Compressors(const std::string& spec, int nranks, int64_t seed = -1) : c(static_cast<size_t>(nranks), nullptr) {
    for (auto& comp : c) {
      status = ccCompressorCreateFromString(&comp, spec.c_str());
      if (status == ccSuccess && seed >= 0) status = ccCompressorSetParam(comp, ccParamSeed, seed);
      if (status != ccSuccess) {
        error = ccGetLastError(nullptr);
        return;
      }
    }
  }
  Compressors(const Compressors&) = delete;
  Compressors& operator=(const Compressors&) = delete;
  ~Compressors() {
    for (auto comp : c) ccCompressorDestroy(comp);
  }
  ccCompressor_t operator[](int r) const { return c[static_cast<size_t>(r)]; }
};

inline bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// vNMSE of out against the reference m over [begin, end): ||out - m||^2 / ||m||^2.
inline double Vnmse(const std::vector<float>& out, const std::vector<double>& m, size_t begin = 0,
                    size_t end = SIZE_MAX) {
  end = end < m.size() ? end : m.size();
  double num = 0.0, den = 0.0;
  for (size_t i = begin; i < end; ++i) {
    const double d = static_cast<double>(out[i]) - m[i];
    num += d * d;
    den += m[i] * m[i];
  }
  return num / den;
}

// CC_CHECK_CALLS (default 1): every call starts with the call-check agreement (ccoll::kCallCheckRecordBytes per
// record). Tests that count bytes or expect a particular error read it here (ctest also runs some cases with CC_CHECK_CALLS=0).
inline bool CallCheckOn() {
  const char* v = std::getenv("CC_CHECK_CALLS");
  return v == nullptr || std::string(v) != "0";
}

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// CCTEST_TIME_SCALE (at least 1; scripts/sanitize.sh sets 4): how much longer a sanitized run may take for what a
// test times or waits for.
inline double TimeScale() {
  const char* scale = std::getenv("CCTEST_TIME_SCALE");
  return scale != nullptr && std::atof(scale) > 1.0 ? std::atof(scale) : 1.0;
}

// A timeout of `ms` scaled by TimeScale(): a case that tells "failed at once" from "waited out the timeout" scales the
// timeout and its bound alike, so that the two stay apart under a sanitizer.
inline int ScaledMs(int ms) { return static_cast<int>(ms * TimeScale()); }

// Polls `done` every millisecond until it holds (true) or ScaledMs(ms) have passed (false; `ms` is not scaled yet): a
// thread that waits for another thread's step must not wait forever when that thread failed before it.
template <typename Done>
bool WaitUntil(Done done, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ScaledMs(ms));
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace cctest
