#include "collectives/device_buffers.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "collectives/reduce_cuda.h"
#include "core/buffer_ops.h"
#include "core/comm.h"
#include "core/cuda_result.h"
#include "core/device_memory.h"
#include "core/device_scope.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/stream_sync.h"

namespace ccoll {
namespace {

std::atomic<uint64_t> gMessages{0};

class DeviceBuffers : public BufferOps, public DeviceCopier {
 public:
  DeviceBuffers(int rank, int device, size_t sliceBytes, int timeoutMs)
      : rank_(rank), device_(device), timeoutMs_(timeoutMs), sliceBytes_(sliceBytes) {}
  ~DeviceBuffers() override {
    // The communicator is being destroyed: its calls are done, and so are its streams' work, each synchronized but
    // for what a timeout left queued; a stream destroyed with work queued is released once that work has run. (A
    // peer's copy into the scratch that timed out: the free waits for it, core/device_memory.h.)
    DeviceScope scope(device_);
    FreeScratch(device_, false, scratch_, stream_);
    if (temp_ != nullptr) FreeScratch(device_, false, temp_, stream_);
    if (stream_ != nullptr) {
      if (SynchronizeWithin(stream_, timeoutMs_) != cudaSuccess) cudaGetLastError();
      gpu::IgnoreCuda(cudaStreamDestroy(stream_));
    }
    if (copyStream_ != nullptr) gpu::IgnoreCuda(cudaStreamDestroy(copyStream_));
  }

  ccResult_t Init(size_t scratchBytes) {
    CC_CHECK(Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
    CC_CHECK(Cuda(cudaStreamCreateWithFlags(&copyStream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
    // Made on the proxy thread while the caller's stream waits for it: from ccoll's stream-ordered pool, which waits
    // for no other stream (core/device_memory.h).
    CC_CHECK(AllocateScratch(device_, false, scratchBytes, stream_, &scratch_));
    return Cuda(SynchronizeWithin(stream_, timeoutMs_), "the allocation of the scratch slots");
  }

  ccResult_t Reduce(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype, ccRedOp_t op) override {
    CC_CHECK(gpu::Reduce(dst, a, b, count, dtype, op, stream_));
    return Cuda(SynchronizeWithin(stream_, timeoutMs_), "the reduction");
  }

  ccResult_t FinishAvg(void* buf, size_t count, ccDataType_t dtype, int nranks) override {
    CC_CHECK(gpu::FinishAvg(buf, count, dtype, nranks, stream_));
    return Cuda(SynchronizeWithin(stream_, timeoutMs_), "the average");
  }

  ccResult_t Premultiply(void* dst, const void* src, size_t count, ccDataType_t dtype, int nranks) override {
    CC_CHECK(gpu::Premultiply(dst, src, count, dtype, nranks, stream_));
    return Cuda(SynchronizeWithin(stream_, timeoutMs_), "the average's premultiply");
  }

  ccResult_t ReducePremultiplied(void* dst, const void* own, const void* other, size_t count, ccDataType_t dtype,
                                 int nranks) override {
    CC_CHECK(gpu::ReducePremultiplied(dst, own, other, count, dtype, nranks, stream_));
    return Cuda(SynchronizeWithin(stream_, timeoutMs_), "the average's reduction");
  }

  // The float16 average's premultiplied input (collectives/average.h), one per call: kept from call to call, and grown
  // when a call needs more, so that a later call of a shape allocates nothing (core/device_proxy.h: on a device
  // without memory pools its stream waits meanwhile). One asked for while that one is lent (not done by any schedule)
  // is allocated and freed on its own.
  ccResult_t Temporary(size_t bytes, void** p) override {
    if (tempLent_) {  // a second one at once
      CC_CHECK(AllocateScratch(device_, false, bytes, stream_, p));
      return Allocated();
    }
    if (temp_ == nullptr || bytes > tempBytes_) {
      if (temp_ != nullptr) FreeScratch(device_, false, temp_, stream_);
      temp_ = nullptr;
      tempBytes_ = 0;
      CC_CHECK(AllocateScratch(device_, false, bytes, stream_, &temp_));
      tempBytes_ = bytes;
      CC_CHECK(Allocated());
    }
    tempLent_ = true;
    *p = temp_;
    return ccSuccess;
  }

  // After the work queued on the stream, which the schedule has synchronized: nothing waits.
  void ReleaseTemporary(void* p) override {
    if (p == temp_) {
      tempLent_ = false;
    } else {
      FreeScratch(device_, false, p, stream_);
    }
  }

  ccResult_t Copy(void* dst, const void* src, size_t bytes) override {
    if (dst == src || bytes == 0) return ccSuccess;
    CC_CHECK(Cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync (copy)"));
    return Cuda(SynchronizeWithin(stream_, timeoutMs_), "the copy");
  }

  char* Scratch(int i) override { return static_cast<char*>(scratch_) + static_cast<size_t>(i) * sliceBytes_; }

  bool IsDevice(const void* p) const override { return PointerDevice(p) >= 0; }

  ccResult_t CopyMessage(void* dst, const void* src, size_t bytes) override {
    gMessages.fetch_add(1, std::memory_order_relaxed);
    DeviceScope scope(device_);  // the copy stream's device; the calling thread may be another rank's
    // Between two GPUs a peer copy: pool memory (core/device_memory.h) is not reachable from other devices otherwise.
    const int to = PointerDevice(dst), from = PointerDevice(src);
    if (to >= 0 && from >= 0 && to != from) {
      CC_CHECK(Cuda(cudaMemcpyPeerAsync(dst, to, src, from, bytes, copyStream_), "cudaMemcpyPeerAsync (message)"));
    } else {
      CC_CHECK(Cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copyStream_), "cudaMemcpyAsync (message)"));
    }
    // The copy writes the receiver's memory, which the receiver frees on its own stream: until the copy is known to
    // have run (a timeout leaves it queued), such frees wait for it (core/device_memory.h).
    const TrackedWork copy = TrackWork(copyStream_);
    const cudaError_t e = SynchronizeWithin(copyStream_, timeoutMs_);
    EndTrackedWork(copy, e == cudaSuccess);
    return Cuda(e, "the message copy");
  }

 private:
  // Waits for an allocation queued on the stream (AllocateScratch is stream-ordered): other streams use it next.
  ccResult_t Allocated() { return Cuda(SynchronizeWithin(stream_, timeoutMs_), "an allocation"); }

  ccResult_t Cuda(cudaError_t e, const char* what) const {
    if (e == cudaSuccess) return ccSuccess;
    cudaGetLastError();  // taken off the thread's error state (core/cuda_result.h, Launched)
    if (e == cudaErrorTimeout) {  // SynchronizeWithin's
      return Fail(ccTimeout, "rank %d: %s on CUDA device %d did not finish within %d ms (CC_TIMEOUT_MS); if the GPU "
                  "is not busy with other work, ccoll's streams may share a hardware queue with a stream that waits "
                  "for them (see CUDA_DEVICE_MAX_CONNECTIONS in the README)", rank_, what, device_, timeoutMs_);
    }
    return Fail(ccUnhandledCudaError, "rank %d: %s on CUDA device %d failed: %s", rank_, what, device_,
                cudaGetErrorString(e));
  }

  const int rank_, device_, timeoutMs_;
  const size_t sliceBytes_;
  cudaStream_t stream_ = nullptr;      // the schedule's kernels and copies (the proxy thread)
  cudaStream_t copyStream_ = nullptr;  // the transport's message copies (any rank's thread)
  void* scratch_ = nullptr;
  void* temp_ = nullptr;  // Temporary's kept block, of tempBytes_
  size_t tempBytes_ = 0;
  bool tempLent_ = false;
};

}  // namespace

uint64_t DeviceMessagesCopied() { return gMessages.load(std::memory_order_relaxed); }

bool MessagesStayOnDevice(const ccComm* comm) {
  if (!comm->config.deviceKernels) return false;
  for (const auto& t : comm->transports) {
    if (!t->CarriesDeviceMemory()) return false;
  }
  return true;
}

ccResult_t EnsureDeviceBuffers(ccComm* comm) {
  if (comm->deviceBuffers) return ccSuccess;
  auto ops = std::make_unique<DeviceBuffers>(comm->rank, comm->config.cudaDev, comm->config.sliceBytes,
                                             comm->config.timeoutMs);
  CC_CHECK(ops->Init(comm->config.sliceBytes * ccComm::kScratchSlots));
  for (auto& t : comm->transports) t->SetDeviceCopier(ops.get());
  comm->deviceBuffers = std::move(ops);
  return ccSuccess;
}

}  // namespace ccoll
