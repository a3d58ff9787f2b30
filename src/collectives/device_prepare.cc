#include "collectives/device_prepare.h"

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

// PrepareNewComm's work, also done by PrepareDevice.
void ReserveBlasForComms(int device) {
#ifdef CCOLL_HAVE_CUBLAS
  const int comms = LiveCommsOnDevice(device);
  if (comms < 2) return;
  if (gpu::ReserveBlasHandles(device, comms) != ccSuccess) {
    CC_WARN("CUDA device %d: making cuBLAS handles for the %d communicators on it failed (%s); PowerSGD calls make "
            "their own", device, comms, LastError().c_str());
  }
#else
  (void)device;
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
  ReserveBlasForComms(device);
  Prepared().insert(device);
  return ccSuccess;
}

void PrepareNewComm(int device) {
  if (device < 0 || !DevicePrepared(device)) return;
  DeviceScope scope(device);
  ReserveBlasForComms(device);
}

}  // namespace ccoll
