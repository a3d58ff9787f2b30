// What a device needs before its first stream wait: every ccoll kernel loaded into its context, and ccoll's memory of
// the device made (core/device_memory.h). CUDA loads kernels lazily, at their first launch, and a load may
// synchronize the context (the CUDA guide, "Lazy Loading": concurrent execution). The device proxy holds the caller's
// stream with a waiting kernel (core/device_proxy.h) while its thread launches the codec and reduction kernels: a lazy
// load there would wait for the waiting kernel, which waits for the load. So each device call first prepares its
// device. Only built with CUDA.
#pragma once

#include "ccoll.h"

namespace ccoll {

// Loads the codec, reduction and stream-wait kernels into the context of CUDA device `device` and makes its memory
// pools and wait words, once per device and process: after a success, later calls return at once; after a failure
// (ccUnhandledCudaError), the next call tries again.
ccResult_t PrepareDevice(int device);
// Whether PrepareDevice(device) has succeeded in this process (it makes memory and loads modules: not inside a CUDA
// graph capture).
bool DevicePrepared(int device);

// cuBLAS handles for PowerSGD. A call borrows one from a pool per device for its products (compress/lowrank_cuda.h):
// the thread that queues a call's device work (the caller's on the nccl transport, else the communicator's proxy),
// and the caller's thread while it primes a compressor's first call (collectives/device_compressed.h). So a
// communicator's calls hold at most two at once, however many compressors are alive. Making one (cublasCreate
// allocates device memory) may synchronize the device, which waits for every stream held by a call in flight: on the
// proxy thread that is a deadlock (its own caller's stream waits for it), and with thread ranks sharing a GPU any
// thread can wait for another rank's stream, held until this thread queues its part. So the pool gets two handles per
// communicator of this process on the device ahead:
//   - with two or more communicators on it: by PrepareDevice, before any stream of the device waits, and, once the
//     device is prepared, by PrepareNewComm(device) after each communicator's setup, where only calls of other
//     communicators can wait (a hazard only when a thread is a rank of both and the other ranks are ahead of it);
//   - always, by ReserveBlasForCalls(device) on the caller's thread before a PowerSGD compressor's first device call
//     (with one communicator only its own calls can wait there, and those go on without this thread).
// Best effort: a failure is left to the calls, which then make their own. Builds with cuBLAS only (else no-ops).
void PrepareNewComm(int device);
void ReserveBlasForCalls(int device);

}  // namespace ccoll
