// A host function that holds a stream: queued with cudaLaunchHostFunc, it returns once the flag it was given is set, so
// the work queued after it on that stream waits (as a caller's earlier work would). Only for tests built with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace cctest {

// `release` is a std::atomic<bool>* that outlives the stream's work (a static, where a failed REQUIRE may leave the
// frame that set it up).
inline void CUDART_CB HoldUntil(void* release) {
  while (!static_cast<std::atomic<bool>*>(release)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace cctest
