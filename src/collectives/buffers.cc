#include "collectives/buffers.h"

#include <cstring>

#include "collectives/reduce.h"
#include "core/comm.h"

namespace ccoll {

ccResult_t HostBuffers::Reduce(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype,
                               ccRedOp_t op) {
  ReduceHost(dst, a, b, count, dtype, op);
  return ccSuccess;
}

ccResult_t HostBuffers::FinishAvg(void* buf, size_t count, ccDataType_t dtype, int nranks) {
  FinishAvgHost(buf, count, dtype, nranks);
  return ccSuccess;
}

ccResult_t HostBuffers::Copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memmove(dst, src, bytes);
  return ccSuccess;
}

char* HostBuffers::Scratch(int i) { return comm_->ScratchSlot(i); }

// Every caller that runs an exact schedule with onDevice made the device ops first (EnsureDeviceBuffers in
// collectives/device_buffers.h).
CallBuffers::CallBuffers(ccComm* comm, const CollArgs& a)
    : host_(comm), ops_(a.onDevice ? comm->deviceBuffers.get() : static_cast<BufferOps*>(&host_)) {}

}  // namespace ccoll
