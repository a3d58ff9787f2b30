// The fake CUDA runtime's "kernel launch": queues a host function on a fake stream (run in order with the stream's
// copies and events on its thread). For the fake codec kernels and the fake NCCL.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

namespace cctest {

// A launch that cannot be queued (a capture invalidated) records its error as the thread's last error, for the
// launch's check (gpu::Launched, which reports any error the thread left behind) to read.
void FakeLaunch(cudaStream_t stream, std::function<void()> op);

// While held, every kernel FakeLaunch queued waits when its turn comes, before it runs, until released: a GPU whose
// kernels do not finish, to test the waits' time limits. (The stream-wait kernel and copies are not held.)
void FakeHoldKernels(bool hold);

// From FakeLoseDevice(true) on, the device is lost, as after a kernel's fault (an Xid): every call that queues, waits,
// allocates or frees returns cudaErrorLaunchFailure, which cudaGetLastError does not take off; what was queued is
// dropped (the stream-wait kernel and held kernels end without running on), so the streams drain; frees still free.
// FakeLoseDevice(false) gives the process its device back (a real one would have to exit).
void FakeLoseDevice(bool lost);

// The calling thread's next n allocations of device or pinned host memory (cudaMalloc, cudaMallocFromPoolAsync,
// cudaHostAlloc) fail with cudaErrorMemoryAllocation: a GPU out of memory on one rank (thread).
void FakeFailAllocations(int n);

// How many devices cudaGetDeviceCount reports and cudaSetDevice takes (default 1). Only device 0 has memory, pools,
// properties and kernels; on another device a program can make streams (cudaStreamGetDevice tells them apart), to
// test what a call given another device's stream does.
void FakeDeviceCount(int n);

// The real NCCL and cuBLAS link the CUDA runtime statically: the errors of their own CUDA calls never reach the
// application's cudaGetLastError. The fake NCCL and cuBLAS call the fake runtime, so their calls that may fail hold
// one of these: the thread's last error is as it was when they return.
class FakeKeepLastError {
 public:
  FakeKeepLastError();
  ~FakeKeepLastError();
  FakeKeepLastError(const FakeKeepLastError&) = delete;
  FakeKeepLastError& operator=(const FakeKeepLastError&) = delete;

 private:
  cudaError_t saved_;
};

// Queues op on a fake stream as device work that is not one of ccoll's kernels (the fake NCCL's communication): in
// order with the stream's other work, without FakeLaunch's lazy-loading synchronization. While the stream captures,
// op is recorded into the graph instead, and runs at every launch of it. cudaErrorStreamCaptureInvalidated: the
// stream's capture was invalidated, op was dropped; cudaErrorStreamCaptureImplicit: op was for the legacy stream
// while a blocking stream captures.
cudaError_t FakePush(cudaStream_t stream, std::function<void()> op);

// The kernel families whose loaders (the Load*Kernels functions of the .cu files) have run. Until all have, the fake
// takes every launch for one that may load a module lazily, and synchronizes the device first, as CUDA may.
enum : unsigned {
  kQuantKernels = 1,
  kCastKernels = 2,
  kSparseKernels = 4,
  kReduceKernels = 8,
  kStreamWaitKernels = 16,
  kLowRankKernels = 32,  // PowerSGD's Gram-Schmidt and start of Q (builds with cuBLAS)
#ifdef CCOLL_HAVE_CUBLAS
  kAllKernelFamilies = 63
#else
  kAllKernelFamilies = 31
#endif
};
void FakeKernelsLoaded(unsigned families);
// A library call that may load kernels lazily on its first use (cuBLAS's products): with cublas in FAKE_CUDA_STRICT
// it synchronizes the device first.
void FakeLazyLibraryCall(const char* what);
// A library call that may synchronize the device (cublasCreate's allocation): with `token` in FAKE_CUDA_STRICT it does.
void FakeStrictCall(const char* token, const char* what);
// A library call that synchronizes the device (cublasDestroy), as cudaFree does here.
void FakeSynchronizeDevice(const char* what);

// The fake's own view of memory: device memory (cudaMalloc) is not accessible at the address the program holds, as
// on a GPU; the fake's copies and kernels reach it here. Any other pointer is returned as it is.
void* FakeHostView(const void* p);
template <typename T>
T* HostView(T* p) {
  return static_cast<T*>(FakeHostView(p));
}

// Codec and reduction kernels launched so far through the fake runtime (all threads): a test can tell that a device
// call ran on the device rather than staging through host memory.
uint64_t FakeCodecKernelLaunches();

// cudaMalloc and cudaHostAlloc calls so far that were not refused before allocating (a lost device, a capture), all
// threads: the allocations that may synchronize the device (with malloc or hostalloc in FAKE_CUDA_STRICT they do).
uint64_t FakeSynchronousAllocations();

// Handles the fake cuBLAS has made (cublasCreate) and destroyed so far, all threads.
uint64_t FakeCublasCreates();
uint64_t FakeCublasDestroys();

}  // namespace cctest
