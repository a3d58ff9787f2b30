// Collectives on device buffers through host staging, stream-ordered: the call copies the device input into pinned
// host memory on the user's stream and queues the host collective for this communicator's proxy thread; the stream
// then waits (a one-thread kernel polling a mapped host word) until the proxy has run it, and copies the result
// back. So the call returns once the work is enqueued, later work on the stream sees the result, and every codec and
// transport works on device buffers with the CPU codecs. The fused-kernel pipeline replaces this path for the codecs
// it covers.
//
// Order: a communicator's device calls run on its proxy thread one after the other, in call order, as host calls
// would; a host call first waits for the queue to empty (ccComm::DrainDevice). A failure on the proxy thread becomes
// the communicator's async error (ccCommGetAsyncError), and the streams waiting for the failed call and every later
// one are released without a result: a failure never hangs a stream.
//
// Without memory pools: where some of ccoll's scratch of the device comes from cudaMalloc or cudaHostAlloc (a device
// without pools of device or of pinned host memory, or CC_MEMORY_POOLS=0: core/device_memory.h), the proxy may
// allocate while it runs a call, and such an allocation may synchronize the device, which would wait for a stream
// held for that very call. So there, the first call of each shape (StagedCall::shape) queues no wait: the caller waits
// on the host until the proxy has run it (so until every rank has made it), and then queues the copy back, and no
// stream of the communicator is held meanwhile. Its allocations are then made and kept (a block freed is handed out
// again for its size), and both staging buffers grown, so the later calls of the shape find them and wait on their
// streams as usual. A first call whose stream does not reach it within CC_TIMEOUT_MS (held by its own earlier work)
// waits on its stream after all, with a warning.
//
// Streams that wait for one another's ranks must be different and must not be the legacy default stream (it
// serializes with every blocking stream of the device): thread ranks on one GPU each take their own stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ccoll.h"
#include "core/fnv.h"

struct ccComm;

namespace ccoll {

// One copy of a device call: `bytes` bytes between device memory at `device` and the staging buffer + `offset`.
struct StagedCopy {
  void* device = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
};

// What one device call moves: each of `ins` from the device into staging before the host work, each of `outs` from
// staging to the device after it, in order. The staging buffer holds stagingBytes. `shape` identifies what the call
// allocates: calls of one shape need the same scratch (0: unknown, the call is never taken as one run before).
struct StagedCall {
  ccStream_t stream = nullptr;
  std::vector<StagedCopy> ins;
  std::vector<StagedCopy> outs;
  size_t stagingBytes = 0;
  uint64_t shape = 0;
};

// The StagedCall::shape of a call described by `fields` (what decides its scratch): their hash, never 0.
inline uint64_t CallShape(const std::vector<uint64_t>& fields) {
  const uint64_t h = Fnv1a(fields.data(), fields.size() * sizeof(uint64_t));
  return h != 0 ? h : 1;
}

// The host part of a device call, run on the proxy thread with the call's staging buffer; staging is NULL when the
// call is skipped (the communicator failed or is aborting, or the staged input could not be read). The proxy
// destroys the work once it has run or been skipped (what the work holds is let go then).
using HostWork = std::function<void(char* staging)>;

class DeviceProxy {
 public:
  // A proxy for comm on CUDA device `device`. ccInvalidUsage in a build without CUDA.
  static ccResult_t Create(ccComm* comm, int device, std::unique_ptr<DeviceProxy>* out);
  // Runs what is queued (skipping it once the communicator failed or is aborting), releases every waiting stream,
  // waits for the streams to be done with the staging memory, and frees it.
  ~DeviceProxy();
  DeviceProxy(const DeviceProxy&) = delete;
  DeviceProxy& operator=(const DeviceProxy&) = delete;

  // Queues one call on call.stream. Blocks only while both staging buffers are still in use by earlier calls, and,
  // without memory pools, for the first call of each shape (see above). An error (a CUDA call failed, the stream is
  // being captured into a graph) leaves the queue unchanged unless *queued says the call was queued before it (the
  // proxy then runs it: the peers expect it).
  ccResult_t Enqueue(const StagedCall& call, HostWork work, bool* queued);
  // ccInvalidUsage when `stream` is being captured into a CUDA graph, which cannot hold a proxy's call. Asked before
  // anything a capture forbids (preparing the device, priming a codec: allocations and synchronizations) is done.
  static ccResult_t RefuseCapture(int rank, ccStream_t stream);
  // Blocks until every queued call has run on the proxy thread (not until the streams have copied the results).
  void Drain();
  // Whether Enqueue reads StagedCall::shape: only without memory pools (see above). Elsewhere a caller may leave it 0
  // rather than compute it.
  bool UsesShapes() const;

  struct Impl;

 private:
  explicit DeviceProxy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ccoll
