// The stream side of the device proxy (device_proxy.h): a one-thread kernel that holds a stream until a host word
// reaches a value. Only built with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ccoll.h"

namespace ccoll {

// Queues on `stream` a wait until *flag >= ticket. flag is the device address of mapped pinned host memory that the
// host raises with release stores.
cudaError_t LaunchStreamWait(const uint64_t* flag, uint64_t ticket, cudaStream_t stream);

// Loads the wait kernel into the current device's context (see core/cuda_result.h: LoadKernel).
ccResult_t LoadStreamWaitKernel();

}  // namespace ccoll
