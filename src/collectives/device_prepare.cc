#include "collectives/device_prepare.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_set>

#include "collectives/reduce_cuda.h"
#include "compress/codec_cuda.h"
#ifdef CCOLL_HAVE_CUBLAS
#include "compress/lowrank_cuda.h"
#endif
#include "core/comm.h"
#include "core/device_memory.h"
#include "core/device_scope.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stream_wait.h"

namespace ccoll {
namespace {

ccResult_t LoadAll() {
  CC_CHECK(gpu::LoadQuantKernels());
  CC_CHECK(gpu::LoadCastKernels());
  CC_CHECK(gpu::LoadSparseKernels());
  CC_CHECK(gpu::LoadReduceKernels());
#ifdef CCOLL_HAVE_CUBLAS
  CC_CHECK(gpu::LoadLowRankKernels());
#endif
  return LoadStreamWaitKernel();
}

// ReserveBlasForCalls's work, when `always` or when two or more communicators share the device.
void ReserveBlas(int device, bool always) {
#ifdef CCOLL_HAVE_CUBLAS
  const int comms = LiveCommsOnDevice(device);
  if (comms < 2 && !always) return;
  const int handles = 2 * std::max(comms, 1);
  if (gpu::ReserveBlasHandles(device, handles) != ccSuccess) {
    CC_WARN("CUDA device %d: making %d cuBLAS handles for the %d communicators on it failed (%s); PowerSGD calls make "
            "their own", device, handles, comms, LastError().c_str());
  }
#else
  (void)device;
  (void)always;
#endif
}

std::mutex gPrepareMutex;
std::unordered_set<int>& Prepared() {
  static auto* loaded = new std::unordered_set<int>();  // never destroyed: calls may come from exit handlers
  return *loaded;
}

}  // namespace

bool DevicePrepared(int device) {
  std::lock_guard<std::mutex> lock(gPrepareMutex);
  return Prepared().count(device) != 0;
}

ccResult_t PrepareDevice(int device) {
  // Held while preparing: a second rank's thread on the same device waits until the kernels are there.
  std::lock_guard<std::mutex> lock(gPrepareMutex);
  if (Prepared().count(device) != 0) return ccSuccess;
  DeviceScope scope(device);
  ccResult_t r = LoadAll();
  // Whether making the pools and wait words synchronizes the device is not documented: they are made here too.
  if (r == ccSuccess) r = PrepareDeviceMemory(device);
  if (r != ccSuccess) {
    const std::string why = LastError();
    return Fail(r, "CUDA device %d: %s", device, why.c_str());
  }
  ReserveBlas(device, false);
  Prepared().insert(device);
  return ccSuccess;
}

void PrepareNewComm(int device) {
  if (device < 0 || !DevicePrepared(device)) return;
  DeviceScope scope(device);
  ReserveBlas(device, false);
}

void ReserveBlasForCalls(int device) { ReserveBlas(device, true); }

}  // namespace ccoll
