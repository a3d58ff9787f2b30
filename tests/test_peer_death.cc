// A rank that dies in the middle of a collective must not hang the others: each survivor's call returns an error
// (ccRemoteError or ccTimeout) within the configured timeout, names a peer rank, and the process exits cleanly.
//
// The test starts its own ranks: the parent makes the unique id, then fork+execs itself once per rank. The last
// rank SIGKILLs itself while a large all-reduce is in flight.
//
//   test_peer_death [nranks] [timeout_ms]      (UCX_TLS picks the transport; tcp detects the death at once,
//                                               shared memory only through the timeout)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// Exit codes of a rank process.
enum : int { kOk = 0, kInitFailed = 10, kFirstCallFailed = 11, kNoError = 12, kTooSlow = 13, kNoPeerNamed = 14,
             kWrongCode = 15 };

int RankMain(int rank, int nranks, int timeoutMs, const char* idHex) {
  ccConfig_t config = CC_CONFIG_INITIALIZER;
  config.timeoutMs = timeoutMs;
  ccComm_t comm = nullptr;
  if (ccCommInitRankConfig(&comm, nranks, FromHex(idHex), rank, &config) != ccSuccess) {
    std::fprintf(stderr, "rank %d: init failed: %s\n", rank, ccGetLastError(nullptr));
    return kInitFailed;
  }
  const size_t count = 32u << 20;  // 128 MiB of float32: long enough to be killed in the middle
  std::vector<float> data(count, 1.0f);
  if (ccAllReduce(data.data(), data.data(), 1024, ccFloat32, ccSum, nullptr, comm, nullptr) != ccSuccess) {
    std::fprintf(stderr, "rank %d: first all-reduce failed: %s\n", rank, ccGetLastError(comm));
    return kFirstCallFailed;
  }
  const bool victim = rank == nranks - 1;
  if (victim) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      raise(SIGKILL);
    }).detach();
  }
  auto start = std::chrono::steady_clock::now();
  ccResult_t rc = ccAllReduce(data.data(), data.data(), count, ccFloat32, ccSum, nullptr, comm, nullptr);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (victim) pause();  // the all-reduce cannot finish without the others; wait for the kill
  std::string error = ccGetLastError(comm);
  std::printf("rank %d: %s after %.2f s: %s\n", rank, ccGetErrorString(rc), seconds, error.c_str());
  ccCommDestroy(comm);
  if (rc == ccSuccess) return kNoError;
  if (rc != ccRemoteError && rc != ccTimeout) return kWrongCode;
  // The kill comes 50 ms in; allow the timeout plus scheduling slack on a loaded 2-core machine.
  if (seconds > timeoutMs / 1000.0 + 3.0) return kTooSlow;
  if (error.find("rank ") == std::string::npos) return kNoPeerNamed;
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::strcmp(argv[1], "--rank") == 0) {
    return RankMain(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), argv[5]);
  }
  const int nranks = argc > 1 ? std::atoi(argv[1]) : 4;
  const int timeoutMs = argc > 2 ? std::atoi(argv[2]) : 5000;
  ccUniqueId id;
  if (ccGetUniqueId(&id) != ccSuccess) {
    std::fprintf(stderr, "ccGetUniqueId failed: %s\n", ccGetLastError(nullptr));
    return 1;
  }
  std::string hex = ToHex(id);
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      std::string rank = std::to_string(r), n = std::to_string(nranks), t = std::to_string(timeoutMs);
      execl("/proc/self/exe", argv[0], "--rank", rank.c_str(), n.c_str(), t.c_str(), hex.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  int failures = 0;
  for (int r = 0; r < nranks; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    bool victim = r == nranks - 1;
    bool ok = victim ? (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
                     : (WIFEXITED(status) && WEXITSTATUS(status) == kOk);
    if (!ok) {
      ++failures;
      std::fprintf(stderr, "rank %d: %s %d\n", r, WIFEXITED(status) ? "exit code" : "signal",
                   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
  }
  std::printf("%d passed, %d failed\n", nranks - failures, failures);
  return failures == 0 ? 0 : 1;
}
