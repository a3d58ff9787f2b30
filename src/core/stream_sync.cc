#include "core/stream_sync.h"

#include <chrono>
#include <thread>

namespace ccoll {

bool PollWithin(const std::function<bool()>& done, int timeoutMs) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    if (done()) return true;
    const Clock::time_point now = Clock::now();
    if (timeoutMs > 0 && now >= deadline) return false;
    if (now - start < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

namespace {

// Polls query() (cudaStreamQuery, cudaEventQuery) until it says something but cudaErrorNotReady.
template <typename Query>
cudaError_t QueryWithin(Query query, int timeoutMs) {
  cudaError_t e = cudaErrorNotReady;
  const bool answered = PollWithin([&] { return (e = query()) != cudaErrorNotReady; }, timeoutMs);
  return answered ? e : cudaErrorTimeout;
}

}  // namespace

cudaError_t SynchronizeWithin(cudaStream_t stream, int timeoutMs) {
  if (timeoutMs <= 0) return cudaStreamSynchronize(stream);
  return QueryWithin([&] { return cudaStreamQuery(stream); }, timeoutMs);
}

cudaError_t EventWithin(cudaEvent_t event, int timeoutMs) {
  return QueryWithin([&] { return cudaEventQuery(event); }, timeoutMs);
}

}  // namespace ccoll
