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

// Copies from device memory to device memory so far (all threads): the exact collectives that stay on the device
// move every message so; staged calls copy only between host and device.
uint64_t FakeDeviceToDeviceCopies();

}  // namespace cctest
