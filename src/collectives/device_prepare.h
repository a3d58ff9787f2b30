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

// Thread ranks that share a GPU. Each PowerSGD compressor on the device takes a cuBLAS handle, and making one
// (cublasCreate allocates device memory) may synchronize the device, which waits for any stream that another rank's
// call holds while that call waits for this thread. So with two or more communicators of this process on a device,
// one handle per communicator is made ahead: by PrepareDevice, before any stream of the device waits, and, once the
// device is prepared, by PrepareNewComm(device) after each communicator's setup, where only calls of other
// communicators can wait (a hazard only when a thread is a rank of both and the other ranks are ahead of it). More
// PowerSGD compressors alive at once than communicators (one per DDP bucket) make their own at their first call.
// Best effort (a failure is left to the first PowerSGD call); with one communicator per device (one process per GPU)
// nothing is made ahead. Builds with cuBLAS only.
void PrepareNewComm(int device);

}  // namespace ccoll
