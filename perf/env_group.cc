#include "env_group.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef CCOLL_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ccperf {

EnvGroup::EnvGroup(ccComm_t comm, const char* program) : comm_(comm), program_(program) {
  ccResult_t r = ccCommUserRank(comm_, &rank_);
  if (r == ccSuccess) r = ccCommCount(comm_, &nranks_);
  if (r != ccSuccess) Die("ccCommUserRank/ccCommCount", r);
  const char* transport = std::getenv("CC_TRANSPORT");
  device_ = transport != nullptr && std::string(transport) == "nccl";
#ifndef CCOLL_PERF_CUDA
  if (device_) {
    std::fprintf(stderr, "%s: CC_TRANSPORT=nccl needs device memory for the side channel, and this program was built "
                 "without CUDA\n", program_);
    Die("EnvGroup", ccInvalidUsage);
  }
#endif
}

EnvGroup::~EnvGroup() {
#ifdef CCOLL_PERF_CUDA
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  cudaFree(deviceWords_);
#endif
}

ccResult_t EnvGroup::Collective(bool gather, const int64_t* in, size_t words, int64_t* out) {
  if (!device_) {
    return gather ? ccAllGather(in, out, words, ccInt64, comm_, nullptr)
                  : ccAllReduce(in, out, words, ccInt64, ccSum, nullptr, comm_, nullptr);
  }
#ifdef CCOLL_PERF_CUDA
  const size_t outWords = gather ? words * static_cast<size_t>(nranks_) : words;
  const size_t need = words + outWords;
  if (need > deviceCapacity_) {
    cudaFree(deviceWords_);
    deviceWords_ = nullptr;
    if (cudaMalloc(&deviceWords_, need * sizeof(int64_t)) != cudaSuccess) return ccUnhandledCudaError;
    deviceCapacity_ = need;
  }
  if (stream_ == nullptr) {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return ccUnhandledCudaError;
    stream_ = s;
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  int64_t* dIn = static_cast<int64_t*>(deviceWords_);
  int64_t* dOut = dIn + words;
  if (cudaMemcpyAsync(dIn, in, words * sizeof(int64_t), cudaMemcpyHostToDevice, s) != cudaSuccess) {
    return ccUnhandledCudaError;
  }
  ccResult_t r = gather ? ccAllGather(dIn, dOut, words, ccInt64, comm_, s)
                        : ccAllReduce(dIn, dOut, words, ccInt64, ccSum, nullptr, comm_, s);
  if (r != ccSuccess) return r;
  if (cudaMemcpyAsync(out, dOut, outWords * sizeof(int64_t), cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess) {
    return ccUnhandledCudaError;
  }
  ccResult_t async = ccSuccess;
  ccCommGetAsyncError(comm_, &async);
  return async;
#else
  return ccInvalidUsage;
#endif
}

ccResult_t EnvGroup::Counted(bool gather, const int64_t* in, size_t words, int64_t* out) {
  ccCommStats_t before, after;
  before.size = after.size = sizeof(ccCommStats_t);
  ccResult_t r = ccCommGetStats(comm_, &before);
  if (r != ccSuccess) Die("ccCommGetStats", r);
  const ccResult_t result = Collective(gather, in, words, out);
  r = ccCommGetStats(comm_, &after);
  if (r != ccSuccess) Die("ccCommGetStats", r);
  ownSent_ += (after.bytesSent - after.callCheckBytesSent) - (before.bytesSent - before.callCheckBytesSent);
  ownNominal_ += after.nominalBytesSent - before.nominalBytesSent;
  return result;
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
  int64_t in = 1, out = 0;
  ccResult_t r = Counted(false, &in, 1, &out);
  if (r != ccSuccess) Die("ccAllReduce", r);
  if (out != nranks_) {
    std::fprintf(stderr, "%s: rank %d: barrier all-reduce returned %lld, expected %d\n", program_, rank_,
                 static_cast<long long>(out), nranks_);
    Die("ccAllReduce", ccInternalError);
  }
}

void EnvGroup::AllGather(const void* mine, size_t bytes, void* all) {
  // ccoll has no byte datatype: whole int64 words, zero-padded (at least one, so that 0 bytes still synchronizes).
  const size_t words = bytes == 0 ? 1 : (bytes + 7) / 8;
  const size_t n = static_cast<size_t>(nranks_);
  std::vector<int64_t> send(words, 0), recv(words * n, 0);
  if (bytes != 0) std::memcpy(send.data(), mine, bytes);
  ccResult_t r = Counted(true, send.data(), words, recv.data());
  if (r != ccSuccess) Die("ccAllGather", r);
  for (size_t i = 0; i < n && bytes != 0; ++i) {
    std::memcpy(static_cast<char*>(all) + i * bytes, recv.data() + i * words, bytes);
  }
}

}  // namespace ccperf
