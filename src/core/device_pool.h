// ccoll's own stream-ordered memory pool, one per CUDA device, for the scratch the proxy thread allocates while a
// caller's stream waits for it (core/device_proxy.h). cudaMalloc may synchronize the device (the CUDA guide counts
// device allocations among the implicit synchronizations); an allocation from a pool with cudaMallocFromPoolAsync does
// not. The pool is ccoll's alone: the device's default pool would let an allocation reuse memory the application freed
// on its own stream by making ccoll's stream wait for that stream, which may be the very stream waiting for the proxy.
// So this pool never adds such a dependency (cudaMemPoolReuseAllowInternalDependencies off), and it keeps what is freed
// to it (release threshold: everything), so that a stream synchronization does not trim it. Only built with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "ccoll.h"

namespace ccoll {

// The pool of CUDA device `device`, made at its first use (collectives/device_kernels.h makes it before a device's
// first stream wait) and kept for the life of the process. ccUnhandledCudaError when it cannot be made.
ccResult_t DevicePool(int device, cudaMemPool_t* pool);

}  // namespace ccoll
