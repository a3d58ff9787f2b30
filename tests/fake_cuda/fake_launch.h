// The fake CUDA runtime's "kernel launch": queues a host function on a fake stream (run in order with the stream's
// copies and events on its thread). For the fake codec kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

namespace cctest {

void FakeLaunch(cudaStream_t stream, std::function<void()> op);

// Codec and reduction kernels launched so far through the fake runtime (all threads): a test can tell that a device
// call ran on the device rather than staging through host memory.
uint64_t FakeCodecKernelLaunches();

}  // namespace cctest
