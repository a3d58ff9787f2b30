#include "core/stream_wait.h"

#include "core/cuda_result.h"

namespace ccoll {
namespace {

// One thread polls the host word, sleeping between reads so that it costs the SM next to nothing.
__global__ void StreamWaitKernel(const volatile uint64_t* flag, uint64_t ticket) {
  while (*flag < ticket) __nanosleep(1000);
  __threadfence_system();
}

}  // namespace

ccResult_t LoadStreamWaitKernel() { return gpu::LoadKernel(StreamWaitKernel, "loading StreamWaitKernel"); }

cudaError_t LaunchStreamWait(const uint64_t* flag, uint64_t ticket, cudaStream_t stream) {
  cudaGetLastError();  // an earlier call's error, reported where it happened, is not this launch's
  StreamWaitKernel<<<1, 1, 0, stream>>>(flag, ticket);
  return cudaGetLastError();
}

}  // namespace ccoll
