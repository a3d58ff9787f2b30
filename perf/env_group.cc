#include "env_group.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ccperf {

EnvGroup::EnvGroup(ccComm_t comm, const char* program) : comm_(comm), program_(program) {
  ccResult_t r = ccCommUserRank(comm_, &rank_);
  if (r == ccSuccess) r = ccCommCount(comm_, &nranks_);
  if (r != ccSuccess) Die("ccCommUserRank/ccCommCount", r);
}

uint64_t EnvGroup::SentNow() {
  ccCommStats_t st;
  st.size = sizeof(st);
  ccResult_t r = ccCommGetStats(comm_, &st);
  if (r != ccSuccess) Die("ccCommGetStats", r);
  return st.bytesSent;
}

void EnvGroup::Die(const char* call, ccResult_t r) {
  std::fprintf(stderr, "%s: rank %d: the side channel between the processes (%s on the communicator under test) "
               "failed: %s: %s; aborting\n", program_, rank_, call, ccGetErrorString(r), ccGetLastError(comm_));
  std::fflush(stderr);
  ccCommAbort(comm_);
  std::exit(1);
}

void EnvGroup::Barrier() {
  // An all-reduce cannot finish on any rank before every rank has contributed.
  const uint64_t before = SentNow();
  int64_t in = 1, out = 0;
  ccResult_t r = ccAllReduce(&in, &out, 1, ccInt64, ccSum, nullptr, comm_, nullptr);
  if (r != ccSuccess) Die("ccAllReduce", r);
  if (out != nranks_) {
    std::fprintf(stderr, "%s: rank %d: barrier all-reduce returned %lld, expected %d\n", program_, rank_,
                 static_cast<long long>(out), nranks_);
    Die("ccAllReduce", ccInternalError);
  }
  ownSent_ += SentNow() - before;
}

void EnvGroup::AllGather(const void* mine, size_t bytes, void* all) {
  // ccoll has no byte datatype: whole int64 words, zero-padded (at least one, so that 0 bytes still synchronizes).
  const size_t words = bytes == 0 ? 1 : (bytes + 7) / 8;
  const size_t n = static_cast<size_t>(nranks_);
  std::vector<int64_t> send(words, 0), recv(words * n, 0);
  if (bytes != 0) std::memcpy(send.data(), mine, bytes);
  const uint64_t before = SentNow();
  ccResult_t r = ccAllGather(send.data(), recv.data(), words, ccInt64, comm_, nullptr);
  if (r != ccSuccess) Die("ccAllGather", r);
  ownSent_ += SentNow() - before;
  for (size_t i = 0; i < n && bytes != 0; ++i) {
    std::memcpy(static_cast<char*>(all) + i * bytes, recv.data() + i * words, bytes);
  }
}

}  // namespace ccperf
