// Waiting for a stream with a time limit, for ccoll's threads (the device proxy): cudaStreamSynchronize waits without
// one, and a stream that never finishes (a GPU fault that hangs, or ccoll's work held in a hardware queue behind a
// waiting stream: README, "Device buffers") would hang the communicator. With a limit the call fails instead, the
// proxy releases the caller's stream, and the communicator reports the error (CC_TIMEOUT_MS).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

namespace ccoll {

// Polls done() until it returns true (true) or timeoutMs has passed (false; timeoutMs <= 0: no limit), yielding the
// core for the first millisecond and then sleeping in 20-microsecond steps: a short wait adds no sleep's latency (its
// timer slack, tens of microseconds), a long one costs little CPU.
bool PollWithin(const std::function<bool()>& done, int timeoutMs);

// Waits until everything queued on `stream` has run: cudaSuccess, CUDA's error, or cudaErrorTimeout once timeoutMs
// has passed (timeoutMs <= 0: no limit). Polls, yielding the core for the first millisecond and then sleeping in short
// steps, so a short wait adds no sleep's latency and a long one costs little CPU.
cudaError_t SynchronizeWithin(cudaStream_t stream, int timeoutMs);

// Waits until `event` has completed, as SynchronizeWithin: cudaSuccess, CUDA's error, or cudaErrorTimeout.
cudaError_t EventWithin(cudaEvent_t event, int timeoutMs);

}  // namespace ccoll
