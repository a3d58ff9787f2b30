// Exact collectives on device buffers that stay on the device: thread ranks on the GPUs of one process, over the
// local transport, which moves every message with one device copy (cudaMemcpyAsync) from the sender's buffer into
// the receiver's. The exact schedules run unchanged on the proxy thread; their reductions and the average are
// kernels (reduce_cuda.h), their copies cudaMemcpyAsync, on a non-blocking stream of the communicator's, synchronized
// before the schedule sends a result; their scratch slots are device memory. The local transport's copies go on a
// second stream, from whichever rank's thread completes a match. So the result is the host schedule's, byte for
// byte, and nothing is staged through host memory.
//
// The device codecs' messages take the same way: their wire slots are device memory, written and read by the codec
// kernels in place (device_compressed.h).
//
// Where a peer is reached through a transport that cannot carry device memory (UCX between processes), exact device
// calls are staged through host memory instead (core/device_proxy.h), and the codecs' messages cross to pinned host
// memory. Only built with CCOLL_HAVE_CUDA.
#pragma once

#include <cstdint>
#include <memory>

#include "ccoll.h"

struct ccComm;

namespace ccoll {

// True when every peer of comm is reached through a transport that carries device memory, and CC_DEVICE_KERNELS is
// not 0: then exact device calls run on the device buffers (collectives.cc), and the device codecs' wire slots are
// device memory too (device_compressed.cc).
bool MessagesStayOnDevice(const ccComm* comm);

// Messages the transports have copied with a DeviceCopier of this file so far, over every communicator of the
// process (for tests: that a call moved its messages device to device).
uint64_t DeviceMessagesCopied();

// Makes comm->deviceBuffers on first use (on the proxy thread, whose current device is the communicator's) and
// hands its copier to comm's transports. A CUDA failure is ccUnhandledCudaError. Only when MessagesStayOnDevice.
ccResult_t EnsureDeviceBuffers(ccComm* comm);

}  // namespace ccoll
