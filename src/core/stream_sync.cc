#include "core/stream_sync.h"

#include <chrono>
#include <thread>

namespace ccoll {

cudaError_t SynchronizeWithin(cudaStream_t stream, int timeoutMs) {
  if (timeoutMs <= 0) return cudaStreamSynchronize(stream);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e != cudaErrorNotReady) return e;
    // Yield for the first millisecond (a kernel or a copy of a slice or of a whole bucket: a sleep would add its
    // timer slack, tens of microseconds, to each), then sleep in 20-microsecond steps.
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return cudaErrorTimeout;
    if (now - start < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace ccoll
