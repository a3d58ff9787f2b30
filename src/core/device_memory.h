// ccoll's memory per CUDA device, for what is allocated while a caller's stream waits for a proxy thread
// (core/device_proxy.h): whatever synchronizes the device then waits for that stream, which waits for the proxy. The
// CUDA guide counts device and pinned host allocations among the implicit synchronizations, and cudaFree and
// cudaFreeHost synchronize the device. Allocations from a memory pool with cudaMallocFromPoolAsync, and frees to it
// with cudaFreeAsync, do not. So ccoll takes its device scratch and its pinned host scratch from pools of its own, and
// the words its streams wait on from a slab made before the device's first wait.
//
// The pools are ccoll's alone: the device's default pool would let an allocation reuse memory the application freed
// on its own stream by making ccoll's stream wait for that stream, which may be the very stream waiting for the proxy.
// So they never add such a dependency (cudaMemPoolReuseAllowInternalDependencies off), and they keep what is freed to
// them (release threshold: everything), so that a stream synchronization does not trim them.
//
// A device may lack pools: of pinned host memory before CUDA 12.6 (cudaDevAttrHostMemoryPoolsSupported), of either
// kind on some virtual GPUs (cudaDevAttrMemoryPoolsSupported); or make them and fail every allocation from them, so a
// new pool is used only once an allocation from it has run. Scratch of a kind without a pool comes from cudaMalloc
// or cudaHostAlloc, in size classes of a power of two and 1.25, 1.5 and 1.75 times one, and what is freed is kept and
// handed out again for its size class once the stream it was freed on has got past the free, never given back with
// cudaFree or cudaFreeHost (a warning says so once per kind, unless CC_MEMORY_POOLS=0 asked for it); and no stream of
// a communicator waits while its call may allocate so: the first call of each shape waits on the host instead
// (core/device_proxy.h).
// Only built with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ccoll.h"

namespace ccoll {

// Makes the pools and the wait-word slab of CUDA device `device` (once; later calls return at once). Called before
// the device's first stream wait (collectives/device_prepare.h), since whether making them synchronizes the device is
// not documented. ccUnhandledCudaError when the release stream or the wait words cannot be made.
ccResult_t PrepareDeviceMemory(int device);

// The device-memory pool of `device` (made at its first use if PrepareDeviceMemory was not called), or nullptr where
// the device has none (cudaDevAttrMemoryPoolsSupported, or the pool cannot be made or fails an allocation) or
// CC_MEMORY_POOLS=0:
// AllocateScratch then takes device memory from cudaMalloc.
ccResult_t DevicePool(int device, cudaMemPool_t* pool);

// The pool of pinned host memory for `device` (every device that has host memory pools reads and writes it), or
// nullptr where the device has none (cudaDevAttrHostMemoryPoolsSupported) or CC_MEMORY_POOLS=0: AllocateScratch then
// takes pinned memory from cudaHostAlloc. Memory freed to the pools stays in them: ccoll's pinned memory is given
// back to the system only at exit.
ccResult_t PinnedHostPool(int device, cudaMemPool_t* pool);

// `bytes` of ccoll's memory for `device`, in the order of `stream`: device memory from the device pool, or pinned host
// memory (pinnedHost) from the host pool, or from cudaMalloc or cudaHostAlloc where the device has no pool of the
// kind. The host and other streams may use it once the stream has got there. Freed with FreeScratch.
ccResult_t AllocateScratch(int device, bool pinnedHost, size_t bytes, cudaStream_t stream, void** p);
// AllocateScratch's calls so far, every device (for tests: that a later device call of a shape allocated nothing).
uint64_t ScratchAllocations();
// Frees what AllocateScratch gave, after the work queued on `stream` (which must not be capturing a graph): to its
// pool, or, for memory that came from cudaMalloc or cudaHostAlloc, to a cache of such blocks that AllocateScratch
// hands out again, for the same size class, once `stream` has got past the free. Not with cudaFree or cudaFreeHost,
// which synchronize the device: a destroy would wait for every stream of the device, even one held by its own earlier
// work, without a bound (only where the event that marks the free cannot be recorded).
void FreeScratch(int device, bool pinnedHost, void* p, cudaStream_t stream);

// Work queued on one stream that may touch memory freed on another: a message copy on one rank's copy stream into
// another rank's scratch, which that rank frees on its own stream. TrackWork marks what `stream` (of the current
// device) has queued so far; EndTrackedWork(work, true) once it is known to have run, (work, false) when a wait for it
// gave up (a timeout): it then stays tracked until it has run, which may be never. While any work is tracked,
// FreeScratch frees on a stream of its own per device that first waits for the freeing stream's point and for all of
// that work; no other stream waits for it. Where work cannot be tracked (nullptr) and its wait gave up, nothing is
// freed any more in the process (a warning says so).
using TrackedWork = cudaEvent_t;
TrackedWork TrackWork(cudaStream_t stream);
void EndTrackedWork(TrackedWork work, bool ran);

// A non-blocking stream of `device` for frees to the pools once nothing uses the memory (a destructor's), made with
// them.
cudaStream_t ReleaseStream(int device);

// A word a stream of `device` can wait on (core/stream_wait.h): pinned, mapped host memory on a cache line of its
// own, set to 0; *deviceAddress is its address for kernels. Given back with ReturnWaitWord once no stream waits on it.
// A slab holds 256 words; a device with more proxies than that gets another slab, made with cudaHostAlloc then.
ccResult_t TakeWaitWord(int device, uint64_t** word, uint64_t** deviceAddress);
void ReturnWaitWord(int device, uint64_t* word);

}  // namespace ccoll
